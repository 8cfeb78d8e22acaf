"""The reference deployment's two layers in one worker: kvaudit's vLLM hook around LMCache's connector.

When `KVAuditConnector` wraps LMCache's vLLM connector (`LMCacheConnectorV1`, or a
subclass), LMCache's engine runs inside the same vLLM worker process. Then, from the one
`kvaudit` section of `kv_connector_extra_config` (docs/design.md section 6.4):

- `inner_config` installs kvaudit's LMCache hook in the worker (the instrumentor, and the
  store plugin in LMCache's own configuration) with the same replica id, guard and
  `sample_rate` (it records the same requests), an export of its own (the LMCache
  process resource declares LMCache's configuration) and the options of the `lmcache`
  subsection (`registry`, `checksum_rate`, `export`);
- `LMCacheFormat` describes LMCache's loads and stores at the vLLM layer, one page per
  vLLM block (keys are vLLM's block hashes), and `join` links each of its spans to the
  LMCache operations of the same request: LMCache's spans become its children and carry
  vLLM's external request id, and every block names the LMCache chunk that served it
  (`kvaudit.page.source_key`: the chunk holding the block's last token).

vLLM-layer pages carry no payload metadata of their own: the chunk's page says what the
fetched object carried, and the auditor judges a block by both (docs/design.md section
4.2). The guard's verdict on a block is LMCache's verdict on its chunk: LMCache's hook
vetted the object, and LMCache reports what it did not load to vLLM, which recomputes it.

`LMCacheMPConnector` keeps its engine in LMCache's multiprocess server, not in the worker:
its blocks are described by `lmcache_mp_layer`, and the server's own hook is
`kvaudit.hooks.lmcache.mp_server`.
"""

from __future__ import annotations

import copy
import functools
import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import msgspec

from kvaudit.contract import Op, Outcome, PageDescriptor, Transfer
from kvaudit.hooks.vllm.geometry import EngineGeometry
from kvaudit.hooks.vllm.inner_formats import CPU_PAGED_LAYOUT, Unit, page_skeletons
from kvaudit.hooks.vllm.plans import RequestPlan, external_request_id
from kvaudit.hooks.vllm.settings import LAYER_SECTION, SECTION, AuditSettings, warn_unknown

if TYPE_CHECKING:
    import torch
    from vllm.config import VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata

    from kvaudit.emit.emitter import Operation

logger = logging.getLogger(__name__)
KVCaches = dict[str, "torch.Tensor"]

BACKEND: Final = "vllm.LMCacheConnectorV1"
# Plans of requests whose later steps may still load or store (chunked prefill):
# kept per worker, the oldest dropped past this bound.
_MAX_PLANS: Final = 4096


@dataclass(frozen=True)
class LayerSettings:
    """The `lmcache` subsection of the `kvaudit` section: options of the LMCache hook.

    Attributes:
        export: where the LMCache hook's spans go; default the vLLM hook's, with
            `.lmcache` before a file's suffix (one writer per file).
        registry: a directory shared by the replicas where stores leave their
            descriptors, so the guard can compare a fetched chunk with its store.
        checksum_rate: share of chunks whose payload gets an xxh3 checksum (0 to 1).
    """

    export: str | None = None
    registry: str | None = None
    checksum_rate: float = 0.0

    @classmethod
    def from_extra_config(cls, extra: dict[str, Any], settings: AuditSettings) -> LayerSettings:
        """Raises ValueError on a malformed subsection."""
        section = extra.get(SECTION, {}).get(LAYER_SECTION, {})
        if not isinstance(section, dict):
            raise ValueError(f'kv_connector_extra_config["{SECTION}"]["{LAYER_SECTION}"] must be a dict')
        try:
            checksum_rate = float(section.get("checksum_rate", 0.0))
        except (TypeError, ValueError):
            raise ValueError(f"kvaudit {LAYER_SECTION}.checksum_rate must be a number") from None
        warn_unknown(f'kv_connector_extra_config["{SECTION}"]["{LAYER_SECTION}"]', section, cls)
        return cls(
            export=section.get("export", layer_export(settings.export)),
            registry=section.get("registry"),
            checksum_rate=checksum_rate,
        )


