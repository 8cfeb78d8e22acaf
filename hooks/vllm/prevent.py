"""Prevention from the vLLM hook: the geometry tag in each request's `kv_transfer_params`.

LMCache's vLLM connector reads a request's `lmcache.*` configuration from
`sampling_params.extra_args["kv_transfer_params"]` in the scheduler
(`extract_request_configs_from_sampling_params`) and carries it to the lookup and to the
worker's loads and stores, where each `lmcache.tag.*` entry becomes part of the keys.
With `prevent` on in the `kvaudit` section, `KVAuditConnector` around `LMCacheConnectorV1`
adds `lmcache.tag.kvaudit_geometry=<fingerprint>` there before LMCache looks the request
up (docs/design.md section 4.5): the tag, and the value, the LMCache hook's own `prevent`
adds from inside the engine, the fingerprint of LMCache's pages on rank 0. A request has
one configuration for all its ranks, whose keys the worker id already tells apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from kvaudit.hooks.lmcache import runtime
from kvaudit.hooks.lmcache.prevent import TAG

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.request import Request

_TRANSFER_PARAMS: Final = "kv_transfer_params"


def request_tag(vllm_config: VllmConfig) -> dict[str, str]:
    """The tag this replica's requests carry: the fingerprint of LMCache's pages on rank 0.

    Reads LMCache's configuration after the wrapped connector applied the `lmcache.*`
    entries of the extra config to it, and LMCache's metadata as its scheduler makes it.
    """
    from lmcache.integration.vllm.utils import lmcache_get_or_create_config
    from lmcache.integration.vllm.vllm_service_factory import VllmServiceFactory

    config = lmcache_get_or_create_config()
    metadata = VllmServiceFactory(config, vllm_config, "scheduler").get_or_create_metadata()
    assert metadata is not None
    first_rank_only = runtime.saves_only_first_rank(config, metadata)
    return {TAG: runtime.geometry_of(config, metadata, first_rank_only, rank_zero=True)}


def tag_request(request: Request, tag: dict[str, str]) -> None:
    """Add `tag` to the request's `kv_transfer_params`, keeping its other entries.

    New dicts rather than the client's own: only LMCache reads the tag. A request without
    sampling parameters (pooling) or whose `kv_transfer_params` is not a mapping is left
    as it is: LMCache would not read a configuration from it either.
    """
    params = getattr(request, "sampling_params", None)
    if params is None:
        return
    extra: dict[str, Any] = dict(params.extra_args or {})
    transfer = extra.get(_TRANSFER_PARAMS)
    if transfer is not None and not isinstance(transfer, Mapping):
        return
    extra[_TRANSFER_PARAMS] = {**(transfer or {}), **tag}
    params.extra_args = extra
