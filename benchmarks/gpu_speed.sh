#!/usr/bin/env bash
# What the device call runs (docs/speed.md, "On a GPU"): gtep's trainer against a bare loop, gtep against upstream
# PyCIL and the paper's ViT methods at 224 px, on CUDA; the results land in $OUT (the device tool's output folder)
# or benchmarks/results/gpu_speed/. The device has torch, timm, torchvision and numpy and nothing to install: the
# PyCIL checkout travels in .pycil/ (ignored by git; carried by the call), and its one use of scipy gets a shim.
#
#   bash benchmarks/gpu_speed.sh [ARGS...]     # there: benchmarks/gpu_speed.py ARGS (e.g. --no-compile)
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else '')"
python benchmarks/gpu_speed.py --out "${OUT:-benchmarks/results/gpu_speed}" "$@"
