"""The pytest marks of a test module that runs vLLM replicas beside LMCache (kept apart from
`mp_server`, which scripts/gpu_vllm_check.py imports where pytest may be absent)."""

from __future__ import annotations

from importlib.util import find_spec

import pytest

# What such a module is: it starts vLLM and LMCache, and waits for replicas run one after the other.
VLLM_AND_LMCACHE_MARKS = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        find_spec("vllm") is None or find_spec("lmcache") is None,
        reason="vllm and lmcache are installed by scripts/install-vllm.sh and scripts/install-lmcache.sh",
    ),
    pytest.mark.timeout(3600),
    # LMCache sets up OpenTelemetry logging through a handler the SDK deprecates: not ours.
    pytest.mark.filterwarnings("ignore:.*LoggingHandler.*:DeprecationWarning"),
]
