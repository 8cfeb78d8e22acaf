"""`KVAuditConnector`: a V1 KV connector that wraps another one and traces what it does.

How it is built, for those who build on it:

- The connector is thin, as vLLM's own `NixlConnector` is: it makes the inner connector
  (`self._inner`) and, by its role, the half that observes it (`self._half`):
  `scheduler.KVAuditScheduler` in the EngineCore process (a `kvaudit.lookup` span per
  lookup, the request plans added to the connector metadata) or `worker.KVAuditWorker`
  in each Worker process (`kvaudit.fetch` and `kvaudit.store` spans, the guard). What
  both halves share (settings, geometry, the inner connector's format, emitter, sampler)
  is set up once in `role.KVAuditRole`.
- A half names the calls it takes over (`KVAuditRole.calls`): its observing methods,
  each of which calls the inner connector's own exactly once with the same arguments
  and returns its answer, and the inner connector's own methods where kvaudit observes
  nothing but vLLM calls them at every layer, step or request. `_expose` makes them what
  vLLM reaches by those names on this connector, with no frame of the connector's in
  between; the worker's half changes some of them from one step to the next.
- `forward_interface` (`delegation`) forwards every other member of the running vLLM's
  `KVConnectorBase_V1` to the wrapped connector: instance methods and properties to the
  instance, class-level hooks to its class with the inner configuration, and
  `kv_cache_access` through vLLM's factory (its `LMCacheMPConnector` special case).
  Nothing is forwarded by hand, so a member a vLLM release adds is forwarded too;
  tests/hooks/vllm/test_versions.py checks each member of each supported release.
- What depends on the vLLM release is read where it is used: the supported range in
  `version`, the scheduler output in `plans.full_block_tables`.
- What a fetched page is, is read from the inner connector's objects by `inner_formats`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorRole,
    SupportsHMA,
    supports_hma,
)

from kvaudit.hooks.vllm import lmcache_layer
from kvaudit.hooks.vllm.delegation import forward_interface, note_inner_class
from kvaudit.hooks.vllm.scheduler import KVAuditScheduler
from kvaudit.hooks.vllm.settings import AuditSettings, inner_vllm_config
from kvaudit.hooks.vllm.version import check_vllm_version
from kvaudit.hooks.vllm.worker import KVAuditWorker

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.config.kv_transfer import KVTransferConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig

logger = logging.getLogger(__name__)


def _role_mismatch(outer: KVTransferConfig, inner: KVTransferConfig) -> str | None:
    """Why vLLM's reading of the wrapper's KV roles differs from the inner connector's, or None.

    vLLM reads `is_kv_producer` / `is_kv_consumer` off the configuration it was given,
    which names KVAuditConnector and so has one `kv_role`; since 0.34 a MultiConnector's
    roles come from its children instead, which only the inner configuration shows.
    """
    roles = (outer.is_kv_producer, outer.is_kv_consumer)
    inner_roles = (inner.is_kv_producer, inner.is_kv_consumer)
    if roles == inner_roles:
        return None
    kv_role = {(True, True): "kv_both", (True, False): "kv_producer", (False, True): "kv_consumer"}.get(inner_roles)
    return (
        f"kvaudit: vLLM takes the KV roles from kv_role={outer.kv_role!r} (producer={roles[0]}, consumer={roles[1]}), "
        f"while {inner.kv_connector}'s own configuration makes it producer={inner_roles[0]}, "
        f"consumer={inner_roles[1]}; set kv_role={kv_role!r} next to kv_connector='{outer.kv_connector}'"
    )


@forward_interface(KVConnectorBase_V1)
class KVAuditConnector(KVConnectorBase_V1):
    """Wraps the connector named in `kv_connector_extra_config["kvaudit"]["wrap"]`.

    Use `KVAuditHMAConnector` to wrap a connector that supports the hybrid memory
    allocator: vLLM decides on HMA from the connector class before it exists.
    """

    UNFORWARDED: tuple[str, ...] = ()  # filled by forward_interface

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig) -> None:
        refusal = check_vllm_version()
        if refusal is not None:
            raise RuntimeError(refusal)
        assert vllm_config.kv_transfer_config is not None
        settings = AuditSettings.from_extra_config(vllm_config.kv_transfer_config.kv_connector_extra_config)
        worker = role == KVConnectorRole.WORKER
        inner_config = lmcache_layer.inner_config(inner_vllm_config(vllm_config, settings), settings, worker)
        # The inner connector first: the forwarders read it from the start.
        self._inner = KVConnectorFactory.create_connector(inner_config, role, kv_cache_config)
        note_inner_class(type(self._inner))
        super().__init__(vllm_config, role, kv_cache_config)
        self._half: KVAuditScheduler | KVAuditWorker
        if worker:
            self._half = KVAuditWorker(vllm_config, settings, self._inner, self._expose, kv_cache_config)
        else:
            self._check_configuration(settings, inner_config.kv_transfer_config)
            self._half = KVAuditScheduler(vllm_config, settings, self._inner, kv_cache_config)
        # Only what this connector's class declares (and so vLLM calls): the running release's
        # interface, and the hybrid memory allocator's where the class supports it.
        self._expose({name: call for name, call in self._half.calls().items() if hasattr(type(self), name)})

    def _expose(self, calls: Mapping[str, Callable[..., Any]]) -> None:
        """Make each of `calls` what vLLM reaches by its name on this connector.

        vLLM calls a connector's methods by attribute (`connector.start_load_kv(...)`), and
        an instance's own attribute is found before its class's: a callable set here is
        reached with no frame of this class in between, which the calls vLLM makes at every
        layer or step need (docs/design.md section 5: what the serving thread pays). The
        one place the connector's attributes are rebound: once as it is built, and by the
        worker's half where a step differs from the one before (`KVAuditWorker._expose_step`).
        """
        vars(self).update(calls)

    def _check_configuration(self, settings: AuditSettings, inner: KVTransferConfig) -> None:
        """Log, once per engine, settings that make the wrapped engine behave otherwise than intended."""
        outer = self._kv_transfer_config
        if settings.guard and outer.kv_load_failure_policy == "fail":
            logger.warning(
                "kvaudit guard is on but kv_load_failure_policy='fail': a rejected page fails its "
                "request instead of being recomputed; set kv_load_failure_policy='recompute'"
            )
        mismatch = _role_mismatch(outer, inner)
        if mismatch is not None:
            logger.warning(mismatch)

    def shutdown(self) -> Any:
        try:
            return self._inner.shutdown()
        finally:
            self._half.shutdown()


@forward_interface(SupportsHMA)
class KVAuditHMAConnector(KVAuditConnector, SupportsHMA):
    """`KVAuditConnector` for inner connectors that support the hybrid memory allocator."""

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        if not supports_hma(self._inner):
            raise ValueError(f"{type(self._inner).__name__} does not support HMA: wrap it with KVAuditConnector")
