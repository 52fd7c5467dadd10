#!/usr/bin/env python
"""The host's own Python per ``fsdist.sample`` call, on a CPU, with every kernel launch a no-op.

    TRITON_INTERPRET=1 python bench/host_cpu_probe.py [--shape 512x8192] [--batches 16,64]
        [--calls 30] [--rounds 60] [--kinds plain,topk_topp,minp,logprobs,processors] [--profile]

Why: an eager call on a GPU host is host-bound (docs/performance.md, "Eager calls are host-bound
at D = 4096"), and host time can be measured without a GPU if the kernels do not run. Under
Triton's interpreter every launch ``kernel[grid](...)`` ends in ``InterpretedFunction.run``;
this script replaces that one method with a function that returns at once, so what is timed is
fsdist's validation, planning, allocations and launch-argument building, and nothing of the
kernels' bodies. Outputs are then uninitialised memory, which is fine: the host never reads a
device value (no synchronisation), so the same host path runs whatever they hold; except on a CPU device,
where the fallback counts its flagged rows on the host: the probe sets select_filtered's flags to True, so
every filtered call runs one fallback round, as a GPU launches its rounds whatever the flags.

What it does not measure: Triton's own launch cost on a GPU (argument specialisation, the
driver), and the GPU-only host paths that the interpreter never takes (the warp-specialised
Hopper kernel, programmatic dependent launches, TMA descriptors, device queries such as the
capability). It measures the host code that every device shares, plus a little that only a CPU
runs (the processors' entries sorted by torch.sort and the fallback's host count of its rows). The CPU
is also faster per Python operation than some GPU hosts (the H200's: ~4-5x), so compare before /
after on one machine, not with GPU figures.

Calls: the serving case, ``[B]`` tensors for temperature, seed and offset (distinct
temperatures), and per kind: ``plain``; ``topk_topp`` (top-k 50 + top-p 0.9 as ``[B]``
tensors); ``minp`` (min-p 0.05); ``logprobs`` (return_logprobs, top_logprobs 5);
``processors`` (a token bitmask, a 16-slot logit bias and all three penalties over 32 output and
32 prompt ids). Each kind: ``--rounds`` rounds of ``--calls`` back-to-back calls after a warm-up, the
kinds interleaved round by round (a slow spell of the machine hits all of them); prints the best
round's µs per call (the least disturbed by the rest of the machine: on a shared VM the median is
often 1.5-2x the best) and the median, a table last; ``--profile`` adds cProfile's top functions by
own time for each kind at the last batch size.
"""
import common as C  # first: repo root on sys.path, safe NVSHMEM/NCCL environment

import argparse  # noqa: E402
import functools  # noqa: E402
import gc  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

import fsdist  # noqa: E402
from fsdist import sampling  # noqa: E402
from fsdist.runtime import interpreting  # noqa: E402

KINDS = ("plain", "topk_topp", "minp", "logprobs", "processors")


def stub_launches() -> dict:
    """Make every interpreted kernel launch return at once; returns the launch counter (per kernel name)."""
    from triton.runtime.interpreter import InterpretedFunction

    counts: dict = {}

    def run(self, *args, grid, warmup, **kwargs):
        # (the real method also evaluates a callable grid; fsdist passes tuples)
        name = self.fn.__name__
        counts[name] = counts.get(name, 0) + 1

    InterpretedFunction.run = run
    # Flag every row for the fallback: on a CPU device fallback.run_fallback counts the flagged rows on the host (a
    # GPU launches every round without looking), so uninitialised flags would make the number of fallback launches
    # vary from call to call.
    select = sampling.launch_select_filtered

    def select_flagging_every_row(*args, **kwargs):
        return select(*args, **kwargs).fill_(True)

    sampling.launch_select_filtered = select_flagging_every_row
    return counts


