"""kvaudit inside LMCache's multiprocess server, loaded by the server's own `--server-module` option.

    lmcache server ... --server-module '{"module_path": "kvaudit.hooks.lmcache.mp_server",
                                         "config": {"replica": "pool", "export": "file:traces/pool.jsonl"}}'

LMCache imports this module and calls `build_server_modules` once its observability is set
up and before it serves (`lmcache.v1.multiprocess.ext_server_module`): kvaudit subscribes
`mp_events` to the server's event bus, with the server's registered KV cache layouts, chunk
size and hash algorithm, and adds no module of its own (nothing on the request path). The
bus exists only with observability on (the server's default; `--disable-observability`
turns it off, and kvaudit then sees nothing). An LMCache release other than the supported
ones gets one log line and nothing installed, as the in-process hook does.

`config`: `replica` (default `lmcache-server`), `export` (default `KVAUDIT_EXPORT`).
"""

from __future__ import annotations

import logging
from typing import Any, Final

from kvaudit.hooks.lmcache.instrumentor import refusal

logger = logging.getLogger(__name__)

SERVER_MODULE_OPTION: Final = "--server-module"
DEFAULT_REPLICA: Final = "lmcache-server"
_CONFIG_KEYS: Final = frozenset({"replica", "export"})


def server_module_argument(replica: str, export: str | None = None) -> str:
    """The JSON value of `lmcache server --server-module` that loads this hook."""
    import json

    config = {"replica": replica, **({"export": export} if export else {})}
    return json.dumps({"module_path": __name__, "config": config})


def build_server_modules(context: Any) -> None:
    """LMCache's server-module factory: subscribe kvaudit to the server's event bus; no module.

    Fails open: whatever goes wrong is one log line and the server runs unobserved.
    """
    import lmcache

    why_not = refusal(lmcache.__version__)
    if why_not is not None:
        logger.warning("kvaudit: %s; the MP server hook is not installed", why_not)
        return None
    try:
        _subscribe(context)
    except Exception as exc:
        logger.warning("kvaudit: the MP server hook is not installed (%r)", exc)
    return None


def _subscribe(context: Any) -> None:
    from kvaudit.hooks.lmcache import mp_events

    config = dict(context.config or {})
    unknown = sorted(set(config) - _CONFIG_KEYS)
    if unknown:
        logger.warning("kvaudit: unknown MP server hook option(s) %s ignored", ", ".join(unknown))
    server = context.server_context
    bus = server.event_bus
    if not bus.enabled:
        logger.warning(
            "kvaudit: the server's event bus is off (--disable-observability): the MP server hook sees nothing"
        )
    registry = server.layout_desc_registry

    def layouts(model: str, world_size: int) -> tuple[list[Any], list[Any]] | None:
        desc = registry.find(model, world_size)
        return None if desc is None else (list(desc.dtypes), list(desc.shapes))

    mp_events.subscribe(
        str(config.get("replica") or DEFAULT_REPLICA),
        config.get("export"),
        bus=bus,
        layouts=layouts,
        chunk_size=context.mp_config.chunk_size,
        hash_algo=context.mp_config.hash_algorithm,
    )
    logger.info("kvaudit: the MP server hook is subscribed to the server's event bus")
