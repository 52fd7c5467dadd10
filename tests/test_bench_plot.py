"""bench/plot.py's A/B/A summary of filter_probe.py runs (pure functions; no GPU, no matplotlib)."""
import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("bench_plot", Path(__file__).resolve().parent.parent / "bench" / "plot.py")
plot = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(plot)


def _run(rows):
    return {"env": {"gpu": {"name": "NVIDIA H200"}},
            "batches": {str(b): {"graph_us": dict(zip(("plain", "k50+p0.9", "min_p0.05"), t))} for b, t in rows.items()}}


def test_filter_ab_ratios_average_the_two_before_runs():
    before = _run({1: (100.0, 110.0, 108.0), 16: (100.0, 112.0, 109.0)})
    after = _run({1: (99.0, 103.95, 104.94), 16: (100.0, 108.0, 106.0)})
    before2 = _run({1: (100.0, 112.0, 110.0), 16: (100.0, 114.0, 111.0)})
    t = plot.filter_ab(before, after, before2)
    assert list(t) == [1, 16]
    assert t[1]["k50+p0.9"] == pytest.approx((1.11, 1.05))
    assert t[1]["min_p0.05"] == pytest.approx((1.09, 1.06))
    assert t[16]["k50+p0.9"] == pytest.approx((1.13, 1.08))
    md = plot.filter_ab_markdown(t, "NVIDIA H200", ["a.json", "b.json", "c.json"])
    assert "| 16 | 1.130 -> **1.080** | 1.100 -> **1.060** |" in md


def test_filter_ab_skips_batches_a_run_lacks_and_wants_triples(tmp_path, capsys):
    before = _run({1: (100.0, 110.0, 108.0), 64: (100.0, 110.0, 108.0)})
    after = _run({1: (100.0, 105.0, 104.0)})
    assert list(plot.filter_ab(before, after, before)) == [1]
    assert plot.main(["--filter-ab", "--no-plots", "x.json", "y.json"]) == 2
    assert "in threes" in capsys.readouterr().err
