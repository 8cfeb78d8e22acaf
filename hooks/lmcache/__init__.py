"""kvaudit's LMCache hook: every store, fetch and lookup of a real LMCache engine.

    from kvaudit.hooks import lmcache as kvaudit_lmcache

    kvaudit_lmcache.instrument(replica="r1", export="file:traces/r1.jsonl", guard=True)
    config = LMCacheEngineConfig.from_defaults(
        ...,
        storage_plugins=[kvaudit_lmcache.PLUGIN_NAME],
        extra_config=kvaudit_lmcache.plugin_config(),
    )

Stores are seen by a passive storage plugin (LMCache's own extension point), fetches
and lookups by the instrumentor. Without an `instrument()` call the plugin switches
the instrumentor on itself, from `kvaudit.*` entries of `extra_config`
(`plugin_config(replica="r1", export="file:...")` writes them).
"""

from typing import Any

from kvaudit.hooks.lmcache.instrumentor import SUPPORTED_VERSIONS, instrument, is_instrumented, uninstrument

_FROM_PLUGIN = ("PLUGIN_NAME", "plugin_config")


def __getattr__(name: str) -> Any:
    # The plugin module subclasses LMCache's plugin interface, so it is imported when first
    # asked for: the rest (SUPPORTED_VERSIONS, for `kvaudit doctor`) imports without LMCache.
    if name in _FROM_PLUGIN:
        from kvaudit.hooks.lmcache import plugin

        return getattr(plugin, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "PLUGIN_NAME",
    "SUPPORTED_VERSIONS",
    "instrument",
    "is_instrumented",
    "plugin_config",
    "uninstrument",
]
