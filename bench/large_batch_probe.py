"""Where an fsdist.sample call at a large batch spends its time: per-call device time (CUDA events,
L2 flushed, inputs rotated, as the harness times it), the host time of the call itself, and the
CUDA kernels of a few calls under torch.profiler (device time per call, by kernel name).

A development probe (issue 14): it explains a harness number, it is not one.

    python3 bench/large_batch_probe.py [--shape 4096x151936] [--batches 128,192,256] [--reps 10]
"""
import common as C  # first: repo root on sys.path, safe environment before torch

import argparse  # noqa: E402
import collections  # noqa: E402
import statistics  # noqa: E402
import cProfile  # noqa: E402
import io  # noqa: E402
import pstats  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

import fsdist  # noqa: E402
from fsdist.ops.configs import chunk_rows_for, chunk_workspace_bytes  # noqa: E402
from fsdist.ops.plan import plan_sample  # noqa: E402


# Host-side pieces of one call, timed by wrapping the names the callers look up (module, attribute).
# Pieces nest (launch_stage1 contains the chunk launches), so the lines below the total overlap.
HOST_PIECES = [("fsdist.processing", "prepare_call_rows"), ("fsdist.sampling", "plan_sample"),
               ("fsdist.sampling", "launch_stage1"), ("fsdist.sampling", "launch_merge"),
               ("fsdist.ops.sample_logits", "chunk_logits"), ("fsdist.ops.sample_logits", "launch_apply_entries"),
               ("fsdist.ops.sample_logits", "launch_sample_logits"), ("fsdist.ops.fused_sample", "tma_operands"),
               ("fsdist.ops.fused_sample", "processor_args"), ("fsdist.ops.layout.BufferPair", "alloc")]


def host_breakdown(call, arg, n=50):
    """Host microseconds per call of each piece in HOST_PIECES (the GPU kept busy meanwhile)."""
    import importlib

    spent = collections.defaultdict(float)
    undo = []

    def wrap(label, fn):
        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[label] += time.perf_counter() - t0
        return timed

    for mod_name, attr in HOST_PIECES:
        if mod_name.endswith(".BufferPair"):
            owner = importlib.import_module(mod_name.rsplit(".", 1)[0]).BufferPair
        else:
            owner = importlib.import_module(mod_name)
        orig = owner.__dict__[attr]
        if isinstance(orig, classmethod):
            new = classmethod(wrap(f"BufferPair.{attr}", orig.__func__))
        else:
            new = wrap(f"{mod_name.split('.')[-1]}.{attr}", orig)
        setattr(owner, attr, new)
        undo.append((owner, attr, orig))
    try:
        torch.cuda._sleep(200_000_000)  # keep the GPU busy for the whole loop
        t0 = time.perf_counter()
        for _ in range(n):
            call(arg)
        total = time.perf_counter() - t0
    finally:
        for owner, attr, orig in undo:
            setattr(owner, attr, orig)
        torch.cuda.synchronize()
    print(f"    host per call {total / n * 1e6:.1f} us; pieces (nested ones overlap):")
    for label, sec in sorted(spent.items(), key=lambda kv: -kv[1]):
        print(f"      {sec / n * 1e6:8.1f} us  {label}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="4096x151936")
    ap.add_argument("--batches", default="128,192,256")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--host-lines", type=int, default=30, help="lines of the host profile printed")
    args = ap.parse_args(argv)
    dev = C.bench_device()
    if dev.type != "cuda":
        print("large_batch_probe: needs a CUDA GPU; nothing to do here")
        return 0
    (D, V), = C.parse_shapes(args.shape)
    W = (torch.randn(V, D, device=dev) * D ** -0.5).to(torch.bfloat16)
    flush = C.L2Flusher(dev)
    props = torch.cuda.get_device_properties(dev)
    print(f"L2_cache_size {getattr(props, 'L2_cache_size', None)}  chunk budget {chunk_workspace_bytes(dev)}")
    for B in C.parse_int_list(args.batches):
        hs = [torch.randn(B, D, device=dev).to(torch.bfloat16) for _ in range(4)]
        seed = torch.randint(0, 2**62, (B,), device=dev)
        off = torch.randint(0, 2**40, (B,), device=dev)
        plan = plan_sample(batch=B, hidden_size=D, weight_rows=V, device=dev, dtype=hs[0].dtype)  # as sample() plans
        rows = chunk_rows_for(B, V, plan.config.block_v, chunk_workspace_bytes(dev))
        print(f"\nB={B}: path {plan.path}, config {plan.config.name}, chunk rows {rows} ({-(-V // rows)} chunks)")
        for label, temp in (("scalar T", 1.0), ("[B] T", torch.ones(B, device=dev))):
            def call(h):
                return fsdist.sample(h, W, temperature=temp, seed=seed, offset=off).tokens
            dev_us = C.time_calls(call, [(h,) for h in hs], warmup=5, reps=args.reps, flush=flush, device=dev)
            host = []
            for i in range(args.reps):
                flush()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                call(hs[i % 4])
                host.append((time.perf_counter() - t0) * 1e6)
                torch.cuda.synchronize()
            same = C.time_calls(call, [(hs[0],)], warmup=3, reps=args.reps, device=dev)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for i in range(5):
                    flush()
                    call(hs[i % 4])
                torch.cuda.synchronize()
            per = collections.defaultdict(float)
            for ev in prof.events():
                if ev.device_type == torch.autograd.DeviceType.CUDA:
                    per[ev.name[:70]] += ev.device_time / 5
            # The host's own cost, with the GPU kept busy so that nothing waits on it: a call that
            # synchronises shows up as a host time near the sleep; a slow enqueue as Python time.
            busy = []
            pr = cProfile.Profile()
            for i in range(args.reps):
                torch.cuda._sleep(20_000_000)  # ~10 ms of GPU clock cycles
                t0 = time.perf_counter()
                pr.enable()
                call(hs[i % 4])
                pr.disable()
                busy.append((time.perf_counter() - t0) * 1e6)
                torch.cuda.synchronize()
            stats = io.StringIO()
            pstats.Stats(pr, stream=stats).sort_stats("cumulative").print_stats(args.host_lines)
            print(f"  {label}: device {statistics.median(dev_us):.1f} us (flushed, rotated), "
                  f"{statistics.median(same):.1f} us (same input, no flush); host {statistics.median(host):.1f} us, "
                  f"{statistics.median(busy):.1f} us with the GPU busy")
            for name, us in sorted(per.items(), key=lambda kv: -kv[1]):
                if us >= 0.5:
                    print(f"      {us:8.1f} us  {name}")
            if label == "[B] T":
                host_breakdown(call, hs[0])
                print("    host profile (cumulative, %d calls):" % args.reps)
                print("\n".join("      " + ln for ln in stats.getvalue().splitlines() if ln.strip())[:6000])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
