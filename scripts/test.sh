#!/usr/bin/env bash
# Install fsdist with its test extras, then run every suite this machine can run:
# single-process tests (kernels on CUDA, or under Triton's interpreter on CPU), and the
# multi-rank tests under MPI at 2 and 4 ranks (gloo on CPU). GPU-only tests skip on CPU.
#
# Timeouts, innermost first: a multi-rank test that runs past FSDIST_TEST_HARD_TIMEOUT (240 s)
# is killed with every thread's traceback (tests/tensor_parallel/conftest.py); gloo gives up on a
# collective after FSDIST_TEST_TIMEOUT (300 s); and each mpirun is killed after
# FSDIST_MPIRUN_TIMEOUT seconds (900 s; SIGKILL 30 s later), so even a wedged launcher cannot
# stall CI. A suite that leaves no report (killed, or crashed before writing one) counts as failed.
set -euo pipefail
cd "$(dirname "$0")/.."
FSDIST_EXTRAS="[test]" source scripts/_install.sh
# The light optional extras, so that their integration tests run here too (vLLM, 2 GB, stays a
# local reference: tests/integrations/test_vllm_reference.py says how). xgrammar and
# megatron-core install with --no-deps on a CPU-only machine (their declared dependencies
# would pull CUDA builds; megatron-core >= 0.17 also declares Python >= 3.12, and its 0.19
# wheel runs on 3.11). FSDIST_SKIP_EXTRAS=1 leaves them out (their tests then skip).
if [ "${FSDIST_SKIP_EXTRAS:-0}" != 1 ]; then
    echo "== optional extras: transformers, xgrammar, megatron-core =="
    "${PIP[@]}" transformers pydantic
    "${PIP[@]}" --no-deps xgrammar==0.2.8 apache-tvm-ffi==0.1.15.post2
    "${PIP[@]}" --no-deps --ignore-requires-python megatron-core==0.19.2
fi
export NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_NVLS_ENABLE=0
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
MPIRUN=$(command -v mpirun || command -v mpiexec || true)
[ -n "$MPIRUN" ] || { echo "mpirun not found (pip package mpich provides it)"; exit 1; }
MPIRUN_TIMEOUT=${FSDIST_MPIRUN_TIMEOUT:-900}
reports=$(mktemp -d)
status=0

# On a CPU-only machine the single-process suite is one interpreter-bound process per core (pytest-xdist; whole
# files per worker, so a file's shared fixtures and caches stay in one process): on CI's two cores it takes about
# half the time. With a GPU it stays one process (the GPU tests share one device). At most 8 workers (each imports
# torch, ~0.5 GB; the suite is ~40 files), on the cores this process may use. FSDIST_TEST_WORKERS overrides the
# count (1: no workers).
workers=${FSDIST_TEST_WORKERS:-$("$PY" -c 'import os, torch; print(1 if torch.cuda.is_available() else min(8, len(os.sched_getaffinity(0))))')}
xdist=()
# (--no-loadscope-reorder: files in collection order, which tests/conftest.py starts with the longest ones)
[ "$workers" -gt 1 ] && xdist=(-n "$workers" --dist loadfile --no-loadscope-reorder)
echo "== single-process suite (${workers} worker(s)) =="
"$PY" -m pytest -q -p no:warnings "${xdist[@]}" tests --junitxml="$reports/single.xml" || status=1

for n in 2 4; do
    echo "== tensor-parallel suite, mpirun -n $n =="
    # Each rank writes its own report; PMI_RANK is set by MPICH's launcher. -x: a rank that
    # fails leaves the others inside a collective it skipped, so every later test would only
    # time out; stopping at the first failure closes its sockets, the peers fail at once,
    # and the real traceback is the one in the log instead of a wall of timeouts.
    rc=0
    timeout --kill-after=30 "$MPIRUN_TIMEOUT" "$MPIRUN" -n "$n" bash -c "exec \"$PY\" -m pytest -q -x -p no:warnings \
        --with-mpi tests/tensor_parallel tests/integrations/test_megatron.py --junitxml=\"$reports/mpi$n-\${PMI_RANK:-0}.xml\"" </dev/null || rc=$?
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        echo "mpirun -n $n did not finish within ${MPIRUN_TIMEOUT}s: killed"
    fi
    [ "$rc" -eq 0 ] || status=1
done

# One closing line for the whole run (rank 0's view of each MPI suite). A suite without a
# readable report (its mpirun was killed, or rank 0 died first) counts as one failure.
"$PY" - "$reports" single.xml mpi2-0.xml mpi4-0.xml <<'PY'
import os, sys, xml.etree.ElementTree as ET
tot = dict(tests=0, failures=0, errors=0, skipped=0)
missing = 0
for name in sys.argv[2:]:
    try:
        root = ET.parse(os.path.join(sys.argv[1], name)).getroot()
    except (OSError, ET.ParseError):
        missing += 1
        continue
    for suite in root.iter("testsuite"):
        for k in tot:
            tot[k] += int(suite.get(k, 0))
failed = tot["failures"] + tot["errors"]
print(f"{tot['tests'] - failed - tot['skipped']} passed, {failed + missing} failed, {tot['skipped']} skipped"
      + (f" ({missing} suite(s) left no report)" if missing else ""))
PY
exit $status
