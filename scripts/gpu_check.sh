#!/usr/bin/env bash
# GPU test entry point (run on a lent GPU): the single-GPU suite on CUDA, GPU-only tests
# included (tests/test_processors_gpu.py, tests/test_gpu_serving.py, tests/ops/test_sample_gpu.py,
# ...). With $OUT set (the device tool), the log is also written to $OUT/gpu_check.log.
# The suite is bound by Triton's compile time on the host (one kernel at a time per process): JOBS=N
# splits its test files into N groups run side by side on the one GPU (scripts/gpu_tests_parallel.sh,
# logs $OUT/gpu_tests_group<i>.log; e.g. JOBS=6 on a 16-core host); the default, 1, runs it in one process.
# SPLIT=tests (with JOBS > 1) splits the collected tests instead of the files, in contiguous blocks (pytest --shard):
# no group waits on one large file. TESTS_TIMEOUT (s, default 450) cuts each group (gpu_tests_parallel.sh).
# Usage: [JOBS=N [SPLIT=tests]] bash scripts/gpu_check.sh [extra pytest args]
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
log="${OUT:+$OUT/gpu_check.log}"
# (without a GPU the suite would run its CPU tests without the interpreter and fail: stop here, say where to go)
python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(), torch.__version__)" \
  || { echo "gpu_check.sh: no CUDA device here; on a CPU-only machine run scripts/test.sh" >&2; exit 2; }
jobs="${JOBS:-1}"
if [[ "$jobs" -gt 1 ]]; then
  groups=()
  if [[ "${SPLIT:-files}" == tests ]]; then
    # contiguous blocks of the collected tests (pytest --shard, tests/sharding.py): a large file's tests spread over
    # several groups (test_fused_ws_gpu.py alone takes ~12 min in one process)
    for ((g = 0; g < jobs; g++)); do groups+=("tests --ignore=tests/tensor_parallel --shard $g/$jobs"); done
  else
    # test files round-robin into $jobs groups, largest first so the groups come out even
    mapfile -t files < <(find tests -name 'test_*.py' -not -path 'tests/tensor_parallel/*' -printf '%s %p\n' \
      | sort -rn | cut -d' ' -f2)
    for ((g = 0; g < jobs; g++)); do groups+=(""); done
    for i in "${!files[@]}"; do groups[$((i % jobs))]+=" ${files[$i]}"; done
  fi
  extra=""
  for a in "$@"; do extra+=" $(printf '%q' "$a")"; done
  for g in "${!groups[@]}"; do groups[$g]+="$extra"; done
  bash scripts/gpu_tests_parallel.sh "${groups[@]}" 2>&1 | tee "${log:-/dev/null}"
  exit "${PIPESTATUS[0]}"
fi
python3 -m pytest -q -p no:warnings -p no:cacheprovider -rfE tests --ignore=tests/tensor_parallel "$@" \
  2>&1 | tee "${log:-/dev/null}"
exit "${PIPESTATUS[0]}"
