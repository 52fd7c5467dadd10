#!/usr/bin/env bash
# One GPU session of a filtered-path change, as v54 / v55 ran it (their scripts call this with their NAME):
#   tests: gpu_session_lib.sh's filter_gpu_tests (five parallel groups, $TESTS_TIMEOUT s each, default 300), plus
#          $EXTRA_TEST_GROUP (pytest arguments) as a sixth when set
#   ab:    bench/filter_probe.py --only graph (plain, top-k 50 + top-p 0.9, min-p 0.05; CUDA-graph replays, L2 flushed,
#          [B] parameters) at B = $AB_BATCHES (default 1,16,64), D = 4096, as an A/B/A against the carried ab_base/
#          tree (gpu_session_lib.sh's ab_runs; $AB_TIMEOUT s a run, default 130)
#   PARTS (default "tests ab"). JSONs in $OUT, logs in $OUT/NAME_logs.tgz.
# Usage: export OUT; bash scripts/gpu_session_filter_ab.sh NAME
set -uo pipefail
[[ $# -eq 1 ]] || { echo "usage: bash scripts/gpu_session_filter_ab.sh NAME   (e.g. v55)"; exit 2; }
name=$1
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
OUT="$(cd "$OUT" && pwd)"
PARTS="${PARTS:-tests ab}"
rc=0
if wants tests; then
  filter_gpu_tests ${EXTRA_TEST_GROUP:+"$EXTRA_TEST_GROUP"} || rc=1
fi
pack_on_exit "$name"
if wants ab; then
  ab_runs "$name" python3 bench/filter_probe.py --only graph --batches "${AB_BATCHES:-1,16,64}" --caps 0 \
    --graph-cases plain,k50+p0.9,min_p0.05 || rc=1
fi
exit $rc
