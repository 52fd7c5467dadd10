"""Where a filtered fsdist.sample call spends its time: each launch of one call timed with CUDA
events (median of a few calls; no L2 flush, a development probe). Prints a table per batch size.
Usage: python3 bench/filter_breakdown.py [--batches 1,16,64,256] [--reps 10]
"""
import argparse
import math
import statistics

import common  # noqa: F401  (repo root on sys.path, no-multicast switches; before torch)
import torch

import fsdist
import fsdist.sampling as sampling

STEPS = ("launch_stage1", "launch_merge", "launch_select_filtered", "run_fallback")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="1,16,64,256")
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("filter_breakdown: needs a CUDA GPU (CUDA events); nothing to do here")
        return
    D, V = 4096, 151936
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(V, D, generator=g) * (2.0 / math.sqrt(D))).cuda().bfloat16()
    times = {}
    originals = {name: getattr(sampling, name) for name in STEPS}

    def timed(name):
        def call(*a, **k):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            out = originals[name](*a, **k)
            e.record()
            times.setdefault(name, []).append((s, e))
            return out
        return call

    for name in STEPS:
        setattr(sampling, name, timed(name))
    print(f"{'B':>4} {'filters':>14} " + " ".join(f"{n.replace('launch_', '')[:14]:>14}" for n in STEPS) + f" {'total':>9}")
    for B in [int(b) for b in args.batches.split(",")]:
        h = torch.randn(B, D, generator=g).cuda().bfloat16()
        rows = torch.arange(B, device="cuda")
        base = dict(temperature=torch.full((B,), 0.8, device="cuda"), seed=rows + 1, offset=rows * 0)
        for label, kw in (("plain", {}), ("k50+p0.9", dict(top_k=torch.full((B,), 50, device="cuda", dtype=torch.int32),
                                                          top_p=torch.full((B,), 0.9, device="cuda"))),
                          ("min_p0.05", dict(min_p=torch.full((B,), 0.05, device="cuda")))):
            fsdist.sample(h, w, **base, **kw)  # compile
            torch.cuda.synchronize()
            times.clear()
            totals = []
            for _ in range(args.reps):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                fsdist.sample(h, w, **base, **kw)
                e.record()
                totals.append((s, e))
            torch.cuda.synchronize()
            med = {n: statistics.median(a.elapsed_time(b) * 1e3 for a, b in times[n]) if n in times else 0.0
                   for n in STEPS}
            tot = statistics.median(a.elapsed_time(b) * 1e3 for a, b in totals)
            print(f"{B:>4} {label:>14} " + " ".join(f"{med[n]:14.1f}" for n in STEPS) + f" {tot:9.1f}", flush=True)


if __name__ == "__main__":
    main()
