#!/usr/bin/env python
"""How often min-p rows of the kernel bench's logits need the exact fallback, with and without
select_filtered's proof from the tiles' winners (docs/performance.md, v28).

    python bench/minp_winner_rate.py [--rows 2048] [--batch 64] [--vocab 151936] [--min-p 0.05]

The family is the kernel bench's: logits N(0, 2^2) per id (its hidden states N(0, 1) and weight
N(0, 4 / D)), temperatures spread over [0.6, 1] ([B] tensor), min-p alone, V = 151936, 128-id
tiles (a GPU's stage-1 tile). Each row's logits are set directly (one-hot hidden states, the weight
holding the logits), so the interpreter runs the real kernels on a CPU in minutes, and fallback
decisions do not depend on the hardware. Every call runs twice, with the winners and with
``winners=False`` (the rule before v28): the tokens must be equal; the table gives both fallback
rates with 95% Wilson upper bounds. JSON to --out (default bench/results/).
"""
import common as C  # first: repo root on sys.path, safe NVSHMEM/NCCL environment

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

import fsdist  # noqa: E402
import fsdist.ops.select_filtered as sf  # noqa: E402
import fsdist.sampling as sampling  # noqa: E402
from fallback_rate import wilson_upper  # noqa: E402
from fsdist import TileConfig  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=2048, help="rows to run (a whole number of --batch: rounded down)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--min-p", type=float, default=0.05)
    p.add_argument("--spread", type=float, default=2.0, help="standard deviation of the logits")
    p.add_argument("--max-seconds", type=float, default=1e9)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    if args.batch < 1 or args.rows < args.batch:
        p.error(f"--rows ({args.rows}) must be at least --batch ({args.batch}) >= 1: rows run a batch at a time")
    device = C.bench_device()
    V, B = args.vocab, args.batch
    gen = torch.Generator().manual_seed(0)
    real = sf.launch_select_filtered
    cfg = TileConfig(B, 128, 32, num_stages=1) if device.type == "cpu" else TileConfig(32, 128, 64, num_warps=4,
                                                                                       num_stages=2)
    counts = {"rows": 0, "winners": 0, "before": 0, "mismatch": 0}
    t0 = time.time()
    for call in range(args.rows // B):
        if time.time() - t0 > args.max_seconds:
            break
        logits = torch.randn(B, V, generator=gen) * args.spread
        temp = C.row_temperatures(B, 0.8, device=torch.device("cpu")).float()
        h = torch.eye(B, device=device)
        w = logits.t().contiguous().to(device)
        kw = dict(temperature=temp.to(device), seed=torch.arange(B, device=device) + call * B, offset=call,
                  min_p=torch.full((B,), args.min_p, device=device), config=cfg, path="fused")
        with_w = fsdist.sample(h, w, **kw)
        sampling.launch_select_filtered = lambda *a, **k: real(*a, **{**k, "winners": False})
        try:
            before = fsdist.sample(h, w, **kw)
        finally:
            sampling.launch_select_filtered = real
        counts["rows"] += B
        counts["winners"] += int(with_w.fallback.sum())
        counts["before"] += int(before.fallback.sum())
        counts["mismatch"] += int((with_w.tokens != before.tokens).sum())
        C.log(f"call {call}: {counts}")
    n = counts["rows"]
    if n == 0:
        print(f"no batch ran within --max-seconds {args.max_seconds}: nothing to report")
        return 1
    res = {"family": f"logits N(0, {args.spread}^2), T in [0.6, 1], min_p {args.min_p}, V {V}, 128-id tiles",
           "counts": counts,
           "rate_before": counts["before"] / n, "rate_before_upper95": wilson_upper(counts["before"], n),
           "rate_winners": counts["winners"] / n, "rate_winners_upper95": wilson_upper(counts["winners"], n),
           "device": device.type, "env": C.env_info()}
    if not args.out or os.path.isdir(args.out):
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        path = os.path.join(args.out or str(C.RESULTS_DIR), f"minp_winner_rate_{C.gpu_slug(device)}_{stamp}.json")
    else:
        path = args.out
    with open(path, "w") as f:
        json.dump(res, f, indent=1, default=C._json_default)
    print(f"\nmin-p {args.min_p} rows of the kernel bench's family ({res['family']}), {n} rows:")
    print(f"  fallback before v28 (kept logits only): {100 * res['rate_before']:.2f}% "
          f"(95% upper {100 * res['rate_before_upper95']:.2f}%)")
    print(f"  fallback with the winners' proof:      {100 * res['rate_winners']:.2f}% "
          f"(95% upper {100 * res['rate_winners_upper95']:.2f}%)")
    print(f"  tokens that differ between the two: {counts['mismatch']}")
    print("results:", path)
    return 0 if counts["mismatch"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
