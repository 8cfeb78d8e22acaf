"""`KVAuditRole`: what the vLLM hook's scheduler half and worker half share.

`KVAuditConnector` builds one half for its role, around the inner connector it wraps:
`scheduler.KVAuditScheduler` in the EngineCore process, `worker.KVAuditWorker` in each
Worker process. Both start from the same setup, made here once: the settings, the
engine's geometry, how the inner connector's objects read (`inner_formats`, or LMCache's
layer where LMCache is the inner connector), the KV configuration the replica declares,
the emitter and the sampler; and both run their observations through `_observed`, so
that a failure of the hook's own never reaches vLLM.

A half names the calls it takes over from the inner connector (`calls`): its own
observing methods, and the inner connector's methods it leaves to it with no frame of
kvaudit's in between. The connector makes them what vLLM reaches by those names.
"""

from __future__ import annotations

import abc
import atexit
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import vllm
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

from kvaudit.emit.emitter import Emitter
from kvaudit.emit.setup import setup_emitter
from kvaudit.hooks.vllm import lmcache_layer, lmcache_mp_layer
from kvaudit.hooks.vllm.geometry import EngineGeometry, engine_geometry
from kvaudit.hooks.vllm.inner_formats import InnerFormat, format_for
from kvaudit.hooks.vllm.settings import AuditSettings
from kvaudit.sampling import request_sampler

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig

logger = logging.getLogger(__name__)
_T = TypeVar("_T")


class KVAuditRole(abc.ABC):
    """The setup both halves share; `calls` is each half's own."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        settings: AuditSettings,
        inner: KVConnectorBase_V1,
        tp_rank: int | None,
        kv_cache_config: KVCacheConfig | None = None,
    ) -> None:
        self._settings = settings
        self._inner = inner
        self._geometry: EngineGeometry = engine_geometry(vllm_config, tp_rank, kv_cache_config)
        # LMCache's format, where it is the inner connector's (`_layer`): its units join the LMCache hook's.
        self._layer = lmcache_layer.format_for(inner, self._geometry)
        # LMCache's multiprocess connector: its blocks name the server's objects (`_mp`).
        self._mp = None if self._layer is not None else lmcache_mp_layer.format_for(inner, self._geometry)
        self._format: InnerFormat = self._layer or self._mp or format_for(inner, self._geometry)
        self._kv = self._geometry.kv_config(self._format.layout)
        self._emitter: Emitter = setup_emitter(
            settings.replica,
            settings.export,
            engine="vllm",
            engine_version=vllm.__version__,
            service_name="vllm",
            kv=self._kv,
            sample_rate=settings.sample_rate,
        )
        atexit.register(self._emitter.shutdown)
        # Which requests are recorded (None: all), by vLLM's request id, as LMCache's hook chooses.
        self._sampler = request_sampler(settings.sample_rate)
        self._observation_failed = False

    @abc.abstractmethod
    def calls(self) -> dict[str, Callable[..., Any]]:
        """{name in vLLM's connector interface: what vLLM's call of that name reaches}."""

    def _straight(self, names: tuple[str, ...]) -> dict[str, Callable[..., Any]]:
        """The inner connector's own methods of these names, where the running vLLM's base
        class declares them (and so calls them)."""
        return {name: getattr(self._inner, name) for name in names if hasattr(KVConnectorBase_V1, name)}

    def shutdown(self) -> None:
        self._emitter.shutdown()

    def _observed(self, describe: Callable[..., _T], *args: Any) -> _T | None:
        """Run one of the hook's own observations; a failure there never reaches vLLM."""
        try:
            return describe(*args)
        except Exception as exc:
            self._failed(describe, exc)
            return None

    def _failed(self, describe: Callable[..., Any], exc: Exception) -> None:
        """Say once that one of the hook's observations failed."""
        if not self._observation_failed:
            self._observation_failed = True
            logger.warning("kvaudit: %s failed (%r); serving continues", describe.__name__, exc, exc_info=True)
