#!/usr/bin/env bash
# One device call on one GPU (nvidia-h100-x1) for v118 (docs/performance.md): logprob / kept-logit calls (filters,
# top-N) on the warp-specialised 128-row tile (configs.WS_FIELDS_FULL_TILE). Parts (PARTS, default
# "tests probe4096 probe8192"), each cut at what is left of $CALL_BUDGET s (default 560):
#   tests      the GPU tests of the path in parallel groups: every field against the Triton twin on 128-row tiles
#              (and the 64-row tile's, unchanged), whole filtered / top-N calls, the exclusions, the TP heads' cases
#   probe4096  bench/filter_probe.py graph replays at D = 4096, A/B/A/B of the switch off ("fields64", v117's dispatch)
#              and the shipped setting ("beside", the switch on since v118): the default dispatch (the ws 64-row tile
#              under "fields64"; under "beside" the 128-row ws tile from configs.FIELDS_FULL_TILE_MIN_BATCH rows) and
#              the 128-row ws config (its Triton twin under "fields64", the ws tile under "beside"); batches $B4096
#   probe8192  the same at D = 8192, where the default config past 64 rows is the 128-row tile; batches $B8192
# TESTS_LIMIT, P4096_LIMIT and P8192_LIMIT (s) cap the parts (260, 280, 280); V118_PDL: the settings, in order
# (v118's own run, before the switch was on, used "beside,full,beside,full": "full" is the switch on, "beside" was off).
# JSONs in $OUT, logs in $OUT/v118_logs.tgz.
# Usage: export OUT; bash scripts/gpu_session_v118.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
pack_on_exit v118
PARTS="${PARTS:-tests probe4096 probe8192}"
C=128x128x64w8s5t-ws
rc=0
if wants tests; then
  K4="cannot_take or tensor_parallel_calls or past_64_rows_take or filtered_calls_on_the_64 or nan_logits"
  K4="$K4 or sample_uses_it"
  TESTS_TIMEOUT=$(part_limit "${TESTS_LIMIT:-260}") bash scripts/gpu_tests_parallel.sh \
    "tests/ops/test_fused_ws_gpu.py -k 'ws_tiles_write and 128 and rows'" \
    "tests/ops/test_fused_ws_gpu.py -k 'ws_tiles_write and 128 and (scalar or greedy)'" \
    "tests/ops/test_fused_ws_gpu.py -k 'filtered_calls_on_the_128'" \
    "tests/ops/test_fused_ws_gpu.py -k '$K4'" \
    "tests/ops/test_fused_ws_gpu.py -k 'ws_tiles_write and 64'" || rc=1
fi
if wants probe4096; then
  TAIL=45 run_part probe4096 "$(part_limit "${P4096_LIMIT:-280}")" v118_probe_4096.log python3 bench/filter_probe.py \
    --shape 4096x151936 --batches "${B4096:-96,136,256,512,1024}" --only graph --caps 0 --configs "$C" \
    --pdl "${V118_PDL:-fields64,beside,fields64,beside}" --graph-cases "plain,k50+p0.9,min_p0.05,k50+p0.9 $C,min_p0.05 $C" \
    || rc=1
fi
if wants probe8192; then
  TAIL=35 run_part probe8192 "$(part_limit "${P8192_LIMIT:-280}")" v118_probe_8192.log python3 bench/filter_probe.py \
    --shape 8192x128256 --batches "${B8192:-96,192,256,512,1024}" --only graph --caps 0 \
    --pdl "${V118_PDL:-fields64,beside,fields64,beside}" --graph-cases "plain,k50+p0.9,min_p0.05" || rc=1
fi
exit $rc
