#!/usr/bin/env bash
# LMCache 0.5.6 on a CPU, for kvaudit.hooks.lmcache, its tests and its benchmark.
# Usage: scripts/install-lmcache.sh PYTHON
#
# LMCache declares CUDA-only dependencies (cupy, cuda-python, cufile, bigtable) that
# a CPU machine cannot install, so it goes in with --no-deps, after a CPU torch,
# followed by the pure-Python packages it really imports. The caps are LMCache's own
# bounds; they are passed to every install here so that no later package raises them.
set -euo pipefail
py="$1"
install=("$py" -m pip install -q --disable-pip-version-check)
caps="$(mktemp)"
trap 'rm -f "$caps"' EXIT
cat >"$caps" <<'CAPS'
opentelemetry-api<=1.40.0
opentelemetry-sdk<=1.40.0
opentelemetry-proto<=1.40.0
opentelemetry-exporter-otlp-proto-common<=1.40.0
opentelemetry-exporter-otlp-proto-http<=1.40.0
prometheus_client<=0.24.1
numpy<=2.2.6
CAPS

# On these machines pip finds the CPU build of torch in its configured wheel directory.
"${install[@]}" -c "$caps" "torch==2.13.0"
"${install[@]}" --no-deps "lmcache==0.5.6"
"${install[@]}" -c "$caps" \
    numpy numba msgspec sortedcontainers pyyaml pyzmq cachetools psutil py-cpuinfo \
    prometheus_client opentelemetry-api opentelemetry-sdk blake3 aiofile aiofiles aiohttp \
    redis safetensors nvtx requests transformers cryptography xxhash
