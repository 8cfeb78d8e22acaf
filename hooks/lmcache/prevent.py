"""Prevention: the replica's geometry fingerprint in every key it makes (docs/design.md section 4.5).

LMCache 0.5.6 puts every `lmcache.tag.*` entry of a request's configuration into the
`CacheEngineKey` it makes for that request (`TokenDatabase._make_key_by_hash`, via
`process_tokens(request_configs=...)`), and its key has no KV layout and no head
geometry. With `prevent` on, the instrumentor's wrap of `process_tokens` adds
`lmcache.tag.kvaudit_geometry=<fingerprint>` there, so a replica whose pages it cannot
read makes other keys than it: such pages miss by construction, before any byte moves.
The fingerprint is that of the engine's rank 0 on every rank: a key names its worker
already, and so every rank tags as the vLLM hook does for a whole request.
"""

from __future__ import annotations

import weakref
from typing import Any, Final

from kvaudit.contract import GEOMETRY_TAG
from kvaudit.hooks.lmcache import runtime

TAG: Final = f"lmcache.tag.{GEOMETRY_TAG}"
# `process_tokens(tokens, hashes, offsets, mask, make_key, request_configs)`: where it sits when passed by position.
_REQUEST_CONFIGS_AT: Final = 5
# Per token database, computed at its first request: its engine's configuration does not
# change, and the hash is on the serving path of every lookup, load and store.
_FINGERPRINTS: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def fingerprint_of(database: Any) -> str:
    """The geometry fingerprint (of rank 0) of the engine a token database makes keys for.

    `SegmentTokenDatabase` (CacheBlend) keeps no engine configuration: its layout is
    hashed as absent, so there only replicas configured alike share keys.
    """
    fingerprint = _FINGERPRINTS.get(database)
    if fingerprint is None:
        config = getattr(database, "config", None)
        fingerprint = runtime.geometry_of(config, database.metadata, database.save_only_first_rank, rank_zero=True)
        _FINGERPRINTS[database] = fingerprint
    return fingerprint


def tagged(database: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """`process_tokens`'s arguments with the fingerprint tag added to its request configuration."""
    tag = {TAG: fingerprint_of(database)}
    if len(args) > _REQUEST_CONFIGS_AT:
        merged = {**(args[_REQUEST_CONFIGS_AT] or {}), **tag}
        return (*args[:_REQUEST_CONFIGS_AT], merged, *args[_REQUEST_CONFIGS_AT + 1 :]), kwargs
    return args, {**kwargs, "request_configs": {**(kwargs.get("request_configs") or {}), **tag}}
