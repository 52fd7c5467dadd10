"""Filtered sampling, piece by piece: stage 1 with and without the kept logits (per tile
config and top-k implementation), stage 2's threshold search (packed or full, per warp
count), and whole calls as CUDA-graph replays, all in one run on the same inputs.

What it answers (docs/performance.md, v13): how much of a filtered call's extra time is the
extended stage-1 epilogue, how much the search, and which tile config suits the epilogue.
Timings: CUDA events around each launch, L2 flushed before each, medians (fsdist.timing).

    python3 bench/filter_probe.py [--shape 4096x151936] [--batches 1,16,64] [--configs ...]

``--variant old-topk`` (run by the parent in a subprocess) swaps in the previous top-k of
the epilogue (two row reductions per kept logit) before anything compiles, for the A/B.
On a machine without a GPU it runs one tiny shape under the interpreter (smoke test).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

import common
import torch
import triton
import triton.language as tl

import fsdist
from fsdist.ops.configs import TileConfig, pick_config
from fsdist.ops.layout import BufferPair
from fsdist.ops.merge_candidates import launch_merge
from fsdist.ops.plan import launch_stage1, plan_sample
from fsdist.ops.select_filtered import launch_select_filtered
from fsdist.params import RowParams
from fsdist.timing import CapturedGraph, L2Flusher, median_us, time_calls, time_graph


@triton.jit
def _old_tile_topk(logit, cols, KEEP: tl.constexpr):
    # The epilogue's top-k before v13: a max, then a min over the columns holding it, per kept value.
    BIG: tl.constexpr = 1 << 30
    slot = tl.arange(0, KEEP)[None, :]
    vals = tl.full([logit.shape[0], KEEP], float("-inf"), tl.float32)
    idx = tl.zeros([logit.shape[0], KEEP], tl.int32)
    x = logit
    for j in tl.static_range(KEEP):
        m = tl.max(x, axis=1)
        c = tl.min(tl.where(x == m[:, None], cols[None, :], BIG), axis=1)
        vals = tl.where(slot == j, m[:, None], vals)
        idx = tl.where(slot == j, c[:, None], idx)
        x = tl.where(cols[None, :] == c[:, None], float("-inf"), x)
    return vals, idx, tl.max(x, axis=1)


def _inputs(D, V, B, device):
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(V, D, generator=g) * (2.0 / D ** 0.5)).to(device, torch.bfloat16)
    h = torch.randn(B, D, generator=g).to(device, torch.bfloat16)
    rows = torch.arange(B, device=device)
    temp = torch.full((B,), 0.8, device=device)
    filt = dict(top_k=torch.full((B,), 50, device=device, dtype=torch.int32), top_p=torch.full((B,), 0.9, device=device))
    return w, h, rows, temp, filt


def stage1_times(D, V, B, configs, args, device):
    w, h, rows, temp, filt = _inputs(D, V, B, device)
    flush = L2Flusher(device)
    params = RowParams(temp, rows + 1, rows * 0)
    fparams = RowParams(temp, rows + 1, rows * 0, **filt)
    out = {}
    for label, extended, cfg in [("plain", False, None)] + [("extended", True, c) for c in configs]:
        cfg = cfg or pick_config(B, D, device.type)
        plan = plan_sample(batch=B, hidden_size=D, weight_rows=V, device=device, config=cfg, path="fused",
                           extended=extended)
        bufs = BufferPair.alloc(plan.layout, device)
        p = fparams if extended else params
        t = median_us(lambda: launch_stage1(plan, h, w, p, bufs, vocab_size=V), warmup=args.warmup, reps=args.reps,
                      flush=flush, device=device)
        out[f"{label} {cfg.name}"] = t
        common.log(f"  B={B} stage1 {label:8s} {cfg.name:16s} {t:9.1f} us")
    return out


def select_times(D, V, B, args, device):
    w, h, rows, temp, filt = _inputs(D, V, B, device)
    flush = L2Flusher(device)
    out = {}
    for name, kw in (("k50+p0.9", filt), ("min_p0.05", dict(min_p=torch.full((B,), 0.05, device=device)))):
        params = RowParams(temp, rows + 1, rows * 0, **kw)
        plan = plan_sample(batch=B, hidden_size=D, weight_rows=V, device=device, path="fused", extended=True)
        bufs = BufferPair.alloc(plan.layout, device)
        launch_stage1(plan, h, w, params, bufs, vocab_size=V)
        tokens0, _, _ = launch_merge(plan.layout, bufs, B, params)
        tokens = tokens0.clone()
        results = {}
        for cap, nw in ((0, 16), (0, 8), (256, 8), (256, 4), (128, 4)):
            def call():
                return launch_select_filtered(plan.layout, bufs, B, params, vocab_size=V, tokens=tokens, cap=cap,
                                              num_warps=nw)
            ts = time_calls(call, warmup=args.warmup, reps=args.reps, flush=flush,
                            before_call=lambda i: tokens.copy_(tokens0), device=device)
            tokens.copy_(tokens0)
            fb = call()
            results[(cap, nw)] = (tokens.clone(), fb.clone())
            out[f"{name} cap={cap} warps={nw}"] = statistics.median(ts)
            common.log(f"  B={B} select {name:10s} cap={cap:<4d} warps={nw:<3d} {statistics.median(ts):8.1f} us, "
                       f"fallback rows {int(fb.sum())}/{B}")
        ref = results[(0, 16)]
        same = all(torch.equal(a, ref[0]) and torch.equal(b, ref[1]) for a, b in results.values())
        out[f"{name} identical"] = same
        common.log(f"  B={B} select {name}: every variant gives the same tokens and flags: {same}")
    return out


def graph_times(D, V, B, args, device):
    w, h, rows, temp, filt = _inputs(D, V, B, device)
    flush = L2Flusher(device)
    out = {}
    for name, kw in (("plain", {}), ("k50+p0.9", filt), ("min_p0.05", dict(min_p=torch.full((B,), 0.05, device=device)))):
        def call(hh):
            return fsdist.sample(hh, w, temperature=temp, seed=rows + 1, offset=rows * 0, **kw)
        graph = CapturedGraph(call, [(h,)], calls=5)
        t = statistics.median(time_graph(graph, warmup=3, reps=max(5, args.reps // 5), flush=flush))
        out[name] = t
        fb = graph.outputs[0].fallback
        common.log(f"  B={B} graph {name:10s} {t:9.1f} us per call"
                   + (f", fallback rows {int(fb.sum())}/{B}" if fb is not None else ""))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default=None, help="DxV (default 4096x151936 on a GPU, 64x2000 on CPU)")
    ap.add_argument("--batches", default=None)
    ap.add_argument("--configs", default="", help="extended stage-1 tile configs to time besides the default "
                                                  "(names as TileConfig.parse reads them, comma-separated)")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--variant", default="", choices=["", "old-topk"])
    ap.add_argument("--only", default="stage1,select,graph")
    ap.add_argument("--no-ab", action="store_true", help="skip the old-topk subprocess")
    args = ap.parse_args()
    gpu = common.has_gpu()
    device = common.bench_device()
    D, V = common.parse_shapes(args.shape or ("4096x151936" if gpu else "64x2000"))[0]
    batches = common.parse_int_list(args.batches or ("1,16,64" if gpu else "2"))
    args.reps = args.reps or (50 if gpu else 2)
    args.warmup = args.warmup or (10 if gpu else 1)
    only = set(args.only.split(","))
    if args.variant == "old-topk":
        import fsdist.ops.fused_sample as fs

        fs.tile_topk = _old_tile_topk  # before the first compile of the stage-1 kernel
    results = {"env": common.env_info(), "shape": [D, V], "variant": args.variant or "current", "batches": {}}
    for B in batches:
        configs = [pick_config(B, D, device.type)] + [TileConfig.parse(c) for c in args.configs.split(",") if c
                                                      and TileConfig.parse(c).block_b >= min(B, 16)]
        r = {}
        if "stage1" in only:
            r["stage1_us"] = stage1_times(D, V, B, configs if gpu else configs[:1], args, device)
        if "select" in only and not args.variant:
            r["select_us"] = select_times(D, V, B, args, device)
        if "graph" in only and not args.variant and gpu:
            r["graph_us"] = graph_times(D, V, B, args, device)
        results["batches"][B] = r
    if args.variant:
        print("JSON " + json.dumps(results["batches"]))
        return
    if not args.no_ab and "stage1" in only:
        cmd = [sys.executable, os.path.abspath(__file__), "--variant", "old-topk", "--only", "stage1",
               "--batches", ",".join(map(str, batches)), "--shape", f"{D}x{V}", "--reps", str(args.reps),
               "--warmup", str(args.warmup)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("JSON ")]
        if line:
            for B, r in json.loads(line[-1][5:]).items():
                results["batches"][int(B)]["stage1_old_topk_us"] = r["stage1_us"]
        else:
            print("old-topk variant failed:", proc.stderr[-2000:])
    w = common.ResultWriter("filter_probe", device)
    w.data.update(results)
    w.flush()
    print(f"\nfilter_probe D={D} V={V} ({results['env'].get('gpu') or 'CPU'}) -> {w.path}")
    for B, r in results["batches"].items():
        for k, v in r.items():
            print(f"B={B} {k}: " + ", ".join(f"{n}={x:.1f}" if isinstance(x, float) else f"{n}={x}"
                                            for n, x in v.items()))


if __name__ == "__main__":
    main()
