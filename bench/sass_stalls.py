"""Stall reasons of a warp-specialised kernel's wgmma loop, from Nsight Compute's per-SASS-instruction samples.

Reads the CSV that ``ncu -i REP --page source --csv --print-source sass`` writes (gzipped or not; one block per
profiled kernel, each opened by a "Kernel Name" line), and for each block sums the warp-stall samples (all samples)
by reason over two parts of the code: the MMA loop (every instruction from the first wgmma, ``HGMMA``, to the last
one in address order: the MMA warpgroup's main loop) and the rest (load warp, epilogue, set-up). Prints each part's
samples, its share of the block's, and the reasons in order of their share, side by side for the blocks (e.g. the
greedy and the noise launch of scripts/gpu_profile_ws_sass.sh, in launch order). No GPU needed.

    python3 bench/sass_stalls.py bench/results/v89_ws_sass_<gpu>_<date>.csv.gz [--names greedy,noise] [--top 8]
"""
import argparse
import csv
import gzip
import io
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


def split_mma_loop(rows: List[dict]):
    """(MMA loop rows, other rows): the MMA loop runs from the first to the last HGMMA instruction."""
    idx = [i for i, r in enumerate(rows) if "HGMMA" in r.get("Source", "")]
    if not idx:
        return [], rows
    lo, hi = idx[0], idx[-1]
    return rows[lo:hi + 1], rows[:lo] + rows[hi + 1:]


def summarize(rows: List[dict], reasons: List[str]) -> Dict:
    sums = {k[len("stall_"):]: sum(_num(r.get(k)) for r in rows) for k in reasons}
    return {"samples": sum(sums.values()), "reasons": sums,
            "instructions": sum(_num(r.get("Instructions Executed")) for r in rows), "lines": len(rows)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("csv", help="ncu --page source --csv --print-source sass output (.csv or .csv.gz)")
    p.add_argument("--names", default="", help="labels of the blocks, in order (default: kernel names)")
    p.add_argument("--top", type=int, default=8, help="reasons shown per part")
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
        for part, rs in (("MMA loop", loop), ("rest", rest)):
            s = summarize(rs, reasons)
            if not s["samples"]:
                print(f"   {part}: no samples ({s['lines']} lines)")
                continue
            top = sorted(s["reasons"].items(), key=lambda kv: -kv[1])[:args.top]
            print(f"   {part}: {s['lines']} lines, {s['samples']:.0f} samples "
                  f"({100 * s['samples'] / max(whole['samples'], 1):.1f}% of the kernel's), "
                  f"{s['instructions']:.0f} instructions executed")
            print("     " + ", ".join(f"{k} {100 * v / s['samples']:.1f}%" for k, v in top if v))
    return 0


if __name__ == "__main__":
    sys.exit(main())
