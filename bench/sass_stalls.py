"""Stall reasons of a warp-specialised kernel's wgmma loop, from Nsight Compute's per-SASS-instruction samples.

Reads the CSV that ``ncu -i REP --page source --csv --print-source sass`` writes (gzipped or not; one block per
profiled kernel, each opened by a "Kernel Name" line), and for each block sums the warp-stall samples (all samples)
by reason over two parts of the code: the MMA loop (the MMA warpgroup's main loop: from the head of the loop that
holds the wgmmas, ``HGMMA``, i.e. the target of the backward branch that follows the last one, where the warps wait
for a stage's operands, to the last wgmma; the first wgmma when no such branch is found) and the rest (load warp,
epilogue, hand-off, set-up). Prints each part's samples, its share of the block's, and the reasons in order of their
share, side by side for the blocks (e.g. the greedy and the noise launch of scripts/gpu_profile_ws_sass.sh, in
launch order); ``--lines N`` also lists each block's N instructions with the most samples; ``--segments`` also
splits the loop's whole body where its warps wait (bench/sass_stalls.py:loop_segments), to set beside the wait
probe's shares; ``--count N`` also sums the reasons over the lines executed N times (+-0.5%) that are neither
branches nor barrier waits: a part of the code by how often it runs, e.g. the epilogue's once-a-tile-a-warp lines
(programs x tiles x epilogue warps). No GPU needed.

    python3 bench/sass_stalls.py bench/results/v89_ws_sass_<gpu>_<date>.csv.gz [--names greedy,noise] [--top 8]
        [--lines 20] [--count 75968] [--segments]
"""
import argparse
import csv
import gzip
import io
import re
import sys
from typing import Dict, List


