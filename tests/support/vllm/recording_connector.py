"""A V1 connector that records every call it gets: the wrapped connector of the conformance probe.

The probe (conformance.py) checks that KVAuditConnector passes each member of vLLM's
connector interface through: the call must reach the wrapped connector once, with the
same arguments, and the wrapped connector's answer must come back. A real connector
acts on what it is given, which these calls (made outside an engine) cannot provide;
this one only records. It is built from the running vLLM's own `KVConnectorBase_V1` and
`SupportsHMA`, so that a member a release adds is recorded too, and is loaded through
vLLM's real factory (`wrap_module_path`).
"""

from __future__ import annotations

import abc
import inspect
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, SupportsHMA


class Answer:
    """What a recorded method returns: an object only that call could have produced."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Answer({self.name})"


# Answers the wrapper reads before it returns them (it unpacks or extends these).
ANSWERS: dict[str, Any] = {"get_num_new_matched_tokens": (32, False), "get_block_ids_with_load_errors": {901}}


class RecordingConnector(KVConnectorBase_V1, SupportsHMA):
    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.answers: dict[str, Any] = {}

    def record(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.calls.append((name, args, kwargs))
        answer = ANSWERS[name] if name in ANSWERS else Answer(name)
        self.answers[name] = answer
        return answer


def _method(name: str) -> Any:
    def record(self: RecordingConnector, *args: Any, **kwargs: Any) -> Any:
        return self.record(name, args, kwargs)

    return record


def _property(name: str) -> property:
    return property(lambda self: self.record(name, (), {}))


for _base in (KVConnectorBase_V1, SupportsHMA):
    for _name in dir(_base):
        _member = inspect.getattr_static(_base, _name)
        if _name.startswith("_") or _name in vars(RecordingConnector):
            continue
        if inspect.isfunction(_member):
            setattr(RecordingConnector, _name, _method(_name))
        elif isinstance(_member, property):
            setattr(RecordingConnector, _name, _property(_name))
abc.update_abstractmethods(RecordingConnector)


class KeepsVllmsPreemptions(RecordingConnector):
    """A connector that keeps vLLM's own no-op `handle_preemptions` (as LMCache's does)."""

    handle_preemptions = KVConnectorBase_V1.handle_preemptions
