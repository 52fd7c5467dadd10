"""bench/kernel_bench.py's --graph-rounds rows (no GPU: round medians given by hand)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))  # (kernel_bench imports bench/common.py)
import kernel_bench as kb  # noqa: E402


def test_graph_rows_from_rounds():
    """One graph row per method from its round medians; every method but cuBLAS carries its ratio to cuBLAS round by
    round, which a drift shared by both methods leaves alone (the ratio of the medians here would be 1.10, round by
    round it is 1.05 in every round)."""
    cublas = [100.0, 110.0, 120.0, 130.0, 140.0]
    fsdist = [105.0, 115.5, 126.0, 136.5, 147.0]  # 1.05x in every round
    late = [115.0, 126.5, 138.0, 149.5, 161.0]  # 1.15x
    cell = {"D": 64, "V": 1064, "B": 8, "dtype": "bf16", "graph_calls": 4}
    samples = {"cublas": cublas, "fsdist": fsdist, "gumbel_compiled": late}
    rows = {r["method"]: r for r in kb.graph_rows_from_rounds(cell, samples, 5)}
    assert set(rows) == {"cublas", "fsdist", "gumbel_compiled"}
    fs = rows["fsdist"]
    assert fs["mode"] == "graph" and fs["median_us"] == 126.0 and fs["n"] == 5 and fs["graph_rounds"] == 5
    assert fs["round_medians_us"] == fsdist and fs["D"] == 64 and fs["error"] is None
    assert fs["paired"]["against"] == "cublas" and fs["paired"]["median"] == pytest.approx(1.05)
    assert fs["paired"]["faster"] == 0 and fs["paired"]["rounds"] == 5
    assert rows["gumbel_compiled"]["paired"]["median"] == pytest.approx(1.15)
    assert "paired" not in rows["cublas"]
    # no cuBLAS in the cell: rows without a ratio
    alone = kb.graph_rows_from_rounds(cell, {"fsdist": fsdist}, 5)
    assert len(alone) == 1 and "paired" not in alone[0]
