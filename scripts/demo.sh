#!/usr/bin/env bash
# Main job: install fsdist, then run the sampling demo (small sizes on a CPU-only
# machine, real LM-head sizes on a GPU) and a real decode loop (examples/generate.py: a
# transformers causal LM with fsdist as its LM head, grammar-constrained through xgrammar).
# Extra arguments go to `python -m fsdist.demo`.
#
# transformers and xgrammar are installed the way scripts/test.sh installs them (xgrammar
# with --no-deps: only its light dependencies are added, never another torch);
# FSDIST_SKIP_EXTRAS=1 leaves them out and the demo skips the decode loop, saying why.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_install.sh
if [ "${FSDIST_SKIP_EXTRAS:-0}" != 1 ]; then
    "${PIP[@]}" transformers pydantic
    "${PIP[@]}" --no-deps xgrammar==0.2.8 apache-tvm-ffi==0.1.15.post2
fi
exec "$PY" -m fsdist.demo "$@"
