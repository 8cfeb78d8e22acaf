"""Every member of vLLM's V1 connector interface, forwarded to the wrapped connector.

`KVAuditConnector` observes a few calls of the interface and must pass every other one
through unchanged, on each supported release, including members a release adds (0.33
added `supports_sleep_mode`, `unregister_kv_caches` and `restore_kv_caches`; 0.34
`supports_lookahead_block_hashes`, `kv_cache_access` and `may_load_async`). So the
forwarders are not a hand-kept list: the class decorator `forward_interface(base)`
gives the class one forwarder for each public member of `base` (the running vLLM's
`KVConnectorBase_V1`, or `SupportsHMA`) that the class would otherwise inherit from
vLLM:

- an instance method calls the inner connector's method of that name, with the
  wrapper's metadata (`KVAuditMetadata`) replaced by the inner connector's own;
- a property reads the inner connector's;
- a class method (a class-level hook, asked before any connector exists: sleep mode,
  lookahead hashing, `kv_cache_access`, the KV cache layout, PIECEWISE CUDA graphs,
  stats, Prometheus metrics) asks the inner connector's class, with each configuration
  argument that names the wrapper replaced by the inner connector's view of it (its own
  name and module: `settings.inner_transfer_config`). Where vLLM's factory answers the
  same question around the class method, the answer is the factory's for the inner
  configuration: 0.34's `KVConnectorFactory.kv_cache_access` forces `LEGACY_IPC` for a
  connector *named* `LMCacheMPConnector`, and the name it reads is then the inner one.

The decorated class must set `self._inner` (the wrapped connector) before anything
calls a forwarder. A public member of any other kind (a plain class attribute, a static
method) cannot be forwarded both on the class and on its instances: it is listed in the
class's `UNFORWARDED` and logged once, and tests/hooks/vllm/test_versions.py fails on it.
"""

from __future__ import annotations

import abc
import functools
import inspect
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from vllm.config.kv_transfer import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

from kvaudit.hooks.vllm import CONNECTOR_NAMES
from kvaudit.hooks.vllm.plans import KVAuditMetadata
from kvaudit.hooks.vllm.settings import SECTION, AuditSettings, inner_transfer_config, inner_vllm_config

if TYPE_CHECKING:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

logger = logging.getLogger(__name__)
_C = TypeVar("_C", bound=type)

# The inner connector class of the last wrapper built in this process: the answer for
# class-level hooks that vLLM asks without a configuration (`build_kv_connector_stats`).
_last_inner_class: type[KVConnectorBase_V1] | None = None


def forward_interface(base: type) -> Callable[[_C], _C]:
    """A class decorator: forwarders for the public members of `base` the class does not define."""

    def decorate(cls: _C) -> _C:
        unforwarded = []
        for name in dir(base):
            if name.startswith("_") or _owner(cls, name) not in base.__mro__:
                continue  # private, or defined by the wrapper itself
            forwarder = _forwarder(name, inspect.getattr_static(base, name))
            if forwarder is None:
                unforwarded.append(name)
            else:
                setattr(cls, name, forwarder)
        cls.UNFORWARDED = (*getattr(cls, "UNFORWARDED", ()), *unforwarded)
        if unforwarded:
            logger.warning(
                "kvaudit: %s.%s cannot be forwarded to the wrapped connector; the wrapper answers with vLLM's default",
                base.__name__,
                ", ".join(unforwarded),
            )
        abc.update_abstractmethods(cls)  # the forwarders implement vLLM's abstract methods
        return cls

    return decorate


def note_inner_class(inner_class: type[KVConnectorBase_V1]) -> None:
    """Record the class a wrapper of this process wraps (see `_last_inner_class`)."""
    global _last_inner_class
    _last_inner_class = inner_class


def _owner(cls: type, name: str) -> type:
    """The class whose definition of `name` instances of `cls` use."""
    return next(klass for klass in cls.__mro__ if name in vars(klass))


def _forwarder(name: str, member: Any) -> Any:
    if isinstance(member, property):
        return property(lambda self: getattr(self._inner, name), doc=member.__doc__)
    if isinstance(member, classmethod):
        return classmethod(_class_forwarder(name, member.__func__))
    if inspect.isfunction(member):
        return _instance_forwarder(name, member)
    return None


def _instance_forwarder(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    # updated=(): copying the function's __dict__ would copy __isabstractmethod__ too.
    @functools.wraps(function, updated=())
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        if args:
            args = tuple(map(_inner_metadata, args))
        if kwargs:
            kwargs = {key: _inner_metadata(value) for key, value in kwargs.items()}
        return getattr(self._inner, name)(*args, **kwargs)

    return forward


def _inner_metadata(value: Any) -> Any:
    # `type(...) is`: the class has no subclass, and isinstance with an ABC (vLLM's metadata
    # class is one) is a Python call, made for each argument of every forwarded call.
    return value.inner if type(value) is KVAuditMetadata else value


def _class_forwarder(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function, updated=())
    def forward(cls: type, *args: Any, **kwargs: Any) -> Any:
        view = _InnerView()
        args = tuple(view(value) for value in args)
        kwargs = {key: view(value) for key, value in kwargs.items()}
        if view.transfer is None:
            inner_class = _last_inner_class or _inner_class_of_current_config()
            if inner_class is None:
                return function(cls, *args, **kwargs)  # nothing to ask: vLLM's default answer
            return getattr(inner_class, name)(*args, **kwargs)
        factory_answer = inspect.getattr_static(KVConnectorFactory, name, None)
        if isinstance(factory_answer, classmethod):
            return getattr(KVConnectorFactory, name)(*args, **kwargs)
        return getattr(KVConnectorFactory.get_connector_class(view.transfer), name)(*args, **kwargs)

    return forward


class _InnerView:
    """Configuration arguments as the inner connector sees them; remembers the inner transfer config."""

    def __init__(self) -> None:
        self.transfer: KVTransferConfig | None = None

    def __call__(self, value: Any) -> Any:
        if isinstance(value, KVTransferConfig):
            if _names_wrapper(value):
                value = inner_transfer_config(value, _settings(value.kv_connector_extra_config))
                self.transfer = self.transfer or value
        elif isinstance(getattr(value, "kv_transfer_config", None), KVTransferConfig):  # a VllmConfig
            if _names_wrapper(value.kv_transfer_config):
                value = inner_vllm_config(value, _settings(value.kv_transfer_config.kv_connector_extra_config))
                self.transfer = self.transfer or value.kv_transfer_config
        elif isinstance(value, dict) and isinstance(value.get(SECTION), dict):  # a kv_connector_extra_config
            settings = _settings(value)
            # The role is required by the config's validation, and changes no class lookup.
            self.transfer = self.transfer or KVTransferConfig(
                kv_connector=settings.wrap,
                kv_connector_module_path=settings.wrap_module_path,
                kv_role="kv_both",
                kv_connector_extra_config=value,
            )
        return value


def _names_wrapper(config: KVTransferConfig) -> bool:
    return config.kv_connector in CONNECTOR_NAMES


def _settings(extra_config: dict[str, Any]) -> AuditSettings:
    return AuditSettings.from_extra_config(extra_config)


def _inner_class_of_current_config() -> type[KVConnectorBase_V1] | None:
    from vllm.config import get_current_vllm_config_or_none

    config = get_current_vllm_config_or_none()
    transfer = config.kv_transfer_config if config is not None else None
    if transfer is None or not _names_wrapper(transfer):
        return None
    settings = _settings(transfer.kv_connector_extra_config)
    return KVConnectorFactory.get_connector_class(inner_transfer_config(transfer, settings))
