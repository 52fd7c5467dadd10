#!/usr/bin/env bash
# Device calls on one GPU (nvidia-h200 preferred; carry ["ab_base"]) for v55 (docs/performance.md; the change is on
# the local branch v55-fewer-reductions, reverted on main, so run this from that branch): one row reduction
# less in stage 1's epilogue (best score and column together), in slot_winner (merge and folded merge), and in
# select_filtered's counts (with the mass over every kept logit only where the search needs it).
#   tests: gpu_session_lib.sh's filter_gpu_tests
#   ab:    bench/filter_probe.py --only graph (plain, top-k 50 + top-p 0.9, min-p 0.05; CUDA-graph replays, L2
#          flushed, [B] parameters), B = $AB_BATCHES (default 1,16,64), D = 4096: the code before (ab_base/), this
#          tree's, the code before again. Build ab_base/ with v52's fsdist and this tree's bench, launch and scripts:
#            rm -rf ab_base && mkdir ab_base && git archive e993dbe fsdist | tar -x -C ab_base \
#              && git archive HEAD bench launch scripts | tar -x -C ab_base --exclude='bench/results/*'
#   PARTS (default "tests ab"; each fits one call on a warm machine: "tests" ~300 s, "ab" ~170 s).
#   Usage: export OUT; bash scripts/gpu_session_v55.sh  (logs in $OUT/v55_logs.tgz)
exec bash "$(dirname "$0")/gpu_session_filter_ab.sh" v55
