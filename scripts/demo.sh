#!/usr/bin/env bash
# Main job: install fsdist, then run the sampling demo (small sizes on a CPU-only
# machine, real LM-head sizes on a GPU). Extra arguments go to `python -m fsdist.demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_install.sh
exec "$PY" -m fsdist.demo "$@"
