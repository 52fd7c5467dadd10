"""Issue 14: the warp-specialised Hopper stage 1 (fsdist/ops/fused_sample_ws.py) against the Triton fused kernel.

For each shape and batch it first checks that the Gluon kernel writes the Triton kernel's candidates bit for
bit (same 128x128x64 TMA tile; `[B]` temperature / seed / offset tensors with greedy, hot, cold and poisoned
rows, then scalar parameters; a vocabulary that is not a multiple of the tile and a batch that leaves part of
the last 128-row tile empty are in the default list), then times stage 1 alone, side by side, L2 flushed,
inputs rotated:

  cublas        F.linear(h, W): the bf16 matmul alone (issue 14's yardstick)
  triton        fused_sample_kernel with 128x128x64 w8 s5 TMA tiles (what the dispatcher runs at these B)
  ws_s<S>r<R>   fused_sample_ws_kernel with S operand stages and R rows per warp in the epilogue layout
  ...e8         the same with 8 epilogue warps (two warpgroups) instead of 4
  ...L<R>       a batch whose last 128-row tile holds at most 64 rows: that tile read in boxes of R rows and
                multiplied as half a tile (launch_fused_ws's last_box_rows; checked bit for bit like every variant,
                and with --pad against the padded whole-tile launch)
  *_greedy      the same with T = 0 (no noise): the main loop with the lightest epilogue
  epi_<variant> the variant with its main loop skipped (zero logits): the epilogue's own time
  pad_<variant> with --pad: the variant on a hidden zero-padded to whole batch tiles, the pad's copy included
                (checked first: the same candidates as the unpadded launch)
  *_proc        with --processors: a token bitmask (half the ids), 500 bias + 250 output + 250 prompt ids
                per row and penalties (--processor-set bitmask: the bitmask alone): the dispatched launch
                (shipped_proc), the Triton twin (twin_proc, with the entry-offset launch), the warp-specialised
                kernel on 64- and 128-row tiles (ws64_proc, ws128_proc; each checked bit for bit against the
                twin) and its epilogue alone

    python3 bench/ws_probe.py [--shapes 4096x151936,8192x128256] [--batches 128,256,512,1024]

Prints a table last; the JSON goes to bench/results/ws_probe_<gpu>_<date>.json (and $OUT). GPU (sm_90) only.
"""
import common as C  # first: the repo root on sys.path, fsdist.env.apply_safe_env() before torch

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402

import fsdist  # noqa: E402
from fsdist.ops.configs import TileConfig, default_config, triton_twin  # noqa: E402
from fsdist.ops.fused_sample import launch_fused, tile_operand  # noqa: E402
from fsdist.ops.fused_sample_ws import launch_fused_ws, ws_supported  # noqa: E402
from fsdist.ops.layout import BufferPair, CandidateLayout  # noqa: E402
from fsdist.params import RowParams  # noqa: E402
from fsdist.processing import prepare_processing  # noqa: E402

TRITON_CFG = TileConfig(128, 128, 64, 8, 5, tma=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="4096x151936,8192x128256")
    p.add_argument("--batches", default="128,256,512,1024")
    p.add_argument("--check-cells", default="4096x1000:200,4096x151936:128,8192x128256:384",
                   help="extra DxV:B cells checked (not timed)")
    p.add_argument("--variants", default="s4r8,s5r8,s4r8e8,s5r8e8", help="ws variants: s<stages>r<row threads>")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--pad", action="store_true",
                   help="also time each ws variant on a hidden zero-padded to whole batch tiles (pad_<variant>: "
                        "the pad's copy included), after checking it writes the same candidates")
    p.add_argument("--processors", action="store_true",
                   help="also time the calls with bitmask + bias + penalties (any B; see the docstring)")
    p.add_argument("--processor-set", choices=("all", "bitmask"), default="all",
                   help="with --processors: all three (default) or the token bitmask alone (issue 12: past 64 rows "
                        "the dispatcher runs a bitmask alone on the Triton twin; is the ws 128-row tile faster?)")
    return p.parse_args(argv)


def serving_params(B, dev, g):
    """[B] tensors: T = 1 mostly, some greedy (0), hot (1.7) and cold (0.3) rows, one negative and one NaN
    temperature (poisoned rows: token -1) when B allows."""
    t = torch.ones(B, device=dev)
    t[1::7] = 0.0
    t[2::11] = 1.7
    t[3::13] = 0.3
    if B > 40:
        t[17] = -1.0
        t[33] = float("nan")
    return RowParams(t, torch.randint(0, 2**62, (B,), device=dev, generator=g),
                     torch.randint(0, 2**40, (B,), device=dev, generator=g))


