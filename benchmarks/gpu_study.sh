#!/usr/bin/env bash
# The one device call (docs/speed.md, "gtep run on a GPU"): gtep's own product on the GPU machine. The image there
# has torch, timm and numpy but no Ray, MLflow, Optuna, pydantic or SQLAlchemy and no network, so those travel as
# one archive (benchmarks/device_bundle.py) and are unpacked first. Then, each in a time box of its own so that a
# slow step never eats the next one's time, and each writing its figures to $OUT as it goes:
#   1. benchmarks/gpu_study.py: real studies through `gtep run` on CUDA, trials packed 1, 2, 4, 8 to the GPU,
#      and under CUDA MPS where the machine has it;
#   2. benchmarks/gpu_throughput.py: ResNet-32 images/s through the trainer;
#   3. benchmarks/gpu_speed.py --compiled-only: the compiled trainer rows the first H200 calls had no time for;
#   4. benchmarks/fusion.py: a trial's orderings fused into one network, beside the packing of step 1.
#
# Here, first (what the call carries: .device-bundle/gtep-deps-cp312.tar.xz and .device-data/):
#   .venv/bin/python benchmarks/device_bundle.py
#   .venv/bin/python benchmarks/gpu_study.py --make-data ../shared/data/tinyimagenet200_32.npz
# There (the device tool, carry [".device-bundle/gtep-deps-cp312.tar.xz", ".device-data"], timeout_s 480):
#   bash benchmarks/gpu_study.sh
# Dry run here, on CPUs (no bundle needed: this environment has every package):
#   bash benchmarks/gpu_study.sh --device cpu --quick
set -uo pipefail
cd "$(dirname "$0")/.."
START=$SECONDS
TOTAL=${GTEP_DEVICE_SECONDS:-450}   # the whole call's box, under the call's own limit (480 s)
STUDIES=${GTEP_STUDY_SECONDS:-300}
OUT=${OUT:-benchmarks/results/gpu_study}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 RAY_AUTH_MODE=disabled MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false HF_HUB_OFFLINE=1

BUNDLE=$(ls .device-bundle/gtep-deps-cp*.tar.xz 2>/dev/null | head -n1)
if ! python3 -c "import ray, mlflow, optuna, pydantic, sqlalchemy" 2>/dev/null; then
    if [[ -z "$BUNDLE" ]]; then
        echo "no .device-bundle/gtep-deps-cp*.tar.xz: build it here first (python benchmarks/device_bundle.py)" >&2
        exit 2
    fi
    DEPS=/tmp/gtep-deps
    mkdir -p "$DEPS" && tar -xJf "$BUNDLE" -C "$DEPS" || exit 2
    export PYTHONPATH="$DEPS${PYTHONPATH:+:$PYTHONPATH}"
    echo "unpacked $BUNDLE in $((SECONDS - START)) s"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python3 -c "import torch, ray, mlflow, optuna; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(),
torch.cuda.get_device_name() if torch.cuda.is_available() else '', '| ray', ray.__version__, 'mlflow', mlflow.__version__,
'optuna', optuna.__version__)" 2>&1 | tee "$OUT/steps.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | tee -a "$OUT/steps.txt"

left() { echo $((TOTAL - (SECONDS - START))); }
step() {  # step NAME SECONDS COMMAND...: run it in its time box, its output in $OUT/NAME.log
    local name=$1 box=$2; shift 2
    (( box > 20 )) || { echo "== $name: skipped, $box s left" | tee -a "$OUT/steps.txt"; return; }
    echo "== $name (at most $box s): $*" | tee -a "$OUT/steps.txt"
    timeout --signal=INT --kill-after=15 "$box" "$@" 2>&1 | tee "$OUT/$name.log"
    echo "== $name: exit ${PIPESTATUS[0]} at $((SECONDS - START)) s" | tee -a "$OUT/steps.txt"
}

if [[ "${1:-}" == "--device" && "${2:-}" == "cpu" ]]; then  # the CPU dry run: the studies only, toy sized
    step gpu_study "$(left)" python3 benchmarks/gpu_study.py --out "$OUT" "$@"
    exit 0
fi
box=$(left); (( box > STUDIES )) && box=$STUDIES
step gpu_study "$box" python3 benchmarks/gpu_study.py --out "$OUT" "$@"
box=$(left); (( box > 60 )) && box=60
step gpu_throughput "$box" python3 benchmarks/gpu_throughput.py --batches 128 1024 --repeats 2
if [[ -f benchmarks/fusion.py ]]; then
    box=$(left); (( box > 90 )) && box=90
    step fusion "$box" python3 benchmarks/fusion.py --device cuda --out "$OUT"
fi
step gpu_speed_compiled "$(left)" python3 benchmarks/gpu_speed.py --compiled-only --out "$OUT"
cat "$OUT/steps.txt"
