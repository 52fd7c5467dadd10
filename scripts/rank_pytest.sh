#!/usr/bin/env bash
# One rank's pytest with its own log: $OUT/<prefix>_rank$RANK.log (RANK from torchrun).
#   TORCHRUN_ARGS=--no-python launch/torchrun.sh 2 bash scripts/rank_pytest.sh <prefix> [pytest args]
# Each rank's failures and summary stay readable even when a peer hangs and is killed.
prefix="$1"; shift
exec python3 -m pytest "$@" > "${OUT:-bench/results}/${prefix}_rank${RANK:-0}.log" 2>&1
