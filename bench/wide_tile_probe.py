"""Issue 14: the warp-specialised kernel's wide tile (128 x 256 x 64, two MMA warpgroups) against its 128 x 128 tile.

A development probe (docs/performance.md v82). First a bit-level check: on each check cell the wide tile's candidate
of every (row, 256-id tile) must be the larger of the 128-id tile's two candidates there (the lower id on equal
scores; poisoned rows NaN / -1 in both), bit for bit, for `[B]` parameters with greedy, hot, cold and poisoned rows,
scalar parameters and an all-greedy batch; then whole `fsdist.sample` calls as CUDA-graph replays (L2 flushed, `[B]`
temperature / seed / offset, 4 calls a graph), side by side:

  cublas     F.linear(h, W): the bf16 matmul alone (issue 14's yardstick)
  shipped    fsdist.sample as dispatched (fused or chunked, configs.choose_path / pick_config)
  ws128      path="fused", the 128 x 128 x 64 ws tile (128x128x64w8s5t-ws)
  wide_s<S>  path="fused", the wide tile with S stages (128x256x64w8s<S>t-ws); its tokens checked against ws128's

    python3 bench/wide_tile_probe.py [--shapes 4096x151936,8192x128256] [--batches 128,192,256,384,512,768,1024]

``--stage1`` times stage 1 alone instead (CUDA events, L2 flushed, medians; the check first as above): each tile
with `[B]` parameters (noise), all-greedy (no noise: the main loop with the lightest epilogue) and with its main loop
skipped (``epilogue_only``: the epilogue's own time), to split a difference between the main loop and the epilogue.

Prints a table last; the JSON goes to $OUT (default bench/results) as wide_tile_probe_<gpu>_<date>.json. sm_90 only.
"""
import common as C  # first: the repo root on sys.path, fsdist.env.apply_safe_env() before torch

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import fsdist  # noqa: E402
from fsdist.ops.configs import TileConfig  # noqa: E402
from fsdist.ops.fused_sample import tile_operand  # noqa: E402
from fsdist.ops.fused_sample_ws import WS_WIDE_BLOCK_V, launch_fused_ws  # noqa: E402
from fsdist.ops.layout import BufferPair, CandidateLayout  # noqa: E402
from fsdist.ops.utils import cdiv  # noqa: E402
from fsdist.params import RowParams  # noqa: E402
from fsdist.timing import CapturedGraph, L2Flusher, time_graph  # noqa: E402

WS128 = "128x128x64w8s5t-ws"


def serving_params(B, dev, g):
    """[B] tensors: T = 1 mostly, some greedy (0), hot (1.7) and cold (0.3) rows, one negative and one NaN
    temperature (poisoned rows) when B allows."""
    t = torch.ones(B, device=dev)
    t[1::7] = 0.0
    t[2::11] = 1.7
    t[3::13] = 0.3
    if B > 40:
        t[17] = -1.0
        t[33] = float("nan")
    return RowParams(t, torch.randint(0, 2**62, (B, ), device=dev, generator=g),
                     torch.randint(0, 2**40, (B, ), device=dev, generator=g))


def pair_max(ref: BufferPair, layout: CandidateLayout, B: int, n_wide: int):
    """Each row's candidate over 256-id tiles from the 128-id tiles' (score, id): the second of a pair only when
    strictly larger; a NaN pair (a poisoned row) stays NaN / -1."""
    f = ref.f[:layout.n_slots * layout.stride_slot].view(layout.n_slots, layout.stride_slot)[:, :B]
    i = ref.i[:layout.n_slots * layout.stride_slot].view(layout.n_slots, layout.stride_slot)[:, :B]
    f_out = torch.empty(n_wide, B, device=f.device)
    i_out = torch.empty(n_wide, B, dtype=i.dtype, device=i.device)
    for j in range(n_wide):
        a_f, a_i = f[2 * j], i[2 * j]
        if 2 * j + 1 < f.shape[0]:
            take = f[2 * j + 1] > a_f
            f_out[j] = torch.where(take, f[2 * j + 1], a_f)
            i_out[j] = torch.where(take, i[2 * j + 1], a_i)
        else:
            f_out[j], i_out[j] = a_f, a_i
    return f_out, i_out


