"""bench/plot_issue14.py: issue 14's ratios, table and plot from a kernel_bench JSON (no GPU)."""
import importlib.util
import json
import math
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "plot_issue14", Path(__file__).resolve().parent.parent / "bench" / "plot_issue14.py")
p14 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(p14)


def _result(D, B, method, mode, us, error=None):
    return {"D": D, "V": 1000 + D, "B": B, "method": method, "mode": mode, "median_us": us, "error": error}


def _data():
    res = []
    for B, (cub, fs, gb, cub_e, fs_e) in {1: (100.0, 94.0, 130.0, 101.0, 96.0),
                                          256: (200.0, 230.0, 250.0, 210.0, 250.0)}.items():
        res += [_result(64, B, "cublas", "graph", cub), _result(64, B, "fsdist", "graph", fs),
                _result(64, B, "gumbel_compiled", "graph", gb), _result(64, B, "cublas", "events", cub_e),
                _result(64, B, "fsdist", "events", fs_e)]
    res.append(_result(64, 512, "cublas", "graph", 400.0))  # fsdist failed at 512: its ratios are NaN
    res.append(_result(64, 512, "fsdist", "graph", 1.0, error="boom"))
    return {"env": {"gpu": {"name": "NVIDIA H100 80GB HBM3"}}, "results": res}


def test_rows_take_graph_ratios_eager_beside_and_leave_failures_nan():
    rs = p14.rows(_data())
    assert [r["B"] for r in rs] == [1, 256, 512]
    assert rs[0]["fs_cublas"] == pytest.approx(0.94) and rs[0]["fs_cublas_eager"] == pytest.approx(96 / 101)
    assert rs[1]["baseline_fs"] == pytest.approx(250 / 230)
    assert math.isnan(rs[2]["fs_cublas"]) and math.isnan(rs[2]["baseline_fs"])
    md = p14.table(_data())
    assert "| 64 | 256 | 200.0 | 230.0 | 250.0 | 1.150 | 1.190 | 1.09 | 1.042 (1.2x) |" in md


def test_both_targets_become_one_bound_on_fsdist_over_cublas():
    """The 1.2x over the baseline, as a bound on fsdist / cuBLAS, is baseline / cuBLAS / 1.2: tighter than 1.05 only
    where the baseline's pass costs less than 26% of the matmul; the table marks the cells that meet the bound and
    lists them."""
    assert p14.needed(100.0, 130.0) == dict(need=1.05, binding="1.05x")  # 130 / 100 / 1.2 = 1.083: 1.05 binds
    cheap = p14.needed(200.0, 250.0)  # the pass is 25% of the matmul: fsdist must be <= 1.042x cuBLAS
    assert cheap["binding"] == "1.2x" and cheap["need"] == pytest.approx(250 / 200 / 1.2)
    assert p14.needed(100.0, 126.0)["binding"] == "1.05x" and p14.needed(100.0, 125.9)["binding"] == "1.2x"
    assert p14.needed(100.0, float("nan"))["binding"] == "?"
    rs = p14.rows(_data())
    assert [r["binding"] for r in rs] == ["1.05x", "1.2x", "?"]
    md = p14.table(_data())
    assert "| 1.050 (1.05x, met) |" in md  # B = 1: 0.94 <= 1.05
    assert md.splitlines()[-1] == ("both targets met (graph replays) at D = 64: B = 1; missed at D = 64: B = 256; "
                                   "not judged (a method's time missing) at D = 64: B = 512")


def test_a_cell_at_the_bound_meets_it_and_a_failed_fsdist_is_not_judged():
    """fsdist / cuBLAS exactly at the bound meets it; a cell whose fsdist failed while cuBLAS and the baseline ran is
    neither met nor missed (it has a bound but no time to hold against it)."""
    data = _data()
    data["results"] = [r for r in data["results"] if r["B"] != 512]
    data["results"] += [_result(64, 4, "cublas", "graph", 100.0), _result(64, 4, "fsdist", "graph", 105.0),
                        _result(64, 4, "gumbel_compiled", "graph", 200.0),  # bound 1.05 exactly: met
                        _result(64, 8, "cublas", "graph", 100.0), _result(64, 8, "gumbel_compiled", "graph", 200.0),
                        _result(64, 8, "fsdist", "graph", 1.0, error="boom")]
    md = p14.table(data)
    assert "| 1.050 (1.05x, met) |" in md.split("| 64 | 4 |")[1].splitlines()[0]
    assert md.splitlines()[-1] == ("both targets met (graph replays) at D = 64: B = 1, 4; missed at D = 64: B = 256; "
                                   "not judged (a method's time missing) at D = 64: B = 8")


