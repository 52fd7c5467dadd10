#!/usr/bin/env bash
# One device call on whichever single GPU comes (a call with no kind may get an H200 or an H100; docs/performance.md
# v128): what is still owed on each.
#   on an H200  v128: v127's three parts (scripts/gpu_session_v127.sh: the noise-skip A/B in turns, issue 14's large
#               batches round by round) within $V127_BUDGET s (default 430), then the skip rules' GPU tests
#               (PARTS=tests scripts/gpu_session_v126.sh) in what is left of $CALL_BUDGET s (default 560)
#   otherwise   the whole single-GPU suite split over $JOBS (default 12) test blocks (JOBS=N SPLIT=tests
#               scripts/gpu_check.sh), each cut at what is left of $CALL_BUDGET s (at most 420); it ran once (fifty-
#               second session, one H100): five blocks did not finish in one call, so scripts/gpu_session_v129.sh
#               runs what it left
# FORCE=v128 or FORCE=regression picks the part whatever the GPU.
# Usage: export OUT; bash scripts/gpu_session_v128.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
part=$(part_for_gpu v128 regression)
rc=0
case "$part" in
  v128)
    CALL_BUDGET="${V127_BUDGET:-430}" bash scripts/gpu_session_v127.sh || rc=1
    # v126's test part as v128's prediction names it (its groups defined there once; logs in $OUT/v126_logs.tgz)
    PARTS=tests TESTS_LIMIT="$(part_limit 560)" bash scripts/gpu_session_v126.sh || rc=1
    ;;
  regression)
    JOBS="${JOBS:-12}" SPLIT=tests TESTS_TIMEOUT="$(part_limit 420)" bash scripts/gpu_check.sh || rc=1
    ;;
  *)
    echo "unknown part: $part (FORCE=v128 or FORCE=regression)" >&2
    rc=2
    ;;
esac
exit $rc
