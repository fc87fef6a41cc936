#!/usr/bin/env bash
# One GPU run: the GPU tests of vllm-ir-cuda and vllm-ir-triton (CUDA-graph capture and
# replay, direct kernel relaunch, compile soundness with user Triton kernels), then every
# GPU benchmark, all within one deadline (BUDGET_S, default 450 s), writing logs and JSON
# into $OUT (default benchmarks/results/), the JSON named with the device.
#
#   bash benchmarks/gpu/run.sh                # from the project root, packages installed
#   WHEELS=dir bash benchmarks/gpu/run.sh     # install the project's wheels from dir first
#                                             # (--no-deps, into a temporary site dir)
#   DRY_RUN=1 bash benchmarks/gpu/run.sh      # print the stages, run nothing
#
# Without CUDA every stage still runs and skips: the tests report skipped, the
# benchmarks print that they skipped and write nothing.
set -u
export PYTHONUNBUFFERED=1
# the Triton direct relaunch is opt-in until this run has checked it on the GPU's Triton
export VLLM_IR_TRITON_DIRECT_LAUNCH=${VLLM_IR_TRITON_DIRECT_LAUNCH:-1}
root=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$root/benchmarks/results}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
T0=$(date +%s)
DEADLINE=$((T0 + ${BUDGET_S:-450}))
el() { echo "=== [t+$(($(date +%s) - T0))s] $*"; }
left() {
  local l=$((DEADLINE - $(date +%s)))
  if ((l > $1)); then echo "$1"; else echo "$l"; fi
}
status=0
stage() { # stage LOG MAX_S cmd...
  local log=$1 max=$2
  shift 2
  if [[ -n "${DRY_RUN:-}" ]]; then
    el "DRY_RUN $* (limit ${max}s, log $log)"
    return
  fi
  local t
  t=$(left "$max")
  if ((t < 15)); then
    el "SKIP $* (no time left)"
    status=1
    return
  fi
  el "START $* (limit ${t}s)"
  timeout "$t" "$@" >>"$OUT/$log" 2>&1
  local rc=$?
  el "END rc=$rc"
  tail -n 12 "$OUT/$log"
  ((rc == 0)) || status=1
}

if [[ -n "${WHEELS:-}" ]]; then
  site=$(mktemp -d)
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$site" "$WHEELS"/*.whl || exit 3
  export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
fi
cache=$(mktemp -d)
export VLLM_IR_CACHE_DIR=${VLLM_IR_CACHE_DIR:-$cache/vllm_ir}
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$cache/inductor}
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$cache/triton}

if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
fi
device=$("$PY" -c '
import torch
name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no-cuda"
print("-".join("".join(c if c.isalnum() else " " for c in name.lower()).split()))
')
"$PY" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.cuda.is_available())"
el "device: $device; results in $OUT"

if [[ "$device" != no-cuda ]]; then
  stage build.log 180 "$PY" -m vllm_ir_cuda build --verbose
fi
for pkg in vllm-ir-cuda vllm-ir-triton; do
  (cd "$root/packages/$pkg" && stage tests.log 120 "$PY" -m pytest -q -p no:cacheprovider -n 8 -rfE tests) || status=1
done
cd "$root" || exit 3
# decode (1 token) and the bandwidth sizes of the targets (4096 and 16384 tokens); native under
# Inductor is left to compiled_priorities (per-op compiles would not fit the deadline)
sizes=(--hidden 4096 8192 --tokens 1 4096 16384 --dtypes bfloat16 --rounds 7 --warmup 3 --target-ms 1)
stage benchmarks.log 75 "$PY" benchmarks/gpu_kernels.py "${sizes[@]}" --no-compiled \
  --out "$OUT/gpu_kernels-$device.json"
stage benchmarks.log 75 "$PY" benchmarks/triton_kernels.py "${sizes[@]}" --no-compiled \
  --out "$OUT/triton_kernels-$device.json"
if [[ "$device" != no-cuda ]]; then
  stage benchmarks.log 90 "$PY" benchmarks/compiled_priorities.py --rounds 20 \
    --out "$OUT/compiled_priorities-$device.json"
fi
el "done (status $status)"
exit $status
