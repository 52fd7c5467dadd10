"""bench/pp_waits.py: the wait probe's rows turned into per-tile figures (no GPU)."""
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

_bench = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(_bench))  # (its `import common`)
_spec = importlib.util.spec_from_file_location("pp_waits", _bench / "pp_waits.py")
pw = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pw)


def _probe(P, consumer):
    rows = torch.full((P + 2, 8), -1, dtype=torch.int64)  # (two rows no program wrote)
    for p in range(P):
        rows[p, 0:4] = torch.tensor(consumer)
        rows[p, 4:8] = torch.tensor(consumer)
    return rows


def test_per_tile_divides_by_each_consumers_tiles():
    # 3 programs, 10 tiles: program p's consumer 0 takes p, p + 6, consumer 1 p + 3, p + 9 (only p = 0 has a 10th)
    got = pw.per_tile(_probe(3, [12000, 2000, 1000, 3000]), 3, 10)
    assert got["programs"] == 3 and got["tiles"] == 10
    # consumer tiles: 2 everywhere except programs 1 and 2's consumer 1 (one tile): medians over the six
    assert got["total"] == pytest.approx(6.0) and got["loop"] == pytest.approx(3.0)
    assert got["operands"] == pytest.approx(1.0) and got["turn"] == pytest.approx(0.5)
    assert got["tail"] == pytest.approx(1.5)


def test_per_tile_refuses_unset_fields_and_rows_past_the_programs():
    assert pw.per_tile(_probe(3, [12000, -1, 1000, 3000]), 3, 10) is None
    assert pw.per_tile(_probe(3, [12000, 2000, 1000, 3000]), 3, 10) is not None
    assert pw.per_tile(_probe(3, [0, 2000, 1000, 3000]), 3, 10) is None  # a total of no cycles
    assert pw.per_tile(_probe(3, [12000, 2000, 1000, 3000]), 4, 10) is None  # a program stored nothing
    assert pw.per_tile(_probe(3, [12000, 2000, 1000, 3000]), 2, 10) is None  # a row past the programs
    assert pw.per_tile(torch.full((4, 8), -1, dtype=torch.int64), 3, 10) is None


def test_a_consumer_without_tiles_is_left_out():
    # 3 programs, 4 tiles: consumer 1 of programs 1 and 2 gets none (the kernel still stores its fields: 0 waits)
    probe = _probe(3, [12000, 2000, 1000, 3000])
    probe[1:3, 4:8] = torch.tensor([50, 0, 0, 0])
    got = pw.per_tile(probe, 3, 4)
    # one tile each for program 0's two consumers and consumer 0 of programs 1 and 2: the medians of those four
    assert got["tiles"] == 4 and got["total"] == pytest.approx(12.0) and got["loop"] == pytest.approx(6.0)


def test_variants():
    assert pw.variant_kwargs("sh4+s6") == dict(shared_epilogue=4, stages=6)
    assert pw.variant_kwargs("sh8") == dict(shared_epilogue=8, stages=5)
    for bad in ("ew8", "sh8+s3", "sh8+"):
        with pytest.raises(ValueError, match="unknown variant"):
            pw.variant_kwargs(bad)


def test_report_checks_prints_and_returns_the_status(capsys, tmp_path):
    import common as C  # (bench/, on the path above)

    class Out:
        path = tmp_path / "x.json"

    assert C.report_checks([], Out()) == 0
    assert "checks: all passed" in capsys.readouterr().out
    assert C.report_checks(["cell A: differs"], Out()) == 1
    text = capsys.readouterr().out
    assert "FAILED\n  cell A: differs" in text and f"results: {Out.path}" in text


def test_hopper_device_skips_anything_but_sm90(capsys, monkeypatch):
    import common as C  # (bench/, on the path above)

    monkeypatch.setattr(C, "bench_device", lambda: torch.device("cpu"))
    assert C.hopper_device("pp_waits") is None
    assert "pp_waits: skipped, needs a Hopper (sm_90) GPU." in capsys.readouterr().out
    monkeypatch.setattr(C, "bench_device", lambda: torch.device("cuda", 0))
    for cap, ok in (((9, 0), True), ((8, 0), False), ((10, 0), False)):
        monkeypatch.setattr(C.torch.cuda, "get_device_capability", lambda dev, cap=cap: cap)
        assert (C.hopper_device("x") is not None) == ok


def test_seeded_weight_is_the_probes_weight_and_hands_on_its_generator():
    import common as C  # (bench/, on the path above)

    W, g = C.seeded_weight(64, 100, torch.device("cpu"))
    ref_g = torch.Generator().manual_seed(64)
    assert W.dtype == torch.bfloat16 and W.shape == (100, 64)
    assert torch.equal(W, (torch.randn(100, 64, generator=ref_g) * 64 ** -0.5).to(torch.bfloat16))
    assert torch.equal(torch.randn(8, generator=g), torch.randn(8, generator=ref_g))  # the hidden states come next
    assert not torch.equal(C.seeded_weight(65, 100, torch.device("cpu"))[0][:, :64], W)  # each shape its own draw
