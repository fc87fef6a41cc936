#!/usr/bin/env bash
# One GPU run: the GPU tests of vllm-ir-cuda and vllm-ir-triton (CUDA-graph capture and
# replay, bad-argument fuzz of the binding, direct kernel relaunch, compile soundness with
# user Triton kernels), the kernel table, the FP8 decoder against plain torch.compile and
# the compiled decoder, all within one deadline (BUDGET_S, default 470 s), writing at most
# seven files (logs and JSON) into $OUT (default benchmarks/results/), the JSON named
# with the device.
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
DEADLINE=$((T0 + ${BUDGET_S:-470}))
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

{
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  c++ --version | head -n 1
  "$PY" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.cuda.is_available())"
} 2>&1 | tee -a "$OUT/env.log"
device=$("$PY" -c '
import torch
name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no-cuda"
print("-".join("".join(c if c.isalnum() else " " for c in name.lower()).split()))
')
el "device: $device; results in $OUT"

if [[ "$device" != no-cuda ]]; then
  stage build.log 180 "$PY" -m vllm_ir_cuda build --verbose
  # which C++ runtime the kernels' library and the interpreter use (the binding once
  # crashed formatting an integer into an error message)
  stage env.log 20 "$PY" -c '
import glob, os, subprocess, torch
from vllm_ir_cuda import _build
lib = str(_build.load())
print(subprocess.run(["ldd", lib], capture_output=True, text=True).stdout)
print([l.split()[-1] for l in open("/proc/self/maps") if "libstdc++" in l][:1])
'
fi
workers=${WORKERS:-16}
# the CUDA kernels' tests first (bad-argument fuzz included), then the kernel table, the
# FP8 decoder and the compiled decoder; Triton's tests (long compiles) last
(cd "$root/packages/vllm-ir-cuda" && stage tests.log 150 "$PY" -m pytest -q -p no:cacheprovider -n "$workers" -rfE tests) || status=1
cd "$root" || exit 3
# decode (1 token) and the bandwidth sizes of the targets (16384 tokens: >= 64 MB in bf16);
# native under Inductor is left to the compiled benchmarks (per-op compiles would not fit)
sizes=(--hidden 4096 8192 --tokens 1 16384 --dtypes bfloat16 --rounds 5 --warmup 3 --target-ms 1)
stage benchmarks.log 90 "$PY" benchmarks/gpu_kernels.py "${sizes[@]}" --no-compiled \
  --out "$OUT/gpu_kernels-$device.json"
if [[ "$device" != no-cuda ]]; then
  stage benchmarks.log 120 "$PY" benchmarks/fp8_decoder.py --rounds 20 \
    --out "$OUT/fp8_decoder-$device.json"
fi
if [[ "$device" != no-cuda ]]; then
  stage benchmarks.log 90 "$PY" benchmarks/compiled_priorities.py --rounds 20 \
    --out "$OUT/compiled_priorities-$device.json"
fi
(cd "$root/packages/vllm-ir-triton" && stage tests.log 150 "$PY" -m pytest -q -p no:cacheprovider -n "$workers" -rfE tests) || status=1
cd "$root" || exit 3
el "done (status $status)"
exit $status
