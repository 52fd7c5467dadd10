# Sourced by demo.sh and test.sh: install fsdist and what it needs on a fresh machine.
# torch is installed only when missing: on a GPU machine the CUDA build already there
# must stay; on a CPU-only machine torch==2.13.0 is the CPU build (an unpinned torch
# would pull several GB of CUDA packages). Triton 3.6.0 matches the GPU image.
set -euo pipefail
PY=${PYTHON:-python3}
PIP=("$PY" -m pip install -q --disable-pip-version-check)
"$PY" -c "import torch" 2>/dev/null || "${PIP[@]}" "torch==2.13.0"
"$PY" -c "import triton" 2>/dev/null || "${PIP[@]}" "triton==3.6.0"
"${PIP[@]}" -e ".${FSDIST_EXTRAS:-}"