def read_blocks(path: str) -> List[dict]:
    """[{"kernel": name, "rows": [row dicts in address order]}] for each profiled kernel of the CSV."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        text = f.read()
    blocks, current, header = [], None, None
    for rec in csv.reader(io.StringIO(text)):
        if not rec:
            continue
        if rec[0] == "Kernel Name":
            current = {"kernel": rec[1] if len(rec) > 1 else "?", "rows": []}
            blocks.append(current)
            header = None
        elif current is not None and header is None and rec[0] == "Address":
            header = rec
        elif current is not None and header is not None:
            current["rows"].append(dict(zip(header, rec)))
    return blocks


def _num(x) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return 0.0


def stall_columns(rows: List[dict]) -> List[str]:
    """The all-samples stall reasons (stall_<reason>, without the "(Not Issued)" copies)."""
    return [k for k in (rows[0] if rows else {}) if k.startswith("stall_") and "Not Issued" not in k]


def _address(text) -> int:
    try:
        return int(str(text), 16)
    except ValueError:
        return -1


def split_mma_loop(rows: List[dict], reach: int = 48):
    """(MMA loop rows, other rows): the MMA loop runs from its head to the last HGMMA instruction. The head is the
    target of a backward branch among the ``reach`` instructions after the last HGMMA (48: the wait probe's clock
    reads put v109's 24 lines between them) that lands at or before the
    first one (the loop's back edge: its head waits for the next stage); without one, the first HGMMA."""
    idx = [i for i, r in enumerate(rows) if "HGMMA" in r.get("Source", "")]
    if not idx:
        return [], rows
    lo, hi = idx[0], idx[-1]
    first = _address(rows[lo].get("Address"))
    where = {_address(r.get("Address")): i for i, r in enumerate(rows)}
    for r in rows[hi + 1:hi + 1 + reach]:
        m = re.search(r"\bBRA\b[^0-9]*(0x[0-9a-fA-F]+)", r.get("Source", ""))
        if m and 0 <= _address(m.group(1)) <= first and _address(m.group(1)) in where:
            lo = min(lo, where[_address(m.group(1))])
            break
    return rows[lo:hi + 1], rows[:lo] + rows[hi + 1:]


def _target(src: str) -> int:
    m = re.search(r"\bBRA\b[^0-9]*(0x[0-9a-fA-F]+)", src)
    return _address(m.group(1)) if m else -1


def loop_segments(rows: List[dict], reach: int = 48) -> Dict[str, List[dict]]:
    """The MMA loop's whole body (its head's stage wait to the back edge) cut where a warp waits, to set beside a
    clock probe's shares (launch_fused_ws's wait_probe, bench/ws_waits.py): "operands" the head up to the branch that
    tests the stage's try-wait (the warpgroup barrier before it and the try-wait: what the probe's operand wait
    spans), "operand retries" the out-of-line block that branch jumps to when the try-wait gave up, to its branch
    back, "retire" the wgmma-retire waits (WARPGROUP.DEPBAR), "issue" the wgmmas (HGMMA), "rest" the other lines
    of the body (the stage release and its warpgroup barrier, the loop's counters, the probe's clock reads after the
    first, which falls in "operands"). Empty dict without a back edge, or where the wgmmas span two loops (a short
    last tile's: the back edge is then not found after the last one). (ncu charges a stall to the instruction that
    waits to issue: a barrier's wait shows on the line after it.)"""
    idx = [i for i, r in enumerate(rows) if "HGMMA" in r.get("Source", "")]
    if not idx:
        return {}
    head_addr = _address(split_mma_loop(rows, reach)[0][0].get("Address"))
    where = {_address(r.get("Address")): i for i, r in enumerate(rows)}
    back = next((j for j in range(idx[-1] + 1, min(len(rows), idx[-1] + 1 + reach))
                 if 0 <= _target(rows[j].get("Source", "")) <= head_addr), None)
    if back is None or head_addr not in where:
        return {}
    head = where[head_addr]
    body = rows[head:back + 1]
    wait = next((k for k, r in enumerate(body) if "TRYWAIT" in r.get("Source", "")), None)
    test = None if wait is None else next((k for k in range(wait + 1, len(body))
                                           if re.search(r"\bBRA\b", body[k].get("Source", ""))), None)
    seg = {"operands": body[:test + 1] if test is not None else [], "operand retries": [], "retire": [], "issue": [],
           "rest": []}
    for r in body[(test + 1) if test is not None else 0:]:
        src = r.get("Source", "")
        seg["retire" if "WARPGROUP.DEPBAR" in src else "issue" if "HGMMA" in src else "rest"].append(r)
    if test is not None and _target(body[test].get("Source", "")) in where:
        j = where[_target(body[test].get("Source", ""))]
        while j < len(rows) and j not in range(head, back + 1):
            seg["operand retries"].append(rows[j])
            src = rows[j].get("Source", "")
            if re.search(r"\bBRA\b", src) and not src.lstrip().startswith("@"):
                break  # the unconditional branch back into the loop
            j += 1
    return seg


def counted_lines(rows: List[dict], count: float, tol: float = 0.005) -> List[dict]:
    """The lines executed ``count`` times (within tol), less branches and barrier waits (whose samples are idling)."""
    return [r for r in rows if abs(_num(r.get("Instructions Executed")) - count) <= tol * count
            and not re.search(r"\bBRA\b|TRYWAIT|BAR\.SYNC|\bNOP\b", r.get("Source", ""))]


def summarize(rows: List[dict], reasons: List[str]) -> Dict:
    sums = {k[len("stall_"):]: sum(_num(r.get(k)) for r in rows) for k in reasons}
    return {"samples": sum(sums.values()), "reasons": sums,
            "instructions": sum(_num(r.get("Instructions Executed")) for r in rows), "lines": len(rows)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("csv", help="ncu --page source --csv --print-source sass output (.csv or .csv.gz)")
    p.add_argument("--names", default="", help="labels of the blocks, in order (default: kernel names)")
    p.add_argument("--top", type=int, default=8, help="reasons shown per part")
    p.add_argument("--lines", type=int, default=0, help="also list each block's N instructions with the most samples")
    p.add_argument("--segments", action="store_true", help="also split the MMA loop's samples where its warps wait "
                   "(operands / their retries / wgmma retire / wgmma issue / rest), to set beside the wait probe's")
    p.add_argument("--count", type=float, default=0, help="also sum the reasons over the non-branch, non-wait lines "
                   "executed this many times (+-0.5%%)")
    args = p.parse_args(argv)
    blocks = read_blocks(args.csv)
    if not blocks:
        print(f"no kernel blocks in {args.csv}", file=sys.stderr)
        return 1
    names = [n for n in args.names.split(",") if n] or [b["kernel"][:24] for b in blocks]
    for i, b in enumerate(blocks):
        label = names[i] if i < len(names) else f"block{i}"
        rows = b["rows"]
        reasons = stall_columns(rows)
        loop, rest = split_mma_loop(rows)
        whole = summarize(rows, reasons)
        print(f"== {label} ({b['kernel'][:40]}): {whole['samples']:.0f} samples, {len(rows)} SASS lines, "
              f"{whole['instructions']:.0f} warp instructions executed")
        parts = [("MMA loop", loop), ("rest", rest)]
        if args.count:
            parts.append((f"lines run {args.count:.0f}x", counted_lines(rows, args.count)))
        for part, rs in parts:
            s = summarize(rs, reasons)
            if not s["samples"]:
                print(f"   {part}: no samples ({s['lines']} lines)")
                continue
            top = sorted(s["reasons"].items(), key=lambda kv: -kv[1])[:args.top]
            print(f"   {part}: {s['lines']} lines, {s['samples']:.0f} samples "
                  f"({100 * s['samples'] / max(whole['samples'], 1):.1f}% of the kernel's), "
                  f"{s['instructions']:.0f} instructions executed")
            print("     " + ", ".join(f"{k} {100 * v / s['samples']:.1f}%" for k, v in top if v))
        if args.segments:
            seg = loop_segments(rows)
            total = sum(summarize(rs, reasons)["samples"] for rs in seg.values())
            if not total:
                print("   MMA loop segments: no back edge or no samples")
            else:
                print("   MMA loop segments (share of the loop body's samples): " + ", ".join(
                    f"{k} {100 * summarize(rs, reasons)['samples'] / total:.1f}% ({len(rs)} lines)"
                    for k, rs in seg.items()))
        if args.lines:
            scored = sorted(((sum(_num(r.get(k)) for k in reasons), j, r) for j, r in enumerate(rows)),
                            key=lambda x: (-x[0], x[1]))[:args.lines]
            for samples, j, r in scored:
                why = sorted(((k[len("stall_"):], _num(r.get(k))) for k in reasons), key=lambda kv: -kv[1])[:3]
                print(f"     #{j:<5d} {100 * samples / max(whole['samples'], 1):5.1f}% "
                      f"x{_num(r.get('Instructions Executed')):<10.0f} {r.get('Source', '').strip()[:56]:56s} "
                      + ", ".join(f"{k} {v:.0f}" for k, v in why if v))
    return 0


if __name__ == "__main__":
    sys.exit(main())
