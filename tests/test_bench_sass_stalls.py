"""bench/sass_stalls.py: reading ncu's per-SASS-instruction CSV and splitting the wgmma loop from the rest (no GPU)."""
import gzip
import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "sass_stalls", Path(__file__).resolve().parent.parent / "bench" / "sass_stalls.py")
ss = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ss)

HEADER = ('"Address","Source","Instructions Executed","stall_no_inst","stall_wait","stall_math",'
          '"stall_no_inst (Not Issued)"')


def _block(name, rows):
    lines = [f'"Kernel Name","{name}",', HEADER]
    lines += [",".join(f'"{x}"' for x in r) for r in rows]
    return "\n".join(lines)


def test_blocks_and_the_mma_loop_split(tmp_path):
    greedy = [("0x0", "LDC R1", 10, 1, 0, 0, 99), ("0x10", "HGMMA.64x128x16", 40, 2, 6, 0, 99),
              ("0x20", "SYNCS.PHASECHK", 40, 5, 1, 0, 99), ("0x30", "HGMMA.64x128x16", 40, 1, 3, 0, 99),
              ("0x40", "MUFU.LG2", 80, 0, 0, 4, 99)]
    noise = [(a, s, n, ni * 3, w, m, 0) for a, s, n, ni, w, m, _ in greedy]
    p = tmp_path / "x.csv.gz"
    with gzip.open(p, "wt") as f:
        f.write(_block("fused_sample_ws_kernel", greedy) + "\n" + _block("fused_sample_ws_kernel", noise) + "\n")
    blocks = ss.read_blocks(str(p))
    assert [len(b["rows"]) for b in blocks] == [5, 5]
    reasons = ss.stall_columns(blocks[0]["rows"])
    assert reasons == ["stall_no_inst", "stall_wait", "stall_math"]  # the "(Not Issued)" copy left out
    loop, rest = ss.split_mma_loop(blocks[0]["rows"])
    assert [r["Address"] for r in loop] == ["0x10", "0x20", "0x30"]  # first to last HGMMA, inclusive
    s = ss.summarize(loop, reasons)
    assert s["reasons"] == {"no_inst": 8.0, "wait": 10.0, "math": 0.0} and s["samples"] == 18.0
    assert ss.summarize(ss.split_mma_loop(blocks[1]["rows"])[0], reasons)["reasons"]["no_inst"] == 24.0
    assert ss.summarize(rest, reasons)["instructions"] == 90.0


def test_the_loop_starts_at_its_back_edge_target():
    """The MMA loop begins where the backward branch after the last HGMMA lands (the loop head's stage wait), which
    lies before the first HGMMA; a branch to a later address, or none, leaves the start at the first HGMMA."""
    rows = [{"Address": a, "Source": src} for a, src in [
        ("0x00", "MOV R1, R2"), ("0x10", "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R3"), ("0x20", "@!P0 BRA 0x10"),
        ("0x30", "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], R24"), ("0x40", "HGMMA.64x128x16.F32.BF16 R24"),
        ("0x50", "WARPGROUP.DEPBAR.LE gsb0, 0x1"), ("0x60", "@P3 BRA 0x10"), ("0x70", "EXIT")]]
    loop, rest = ss.split_mma_loop(rows)
    assert [r["Address"] for r in loop] == ["0x10", "0x20", "0x30", "0x40"]
    assert [r["Address"] for r in rest] == ["0x00", "0x50", "0x60", "0x70"]
    rows[6]["Source"] = "@P3 BRA 0x70"  # a forward branch: not the back edge
    assert [r["Address"] for r in ss.split_mma_loop(rows)[0]] == ["0x30", "0x40"]


def test_no_wgmma_leaves_everything_in_the_rest():
    rows = [{"Address": "0x0", "Source": "FFMA R0, R1, R2, R3"}]
    assert ss.split_mma_loop(rows) == ([], rows)


def test_counted_lines_take_the_lines_run_that_often_less_branches_and_waits():
    """--count: the lines executed N times (+-0.5%), without branches, try-waits, barriers and NOPs (idling); a line
    run 1% more or less often, or a wait run exactly N times, is left out."""
    rows = [{"Address": a, "Source": src, "Instructions Executed": str(n)} for a, src, n in [
        ("0x00", "FFMA R0, R1, R2, R3", 1000), ("0x10", "MUFU.LG2 R4, R5", 1004), ("0x20", "IMAD.WIDE.U32 R6, R7", 990),
        ("0x30", "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R3", 1000), ("0x40", "@!P0 BRA 0x30", 1000),
        ("0x50", "BAR.SYNC.DEFER_BLOCKING 0x3, 0x100", 1000), ("0x60", "NOP", 1000), ("0x70", "LOP3.LUT R1", 2000)]]
    assert [r["Address"] for r in ss.counted_lines(rows, 1000)] == ["0x00", "0x10"]
    assert [r["Address"] for r in ss.counted_lines(rows, 2000)] == ["0x70"]
    assert ss.counted_lines(rows, 500) == []


def test_loop_segments_cut_the_body_where_the_warps_wait():
    """--segments: the head's barrier, try-wait and its test branch are "operands"; the out-of-line retry block the
    test jumps to (up to its unconditional branch back) "operand retries"; DEPBAR "retire"; HGMMA "issue"; the stage
    release and the back edge "rest" (a clock read at the head falls in "operands"). A loop without a back edge gives no segments."""
    rows = [{"Address": a, "Source": src} for a, src in [
        ("0x00", "MOV R1, R2"), ("0x10", "CS2R R2, SR_CLOCKLO"), ("0x20", "BAR.SYNC.DEFER_BLOCKING 0x0, 0x80"),
        ("0x30", "SYNCS.PHASECHK.TRANS64.TRYWAIT P3, [UR4], R3"), ("0x40", "@!P3 BRA 0xc0"),
        ("0x50", "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], R24"), ("0x60", "HGMMA.64x128x16.F32.BF16 R24, gsb0"),
        ("0x70", "WARPGROUP.DEPBAR.LE gsb0, 0x1"), ("0x80", "@P3 SYNCS.ARRIVE.TRANS64.A1T0 RZ, [UR6], RZ"),
        ("0x90", "@P3 BRA 0x10"), ("0xa0", "EXIT"), ("0xb0", "BRA 0xb0"),
        ("0xc0", "SYNCS.PHASECHK.TRANS64.TRYWAIT P3, [UR4], R3"), ("0xd0", "@!P3 BRA 0xc0"), ("0xe0", "BRA 0x50"),
        ("0xf0", "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR9], R3")]]
    seg = ss.loop_segments(rows)
    addr = {k: [r["Address"] for r in v] for k, v in seg.items()}
    assert addr == {"operands": ["0x10", "0x20", "0x30", "0x40"], "operand retries": ["0xc0", "0xd0", "0xe0"],
                    "retire": ["0x70"], "issue": ["0x50", "0x60"], "rest": ["0x80", "0x90"]}
    rows = rows[:10]
    rows[9]["Source"] = "@P3 BRA 0xa0"  # no back edge
    assert ss.loop_segments(rows) == {}
