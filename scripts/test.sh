#!/usr/bin/env bash
# Install fsdist with its test extras, then run every suite this machine can run:
# single-process tests (kernels on CUDA, or under Triton's interpreter on CPU), and the
# multi-rank tests under MPI at 2 and 4 ranks (gloo on CPU). GPU-only tests skip on CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
FSDIST_EXTRAS="[test]" source scripts/_install.sh
export NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_NVLS_ENABLE=0
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
MPIRUN=$(command -v mpirun || command -v mpiexec || true)
[ -n "$MPIRUN" ] || { echo "mpirun not found (pip package mpich provides it)"; exit 1; }
reports=$(mktemp -d)
status=0

echo "== single-process suite =="
"$PY" -m pytest -q -p no:warnings tests --junitxml="$reports/single.xml" || status=1

for n in 2 4; do
    echo "== tensor-parallel suite, mpirun -n $n =="
    # Each rank writes its own report; PMI_RANK is set by MPICH's launcher. -x: a rank that
    # fails leaves the others inside a collective it skipped, so every later test would only
    # time out; stopping at the first failure closes its sockets, the peers fail at once,
    # and the real traceback is the one in the log instead of a wall of timeouts.
    "$MPIRUN" -n "$n" bash -c "exec \"$PY\" -m pytest -q -x -p no:warnings --with-mpi tests/tensor_parallel \
        --junitxml=\"$reports/mpi$n-\${PMI_RANK:-0}.xml\"" || status=1
done

# One closing line for the whole run (rank 0's view of each MPI suite).
"$PY" - "$reports" <<'PY'
import glob, sys, xml.etree.ElementTree as ET
tot = dict(tests=0, failures=0, errors=0, skipped=0)
for f in sorted(glob.glob(sys.argv[1] + "/single.xml") + glob.glob(sys.argv[1] + "/mpi*-0.xml")):
    for suite in ET.parse(f).getroot().iter("testsuite"):
        for k in tot:
            tot[k] += int(suite.get(k, 0))
failed = tot["failures"] + tot["errors"]
print(f"{tot['tests'] - failed - tot['skipped']} passed, {failed} failed, {tot['skipped']} skipped")
PY
exit $status