def layer_export(export: str | None) -> str | None:
    """The LMCache hook's default destination beside the vLLM hook's: `file:r1.jsonl` -> `file:r1.lmcache.jsonl`."""
    if export is None or not export.startswith("file:"):
        return export
    stem, dot, suffix = export.rpartition(".")
    return f"{stem}.lmcache.{suffix}" if dot and "/" not in suffix else f"{export}.lmcache"


def wraps_lmcache(connector_class: type) -> bool:
    """Whether the wrapped connector runs LMCache's engine in the worker (`LMCacheConnectorV1` or a subclass)."""
    from vllm.distributed.kv_transfer.kv_connector.v1.lmcache_connector import LMCacheConnectorV1

    return issubclass(connector_class, LMCacheConnectorV1)


def inner_config(inner: VllmConfig, settings: AuditSettings, worker: bool) -> VllmConfig:
    """The inner connector's config; around LMCache's connector in a worker, with kvaudit's LMCache hook on.

    Installs the instrumentor in this process and returns a copy of `inner` whose
    `lmcache.*` entries add kvaudit's store plugin to LMCache's configuration. Anything
    else is returned unchanged, as is everything when the hook cannot be installed
    (LMCache then runs unobserved, and the vLLM layer's pages stay unjoined).
    """
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    transfer = inner.kv_transfer_config
    assert transfer is not None
    if not worker or not wraps_lmcache(KVConnectorFactory.get_connector_class(transfer)):
        return inner
    from kvaudit.hooks import lmcache as lmcache_hook
    from kvaudit.hooks.lmcache.links import LINKS

    extra = dict(transfer.kv_connector_extra_config)
    layer = LayerSettings.from_extra_config(extra, settings)
    installed = lmcache_hook.instrument(
        replica=settings.replica,
        export=layer.export,
        guard=settings.guard,
        checksum_rate=layer.checksum_rate,
        registry=layer.registry,
        sample_rate=settings.sample_rate,
    )
    if not installed:
        return inner
    LINKS.rename = external_request_id
    extra.update(_plugin_entries(extra))
    inner_transfer = copy.copy(transfer)
    object.__setattr__(inner_transfer, "kv_connector_extra_config", extra)
    config = copy.copy(inner)
    object.__setattr__(config, "kv_transfer_config", inner_transfer)
    return config


def _plugin_entries(extra: dict[str, Any]) -> dict[str, Any]:
    """`lmcache.*` entries adding the store plugin to what LMCache is configured with.

    LMCache applies `lmcache.<name>` entries of the extra config over its configuration
    file and environment, replacing a value whole: both entries are the configured value
    (the entry's, else the file's or environment's) with the plugin added.
    """
    from lmcache.integration.vllm.utils import lmcache_get_or_create_config

    from kvaudit.hooks.lmcache import PLUGIN_NAME, plugin_config

    configured = lmcache_get_or_create_config()  # the singleton LMCache itself reads next
    plugins = list(extra.get("lmcache.storage_plugins") or configured.storage_plugins or [])
    base = extra.get("lmcache.extra_config") or configured.extra_config or {}
    return {
        "lmcache.storage_plugins": plugins if PLUGIN_NAME in plugins else [*plugins, PLUGIN_NAME],
        "lmcache.extra_config": {**base, **plugin_config()},
    }


