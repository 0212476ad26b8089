#!/usr/bin/env bash
# What the device call runs (docs/benchmarks.md, "Every learner on a GPU"): the device machine has torch, timm
# and torchvision but no pytest, so pytest travels as wheels in .gpu-wheels/ (ignored by git; carried by the
# call) and is installed into .gpu-site/ there; then every learner is checked on CUDA and the results land in
# $OUT (the device tool's output folder) or benchmarks/results/gpu_check/.
#
#   bash benchmarks/gpu_check.sh --prepare     # here, once: download the wheels for the device's Python 3.12
#   bash benchmarks/gpu_check.sh [ARGS...]     # there: install them and run benchmarks/gpu_check.py ARGS
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=.gpu-wheels
if [[ "${1:-}" == "--prepare" ]]; then
    python3 -m pip download -q --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
        --implementation cp -d "$WHEELS" pytest
    ls "$WHEELS"
    exit 0
fi
if ! python -c "import pytest" 2>/dev/null; then
    python -m pip install -q --no-index --find-links "$WHEELS" --target .gpu-site pytest
    export PYTHONPATH="$PWD/.gpu-site${PYTHONPATH:+:$PYTHONPATH}"
fi
export HF_HUB_OFFLINE=1
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else '')"
python benchmarks/gpu_check.py --out "${OUT:-benchmarks/results/gpu_check}" "$@"
