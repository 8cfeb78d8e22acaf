"""Which vLLM versions the hook supports, declared once, as OpenTelemetry instrumentors do.

The wrapper forwards vLLM's V1 connector interface as the running release defines it
(see `delegation`), but it also reads engine internals whose meaning changes between
releases (`yield_req_data`, the scheduler output, ExampleConnector's file naming). So
each release is supported on purpose, after its conformance tests pass
(tests/hooks/vllm/test_versions.py): on any other version the hook refuses with one log line
instead of failing somewhere deep inside the engine. `kvaudit doctor` reports the same
answer.
"""

from __future__ import annotations

import logging
from typing import Final

from packaging.requirements import Requirement
from packaging.version import InvalidVersion, Version

logger = logging.getLogger(__name__)

# The one place the supported range is written (PEP 508), like an instrumentor's
# `_instruments`. Releases are added here after their conformance tests pass.
INSTRUMENTS: Final = "vllm >= 0.32, < 0.35"

_REQUIREMENT: Final = Requirement(INSTRUMENTS)
_refusal_logged = False


def instrumentation_dependencies() -> tuple[str, ...]:
    """The requirements the hook instruments, as `BaseInstrumentor.instrumentation_dependencies()` says them."""
    return (INSTRUMENTS,)


def supported_specifier() -> str:
    """The supported range as a PEP 440 specifier, lower bound first: `>=0.32,<0.35`."""
    return ",".join(sorted(map(str, _REQUIREMENT.specifier), key=lambda bound: not bound.startswith(">")))


def first_releases() -> tuple[str, ...]:
    """The first release of each minor version in the range (`0.32.0`, `0.33.0`, ...): the
    releases the conformance tests run against (scripts/side-vllm.sh prepares them)."""
    bounds = {spec.operator: Version(spec.version) for spec in _REQUIREMENT.specifier}
    lowest, below = bounds[">="], bounds["<"]
    return tuple(f"{lowest.major}.{minor}.0" for minor in range(lowest.minor, below.minor))


def is_supported(version: str) -> bool:
    """Whether `version` (e.g. `0.32.0+cpu`) is in the supported range.

    Pre-releases and development builds are refused: a `0.34.1.dev5` nightly carries
    changes made after 0.34.0, which no conformance test has seen.
    """
    try:
        return _REQUIREMENT.specifier.contains(version, prereleases=False)
    except InvalidVersion:
        return False


def refusal(version: str) -> str | None:
    """Why the hook does not instrument vLLM `version`, or None when it does."""
    if is_supported(version):
        return None
    return f"kvaudit.hooks.vllm supports {INSTRUMENTS}, found vllm {version}: not instrumenting"


def check_vllm_version() -> str | None:
    """The reason to refuse the installed vLLM, logged once per process, or None when supported."""
    global _refusal_logged
    import vllm

    reason = refusal(getattr(vllm, "__version__", "unknown"))
    if reason is not None and not _refusal_logged:
        _refusal_logged = True
        logger.warning(reason)
    return reason
