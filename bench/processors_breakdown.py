#!/usr/bin/env python
"""Where a processed fsdist.sample call spends its *device* time: torch.profiler (CUPTI) time
per kernel, per call, for plain / bitmask / bias+penalties / all, at each batch size.

    python bench/processors_breakdown.py [--shape 4096x151936] [--batches 1,16,64,256] [--iters 20]
                                         [--groups plain,bitmask,bias_pen,all,topk_topp,minp]

The kernel bench's graph replays showed bias + penalties costing ~46 µs at B = 1 with no host in
the loop (docs/performance.md, v9 outcome); this says which kernel it is: the preparation
(``prepare_processors_kernel``: range checks, slots, the per-row sort), the stage-1 epilogue
(``fused_sample_kernel`` / ``sample_logits_kernel`` growing against the plain call: the bitmask
test, the entry searches), or the small torch ops around them. Same processors as
``bench/kernel_bench.py --methods processors`` (its ``set_processors``); the filter groups are the
kernel bench's too (top-k 50 + top-p 0.9, or min-p 0.05, as [B] tensors), as is the weight's scale
(N(0, 4 / D) entries: logits of spread ~2 for N(0, 1) hidden states). Device times do not
depend on how fast the host is. Runs on CPU too (profiler CPU times, Triton interpreter; a smoke
run). Prints a table last; JSON to --out (default $OUT or bench/results).
"""
import common as C  # first: repo root on sys.path, safe NVSHMEM/NCCL environment

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402
from typing import Dict  # noqa: E402

import torch  # noqa: E402

import fsdist  # noqa: E402
from kernel_bench import FILTER_GROUPS, PROCESSOR_GROUPS, ShapeCtx  # noqa: E402  (the kernel bench's groups)

GROUPS = ("plain", "bitmask", "bias_pen", "all")  # the default; --groups adds the FILTER_GROUPS


def kernel_times(fn, iters: int, device) -> Dict[str, float]:
    """µs per call of each kernel (device time on CUDA, CPU time otherwise), from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    on_gpu = device.type == "cuda"
    with profile(activities=[ProfilerActivity.CUDA] if on_gpu else [ProfilerActivity.CPU]) as prof:
        for _ in range(iters):
            fn()
        C.sync(device)
    return C.per_kernel_us(prof, device, iters)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    C.add_problem_options(p)
    p.add_argument("--groups", default=",".join(GROUPS),
                   help=f"comma-separated, of plain, {', '.join(PROCESSOR_GROUPS)}, {', '.join(FILTER_GROUPS)}")
    args = p.parse_args()
    groups = args.groups.split(",")
    unknown = [g for g in groups if g != "plain" and g not in PROCESSOR_GROUPS and g not in FILTER_GROUPS]
    if unknown:
        p.error(f"--groups: unknown group(s) {unknown}")
    device, D, V, batches, iters, dtype = C.problem_from_args(args, gpu_iters=20, cpu_iters=1)
    on_gpu = device.type == "cuda"
    gen = torch.Generator(device=device).manual_seed(0)
    W = (torch.randn(V, D, device=device, generator=gen) * (2.0 / D ** 0.5)).to(dtype)
    rows = []
    for B in batches:
        inp = ShapeCtx(D=D, V=V, dtype=dtype, device=device, T=0.8,
                       proc_cfg={"density": 0.5, "n_bias": 500, "n_output": 250, "n_prompt": 250},
                       filters={"top_k": 50, "top_p": 0.9, "min_p": 0.05})
        inp.set_processors(B, gen)
        inp.set_filters(B)
        h = (torch.randn(B, D, device=device, generator=gen)).to(dtype)
        temp = C.row_temperatures(B, 0.8, device=device)
        seed = torch.arange(B, device=device) * 7 + 1
        off = torch.zeros(B, dtype=torch.int64, device=device)
        for group in groups:
            kw = inp.filter_kwargs(group) if group in FILTER_GROUPS else inp.processor_kwargs(
                None if group == "plain" else group)

            def fn(kw=kw):
                return fsdist.sample(h, W, temperature=temp, seed=seed, offset=off, **kw)

            for _ in range(3 if on_gpu else 1):
                fn()
            C.sync(device)
            per = kernel_times(fn, iters, device)
            total = sum(per.values())
            rows.append({"B": B, "group": group, "total_us": total, "kernels_us": per})
            top = ", ".join(f"{k[:40]} {v:.1f}" for k, v in sorted(per.items(), key=lambda kv: -kv[1])[:5])
            C.log(f"B={B:<4} {group:<9} {total:8.1f} us/call  [{top}]")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"processors_breakdown_{C.gpu_slug(device)}_"
                                  f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json")
    with open(path, "w") as f:
        json.dump({"schema": C.SCHEMA, "env": C.env_info(), "D": D, "V": V, "iters": iters, "rows": rows}, f,
                  indent=1, default=str)
    kinds = sorted({k for r in rows for k in r["kernels_us"]}, key=lambda k: -max(
        r["kernels_us"].get(k, 0.0) for r in rows))[:8]
    unit = "device" if on_gpu else "CPU (interpreter: not a GPU figure)"
    print(f"\nD={D} V={V}: {unit} µs per call of each kernel, {iters} calls; the 8 largest kernels")
    print(f"{'B':>5} {'group':<9} {'total':>8} " + " ".join(f"{k[:22]:>22}" for k in kinds))
    for r in rows:
        print(f"{r['B']:>5} {r['group']:<9} {r['total_us']:8.1f} "
              + " ".join(f"{r['kernels_us'].get(k, 0.0):22.1f}" for k in kinds))
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