def check_cell(D, V, B, dev, stages, failures):
    g = torch.Generator(device=dev).manual_seed(2000 + B)
    W = (torch.randn(V, D, device=dev, generator=g) * D ** -0.5).to(torch.bfloat16)
    h = torch.randn(B, D, device=dev, generator=g).to(torch.bfloat16)
    lay128 = CandidateLayout(1, cdiv(V, 128), B)
    n_wide = cdiv(V, WS_WIDE_BLOCK_V)
    lay256 = CandidateLayout(1, n_wide, B)
    hp = tile_operand(h, 128, min_rows=1)
    n = 0
    for params in (serving_params(B, dev, g), RowParams(0.8, 1234, 99), RowParams(0.0, 0, 0)):
        ref = BufferPair.alloc(lay128, dev)
        ref.f.fill_(7.0)
        ref.i.fill_(7)
        launch_fused_ws(hp, W, params, lay128, ref, vocab_size=V, batch=B)
        want_f, want_i = pair_max(ref, lay128, B, n_wide)
        for s in stages:
            got = BufferPair.alloc(lay256, dev)
            got.f.fill_(7.0)
            got.i.fill_(7)
            try:
                launch_fused_ws(hp, W, params, lay256, got, vocab_size=V, batch=B, stages=s,
                                block_v=WS_WIDE_BLOCK_V)
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001  (report, keep going)
                failures.append(f"D={D} V={V} B={B} wide_s{s}: {type(e).__name__}: {str(e)[:400]}")
                continue
            f = got.f[:n_wide * lay256.stride_slot].view(n_wide, lay256.stride_slot)[:, :B]
            i = got.i[:n_wide * lay256.stride_slot].view(n_wide, lay256.stride_slot)[:, :B]
            same = torch.equal(i, want_i) and torch.equal(torch.nan_to_num(f, nan=-12345.0),
                                                            torch.nan_to_num(want_f, nan=-12345.0))
            n += 1
            if not same:
                failures.append(f"D={D} V={V} B={B} wide_s{s}: candidates differ ({(i != want_i).sum().item()} ids "
                                f"of {i.numel()})")
    C.log(f"check D={D} V={V} B={B}: {n} comparisons")


