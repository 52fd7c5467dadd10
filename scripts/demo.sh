#!/usr/bin/env bash
# Main job: install fsdist, then run the sampling demo (small sizes on a CPU-only
# machine, real LM-head sizes on a GPU). Extra arguments go to `python -m fsdist.demo`.
# The examples and grammar extras (transformers, xgrammar) let the demo end with a real
# decode loop (examples/generate.py); FSDIST_EXTRAS="" installs fsdist alone.
set -euo pipefail
cd "$(dirname "$0")/.."
FSDIST_EXTRAS="${FSDIST_EXTRAS-[examples,grammar]}"
source scripts/_install.sh
exec "$PY" -m fsdist.demo "$@"
