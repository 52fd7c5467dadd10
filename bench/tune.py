"""Sweep fsdist tile configurations on the GPU, next to cuBLAS in the same run.

    python bench/tune.py [--shapes 4096x151936 8192x128256] [--batches 1 16 64 256] [--quick]

Prints, per (shape, B), cuBLAS time and the best configs; writes every timing as JSON
to bench/results/ (and $OUT when set). Its winners feed fsdist/ops/configs.py.
"""
import common as C  # first: the repo root on sys.path, fsdist.env.apply_safe_env() before torch

import argparse  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402
import triton.testing  # noqa: E402

import fsdist  # noqa: E402
from fsdist.ops.configs import TileConfig, pick_config  # noqa: E402


def candidates(B, quick):
    bbs = sorted({max(16, min(triton.next_power_of_2(B), 64)), max(16, min(triton.next_power_of_2(B), 128))})
    if B > 64:
        bbs = sorted(set(bbs) | {64, 128})
    bvs = [64, 128, 256]
    bks = [64, 128, 256]
    warps = [4, 8]
    stages = [3, 4, 5]
    out = []
    for bb, bv, bk, nw, ns in itertools.product(bbs, bvs, bks, warps, stages):
        smem = ns * (bb + bv) * bk * 2
        if smem > 200 * 1024 or bb * bv > 128 * 256:
            continue
        if quick and (ns == 3 or bk == 256):
            continue
        out.append(TileConfig(bb, bv, bk, nw, ns))
    return out


def bench(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median") * 1e3  # us


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=["4096x151936", "8192x128256"])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 16, 64, 256])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--paths-only", action="store_true", help="only compare the fused and chunked paths")
    ap.add_argument("--budget-s", type=float, default=400.0, help="stop sweeping after this long")
    args = ap.parse_args()
    t_start = time.time()
    dev = torch.cuda.get_device_name()
    rows = []
    summary = []
    for shape in args.shapes:
        D, V = map(int, shape.split("x"))
        ws = [torch.randn(V, D, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(2)]
        for B in args.batches:
            h = torch.randn(B, D, device="cuda", dtype=torch.bfloat16)
            it = iter(range(10**9))
            t_mm = bench(lambda: h @ ws[next(it) % 2].T)
            default = pick_config(B, D, "cuda")
            t_chunk = bench(lambda: fsdist.sample(h, ws[next(it) % 2], seed=1, path="chunked"))
            t_fused = bench(lambda: fsdist.sample(h, ws[next(it) % 2], seed=1, path="fused"))
            rows.append(dict(D=D, V=V, B=B, cublas_us=t_mm, chunked_us=t_chunk, fused_default_us=t_fused))
            print(f"D={D} V={V} B={B:3d} cublas={t_mm:7.1f}us fused(default cfg)={t_fused:7.1f}us "
                  f"chunked={t_chunk:7.1f}us", flush=True)
            summary.append(f"PATHS D={D} B={B:3d} cublas={t_mm:7.1f} fused={t_fused:7.1f} ({t_fused / t_mm:.3f}x) "
                           f"chunked={t_chunk:7.1f} ({t_chunk / t_mm:.3f}x)")
            if args.paths_only:
                continue
            results = []
            for cfg in [default] + [c for c in candidates(B, args.quick) if c != default]:
                if time.time() - t_start > args.budget_s:
                    break
                try:
                    t = bench(lambda: fsdist.sample(h, ws[next(it) % 2], seed=1, config=cfg))
                except Exception as e:  # out of resources and the like: skip the config
                    print(f"  skip {cfg}: {type(e).__name__}", flush=True)
                    continue
                results.append((t, cfg))
                rows.append(dict(D=D, V=V, B=B, cublas_us=t_mm, fsdist_us=t, **cfg.__dict__))
            results.sort(key=lambda r: r[0])
            t_def = next(t for t, c in results if c == default) if results else float("nan")
            line = (f"D={D} V={V} B={B:3d} cublas={t_mm:7.1f}us default={t_def:7.1f}us "
                    f"({t_def / t_mm:.3f}x) best={results[0][0]:7.1f}us ({results[0][0] / t_mm:.3f}x) "
                    f"{results[0][1]}" if results else f"D={D} B={B}: no results")
            print(line, flush=True)
            summary.append(line)
            for t, c in results[1:4]:
                print(f"      next {t:7.1f}us {c}", flush=True)
        del ws
        torch.cuda.empty_cache()
    meta = dict(gpu=dev, date=time.strftime("%Y-%m-%d"), torch=torch.__version__, triton=triton.__version__,
                cuda=torch.version.cuda, command=" ".join(sys.argv))
    name = f"tune_{dev.replace(' ', '_')}_{meta['date']}.json"
    for d in filter(None, ["bench/results", os.environ.get("OUT")]):
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, name), "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)
    print("\n".join(["", "SUMMARY"] + summary))


if __name__ == "__main__":
    main()