def test_main_writes_one_png_per_json_named_after_it(tmp_path, capsys):
    pytest.importorskip("matplotlib")  # (the test extras install it; without it only the drawing is untested)
    path = tmp_path / "kernel_bench_h100_20261206T161615Z_v108.json"
    path.write_text(json.dumps(_data()))
    assert p14.main([str(path), "--plots-dir", str(tmp_path / "plots")]) == 0
    png = tmp_path / "plots" / "issue14_h100_20261206T161615Z_v108.png"
    assert png.exists() and png.stat().st_size > 10_000
    assert "fsdist / cuBLAS" in capsys.readouterr().out
    empty = tmp_path / "kernel_bench_h100_x.json"
    empty.write_text(json.dumps({"results": []}))
    assert p14.main([str(empty), "--plots-dir", str(tmp_path / "plots")]) == 1


def test_round_by_round_ratios_join_the_table():
    """kernel_bench --graph-rounds: fsdist's graph row carries its ratio to cuBLAS round by round; the table gains a
    column for it (p10-p90 beside), and a JSON without it keeps the old columns."""
    data = _data()
    for r in data["results"]:
        if r["method"] == "fsdist" and r["mode"] == "graph" and r["B"] == 256:
            r["paired"] = {"against": "cublas", "median": 1.12, "p10": 1.10, "p90": 1.16, "faster": 0, "rounds": 20}
    rs = {r["B"]: r for r in p14.rows(data)}
    assert rs[256]["fs_cublas_paired"] == 1.12 and rs[256]["fs_cublas_p90"] == 1.16
    assert math.isnan(rs[1]["fs_cublas_paired"])
    md = p14.table(data)
    assert "round by round (p10-p90)" in md and "| 1.120 (1.100-1.160) |" in md
    assert "round by round" not in p14.table(_data())


def test_plot_draws_the_round_by_round_bars(tmp_path):
    pytest.importorskip("matplotlib")
    data = _data()
    for r in data["results"]:
        if r["method"] == "fsdist" and r["mode"] == "graph":
            r["paired"] = {"against": "cublas", "median": 1.0, "p10": 0.98, "p90": 1.03, "faster": 3, "rounds": 6}
    p14.plot(data, str(tmp_path / "p.png"))
    assert (tmp_path / "p.png").stat().st_size > 10_000


def test_times_over_the_weight_read_once_where_the_run_measured_its_bandwidth():
    """With kernel_bench's ceilings the table adds fsdist's time and the bound's over the time to read the [V, D] bf16
    weight once at the measured read bandwidth; without them there is no such column."""
    data = _data()
    for r in data["results"]:
        r["dtype"] = "bf16"
    V, D = 1000 + 64, 64  # (_result's V)
    data["ceilings"] = {"read": {"bytes_per_s": V * D * 2 / 100e-6}}  # the weight read once in 100 µs
    assert p14.read_floor_us(data, D, V) == pytest.approx(100.0)
    rs = p14.rows(data)
    assert rs[0]["fs_floor"] == pytest.approx(0.94) and rs[0]["need_floor"] == pytest.approx(1.05)
    assert rs[1]["need_floor"] == pytest.approx(250 / 1.2 / 100)
    md = p14.table(data)
    assert "fsdist (bound) / weight read once |" in md
    assert "| 1.050 (1.05x, met) | 0.940 (1.050) |" in md
    for r in data["results"]:
        r["dtype"] = "fp32"  # 4 bytes a weight: twice the floor
    assert p14.read_floor_us(data, D, V) == pytest.approx(200.0)
    assert "weight read once" not in p14.table(_data())
