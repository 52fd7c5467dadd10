#!/usr/bin/env python
"""How often the tiles' winners can prove a min-p row, on the CPU, in float64 with torch's Gumbel noise.

    python bench/minp_proof_model.py [--scales 1.2,1.6,2.0,2.5,3.0] [--draws 2000] [--min-p 0.05]

The rows are tests/test_gpu_serving.py's min-p chi-squared rows: one hidden state (D = 256) against a
weight of N(0, scale^2 / D) entries, V = 151936 in 128-id tiles, bf16 operands. select_filtered proves
a min-p row from the tiles' stage-1 winners unless an *open* tile (more survivors than the 4 logits it
keeps) has a winner that is not a survivor and scores above every survivor: then that tile's survivors
are unbounded and the row falls back. This model takes exactly that condition (fresh noise per draw;
the kernels' Philox noise is another stream of the same law), so its rate is the fallback rate to
expect. It chose the GPU test's "flat" spread: 1.6 (the H200 measured 44.8% at 1.2, the model 46%).
"""
import argparse
import math

import torch

V, D, TILE, KEEP = 151936, 256, 128, 4


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scales", default="1.2,1.6,2.0,2.5,3.0")
    p.add_argument("--draws", type=int, default=2000)
    p.add_argument("--min-p", type=float, default=0.05)
    args = p.parse_args()
    print(f"{'scale':>6} {'survivors':>10} {'open tiles':>11} {'fallback':>9}")
    for scale in (float(s) for s in args.scales.split(",")):
        g = torch.Generator().manual_seed(2027)  # the GPU test's seed: the same hidden state and weight
        h1 = torch.randn(1, D, generator=g)
        w = torch.randn(V, D, generator=g) * (scale / math.sqrt(D))
        logits = (h1.bfloat16().float() @ w.bfloat16().float().T)[0].double()
        padded = torch.full((-(-V // TILE) * TILE,), -math.inf, dtype=torch.double)
        padded[:V] = logits
        survives = padded >= logits.max() + math.log(args.min_p)
        open_tile = survives.view(-1, TILE).sum(1) > KEEP
        fell_back = 0
        for _ in range(args.draws):
            u = torch.rand(padded.shape, dtype=torch.double, generator=g)
            score = (padded - torch.log(-torch.log(u))).view(-1, TILE)
            best_survivor = score.view(-1)[survives].max()
            win_score, win_id = score.max(1)
            win_survives = survives.view(-1, TILE).gather(1, win_id[:, None])[:, 0]
            fell_back += bool((open_tile & ~win_survives & (win_score > best_survivor)).any())
        print(f"{scale:6.2f} {int(survives.sum()):10d} {int(open_tile.sum()):11d} {fell_back / args.draws:9.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
