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


def _settings_run(cells):
    """A filter_probe-like JSON whose graph replays ran under --pdl settings: cells = {B: {key: µs}}."""
    return {"env": {"gpu": {"name": "NVIDIA H100 80GB HBM3"}}, "shape": [4096, 151936],
            "batches": {str(b): {"graph_us": g} for b, g in cells.items()}}


def test_filter_settings_ratios_pair_each_repeat_with_its_own_plain_call():
    run = _settings_run({256: {
        "plain pdl=off": 100.0, "plain pdl=on": 110.0, "plain pdl=off#2": 200.0, "plain pdl=on#2": 100.0,
        "k50+p0.9 pdl=off": 130.0, "k50+p0.9 pdl=on": 121.0, "k50+p0.9 pdl=off#2": 280.0, "k50+p0.9 pdl=on#2": 130.0,
        "min_p0.05 pdl=off": 120.0, "min_p0.05 pdl=on": 132.0},  # min-p: one repeat each
        512: {"plain pdl=off": 100.0, "k50+p0.9 pdl=off": 120.0}})  # no plain call under "on": left out
    t = plot.filter_settings(run, "off", "on")
    assert list(t) == [256]
    # each ratio over the plain call of the same setting and repeat, then the mean over the repeats
    assert t[256]["k50+p0.9"] == pytest.approx(((1.3 + 1.4) / 2, (1.1 + 1.3) / 2))
    assert t[256]["min_p0.05"] == pytest.approx((1.2, 1.2))
    md = plot.filter_ab_markdown(t, "H100", ["r.json"], before="off", after="on")
    assert "| 256 | 1.350 -> **1.200** | 1.200 -> **1.200** |" in md and "off -> on" in md


def test_filter_settings_refuses_bad_arguments(tmp_path, capsys):
    f = tmp_path / "run.json"
    f.write_text(__import__("json").dumps(_settings_run({1: {"plain pdl=a": 1.0, "k50+p0.9 pdl=a": 1.1}})))
    assert plot.main(["--filter-settings", "a", "--no-plots", str(f)]) == 2
    assert "two setting names" in capsys.readouterr().err
    assert plot.main(["--filter-settings", "a,b", "--no-plots", str(f)]) == 2  # no plain call under "b"
    assert "no batch has the plain call" in capsys.readouterr().err
    assert plot.main(["--filter-settings", "a,a", "--setting-labels", "x", "--no-plots", str(f)]) == 2
    assert "two labels" in capsys.readouterr().err
    assert plot.main(["--filter-settings", "a,a", "--setting-labels", "x,y", "--no-plots", str(f)]) == 0
    assert "x -> y" in capsys.readouterr().out


_tspec = importlib.util.spec_from_file_location(
    "bench_plot_targets", Path(__file__).resolve().parent.parent / "bench" / "plot_targets.py")
targets = importlib.util.module_from_spec(_tspec)
_tspec.loader.exec_module(targets)


def _bench(cells, gpu="NVIDIA H100 80GB HBM3"):
    """A kernel_bench-like JSON: cells = {(B, method): graph µs} at D = 4096, and an eager row to be ignored."""
    rows = [dict(D=4096, V=151936, B=b, method=m, mode="graph", median_us=us) for (b, m), us in cells.items()]
    rows.append(dict(D=4096, V=151936, B=1, method="fsdist_minp", mode="events", median_us=1.0))
    return {"env": {"gpu": {"name": gpu}}, "results": rows}


def test_plot_targets_reached_ceiling_and_x_plain():
    """reached = baseline / fsdist's call, ceiling = baseline / min(cuBLAS, plain), x plain = call / plain; B > 64 and
    calls without their baseline are left out; the GPU's short name labels the table."""
    cells = {(1, "cublas"): 440.0, (1, "fsdist"): 400.0, (1, "fsdist_minp"): 420.0, (1, "torch_minp_compiled"): 588.0,
             (128, "cublas"): 460.0, (128, "fsdist"): 430.0, (128, "fsdist_minp"): 540.0,
             (128, "torch_minp_compiled"): 800.0, (1, "fsdist_bitmask"): 401.0}
    doc = _bench(cells)
    rows = targets.rows_of(doc)
    assert [r["call"] for r in rows] == ["min-p 0.05"]
    (c,) = rows[0]["cells"]
    assert c["B"] == 1
    assert c["reached"] == pytest.approx(1.4) and c["ceiling"] == pytest.approx(1.47)
    assert c["x_plain"] == pytest.approx(1.05)
    assert targets.gpu_label(doc) == "H100"
    md = targets.markdown([("H100", rows)])
    assert "| H100 | 4096 | min-p 0.05 | 1.40 / 1.47 | 1.050-1.050 (<= 1.10) |" in md
    # the ceiling takes cuBLAS where it is the faster
    cells[(1, "cublas")] = 392.0
    assert targets.rows_of(_bench(cells))[0]["cells"][0]["ceiling"] == pytest.approx(1.5)
    # a B without cuBLAS (or without plain fsdist) has no ceiling: left out
    del cells[(1, "cublas")]
    assert targets.rows_of(_bench(cells)) == []
    assert targets.gpu_label({"name": "kernel_bench", "results": []}) == "GPU"


def test_plot_targets_labels_a_gpu_and_shape_two_files_share(tmp_path, capsys):
    """Two JSONs of one GPU and shape keep both tables, each labelled with its file; a second shape in one JSON gets
    rows of its own; a JSON with no processed call is refused with its name."""
    cells = {(1, "cublas"): 440.0, (1, "fsdist"): 400.0, (1, "fsdist_bitmask"): 402.0,
             (1, "torch_bitmask_compiled"): 560.0}
    doc = _bench(cells)
    doc["results"] += [dict(r, D=8192, V=128256, median_us=r["median_us"] * 1.7) for r in list(doc["results"])]
    paths = []
    for name in ("a_v1.json", "b_v2.json"):
        paths.append(tmp_path / name)
        paths[-1].write_text(targets.json.dumps(doc))
    tables = dict(targets.load([str(p) for p in paths]))
    assert sorted(tables) == ["H100 (a_v1)", "H100 (b_v2)"]
    assert [(r["D"], r["call"]) for r in tables["H100 (a_v1)"]] == [(4096, "bitmask"), (8192, "bitmask")]
    empty = tmp_path / "empty.json"
    empty.write_text(targets.json.dumps(_bench({(1, "cublas"): 1.0, (1, "fsdist"): 1.0})))
    with pytest.raises(SystemExit, match="empty.json"):
        targets.load([str(empty)])
