"""The `kvaudit` section of `kv_connector_extra_config`, and the inner connector's config.

kv_connector_extra_config={
    "kvaudit": {"wrap": "ExampleConnector", "replica": "r1",
                "export": "file:traces/{replica}.jsonl", "guard": True,
                "stamp_dir": "/shared/kvaudit-stamps", "prevent": False, "sample_rate": 1.0},
    "shared_storage_path": "/shared/kv",   # the inner connector's own keys
}
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Final

from kvaudit.sampling import sample_rate

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.config.kv_transfer import KVTransferConfig

logger = logging.getLogger(__name__)

SECTION: Final = "kvaudit"
# The subsection of the LMCache hook's options (kvaudit.hooks.vllm.lmcache_layer.LayerSettings).
LAYER_SECTION: Final = "lmcache"


def warn_unknown(where: str, section: dict[str, Any], settings: type, *more: str) -> None:
    """One warning naming the keys of `section` that neither a field of the `settings`
    dataclass nor one of `more` reads: a misspelt option is not silently dropped."""
    known = [*(field.name for field in fields(settings)), *more]
    unknown = sorted(str(key) for key in section if key not in known)
    if unknown:
        logger.warning(
            "kvaudit: %s: unknown key%s %s ignored (known: %s)",
            where,
            "s" if len(unknown) > 1 else "",
            ", ".join(unknown),
            ", ".join(sorted(known)),
        )


@dataclass(frozen=True)
class AuditSettings:
    """What the wrapper is told to do.

    Attributes:
        wrap: the inner connector, a registered name or a class name in `wrap_module_path`.
        wrap_module_path: module of an out-of-tree inner connector.
        replica: the replica id (`service.instance.id`).
        export: `file:PATH` or `otlp:URL`; None reads `KVAUDIT_EXPORT` / `OTEL_EXPORTER_OTLP_*`.
        guard: reject fetched pages that fail the in-process checks (safe misses).
        stamp_dir: a directory shared by the replicas where the producer records, per
            stored page, what the inner connector's objects do not carry (model, TP
            world size and rank, head geometry). None: no stamps.
        prevent: around LMCache's connectors, put this replica's geometry fingerprint
            into the LMCache keys of every request (docs/design.md section 4.5).
        sample_rate: the share of requests recorded, 0 to 1, chosen by request id in
            every layer alike (docs/design.md section 3.10); the guard judges them all.
    """

    wrap: str
    replica: str
    wrap_module_path: str | None = None
    export: str | None = None
    guard: bool = False
    stamp_dir: str | None = None
    prevent: bool = False
    sample_rate: float = 1.0

    @classmethod
    def from_extra_config(cls, extra: dict[str, Any]) -> AuditSettings:
        """Raises ValueError when the section is missing or incomplete."""
        section = extra.get(SECTION)
        if not isinstance(section, dict) or not section.get("wrap") or not section.get("replica"):
            raise ValueError(
                'KVAuditConnector needs kv_connector_extra_config={"kvaudit": '
                '{"wrap": <connector>, "replica": <replica id>, ...}}'
            )
        warn_unknown(f'kv_connector_extra_config["{SECTION}"]', section, cls, LAYER_SECTION)
        return cls(
            wrap=str(section["wrap"]),
            replica=str(section["replica"]),
            wrap_module_path=section.get("wrap_module_path"),
            export=section.get("export"),
            guard=bool(section.get("guard", False)),
            stamp_dir=section.get("stamp_dir"),
            prevent=bool(section.get("prevent", False)),
            sample_rate=sample_rate(
                section.get("sample_rate", 1.0), f'kv_connector_extra_config["{SECTION}"]["sample_rate"]'
            ),
        )


def inner_transfer_config(outer: KVTransferConfig, settings: AuditSettings) -> KVTransferConfig:
    """The wrapper's transfer config as the inner connector must see it: its own name and module.

    A shallow copy: the extra config dict is shared, the inner connector ignores the
    `kvaudit` key.
    """
    inner = copy.copy(outer)
    object.__setattr__(inner, "kv_connector", settings.wrap)
    object.__setattr__(inner, "kv_connector_module_path", settings.wrap_module_path)
    return inner


def inner_vllm_config(outer: VllmConfig, settings: AuditSettings) -> VllmConfig:
    """A shallow copy of the engine config whose transfer config names the inner connector."""
    assert outer.kv_transfer_config is not None
    inner = copy.copy(outer)
    object.__setattr__(inner, "kv_transfer_config", inner_transfer_config(outer.kv_transfer_config, settings))
    return inner