def run_triton(h, W, params, layout, cand, V):
    launch_fused(h, W, params, TRITON_CFG, layout, cand, vocab_size=V, vocab_start=0)


def processing_for(B, V, dev, g, which="all"):
    """kernel_bench's processors: a random bitmask (each id allowed with probability 1/2), 500 bias ids, 250
    output and 250 prompt ids per row, repetition 1.1-1.3, frequency 0.1-0.4, presence 0.1-0.3; which="bitmask":
    the bitmask alone."""
    words = -(-V // 32)
    bm = torch.randint(-2**31, 2**31 - 1, (B, words), device=dev, generator=g, dtype=torch.int64).to(torch.int32)
    if which == "bitmask":
        return prepare_processing(token_bitmask=bm, batch=B, vocab_size=V, device=dev)
    ids = torch.randint(0, V, (B, 1000), device=dev, generator=g)
    def lin(a, b):
        return torch.linspace(a, b, B, device=dev) if B > 1 else torch.full((1,), a, device=dev)

    return prepare_processing(
        token_bitmask=bm, logit_bias=fsdist.SparseLogits(ids[:, :500], torch.randn(B, 500, device=dev, generator=g)),
        penalties=fsdist.Penalties(lin(1.1, 1.3), lin(0.1, 0.4), lin(0.1, 0.3), ids[:, 500:750], ids[:, 750:]),
        batch=B, vocab_size=V, device=dev)


def run_ws(h, W, params, layout, cand, V, stages, rows, warps=4, epilogue_only=False, block_b=128, pad=False,
           last=0):
    batch = None
    if pad:
        # Zero rows up to whole batch tiles (the 64-row tile too), so that no TMA box of the hidden reaches past
        # its rows (v17 / v25: a half-empty box looked slow). The pad's allocation and copy are part of the timed call.
        h, batch, last = tile_operand(h, block_b, min_rows=1), h.shape[0], 0
    launch_fused_ws(h, W, params, layout, cand, vocab_size=V, vocab_start=0, stages=stages, row_threads=rows,
                    epilogue_warps=warps, epilogue_only=epilogue_only, block_b=block_b, batch=batch,
                    last_box_rows=last)


def variants(text):
    """'s4r8' -> ('s4r8', 4 stages, 8 rows per warp, 4 epilogue warps, 128-row tile, 0); 's5r8e8': 8 epilogue
    warps; 's5r8e8b64': a 64-row batch tile; 's5r8e8L8': a last tile of at most 64 rows read in boxes of 8 rows and
    multiplied as half a tile (launch_fused_ws's last_box_rows; other batches: as without it)."""
    out = []
    for v in text.split(","):
        v = v.strip()
        m = re.fullmatch(r"s(\d+)r(\d+)(?:e(\d+))?(?:b(\d+))?(?:L(\d+))?", v)
        if not m:
            raise SystemExit(f"bad variant {v!r}: want s<stages>r<rows>[e<epilogue warps>][b<batch tile>][L<rows>]")
        out.append((v, int(m.group(1)), int(m.group(2)), int(m.group(3) or 4), int(m.group(4) or 128),
                    int(m.group(5) or 0)))
    return out


def check_cell(D, V, B, dev, vs, failures, W=None):
    g = torch.Generator(device=dev).manual_seed(1000 + B)
    if W is None:
        W = (torch.randn(V, D, device=dev, generator=g) * D ** -0.5).to(torch.bfloat16)
    h = torch.randn(B, D, device=dev, generator=g).to(torch.bfloat16)
    layout = CandidateLayout(1, triton.cdiv(V, 128), B)
    checked = 0
    for params in (serving_params(B, dev, g), RowParams(0.8, 1234, 99), RowParams(0.0, 0, 0)):
        ref = BufferPair.alloc(layout, dev)
        ref.f.fill_(7.0)
        ref.i.fill_(7)
        run_triton(h, W, params, layout, ref, V)
        if not ws_supported(h, W, params):
            failures.append(f"D={D} V={V} B={B}: ws_supported said no")
            return W
        for name, s, r, e, bb, lb in vs:
            got = BufferPair.alloc(layout, dev)
            got.f.fill_(7.0)
            got.i.fill_(7)
            try:
                run_ws(h, W, params, layout, got, V, s, r, e, block_b=bb, last=lb)
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001  (report, keep going)
                failures.append(f"D={D} V={V} B={B} {name}: {type(e).__name__}: {str(e)[:400]}")
                continue
            same_i = torch.equal(got.i, ref.i)
            same_f = torch.equal(torch.nan_to_num(got.f, nan=-12345.0), torch.nan_to_num(ref.f, nan=-12345.0))
            checked += 1
            if not (same_i and same_f):
                bad = (got.i != ref.i).sum().item()
                failures.append(f"D={D} V={V} B={B} {name} T={_t(params)}: candidates differ ({bad} ids of "
                                f"{ref.i.numel()}; scores: {_score_diff(got.f, ref.f)})")
    C.log(f"check D={D} V={V} B={B}: {checked} comparisons")
    return W


def check_processors(h, W, pp, block_b, twin, layout, V, failures, label):
    """The warp-specialised kernel with processors on block_b-row tiles writes the Triton twin's candidates."""
    got, ref = BufferPair.alloc(layout, h.device), BufferPair.alloc(layout, h.device)
    run_ws(h, W, pp, layout, got, V, 5, 8, 8, block_b=block_b)
    launch_fused(h, W, pp, twin, layout, ref, vocab_size=V)
    same_f = torch.equal(torch.nan_to_num(got.f, nan=-1.0), torch.nan_to_num(ref.f, nan=-1.0))
    if not (torch.equal(got.i, ref.i) and same_f):
        failures.append(f"{label} processors: ws and Triton twin differ ({_score_diff(got.f, ref.f)})")


def check_pad(h, W, params, layout, V, s, r, e, bb, failures, label, lb=0):
    """The padded launch writes the unpadded launch's candidates (with lb: its short last tile's), bit for bit."""
    ref = BufferPair.alloc(layout, h.device)
    got = BufferPair.alloc(layout, h.device)
    for buf in (ref, got):
        buf.f.fill_(float("nan"))
        buf.i.fill_(-7)
    run_ws(h, W, params, layout, ref, V, s, r, e, block_b=bb, last=lb)
    run_ws(h, W, params, layout, got, V, s, r, e, block_b=bb, pad=True)
    torch.cuda.synchronize()
    same = torch.equal(ref.i, got.i) and torch.equal(ref.f.view(torch.int32), got.f.view(torch.int32))
    C.log(f"{label}: padded candidates {'equal' if same else 'DIFFER'}")
    if not same:
        failures.append(f"{label}: the padded launch's candidates differ")


def _t(params):
    return "[B]" if isinstance(params.temperature, torch.Tensor) else params.temperature


def _score_diff(got, ref):
    """How two score buffers differ: count, largest difference in ulps, a few pairs as hex."""
    a = torch.nan_to_num(got, nan=-12345.0)
    b = torch.nan_to_num(ref, nan=-12345.0)
    where = (a != b).nonzero().flatten()
    if where.numel() == 0:
        return "equal"
    ai = a[where].view(torch.int32).long()
    bi = b[where].view(torch.int32).long()
    ulps = (ai - bi).abs().max().item()
    pairs = [(f"{a[i].item():.9g}", f"{b[i].item():.9g}", int(i)) for i in where[:4].tolist()]
    return f"{where.numel()} differ, max {ulps} ulp, e.g. (got, ref, index) {pairs}"


def main(argv=None) -> int:
    args = parse_args(argv)
    dev = C.hopper_device("ws_probe")
    if dev is None:
        return 0
    vs = variants(args.variants)
    out = C.ResultWriter("ws_probe", dev)
    out.data.update(env=C.env_info(), args=vars(args), cells=[])
    failures = []
    for cell in args.check_cells.split(","):
        if cell.strip():
            shape, b = cell.split(":")
            d, v = (int(x) for x in shape.split("x"))
            check_cell(d, v, int(b), dev, vs, failures)
    flush = C.L2Flusher(dev)
    table = []
    for D, V in C.parse_shapes(args.shapes):
        W = None
        for B in C.parse_int_list(args.batches):
            W = check_cell(D, V, B, dev, vs, failures, W)
            g = torch.Generator(device=dev).manual_seed(B)
            hs = [torch.randn(B, D, device=dev, generator=g).to(torch.bfloat16) for _ in range(4)]
            params = RowParams(torch.ones(B, device=dev), torch.randint(0, 2**62, (B,), device=dev, generator=g),
                               torch.randint(0, 2**40, (B,), device=dev, generator=g))
            layout = CandidateLayout(1, triton.cdiv(V, 128), B)
            cand = BufferPair.alloc(layout, dev)
            shipped = default_config(B, D, dev)
            methods = {"cublas": lambda h: F.linear(h, W),
                       "triton": lambda h: run_triton(h, W, params, layout, cand, V)}
            if shipped != TRITON_CFG:  # what fsdist.sample runs at this B (launch_fused: ws or its Triton twin)
                methods["shipped"] = lambda h: launch_fused(h, W, params, shipped, layout, cand, vocab_size=V)
            for name, s, r, e, bb, lb in vs:
                methods["ws_" + name] = lambda h, s=s, r=r, e=e, bb=bb, lb=lb: run_ws(h, W, params, layout, cand, V,
                                                                                       s, r, e, block_b=bb, last=lb)
            if args.pad:
                for name, s, r, e, bb, lb in vs:
                    check_pad(hs[0], W, params, layout, V, s, r, e, bb, failures, f"D={D} B={B} {name}", lb)
                    if lb:
                        continue  # (padded, a short-tile variant is its variant without L: timed once)
                    methods["pad_" + name] = lambda h, s=s, r=r, e=e, bb=bb: run_ws(h, W, params, layout, cand, V, s,
                                                                                    r, e, block_b=bb, pad=True)
            # Greedy (no noise): the main loops alone, so the epilogue's share shows.
            greedy = RowParams(0.0, 0, 0)
            methods["triton_greedy"] = lambda h: run_triton(h, W, greedy, layout, cand, V)
            _, s0, r0, e0, b0, _ = vs[0]
            methods["ws_greedy"] = lambda h: run_ws(h, W, greedy, layout, cand, V, s0, r0, e0, block_b=b0)
            # The epilogue alone (zero logits, no main loop): what it costs when nothing hides it.
            for name, s, r, e, bb, lb in vs:
                methods["epi_" + name] = lambda h, s=s, r=r, e=e, bb=bb, lb=lb: run_ws(
                    h, W, params, layout, cand, V, s, r, e, epilogue_only=True, block_b=bb, last=lb)
            if args.processors and shipped.ws:
                pp = dataclasses.replace(params, processing=processing_for(B, V, dev, g, args.processor_set))
                twin = triton_twin(shipped, D)
                # What launch_fused runs for the shipped config (the ws 64-row tile wherever there are bias /
                # penalty entries, as here), the Triton twin, and the ws kernel on 64- and 128-row tiles (the
                # latter spills: measured, not dispatched). epi_*: the dispatched tile, epilogue only.
                methods["shipped_proc"] = lambda h: launch_fused(h, W, pp, shipped, layout, cand, vocab_size=V)
                methods["twin_proc"] = lambda h: launch_fused(h, W, pp, twin, layout, cand, vocab_size=V)
                for bb in (64, 128):
                    run = (lambda h, bb=bb: run_ws(h, W, pp, layout, cand, V, shipped.num_stages, 8, 8, block_b=bb))
                    check_processors(hs[0], W, pp, bb, twin, layout, V, failures, f"D={D} B={B} ws{bb}")
                    methods[f"ws{bb}_proc"] = run
                methods["epi_shipped"] = lambda h: run_ws(h, W, params, layout, cand, V, shipped.num_stages, 8, 8,
                                                          epilogue_only=True, block_b=shipped.block_b)
                # the tile launch_fused gives these processors: 64 rows (bias / penalty entries)
                methods["epi_shipped_proc"] = lambda h: run_ws(h, W, pp, layout, cand, V, shipped.num_stages, 8, 8,
                                                               epilogue_only=True, block_b=64)
            row = {"D": D, "V": V, "B": B,
                   "times": C.time_methods(methods, [(h,) for h in hs], warmup=args.warmup, reps=args.reps,
                                           flush=flush, device=dev, failures=failures, label=f"D={D} B={B}")}
            out.data["cells"].append(row)
            out.flush()
            table.append(row)
            C.log(f"D={D} B={B}: " + ", ".join(f"{k} {v['median_us']:.1f}" for k, v in row["times"].items()))
        W = None  # free the weight before the next shape
        torch.cuda.empty_cache()
    out.data["failures"] = failures
    out.flush()
    names = list(table[0]["times"]) if table else []
    print("\nstage 1 alone, median us per call (L2 flushed); in brackets: / cublas")
    print(f"{'method':12s}" + "".join(f" {'D%d/B%d' % (r['D'], r['B']):>18s}" for r in table))
    for name in names:
        cells = []
        for r in table:
            t = r["times"].get(name, {}).get("median_us")
            base = r["times"].get("cublas", {}).get("median_us")
            cells.append(f"{t:9.1f} ({t / base:5.2f})" if t and base else f"{'-':>18s}")
        print(f"{name:12s}" + "".join(f" {c:>18s}" for c in cells))
    return C.report_checks(failures, out)


if __name__ == "__main__":
    sys.exit(main())
