#!/usr/bin/env python
"""Host time per call: is a method launch-bound?

    python bench/host_overhead.py [--shape 4096x151936] [--batches 1,64,256]
    launch/torchrun.sh 1 bench/host_overhead.py --head nvshmem,symm_mem,collective

For fsdist.sample (and, with ``--head``, a ShardedFlashLMHead per transport in the
torchrun world) in the serving case ([B] device tensors), back-to-back calls with no
synchronisation in between: the host's time to *submit* a call (perf_counter over the
loop, before the final sync) against the stream time per call (CUDA events around the
same loop). When host >= stream the GPU waits on Python and a faster kernel changes
nothing; a CUDA-graph replay removes the host part. ``--profile`` adds cProfile's top
functions by own time for the last batch size (rank 0). Prints a table last, writes JSON
to --out (default $OUT or bench/results).
"""
import common as C  # first: repo root on sys.path, safe NVSHMEM/NCCL environment

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

import fsdist  # noqa: E402


def host_and_stream_us(fn, iters: int, warmup: int, device):
    for _ in range(warmup):
        fn()
    C.sync(device)
    start = C.Stamp(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    host = (time.perf_counter() - t0) / iters * 1e6
    end = C.Stamp(device)
    C.sync(device)
    return host, start.us_to(end) / iters


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    C.add_problem_options(p)
    p.add_argument("--head", default="", help="comma list of transports for a ShardedFlashLMHead (needs a "
                   "torch.distributed launch, e.g. launch/torchrun.sh 1 ...)")
    p.add_argument("--filters", action="store_true", help="also time top-k 50 + top-p 0.9 and min-p 0.05 calls "
                   "([B] device tensors), whose host path plans and launches more (select_filtered, the fallback)")
    p.add_argument("--profile", action="store_true")
    args = p.parse_args()
    device, D, V, batches, iters, dtype = C.problem_from_args(args, gpu_iters=50, cpu_iters=3)
    g = torch.Generator(device="cpu").manual_seed(0)
    W = (torch.randn(V, D, generator=g) / D ** 0.5).to(device=device, dtype=dtype)
    rank, world = 0, 1
    heads = {}
    if args.head:
        from fsdist import distributed as fsd

        ctx = fsd.init_distributed()
        rank, world = ctx.rank, ctx.world_size
        for t in args.head.split(","):
            head = fsdist.ShardedFlashLMHead(D, V, transport=t, device=device, params_dtype=dtype,
                                             vocab_size_is_true=True, max_batch_size=max(batches))
            head.load_full_weight(W)
            heads[t] = head
    rows = []
    prof = None
    for B in batches:
        h = torch.randn(B, D, generator=g).to(device=device, dtype=dtype)
        temp = C.row_temperatures(B, 0.8).to(device)
        seed = torch.arange(B, device=device) * 7 + 1
        off = torch.zeros(B, dtype=torch.int64, device=device)
        methods = {"fsdist.sample": lambda: fsdist.sample(h, W, temperature=temp, seed=seed, offset=off)}
        if args.filters:
            top_k = torch.full((B, ), 50, dtype=torch.int64, device=device)
            top_p = torch.full((B, ), 0.9, device=device)
            min_p = torch.full((B, ), 0.05, device=device)
            methods["sample k50+p0.9"] = lambda: fsdist.sample(h, W, temperature=temp, seed=seed, offset=off,
                                                               top_k=top_k, top_p=top_p)
            methods["sample min_p0.05"] = lambda: fsdist.sample(h, W, temperature=temp, seed=seed, offset=off,
                                                                min_p=min_p)
        for t, head in heads.items():
            methods[f"head/{t}"] = (lambda _h=head: _h(h, temperature=temp, seed=seed, offset=off))
        for name, fn in methods.items():
            host, stream = host_and_stream_us(fn, iters, 3, device)
            rows.append({"B": B, "method": name, "host_us": host, "stream_us": stream})
            C.log(f"B={B:<4} {name:<22} host {host:8.1f} us/call  stream {stream:8.1f} us/call", rank=rank)
            if args.profile and B == batches[-1] and rank == 0:
                prof = (prof or "") + f"\n=== cProfile {name} B={B}, {iters} calls, by own time ===\n"
                prof += C.profile_top(fn, iters)
    C.sync(device)
    for head in heads.values():
        head.close()
    if heads:
        fsd.shutdown()
    if rank != 0:
        return 0
    if prof:
        print(prof)
    info = C.env_info()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"host_overhead_{C.gpu_slug(device)}_tp{world}_"
                                  f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json")
    with open(path, "w") as f:
        json.dump({"schema": C.SCHEMA, "env": info, "D": D, "V": V, "iters": iters, "rows": rows,
                   "profile": prof}, f, indent=1, default=str)
    print(f"\nD={D} V={V}, {iters} back-to-back calls, [B] tensors; host = submit time, stream = CUDA events")
    print(f"{'B':>5} {'method':<22} {'host us':>9} {'stream us':>10} {'host/stream':>12}")
    for r in rows:
        print(f"{r['B']:>5} {r['method']:<22} {r['host_us']:9.1f} {r['stream_us']:10.1f} "
              f"{r['host_us'] / max(r['stream_us'], 1e-9):12.2f}")
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
