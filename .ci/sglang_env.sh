#!/usr/bin/env bash
# The SGLang test tier's own environment: the real `sglang` package on the CPU build of torch.
# sglang pins a CUDA torch and many GPU-only wheels, so it is installed without its dependencies and
# then given the pure-Python ones its layer, plugin and server modules import, with torch held to the
# CPU wheel. PyPI's torchvision is built against CUDA torch: its C++ ops cannot load here (see
# tests/sglang_child.py for the two operator schemas it then needs). Usage: .ci/sglang_env.sh [VENV]
set -euo pipefail
cd "$(dirname "$0")/.."
. .ci/engine_venv.sh
VENV="${1:-.venv-sglang}"
SGLANG_VERSION=0.5.23
fresh_venv sglang "$VENV" "$0"
PIP="$VENV/bin/pip"
constraints=constraints/cpu.txt  # the CPU set-up's torch and triton, as the README's commands install them
"$PIP" install -q -c "$constraints" torch triton
"$PIP" install -q --no-deps "sglang==$SGLANG_VERSION" torchvision==0.28.0
"$PIP" install -q -c "$constraints" numpy orjson psutil pybase64 requests packaging pillow starlette fastapi \
  uvicorn msgspec pydantic pyzmq tqdm IPython aiohttp "transformers==5.19.0" dill "sentencepiece==0.2.1" \
  "apache-tvm-ffi==0.1.11" compressed-tensors gguf ninja setproctitle
"$PIP" install -q --no-deps -e .  # kernelbot itself, for its sglang.srt.plugins entry point
"$VENV/bin/python" -c "import torch; assert torch.__version__.endswith('+cpu'), torch.__version__"
stamp_venv sglang "$VENV"
