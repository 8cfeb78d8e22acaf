"""Which vLLM versions the hook supports, checked the way OpenTelemetry instrumentors do.

The wrapper calls private parts of some inner connectors (ExampleConnector's file
naming) and relies on the V1 connector interface of one vLLM minor version: on any
other version it refuses with one log line instead of failing somewhere deep inside
the engine.
"""

from __future__ import annotations

import logging
import re
from typing import Final

logger = logging.getLogger(__name__)

# Lowest supported version (inclusive) and the first unsupported one (exclusive).
SUPPORTED_MIN: Final = (0, 32)
SUPPORTED_BELOW: Final = (0, 33)
INSTRUMENTS: Final = "vllm >= 0.32, < 0.33"

_refusal_logged = False


def parse_version(version: str) -> tuple[int, int]:
    """Major and minor of a version string such as `0.32.0+cpu`; (0, 0) when unreadable."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match[1]), int(match[2])) if match else (0, 0)


def is_supported(version: str) -> bool:
    return SUPPORTED_MIN <= parse_version(version) < SUPPORTED_BELOW


def check_vllm_version() -> str | None:
    """The reason to refuse the installed vLLM, logged once per process, or None when supported."""
    global _refusal_logged
    import vllm

    version = getattr(vllm, "__version__", "unknown")
    if is_supported(version):
        return None
    reason = f"kvaudit.hooks.vllm supports {INSTRUMENTS}, found vllm {version}: not instrumenting"
    if not _refusal_logged:
        _refusal_logged = True
        logger.warning(reason)
    return reason