def call_args(kind: str, B: int, V: int, device) -> dict:
    """The keyword arguments of one kind of call (besides hidden and weight)."""
    kw = dict(temperature=torch.linspace(0.6, 1.0, B, device=device),
              seed=torch.arange(B, dtype=torch.int64, device=device),
              offset=torch.full((B,), 7, dtype=torch.int64, device=device))
    if kind == "topk_topp":
        kw.update(top_k=torch.full((B,), 50, dtype=torch.int64, device=device),
                  top_p=torch.full((B,), 0.9, device=device))
    elif kind == "minp":
        kw.update(min_p=torch.full((B,), 0.05, device=device))
    elif kind == "logprobs":
        kw.update(return_logprobs=True, top_logprobs=5)
    elif kind == "processors":
        g = torch.Generator(device="cpu").manual_seed(1)
        words = (V + 31) // 32
        kw.update(token_bitmask=torch.full((B, words), -1, dtype=torch.int32, device=device),
                  logit_bias=fsdist.SparseLogits(torch.randint(0, V, (B, 16), generator=g).to(device),
                                                 torch.randn(B, 16, generator=g).to(device)),
                  penalties=fsdist.Penalties(repetition=torch.full((B,), 1.1, device=device),
                                             frequency=torch.full((B,), 0.2, device=device),
                                             presence=torch.full((B,), 0.1, device=device),
                                             output_ids=torch.randint(0, V, (B, 32), generator=g).to(device),
                                             prompt_ids=torch.randint(0, V, (B, 32), generator=g).to(device)))
    elif kind != "plain":
        raise ValueError(f"unknown kind {kind!r} (one of {', '.join(KINDS)})")
    return kw


def time_rounds(fn, calls: int, rounds: int) -> list:
    """µs per call of each round of ``calls`` back-to-back calls."""
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t0) / calls * 1e6)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="512x8192", help="DxV of the weight (small: only the host is timed)")
    p.add_argument("--batches", default="16,64")
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--calls", type=int, default=30,
                   help="calls per round (short rounds: more chances of an undisturbed one)")
    p.add_argument("--rounds", type=int, default=60)
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--profile", action="store_true", help="cProfile's top functions per kind (last batch size)")
    p.add_argument("--top", type=int, default=30, help="lines of each --profile list")
    args = p.parse_args()
    if not interpreting():
        print("host_cpu_probe: needs Triton's interpreter (TRITON_INTERPRET=1, or a machine without a GPU)",
              file=sys.stderr)
        return 2
    D, V = (int(x) for x in args.shape.lower().split("x"))
    batches = C.parse_int_list(args.batches)
    kinds = [k for k in args.kinds.split(",") if k]
    dtype = C.parse_dtype(args.dtype)
    device = torch.device("cpu")
    counts = stub_launches()
    g = torch.Generator(device="cpu").manual_seed(0)
    weight = (torch.randn(V, D, generator=g) / D ** 0.5).to(dtype)
    C.log(f"host_cpu_probe: fsdist {os.path.dirname(fsdist.__file__)}, torch {torch.__version__}, "
          f"D={D} V={V}, {args.rounds} rounds x {args.calls} calls, kernels stubbed")
    table = []
    for B in batches:
        hidden = torch.randn(B, D, generator=g).to(dtype)
        fns, launched = {}, {}
        for kind in kinds:
            kw = call_args(kind, B, V, device)
            fns[kind] = functools.partial(fsdist.sample, hidden, weight, **kw)
            for _ in range(max(5, args.calls // 10)):  # warm-up: first-call caches, the interpreter's rewrite
                fns[kind]()
            counts.clear()
            fns[kind]()
            launched[kind] = dict(counts)
        # Kinds interleaved round by round, so a slow spell of the machine hits each of them alike.
        us = {kind: [] for kind in kinds}
        gc.collect()
        for _ in range(args.rounds):
            for kind in kinds:
                us[kind] += time_rounds(fns[kind], args.calls, 1)
        for kind in kinds:
            best, med = min(us[kind]), statistics.median(us[kind])
            table.append((B, kind, sum(launched[kind].values()), best, med))
            C.log(f"B={B:<4} {kind:<11} launches {table[-1][2]}  best {best:7.1f} µs  median {med:7.1f} µs  "
                  f"({', '.join(sorted(launched[kind]))})")
            if args.profile and B == batches[-1]:
                print(f"--- cProfile, B={B} {kind}, {args.calls} calls, by own time")
                print(C.profile_top(fns[kind], args.calls, args.top))
    print(f"\n{'B':>5} {'kind':<11} {'launches':>8} {'best µs':>9} {'median µs':>10}")
    for B, kind, launches, best, med in table:
        print(f"{B:>5} {kind:<11} {launches:>8} {best:>9.1f} {med:>10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
