#!/usr/bin/env bash
# One device call on one GPU (nvidia-h200 preferred; carry ["ab_base"]) for v54 (docs/performance.md; the change is on
# the local branch v54-kept-layout, not on main, so run this from that branch): the kept
# logits laid out [tile, row, KEEP] (layout.kept_offset), checked on the GPU and timed against the layout before.
#   tests: gpu_session_lib.sh's filter_gpu_tests (the call of 2026-11-28 ran its first group with
#          test_fused_ws_gpu's "padded_partial_tile_writes" case in place of tests/ops/test_sample_gpu.py)
#   ab:    bench/filter_probe.py --only graph (plain, top-k 50 + top-p 0.9, min-p 0.05; CUDA-graph replays, L2
#          flushed, [B] parameters), B = $AB_BATCHES (default 1,16,64), D = 4096: the code before (ab_base/), this
#          tree's, the code before again. Build ab_base/ with the previous layout's fsdist and this tree's bench,
#          launch and scripts:
#            rm -rf ab_base && mkdir ab_base && git archive e993dbe fsdist | tar -x -C ab_base \
#              && git archive HEAD bench launch scripts | tar -x -C ab_base --exclude='bench/results/*'
#   PARTS (default "tests ab"). Usage: export OUT; bash scripts/gpu_session_v54.sh  (logs in $OUT/v54_logs.tgz)
exec bash "$(dirname "$0")/gpu_session_filter_ab.sh" v54
