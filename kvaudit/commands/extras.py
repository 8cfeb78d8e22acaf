"""Which of kvaudit's extras installs a module that a command could not import.

`pip install kvaudit` is the serving side (OpenTelemetry and msgspec); the analysis side
comes with extras (`analysis`, `tui`, `report`, `clickhouse`, or `all`). A command run
where its library is missing says in one line which extra to install. The extras are
read from the installed package's metadata: pyproject.toml stays their one source.
"""

from __future__ import annotations

import re
from importlib import metadata
from typing import Final

# Import names that differ from the name of the distribution that provides them.
_DISTRIBUTION: Final = {
    "yaml": "pyyaml",
    "zmq": "pyzmq",
    "clickhouse_connect": "clickhouse-connect",
    "llvmlite": "numba",  # numba's compiler: numba brings it
    "backports": "backports.zstd",
}
_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_EXTRA: Final = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")


def extra_providing(module: str) -> str | None:
    """The extra whose requirements name the distribution of `module` (None: no extra does)."""
    top = module.partition(".")[0]
    wanted = _normalised(_DISTRIBUTION.get(top, top))
    if wanted == "kvaudit":
        return None  # a module of its own missing is no extra's: the extras name kvaudit[analysis] themselves
    try:
        requirements = metadata.requires("kvaudit") or []
    except metadata.PackageNotFoundError:
        return None
    for requirement in requirements:
        name, extra = _NAME.match(requirement), _EXTRA.search(requirement)
        if name and extra and _normalised(name.group()) == wanted:
            return extra.group(1)
    return None


def _normalised(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()
