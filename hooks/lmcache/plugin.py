"""The store hook: a passive LMCache storage plugin.

LMCache hands every store (`StorageManager.batched_put`) to each storage backend,
plugins included, with the keys and the memory objects: that is the extension point
this hook uses instead of a patch. The plugin records one `kvaudit.store` span per
store with a complete descriptor per page, and stores nothing: it never claims a hit
and returns nothing that LMCache could load.

Configure it with `storage_plugins=[PLUGIN_NAME]` and `plugin_config()` merged into
`extra_config`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

from lmcache.v1.storage_backend.abstract_backend import StoragePluginInterface

from kvaudit.contract import Hook, Op, Outcome
from kvaudit.hooks.lmcache import runtime
from kvaudit.hooks.lmcache.checksums import payload_checksum, sampled
from kvaudit.hooks.lmcache.links import LINKS, LazyPages
from kvaudit.hooks.lmcache.pages import backend_label, objects_facts, store_page

if TYPE_CHECKING:
    from lmcache.utils import CacheEngineKey
    from lmcache.v1.memory_management import MemoryObj

PLUGIN_NAME: Final = "kvaudit"


def plugin_config(**options: Any) -> dict[str, Any]:
    """The `extra_config` entries that load the plugin; `options` become `kvaudit.<name>` entries."""
    config: dict[str, Any] = {
        f"storage_plugin.{PLUGIN_NAME}.module_path": __name__,
        f"storage_plugin.{PLUGIN_NAME}.class_name": KvauditStorePlugin.__name__,
    }
    config.update({f"kvaudit.{name}": value for name, value in options.items() if value is not None})
    return config


class KvauditStorePlugin(StoragePluginInterface):
    def __init__(self, dst_device: str = "cpu", config: Any = None, metadata: Any = None, **kwargs: Any) -> None:
        super().__init__(dst_device=dst_device, config=config, metadata=metadata, **kwargs)
        if runtime.current() is None:
            # Configured through LMCache's config alone: the fetch side needs the
            # instrumentor, which the same options switch on.
            from kvaudit.hooks.lmcache.instrumentor import instrument

            options = runtime.Options.from_extra_config(getattr(config, "extra_config", None))
            instrument(**vars(options))
        self._targets = ",".join(
            backend_label(name)
            for name, enabled in (
                ("LocalCPUBackend", getattr(config, "local_cpu", False)),
                ("LocalDiskBackend", getattr(config, "local_disk", None)),
                (
                    "RemoteBackend",
                    getattr(config, "remote_url", None) or getattr(config, "remote_storage_plugins", None),
                ),
            )
            if enabled
        )
        # The engine's geometry fingerprint, at the first store: its configuration does not change.
        self._geometry: str | None = None

    def batched_submit_put_task(
        self,
        keys: Sequence[CacheEngineKey],
        objs: list[MemoryObj],
        transfer_spec: Any = None,
        on_complete_callback: Callable[[CacheEngineKey], None] | None = None,
    ) -> None:
        try:
            self._record(keys, objs)
        except Exception as exc:  # the hook's own failure must not become LMCache's
            runtime.failed("store", exc)
        return None

    def _record(self, keys: Sequence[CacheEngineKey], objs: list[MemoryObj]) -> None:
        # Looked up on every store: after uninstrument() the plugin records nothing.
        state = runtime.current()
        if state is None or not keys:
            return
        started = time.time_ns()
        engine_request_id = runtime.REQUEST_ID.get()
        link = LINKS.get(engine_request_id, Op.STORE)
        rate, registry, stored = state.options.checksum_rate, state.registry, 0
        in_sample = state.records(engine_request_id, link)
        if not in_sample and registry is None and link is None:
            return  # a request not recorded, whose pages no guard reads
        emitter = state.emitter(self.config, self.metadata)
        ranges = state.ranges_of(keys)
        last = ranges[-1]
        if self._geometry is None:
            self._geometry = state.kv_config(self.config, self.metadata).geometry
        # Read now, while LMCache holds the objects; the descriptors are made later (LazyPages).
        recorded = []
        for key, obj, facts, token_range in zip(keys, objs, objects_facts(objs), ranges, strict=False):
            recorded.append((key, facts, token_range, payload_checksum(obj) if rate and sampled(key, rate) else None))
            if token_range is not None:
                stored += token_range[1] - token_range[0]
        metadata, hash_algo, geometry = self.metadata, state.hash_algo, self._geometry
        pages = LazyPages(
            len(recorded),
            lambda: [
                store_page(key, facts, metadata, hash_algo, token_range, checksum, geometry)
                for key, facts, token_range, checksum in recorded
            ],
            all_used=True,
        )
        if registry is not None:
            # Consumers compare what they fetch with this at once: made here, not later.
            for key, page in zip(keys, pages, strict=False):
                registry.put(key, page)
        if in_sample:
            emitter.record(
                Op.STORE,
                Hook.LMCACHE_BACKEND,
                LINKS.request_id(engine_request_id, link),
                self._targets,
                last[1] if last else None,
                link.parent if link is not None else None,
                started,
                Outcome.HIT,
                (None, stored or None, None, None, None),
                pages.__iter__,  # a bound method: no function of its own to make
            )
        if link is not None:
            link.on_pages(pages)

    # The rest of the backend interface: a plugin that holds nothing.
    def contains(self, key: CacheEngineKey, pin: bool = False) -> bool:
        return False

    def batched_contains(self, keys: list[CacheEngineKey], pin: bool = False) -> int:
        return 0

    def exists_in_put_tasks(self, key: CacheEngineKey) -> bool:
        return False

    def get_blocking(self, key: CacheEngineKey) -> None:
        return None

    def batched_get_blocking(self, keys: list[CacheEngineKey]) -> list[MemoryObj | None]:
        # An empty answer, not a list of Nones: StorageManager.batched_get takes any
        # non-empty list as this backend's final answer.
        return []

    def get_non_blocking(self, key: CacheEngineKey, location: str | None = None) -> None:
        return None

    async def batched_async_contains(self, lookup_id: str, keys: list[CacheEngineKey], pin: bool = False) -> int:
        return 0

    async def batched_get_non_blocking(
        self, lookup_id: str, keys: list[CacheEngineKey], transfer_spec: Any = None
    ) -> list[MemoryObj]:
        return []

    def pin(self, key: CacheEngineKey) -> bool:
        return False

    def unpin(self, key: CacheEngineKey) -> bool:
        return False

    def remove(self, key: CacheEngineKey, force: bool = True) -> bool:
        return False

    def touch_cache(self) -> None:
        return None

    def get_allocator_backend(self) -> Any:
        # The local CPU backend allocated the stored objects already: naming it keeps
        # StorageManager from copying them for this plugin.
        return self.local_cpu_backend

    def close(self) -> None:
        state = runtime.current()
        if state is not None:
            state.flush()
