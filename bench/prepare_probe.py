#!/usr/bin/env python
"""Which way of preparing logit bias + penalties is fastest: the sort variants of
``fsdist.ops.prepare_processors.launch_prepare`` side by side, each checked first.

    python bench/prepare_probe.py [--batches 1,16,64,256] [--vocab 151936] [--reps 50] [--slots 1000]

The processors are the kernel bench's (``kernel_bench.ShapeCtx.set_processors``: by default 500
bias + 250 output + 250 prompt ids a row, [B] penalties; --slots sets other totals). Variants: the rank sort (a second kernel,
``sort_entries.py``), and the in-kernel bitonic sort with 64- or 32-bit keys on 4, 8 or 16
warps. Every variant's entries / values / penalties / bad flags must equal the torch-sorted
preparation's before it is timed. Time: CUDA-graph replays of 20 launches (µs per launch, the
way a decode step replays them), median of --reps replays; and the entry-offset table of the
Triton stage-1 tile (``entry_offsets.py``, B <= 32) for scale. Runs on CPU as a smoke test
(interpreter, host clock). Prints a table last; JSON to $OUT or bench/results.
"""
import common as C  # first: repo root on sys.path, safe NVSHMEM/NCCL environment

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

from fsdist.ops.entry_offsets import launch_entry_offsets  # noqa: E402
from fsdist.ops.prepare_processors import key32_fits, launch_prepare  # noqa: E402
from fsdist.ops.sort_entries import RANK_SORT_MAX  # noqa: E402
from kernel_bench import ShapeCtx  # noqa: E402

VARIANTS = {  # name -> launch_prepare options
    "rank": dict(sort="rank"),
    "bitonic64_w4": dict(sort="bitonic", key32=False, num_warps=4),
    "bitonic64_w16": dict(sort="bitonic", key32=False, num_warps=16),
    "bitonic32_w4": dict(sort="bitonic", key32=True, num_warps=4),
    "bitonic32_w8": dict(sort="bitonic", key32=True, num_warps=8),
    "bitonic32_w16": dict(sort="bitonic", key32=True, num_warps=16),
    "default": dict(),
}


def time_us(fn, device, reps: int, per_graph: int = 20) -> float:
    """µs per call: median over replays of a CUDA graph of ``per_graph`` calls (host clock on CPU)."""
    if device.type != "cuda":
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e6
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(per_graph):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000 / per_graph)
    return statistics.median(times)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", default=None, help="comma-separated batch sizes (GPU 1,16,64,256; CPU 2)")
    p.add_argument("--vocab", type=int, default=None, help="vocabulary size (GPU 151936; CPU 4096)")
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--only", default=None, help="comma-separated variants")
    p.add_argument("--slots", default="1000", help="comma-separated ids a row (half bias, a quarter output, "
                   "a quarter prompt ids; default 1000, the kernel bench's)")
    args = p.parse_args()
    device = C.bench_device()
    on_gpu = device.type == "cuda"
    V = args.vocab or (151936 if on_gpu else 4096)
    batches = C.parse_int_list(args.batches or ("1,16,64,256" if on_gpu else "2"))
    names = args.only.split(",") if args.only else list(VARIANTS)
    gen = torch.Generator(device=device).manual_seed(0)
    rows, results = [], {}
    for B, n in [(B, n) for n in C.parse_int_list(args.slots) for B in batches]:
        ctx = ShapeCtx(D=64, V=V, dtype=torch.bfloat16, device=device, T=0.8,
                       proc_cfg={"density": 0.5, "n_bias": n // 2, "n_output": n // 4, "n_prompt": n - n // 2 - n // 4})
        ctx.set_processors(B, gen)
        kw = dict(bias_ids=ctx.bias_ids_t, bias_values=ctx.bias_vals_t, output_ids=ctx.out_ids_t,
                  prompt_ids=ctx.prompt_ids_t, repetition=ctx.rep_t, frequency=ctx.freq_t, presence=ctx.pres_t,
                  penalties=True)
        want = launch_prepare(B, V, device, sort="torch", **kw)
        S = want[0].shape[1]
        cell = {}
        for name in names:
            opts = VARIANTS[name]
            if opts.get("key32") and not key32_fits(V, 1 << (S - 1).bit_length()):
                continue
            if opts.get("sort") == "rank" and S > RANK_SORT_MAX:
                continue  # the rank sort refuses rows wider than RANK_SORT_MAX
            if not on_gpu and opts.get("sort") == "bitonic" and B > 2:
                continue  # the interpreter runs tl.sort element by element
            got = launch_prepare(B, V, device, **opts, **kw)
            ok = all(torch.equal(a, b) for a, b in zip(got, want))
            if not ok:
                C.log(f"B={B} {name}: MISMATCH against the torch-sorted preparation")
                cell[name] = {"ok": False}
                continue
            us = time_us(lambda: launch_prepare(B, V, device, **opts, **kw), device, args.reps)
            cell[name] = {"ok": True, "us": us}
            C.log(f"B={B:4d} S={S} {name:15s} {us:8.2f} us")
        ent, val = want[0], want[1]
        n_tiles = -(-V // 128)
        cell["entry_offsets"] = {"ok": True, "us": time_us(lambda: launch_entry_offsets(ent, val, 0, 128, n_tiles),
                                                             device, args.reps)}
        results[f"{B}x{S}"] = cell
        rows.append((B, S, cell))
    info = C.env_info()
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out_dir = os.environ.get("OUT") or str(C.RESULTS_DIR)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"prepare_probe_{C.gpu_slug(device)}_{stamp}.json")
    with open(path, "w") as f:
        json.dump({"schema": C.SCHEMA, "env": info, "vocab": V, "variants": VARIANTS,
                   "results": {str(k): v for k, v in results.items()}}, f, indent=1, default=C._json_default)
    cols = names + ["entry_offsets"]
    print(f"\nprepare_processors variants, µs per launch (graph replays, median), V={V}, "
          f"S ids a row: half bias, a quarter output, a quarter prompt ids")
    print(f"{'B':>5} {'S':>5} " + " ".join(f"{c:>14}" for c in cols))
    for B, S, cell in rows:
        vals = []
        for c in cols:
            r = cell.get(c)
            vals.append("-" if r is None else ("MISMATCH" if not r["ok"] else f"{r['us']:.2f}"))
        print(f"{B:>5} {S:>5} " + " ".join(f"{v:>14}" for v in vals))
    print("results:", path)
    return 0 if all(r.get("ok", True) for c in results.values() for r in c.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
