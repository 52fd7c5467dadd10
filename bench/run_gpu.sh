#!/usr/bin/env bash
# One GPU-tool call = one line of this script. Prints progress (the tool keeps the last
# 12k characters) and leaves JSONs + logs in $OUT (the only folder that comes back).
#
#   bash bench/run_gpu.sh kernel [kernel_bench.py options]
#   bash bench/run_gpu.sh tp "1 2" [tp_sweep.py options]     # one torchrun per TP degree, in order
#
# Wheels in .whl/ (e.g. nvshmem4py-cu13, flashinfer-python) are installed first when the
# call carries that folder. BENCH_TIMEOUT (seconds, default 570) bounds each python run.
set -o pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
OUT="${OUT:-bench/results}"
mkdir -p "$OUT"
limit="${BENCH_TIMEOUT:-570}"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site" || echo "warning: wheel install failed" >&2
fi
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, "gpus", torch.cuda.device_count(), flush=True)'
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,clocks.sm,clocks.max.sm --format=csv 2>/dev/null
what="$1"; shift || true
rc=0
deadline=$((SECONDS + limit))
case "$what" in
  kernel)
    # stop starting new cells a minute before the hard limit; the table still prints
    budget=$(python3 -c "print(max(1.0, ($limit - 60) / 60))")
    timeout -k 15 "$limit" python3 bench/kernel_bench.py --max-minutes "$budget" "$@" 2>&1 \
      | tee "$OUT/kernel_bench.log" || rc=$?
    ;;
  tp)
    degrees="$1"; shift || true
    left_runs=0; for n in $degrees; do left_runs=$((left_runs + 1)); done
    for n in $degrees; do
      remaining=$((deadline - SECONDS))
      per_run=$((remaining / left_runs))
      left_runs=$((left_runs - 1))
      budget=$(python3 -c "print(max(0.5, ($per_run - 75) / 60))")
      echo "== TP=$n: ${per_run}s of ${remaining}s left (python budget ${budget} min)"
      PYTHON=python3 timeout -k 15 "$per_run" launch/torchrun.sh "$n" bench/tp_sweep.py --max-minutes "$budget" \
        "$@" 2>&1 | tee "$OUT/tp_sweep_tp$n.log" || rc=$?
    done
    ;;
  *)
    echo "usage: bash bench/run_gpu.sh kernel [options] | tp \"1 2 4\" [options]" >&2
    exit 2
    ;;
esac
exit $rc