class LMCacheUnit(msgspec.Struct):
    """One LMCache load or store of one request in one step, as the vLLM layer follows it
    (a struct: made in C, on the serving thread).

    Attributes:
        reports: what the LMCache hook reported of the operation's chunks (their pages),
            one sequence per LMCache call; a store's are made when first read.
        rejected: on a fetch, the position (in the unit) of the first block vLLM may not
            use, or None; decided when the load returns.
    """

    reports: list[Sequence[PageDescriptor]] = msgspec.field(default_factory=list)
    rejected: int | None = None
    all_used: bool = True

    def tell(self, chunks: Sequence[PageDescriptor]) -> None:
        """The LMCache hook's report (a `Link.on_pages`): kept as it is, read when needed."""
        self.reports.append(chunks)
        # `LazyPages.all_used` (read by name: this module loads the LMCache hook only when it is used).
        if not getattr(chunks, "all_used", False):
            self.all_used = False

    @property
    def chunks(self) -> list[PageDescriptor]:
        """Every reported chunk, in the order reported."""
        return [chunk for report in self.reports for chunk in report]

    def first_rejected(self, first: int, count: int, block_size: int, guard: bool) -> int | None:
        """Position of the first of blocks `first`..`first + count - 1` that vLLM may not use.

        A block is served by the chunk holding its last token (LMCache serves prefixes,
        so that chunk's use implies the earlier ones'): it is rejected when that chunk was
        not used, or, with the guard on, when no chunk served it (unchecked is unused).
        One step per chunk, not per block: the blocks a chunk serves share its verdict;
        none at all without the guard when LMCache used every chunk it reported.
        """
        if self.all_used and not guard:
            return None
        chunks = self.chunks
        index, end = first, first + count
        while index < end:
            chunk = _chunk_of((index + 1) * block_size - 1, chunks)
            if chunk is None:
                if guard:
                    return index - first
                index += 1
            elif not chunk.used:
                return index - first
            else:
                assert chunk.token_end is not None  # _chunk_of found a range
                index = max(index + 1, chunk.token_end // block_size)
        return None


def _chunk_of(token: int, chunks: list[PageDescriptor]) -> PageDescriptor | None:
    """The last reported chunk holding `token`."""
    for chunk in reversed(chunks):
        start, end = chunk.token_start, chunk.token_end
        if start is not None and end is not None and start <= token < end:
            return chunk
    return None


def name_sources(pages: list[PageDescriptor], chunks: list[PageDescriptor]) -> None:
    """Each block's source: the chunk holding its last token; its use is that chunk's."""
    for page in pages:
        if page.token_end is None:
            continue
        chunk = _chunk_of(page.token_end - 1, chunks)
        if chunk is not None:
            page.source_key = chunk.key
            page.used = chunk.used


class LMCacheFormat:
    """LMCache's connector as the vLLM layer sees it: its metadata's requests, one page per block."""

    backend = BACKEND

    def __init__(self, inner: KVConnectorBase_V1, geometry: EngineGeometry) -> None:
        self._geometry = geometry
        self._fields = {"hash_algo": geometry.hash_algo}
        self._plans: OrderedDict[str, RequestPlan] = OrderedDict()
        self.layout = _memory_format(inner)
        # A stored block is this replica's: its fingerprint is the one its resource declares.
        self._store_geometry = geometry.kv_config(self.layout).geometry
        # The LMCache hook's, imported here (this module loads it only where LMCache is
        # wrapped), not at each join.
        from kvaudit.hooks.lmcache.links import LINKS, Link

        self._links, self._link = LINKS, Link

    def join(self, unit: Unit, operation: Operation) -> None:
        """Make the LMCache operations of `unit`'s request children of `operation`'s span."""
        # The operation itself, not its span's context: that is made on the exporter thread.
        link = self._link(unit.plan.request_id, operation, unit.ref.tell)
        self._links.put(unit.plan.req_id, Op.STORE if unit.is_store else Op.FETCH, link)

    def units(self, inner_meta: KVConnectorMetadata, plans: list[RequestPlan]) -> list[Unit]:
        for plan in plans:
            self._plans[plan.req_id] = plan
            self._plans.move_to_end(plan.req_id)
        while len(self._plans) > _MAX_PLANS:
            self._plans.popitem(last=False)
        units = []
        for request in getattr(inner_meta, "requests", ()):
            plan = self._plans.get(request.req_id)
            if plan is None:
                continue
            load = request.load_spec
            if load is not None and load.can_load and plan.load_tokens > 0:
                units.append(Unit(plan, False, plan.local_tokens, plan.load_tokens, LMCacheUnit()))
            save = request.save_spec
            # What LMCacheConnectorV1.wait_for_save stores: the request's tokens past those saved.
            if save is not None and save.can_save and save.skip_leading_tokens < len(request.token_ids):
                start = save.skip_leading_tokens
                units.append(Unit(plan, True, start, len(request.token_ids) - start, LMCacheUnit()))
        return units

    def finish_fetch(self, unit: Unit, fetch: Operation, guard: bool) -> list[int]:
        """End `fetch` once LMCache's load returned; the ids of the blocks vLLM must recompute.

        Only the verdict is made here, from the chunks the LMCache hook reported; the
        blocks' descriptors are made by `describe_fetch` on the exporter thread.
        """
        block_size = self._geometry.block_size
        first, count = unit.token_start // block_size, unit.num_tokens // block_size
        state: LMCacheUnit = unit.ref
        state.rejected = rejected = state.first_rejected(first, count, block_size, guard)
        describe = functools.partial(self.describe_fetch, unit)
        if rejected is None:
            used = count * block_size
            fetch.end(Outcome.HIT if used >= unit.num_tokens else Outcome.PARTIAL, tokens_hit=used, describe=describe)
            return []
        fetch.end(Outcome.REJECTED, tokens_hit=rejected * block_size, describe=describe)
        # vLLM recomputes from the first rejected block on: later blocks are not used either.
        return unit.plan.block_ids[first + rejected : first + count]

    def describe_fetch(self, unit: Unit) -> list[PageDescriptor]:
        """The unit's blocks: key, token range, the chunk that served each, and vLLM's use of it."""
        pages = page_skeletons(unit, self._geometry, self._fields)
        state: LMCacheUnit = unit.ref
        name_sources(pages, state.chunks)
        for index, page in enumerate(pages):
            page.used = state.rejected is None or index < state.rejected
        return pages

    def describe_store(self, unit: Unit, kv_caches: KVCaches) -> list[PageDescriptor]:
        """One page per block of the chunks LMCache stored for the request (as it reported them)."""
        block_size = self._geometry.block_size
        keys = unit.plan.keys
        pages = []
        for chunk in unit.ref.chunks:
            if chunk.token_start is None or chunk.token_end is None:
                continue
            for block in range(chunk.token_start // block_size, chunk.token_end // block_size):
                if block < len(keys):
                    page = PageDescriptor(
                        key=keys[block],
                        token_start=block * block_size,
                        token_end=(block + 1) * block_size,
                        source_key=chunk.key,
                        geometry=self._store_geometry,
                        **self._fields,
                    )
                    pages.append(self._stored(page, unit, block, kv_caches))
        return pages

    def _stored(self, page: PageDescriptor, unit: Unit, block: int, kv_caches: KVCaches) -> PageDescriptor:
        """A stored block's page as this connector stores it (LMCache's chunk page says the rest)."""
        return page


class RawPointerLMCacheFormat(LMCacheFormat):
    """The raw-pointer fallback's stores (`kvaudit.hooks.vllm.lmcache_cpu`): raw paged blocks,
    referred to by their process-local addresses."""

    def _stored(self, page: PageDescriptor, unit: Unit, block: int, kv_caches: KVCaches) -> PageDescriptor:
        page.layout = CPU_PAGED_LAYOUT
        page.transfer = Transfer.RAW_PTR
        first_cache = next(iter(kv_caches.values()), None)
        if first_cache is not None and block < len(unit.plan.block_ids):
            page.address = int(first_cache[unit.plan.block_ids[block]].data_ptr())
        return page


def _memory_format(inner: KVConnectorBase_V1) -> str | None:
    """The LMCache memory format the inner connector exchanges pages in (as LMCache's engine picks it)."""
    from kvaudit.hooks.lmcache.runtime import expected_format

    try:
        adapter = inner._lmcache_engine  # type: ignore[attr-defined]
        return expected_format(adapter.config, adapter.lmcache_engine_metadata)
    except Exception as exc:  # LMCache degraded or changed: the layout stays undeclared
        logger.warning("kvaudit: cannot tell LMCache's memory format (%r)", exc)
        return None


def format_for(inner: KVConnectorBase_V1, geometry: EngineGeometry) -> LMCacheFormat | None:
    """The format of an LMCache inner connector; None for any other."""
    if not wraps_lmcache(type(inner)):
        return None
    from kvaudit.hooks.vllm.lmcache_cpu import RawPointerFaultLMCacheConnector

    if isinstance(inner, RawPointerFaultLMCacheConnector):
        return RawPointerLMCacheFormat(inner, geometry)
    return LMCacheFormat(inner, geometry)
