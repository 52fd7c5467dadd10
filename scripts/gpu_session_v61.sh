#!/usr/bin/env bash
# One device call on one GPU (an H200 wanted) for v61 (docs/performance.md): the first-wave stagger's size for plain
# and filtered calls apart, now that B = 17-32 runs 5 stages on fast memory (v60). bench/filter_probe.py --only graph
# (plain / top-k 50 + top-p 0.9 / min-p 0.05, CUDA-graph replays, L2 flushed, [B] parameters), D = 4096: B = 16 with
# the shipped 16-row tile at 12 µs against 6, 9 and 16 µs; B = 32 the same with the 32-row tile (its stages: the
# device's default). The delay is a runtime argument: one compiled kernel for every size. JSONs and logs in $OUT.
# Usage: export OUT; bash scripts/gpu_session_v61.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_session_lib.sh
rc=0
stages32=$(python3 -c "import torch; from fsdist.ops.configs import pick_config, fast_memory; \
print(pick_config(32, 4096, 'cuda', fast_memory=fast_memory(torch.device('cuda'))).num_stages)")
for spec in "16:16x128x128w4s5" "32:32x128x128w4s$stages32"; do
  B=${spec%%:*} base=${spec#*:} cfgs="" cases="plain,k50+p0.9,min_p0.05"
  for d in 6 9 16; do cfgs+="${cfgs:+,}${base}d$d"; cases+=",plain ${base}d$d,k50+p0.9 ${base}d$d,min_p0.05 ${base}d$d"; done
  TAIL=2 run_part "stagger B=$B" "${PROBE_TIMEOUT:-200}" "v61_probe_b$B.log" python3 bench/filter_probe.py --only graph \
    --shape 4096x151936 --batches "$B" --caps 0 --configs "$cfgs" --graph-cases "$cases" || rc=1
done
exit $rc