def stage1_table(args, dev, stages, failures, flush) -> int:
    from fsdist.timing import median_us

    rows = []
    for shape in args.shapes.split(","):
        D, V = (int(x) for x in shape.split("x"))
        g = torch.Generator(device=dev).manual_seed(7)
        W = (torch.randn(V, D, device=dev, generator=g) * D ** -0.5).to(torch.bfloat16)
        for B in (int(x) for x in args.batches.split(",")):
            h = tile_operand(torch.randn(B, D, device=dev, generator=g).to(torch.bfloat16), 128, min_rows=1)
            noisy = serving_params(B, dev, g)
            greedy = RowParams(0.0, 0, 0)
            cell = {"D": D, "V": V, "B": B, "cublas": median_us(lambda: F.linear(h[:B], W), flush=flush,
                                                                reps=args.reps)}
            tiles = [("ws128", 128, 4)] + [(f"wide_s{s}", WS_WIDE_BLOCK_V, s) for s in stages]
            for name, bv, st in tiles:
                lay = CandidateLayout(1, cdiv(V, bv), B)
                buf = BufferPair.alloc(lay, dev)
                for kind, params, epi in (("", noisy, False), ("_greedy", greedy, False), ("_epi", noisy, True)):
                    def call(params=params, epi=epi, lay=lay, buf=buf, bv=bv, st=st):
                        launch_fused_ws(h, W, params, lay, buf, vocab_size=V, batch=B, stages=st, block_v=bv,
                                        epilogue_only=epi)
                    try:
                        cell[name + kind] = median_us(call, flush=flush, reps=args.reps)
                    except Exception as e:  # noqa: BLE001
                        failures.append(f"D={D} B={B} {name}{kind}: {type(e).__name__}: {str(e)[:300]}")
                        cell[name + kind] = None
            rows.append(cell)
            C.log(" ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in cell.items()))
    return report(args, dev, rows, failures, "stage 1 alone, CUDA events, L2 flushed, µs (ratio to cublas)",
                  "wide_tile_stage1")


def report(args, dev, rows, failures, title, stem) -> int:
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{stem}_{C.gpu_slug(dev)}_{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json")
    with open(path, "w") as f:
        json.dump({"schema": C.SCHEMA, "env": C.env_info(), "rows": rows, "failures": failures,
                   "command": " ".join(os.sys.argv)}, f, indent=1, default=str)
    names = [k for k in rows[0] if k not in ("D", "V", "B")] if rows else []
    print(f"\n{title}")
    print(f"{'D':>5} {'B':>5} " + " ".join(f"{n:>16}" for n in names))
    for r in rows:
        base = r.get("cublas")
        cells = []
        for n in names:
            v = r.get(n)
            cells.append(f"{'-':>16}" if v is None else
                         f"{v:9.1f} ({v / base:4.2f})" if base else f"{v:16.1f}")
        print(f"{r['D']:>5} {r['B']:>5} " + " ".join(cells))
    print(f"failures: {len(failures)}")
    for fl in failures:
        print("  " + fl)
    print(f"results: {path}")
    return 1 if failures else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="4096x151936,8192x128256")
    p.add_argument("--batches", default="128,192,256,384,512,768,1024")
    p.add_argument("--stages", default="3,4", help="the wide tile's stage counts to run")
    p.add_argument("--check-cells", default="4096x1000:200,4096x151936:128,8192x128256:384,4096x151936:1000")
    p.add_argument("--reps", type=int, default=40)
    p.add_argument("--stage1", action="store_true", help="time stage 1 alone: noise, greedy, epilogue only")
    p.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    args = p.parse_args()
    dev = torch.device("cuda")
    stages = [int(x) for x in args.stages.split(",") if x]
    failures = []
    for cell in args.check_cells.split(","):
        if cell:
            dv, b = cell.split(":")
            D, V = (int(x) for x in dv.split("x"))
            check_cell(D, V, int(b), dev, stages, failures)
    flush = L2Flusher(dev)
    rows = []
    if args.stage1:
        return stage1_table(args, dev, stages, failures, flush)
    for shape in args.shapes.split(","):
        D, V = (int(x) for x in shape.split("x"))
        g = torch.Generator(device=dev).manual_seed(7)
        W = (torch.randn(V, D, device=dev, generator=g) * D ** -0.5).to(torch.bfloat16)
        for B in (int(x) for x in args.batches.split(",")):
            hs = [torch.randn(B, D, device=dev, generator=g).to(torch.bfloat16) for _ in range(2)]
            temp = torch.full((B, ), 0.8, device=dev)
            seed = torch.arange(B, device=dev) * 7 + 1
            off = torch.full((B, ), 3, dtype=torch.int64, device=dev)
            kw = dict(temperature=temp, seed=seed, offset=off)
            methods = {"cublas": lambda x: F.linear(x, W),
                       "shipped": lambda x: fsdist.sample(x, W, **kw).tokens,
                       "ws128": lambda x: fsdist.sample(x, W, config=TileConfig.parse(WS128), path="fused",
                                                        **kw).tokens}
            for s in stages:
                cfg = TileConfig.parse(f"128x256x64w8s{s}t-ws")
                methods[f"wide_s{s}"] = (lambda x, c=cfg: fsdist.sample(x, W, config=c, path="fused", **kw).tokens)
            ref = methods["ws128"](hs[0])
            cell = {"D": D, "V": V, "B": B}
            for name, fn in methods.items():
                try:
                    if name.startswith("wide") or name == "shipped":
                        got = fn(hs[0])
                        if not torch.equal(got, ref):
                            failures.append(f"D={D} B={B} {name}: tokens differ from ws128's "
                                            f"({(got != ref).sum().item()} of {B})")
                    graph = CapturedGraph(fn, [(x, ) for x in hs], calls=4)
                    ts = time_graph(graph, warmup=3, reps=max(10, args.reps // 4), flush=flush)
                    cell[name] = statistics.median(ts)
                    del graph
                except Exception as e:  # noqa: BLE001
                    failures.append(f"D={D} B={B} {name}: {type(e).__name__}: {str(e)[:300]}")
                    cell[name] = None
            rows.append(cell)
            C.log(" ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in cell.items()))
    return report(args, dev, rows, failures, "graph replays, L2 flushed, [B] parameters, µs (ratio to cublas)",
                  "wide_tile_probe")


if __name__ == "__main__":
    raise SystemExit(main())
