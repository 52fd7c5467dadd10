"""Smoke test for a launch: every rank samples with ShardedFlashLMHead and checks TP invariance.

    launch/mpirun.sh 2 launch/smoke_test.py
    launch/torchrun.sh 4 launch/smoke_test.py --transport auto --reduction group_logmass

Prints one "OK" line per rank and exits non-zero on a mismatch.
"""
import argparse
import os
import sys

import torch

import fsdist
from fsdist.distributed import SAFE_ENV, distributed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--transport", default="auto")
    ap.add_argument("--reduction", default="candidates")
    ap.add_argument("--vocab", type=int, default=1000)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--no-close", action="store_true", help="skip head.close() (tests exit-time cleanup)")
    args = ap.parse_args()
    with distributed() as ctx:
        g = torch.Generator().manual_seed(0)
        W = torch.randn(args.vocab, args.hidden, generator=g).to(ctx.device, torch.bfloat16)
        h = torch.randn(args.batch, args.hidden, generator=g).to(ctx.device, torch.bfloat16)
        head = fsdist.ShardedFlashLMHead(args.hidden, args.vocab, transport=args.transport,
                                         reduction=args.reduction, device=ctx.device)
        head.load_full_weight(W)
        out = head(h, seed=1, offset=2, return_logprobs=True)
        ok = bool((out.tokens >= 0).all() and (out.tokens < args.vocab).all())
        if args.reduction == "candidates":
            ref = fsdist.sample(h, W, seed=1, offset=2, vocab_size=args.vocab)
            ok = ok and torch.equal(out.tokens, ref.tokens)
        env_ok = all(os.environ.get(k) == v for k, v in SAFE_ENV.items())
        if not args.no_close:
            head.close()
        line = (f"{'OK' if ok and env_ok else 'FAIL'} rank {ctx.rank}/{ctx.world_size} local {ctx.local_rank} "
                f"device {ctx.device} backend {ctx.backend} transport {head.transport_name} "
                f"launcher {ctx.launcher} tokens {out.tokens.tolist()}\n")
        sys.stdout.write(line)  # one write per rank: ranks share the output pipe
        sys.stdout.flush()
    sys.exit(0 if ok and env_ok else 1)


if __name__ == "__main__":
    main()
