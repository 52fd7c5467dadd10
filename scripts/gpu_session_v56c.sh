#!/usr/bin/env bash
# One device call on one GPU for v56c (docs/performance.md): the first-wave stagger as the B <= 32 default.
#   tests: the filter kernels' GPU tests (gpu_session_lib.sh's filter_gpu_tests groups) plus the golden tokens and the
#          processors' GPU tests, six pytest processes side by side, each cut at $TESTS_TIMEOUT s (default 260)
#   ab:    bench/filter_probe.py --only graph (plain, top-k 50 + top-p 0.9, min-p 0.05; CUDA-graph replays, L2 flushed,
#          [B] parameters) at B = $AB_BATCHES (default 1,16,32), D = 4096, as an A/B/A against the carried ab_base/
#          tree (the code before: 0b7f873), $AB_TIMEOUT s a run (default 100)
#   PARTS (default "tests ab"). JSONs in $OUT, logs in $OUT/v56c_logs.tgz. (gpu_session_filter_ab.sh runs both.)
# Usage: export OUT; bash scripts/gpu_session_v56c.sh
TESTS_TIMEOUT="${TESTS_TIMEOUT:-260}" AB_TIMEOUT="${AB_TIMEOUT:-100}" AB_BATCHES="${AB_BATCHES:-1,16,32}" \
  EXTRA_TEST_GROUP="tests/test_golden.py tests/test_processors_gpu.py" \
  exec bash "$(dirname "$0")/gpu_session_filter_ab.sh" v56c
