"""What a filtered call costs when rows need the exact fallback, and which way it finished them.

For each batch size and filter case (chosen so that a few, many or most rows cannot be proven
from the kept logits on random-weight logits of std ~2), one eager call reports how many rows
fell back and how many of those were finished from their needed tiles (a need key > 0) rather
than their whole recomputed row; then whole calls are timed as CUDA-graph replays (L2
flushed, medians) three ways side by side: the plain call (no filter), the filtered call as
shipped, and the filtered call with REFINE_CAP = 0 (every fallback row recomputed whole: the
fallback before docs/performance.md's v20). Tokens of the two filtered graphs must be equal.
Since v28 most min-p rows that the kept logits cannot prove are finished from the tiles' winners
instead of the fallback, so the min-p cases fall back far less often than the filters alone
suggest (bench/minp_winner_rate.py measures by how much).

    python3 bench/fallback_probe.py [--shape 4096x151936] [--batches 1,16,64] [--cases ...]

On a machine without a GPU it runs one tiny shape under the interpreter (smoke test, no
timing).
"""
import argparse
import statistics

import common
import torch

import fsdist
import fsdist.ops.select_filtered as sf
import fsdist.sampling as sampling
from fsdist.timing import CapturedGraph, L2Flusher, time_graph

CASES = {
    "min_p0.05": dict(min_p=0.05),
    "min_p0.02": dict(min_p=0.02),
    "min_p0.01": dict(min_p=0.01),
    "k50+p0.9": dict(top_k=50, top_p=0.9),
}


class NeedKeys:
    """Wraps sampling.run_fallback to record the need keys of the rows it was handed (eager calls only)."""

    def __init__(self):
        self.keys = None
        self.orig = sampling.run_fallback

    def __enter__(self):
        def wrapped(*a, **k):
            self.orig(*a, **k)
            self.keys = k["kept"].need_key[k["flags"]].cpu()
        sampling.run_fallback = wrapped
        return self

    def __exit__(self, *exc):
        sampling.run_fallback = self.orig


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default=None, help="DxV (default 4096x151936 on a GPU, 64x4096 on CPU)")
    ap.add_argument("--batches", default=None)
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated names of " + ", ".join(CASES))
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    gpu = common.has_gpu()
    device = common.bench_device()
    D, V = common.parse_shapes(args.shape or ("4096x151936" if gpu else "64x4096"))[0]
    batches = common.parse_int_list(args.batches or ("1,16,64" if gpu else "4"))
    cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        raise SystemExit(f"unknown case(s) {unknown}; choose from {list(CASES)}")
    g = torch.Generator().manual_seed(0)
    dtype = torch.bfloat16 if gpu else torch.float32
    w = (torch.randn(V, D, generator=g) * (2.0 / D ** 0.5)).to(device, dtype)
    flush = L2Flusher(device)
    results = {"env": common.env_info(), "shape": [D, V], "temperature": args.temperature, "cells": []}
    rows_out = []
    for B in batches:
        h = torch.randn(B, D, generator=g).to(device, dtype)
        rows = torch.arange(B, device=device)
        temp = torch.full((B,), args.temperature, device=device)

        def call(hh, kw):
            return fsdist.sample(hh, w, temperature=temp, seed=rows * 7 + 1, offset=rows * 0 + 3, **kw)

        plain_us = None
        if gpu:
            graph = CapturedGraph(lambda hh: call(hh, {}), [(h,)], calls=5)
            plain_us = statistics.median(time_graph(graph, warmup=3, reps=args.reps, flush=flush))
        for name in cases:
            kw = {k: torch.full((B,), v, device=device, dtype=torch.int32 if k == "top_k" else torch.float32)
                  for k, v in CASES[name].items()}
            with NeedKeys() as nk:
                out = call(h, kw)
            fell = int(out.fallback.sum())
            refined = int((nk.keys > 0).sum()) if nk.keys is not None else 0
            cell = dict(batch=B, case=name, fallback_rows=fell, refined_rows=refined, plain_us=plain_us)
            if gpu:
                default_cap = sf.REFINE_CAP
                toks = {}
                for label, cap in (("filtered_us", default_cap), ("whole_row_us", 0)):
                    sf.REFINE_CAP = cap
                    try:
                        graph = CapturedGraph(lambda hh: call(hh, kw), [(h,)], calls=5)
                    finally:
                        sf.REFINE_CAP = default_cap
                    cell[label] = statistics.median(time_graph(graph, warmup=3, reps=args.reps, flush=flush))
                    toks[label] = torch.stack([o.tokens for o in graph.outputs])
                cell["tokens_equal"] = bool(torch.equal(toks["filtered_us"], toks["whole_row_us"]))
                if not cell["tokens_equal"]:
                    print(f"!! B={B} {name}: the two fallbacks gave different tokens")
            results["cells"].append(cell)
            rows_out.append(cell)
            common.log(f"B={B} {name}: fallback {fell}/{B} rows ({refined} from needed tiles)"
                       + (f", graph plain {plain_us:.1f} / filtered {cell['filtered_us']:.1f} / whole-row fallback "
                          f"{cell['whole_row_us']:.1f} us" if gpu else ""))
    wr = common.ResultWriter("fallback_probe", device)
    wr.data.update(results)
    wr.flush()
    print(f"\nfallback_probe D={D} V={V} T={args.temperature} ({results['env'].get('gpu') or 'CPU'}) -> {wr.path}")
    print("| B | case | fallback rows | from needed tiles | plain µs | filtered µs | whole-row fallback µs | tokens equal |")
    print("|---|---|---|---|---|---|---|---|")
    for c in rows_out:
        f = (lambda k: f"{c[k]:.1f}" if c.get(k) is not None else "–")  # noqa: E731
        print(f"| {c['batch']} | {c['case']} | {c['fallback_rows']} | {c['refined_rows']} | {f('plain_us')} | "
              f"{f('filtered_us')} | {f('whole_row_us')} | {c.get('tokens_equal', '–')} |")


if __name__ == "__main__":
    main()
