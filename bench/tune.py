"""Sweep fsdist tile configurations, next to cuBLAS in the same run.

    python bench/tune.py [--shapes 4096x151936 8192x128256] [--batches 1 16 64 256] [--quick]
    python bench/tune.py                 # without a GPU: a tiny smoke run under the interpreter

Prints, per (shape, B), cuBLAS time and the best configs (as TileConfig.name, e.g.
64x128x64w8s4; kernel_bench --configs reads that spelling); writes every timing as JSON
to bench/results/ (and $OUT when set). Its winners feed fsdist/ops/configs.py.
Timing: fsdist.timing.median_us, L2 flushed before every call, two weight copies rotated.
Without a GPU it runs a small shape with a few configs to check the code paths; those
timings mean nothing and go nowhere unless --out is given.
"""
import common as C  # first: the repo root on sys.path, fsdist.env.apply_safe_env() before torch

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402

import fsdist  # noqa: E402
from fsdist.ops.configs import TileConfig, default_config  # noqa: E402
from fsdist.timing import median_us  # noqa: E402


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


def main():
    dev = C.bench_device()
    on_gpu = dev.type == "cuda"
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=["4096x151936", "8192x128256"] if on_gpu else ["64x1000"])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 16, 64, 256] if on_gpu else [1, 4])
    ap.add_argument("--quick", action="store_true", help="skip num_stages=3 and block_k=256 (always on without a GPU)")
    ap.add_argument("--paths-only", action="store_true", help="only compare the fused and chunked paths")
    ap.add_argument("--budget-s", type=float, default=400.0 if on_gpu else 20.0, help="stop sweeping after this long")
    ap.add_argument("--warmup", type=int, default=10 if on_gpu else 1, help="warm-up calls per measurement")
    ap.add_argument("--reps", type=int, default=100 if on_gpu else 2, help="timed calls per measurement (median)")
    ap.add_argument("--out", help="directory for the JSON (default bench/results/ on a GPU, none on CPU)")
    args = ap.parse_args()
    quick = args.quick or not on_gpu
    t_start = time.time()
    name_dev = torch.cuda.get_device_name() if on_gpu else "cpu"
    dtype = torch.bfloat16 if on_gpu else torch.float32  # bf16 tl.dot is not trusted under the interpreter
    flush = C.L2Flusher(dev)

    def bench(fn, arg_sets):
        return median_us(fn, arg_sets, warmup=args.warmup, reps=args.reps, flush=flush, device=dev)

    rows = []
    summary = []
    for shape in args.shapes:
        D, V = map(int, shape.split("x"))
        ws = [(torch.randn(V, D, device=dev, dtype=dtype) * 0.02,) for _ in range(2)]  # rotated: never L2-warm
        for B in args.batches:
            h = torch.randn(B, D, device=dev, dtype=dtype)
            t_mm = bench(lambda w: h @ w.T, ws)
            default = default_config(B, D, dev)
            t_chunk = bench(lambda w: fsdist.sample(h, w, seed=1, path="chunked"), ws)
            t_fused = bench(lambda w: fsdist.sample(h, w, seed=1, path="fused"), ws)
            rows.append(dict(D=D, V=V, B=B, cublas_us=t_mm, chunked_us=t_chunk, fused_default_us=t_fused))
            print(f"D={D} V={V} B={B:3d} cublas={t_mm:7.1f}us fused(default cfg)={t_fused:7.1f}us "
                  f"chunked={t_chunk:7.1f}us", flush=True)
            summary.append(f"PATHS D={D} B={B:3d} cublas={t_mm:7.1f} fused={t_fused:7.1f} ({t_fused / t_mm:.3f}x) "
                           f"chunked={t_chunk:7.1f} ({t_chunk / t_mm:.3f}x)")
            if args.paths_only:
                continue
            results = []
            # the candidates carry the default's first-wave stagger (configs.first_wave_stagger_us): a sweep compares
            # tiles, not the stagger
            cands = [dataclasses.replace(c, stagger_us=default.stagger_us) for c in candidates(B, quick)]
            for cfg in [default] + [c for c in cands if c != default]:
                if results and time.time() - t_start > args.budget_s:  # the default config is always timed
                    break
                try:
                    t = bench(lambda w, _c=cfg: fsdist.sample(h, w, seed=1, config=_c), ws)
                except Exception as e:  # out of resources and the like: skip the config
                    print(f"  skip {cfg.name}: {type(e).__name__}", flush=True)
                    continue
                results.append((t, cfg))
                rows.append(dict(D=D, V=V, B=B, cublas_us=t_mm, fsdist_us=t, **cfg.__dict__))
            results.sort(key=lambda r: r[0])
            t_def = next(t for t, c in results if c == default) if results else float("nan")
            line = (f"D={D} V={V} B={B:3d} cublas={t_mm:7.1f}us default={t_def:7.1f}us "
                    f"({t_def / t_mm:.3f}x) best={results[0][0]:7.1f}us ({results[0][0] / t_mm:.3f}x) "
                    f"{results[0][1].name}" if results else f"D={D} B={B}: no results")
            print(line, flush=True)
            summary.append(line)
            for t, c in results[1:4]:
                print(f"      next {t:7.1f}us {c.name}", flush=True)
        del ws
        if on_gpu:
            torch.cuda.empty_cache()
    meta = dict(gpu=name_dev, date=time.strftime("%Y-%m-%d"), torch=torch.__version__, triton=triton.__version__,
                cuda=torch.version.cuda, command=" ".join(sys.argv))
    name = f"tune_{name_dev.replace(' ', '_')}_{meta['date']}.json"
    dirs = [args.out or (str(C.RESULTS_DIR) if on_gpu else None), os.environ.get("OUT")]
    for d in filter(None, dirs):
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, name), "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)
        print(f"results: {os.path.join(d, name)}", flush=True)
    print("\n".join(["", "SUMMARY"] + summary))


if __name__ == "__main__":
    main()
