"""Issue 11: a target for Nsight Compute (ncu) — whole filtered calls, one call per case.

After one warm-up round (compiles), runs one ``fsdist.sample`` call per case in a fixed order, each
in an NVTX range "<round>:<case>", so that ncu with ``--nvtx --nvtx-include "regex:profiled:.*/"``
profiles every kernel of exactly the second round's calls:

  plain_B<B>   [B] temperatures, no filter (stage 1 with the plain epilogue, merge)
  topkp_B<B>   the same with top-k 50 + top-p 0.9 as [B] tensors (extended stage 1, merge,
               select_filtered, the fallback's gated launches)
  minp_B<B>    the same with min-p 0.05

The question (docs/performance.md, v21): where the extended stage-1 epilogue's time goes at B = 64
(it is ~+35 µs there, ~+7 at B = 1) and what select_filtered's one program per row waits on.
GPU only; D = 4096, V = 151936 unless --shape says otherwise.
"""
import common as C  # first: the repo root on sys.path, fsdist.env.apply_safe_env() before torch

import argparse  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402

import fsdist  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="4096x151936")
    p.add_argument("--batches", default="1,64")
    p.add_argument("--cases", default="plain,topkp,minp")
    args = p.parse_args(argv)
    cases = args.cases.split(",")
    unknown = sorted(set(cases) - {"plain", "topkp", "minp"})
    if unknown:
        p.error(f"--cases: unknown {unknown}; choose from plain, topkp, minp")
    dev = C.bench_device()
    if dev.type != "cuda":
        print("filter_profile: skipped, needs a CUDA GPU.", flush=True)
        return 0
    (D, V), = C.parse_shapes(args.shape)
    g = torch.Generator(device=dev).manual_seed(0)
    W = (torch.randn(V, D, device=dev, generator=g) * (2.0 / D ** 0.5)).to(torch.bfloat16)
    calls = []
    for B in C.parse_int_list(args.batches):
        h = torch.randn(B, D, device=dev, generator=g).to(torch.bfloat16)
        rows = torch.arange(B, device=dev)
        base = dict(temperature=torch.full((B,), 0.8, device=dev), seed=rows + 1, offset=rows * 0)
        kw = {"plain": {},
              "topkp": dict(top_k=torch.full((B,), 50, device=dev, dtype=torch.int32),
                            top_p=torch.full((B,), 0.9, device=dev)),
              "minp": dict(min_p=torch.full((B,), 0.05, device=dev))}
        for case in cases:
            calls.append((f"{case}_B{B}", lambda h=h, base=base, k=kw[case]: fsdist.sample(h, W, **base, **k)))
    for _round in ("warm-up", "profiled"):
        for name, fn in calls:
            torch.cuda.nvtx.range_push(f"{_round}:{name}")
            fn()
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_pop()
        C.log(f"{_round} round done")
    print("cases, in launch order (each round):", ", ".join(n for n, _ in calls), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
