"""Issue 14, v116: where the ping-pong kernel's consumers spend each tile, with and without noise.

``launch_fused_pp(wait_probe=)`` has each program count cycles (``%clock64``, warp 0 of each consumer) and this probe
reports, per variant and case, the medians over the programs of, per tile of a consumer (kcycles):

  total     a consumer's cycles from its first tile to its last, per tile
  operands  waiting for the next operand stage
  turn      waiting for its turn (the other consumer's main loop)
  tail      from the end of its main loop to its next turn wait: the last wgmma's retire, then its own epilogue
  loop      total - operands - turn - tail: the main loop's own instructions (issuing the wgmmas, barrier
            arrivals) and its waits for the previous wgmma to retire (tensor-core time: at the cuBLAS line it is
            most of the loop; a loop that grows with noise at the same wgmmas is issue delay)

Also each launch's time with and without the probe (its own cost) beside the ws kernel's and cuBLAS's, L2 flushed,
medians of three runs. Checks first: every probed launch writes the unprobed launch's candidates, and every variant
the ws kernel's, bit for bit; each of the launch's programs stores every field, and no row past them is written.
(v116 also ran the variants with 4 / 8 epilogue warps of their own, removed since: docs/performance.md.)

    python3 bench/pp_waits.py [--shapes 4096x151936,8192x128256] [--batches 512,1024] [--cases greedy,noise]
                              [--variants sh8,sh4]

Variants: ``sh8`` / ``sh4`` (the consumers move their accumulators through shared memory in 8 / 4 column chunks;
sh8 is the shipped greedy path), each with ``+s4`` / ``+s6`` for 4 / 6 operand stages (else 5). Prints a table last;
the JSON goes to bench/results/pp_waits_<gpu>_<date>.json (and $OUT). sm_90 only.
"""
import common as C  # first: the repo root on sys.path, fsdist.env.apply_safe_env() before torch

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402

from fsdist.ops.configs import default_config  # noqa: E402
from fsdist.ops.fused_sample_pp import PP_WAIT_FIELDS, launch_fused_pp, new_pp_wait_probe  # noqa: E402
from fsdist.ops.fused_sample_ws import launch_fused_ws  # noqa: E402
from fsdist.ops.layout import BufferPair, CandidateLayout  # noqa: E402
from fsdist.ops.utils import sm_count  # noqa: E402
from fsdist.params import RowParams  # noqa: E402


def variant_kwargs(name: str) -> dict:
    """launch_fused_pp's keyword arguments of a --variants entry."""
    base, plus, more = name.partition("+")
    kw = {"sh8": dict(shared_epilogue=8), "sh4": dict(shared_epilogue=4)}.get(base)
    if kw is None or (plus and more not in ("s4", "s6")):
        raise ValueError(f"unknown variant {name!r} (sh8, sh4, each optionally +s4 or +s6)")
    return dict(kw, stages=int(more[1:]) if more else 5)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="4096x151936,8192x128256")
    p.add_argument("--batches", default="512,1024")
    p.add_argument("--cases", default="greedy,noise")
    p.add_argument("--variants", default="sh8")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--probe-runs", type=int, default=3, help="probed launches a case (the fields: their medians)")
    args = p.parse_args(argv)
    if set(args.cases.split(",")) - {"greedy", "noise"}:
        p.error("--cases: greedy and / or noise")
    try:
        args.variant_kwargs = {v: variant_kwargs(v) for v in args.variants.split(",")}
    except ValueError as e:
        p.error(f"--variants: {e}")
    return args


def per_tile(probe: torch.Tensor, programs: int, n_tiles: int) -> dict:
    """Medians over the launch's ``programs`` programs and both consumers of each field per consumer tile
    (kilocycles); None when a program left a field unset (-1) or a row past the programs was written (row p must be
    program p: the per-tile division counts p's tiles)."""
    rows = probe[:programs]
    P = programs
    if (P == 0 or rows.shape[0] < P or (rows < 0).any() or (rows[:, [0, 4]] <= 0).any()
            or (probe[programs:] != -1).any()):
        return None
    per = {k: [] for k in ("total", "operands", "turn", "tail", "loop")}
    tiles = 0
    for p in range(P):
        for r in range(2):
            n = len(range(p + r * P, n_tiles, 2 * P))
            tiles += n
            if n == 0:
                continue
            f = [float(x) for x in rows[p, 4 * r:4 * r + 4]]
            for k, v in zip(("total", "operands", "turn", "tail"), f):
                per[k].append(v / n / 1e3)
            per["loop"].append((f[0] - f[1] - f[2] - f[3]) / n / 1e3)
    out = {k: statistics.median(v) for k, v in per.items()}
    out.update(programs=P, tiles=tiles)
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    dev = C.hopper_device("pp_waits")
    if dev is None:
        return 0
    out = C.ResultWriter("pp_waits", dev)
    out.data.update(env=C.env_info(), args={k: v for k, v in vars(args).items() if k != "variant_kwargs"}, cells=[],
                    fields=PP_WAIT_FIELDS.value)
    failures = []
    flush = C.L2Flusher(dev)
    table = []
    for D, V in C.parse_shapes(args.shapes):
        W, g = C.seeded_weight(D, V, dev)
        for B in C.parse_int_list(args.batches):
            label = f"D={D} B={B}"
            cfg = default_config(B, D, dev)
            h = torch.randn(B, D, device=dev, generator=g).to(torch.bfloat16)
            serving = RowParams(torch.ones(B, device=dev), torch.randint(0, 2**62, (B,), device=dev, generator=g),
                                torch.randint(0, 2**40, (B,), device=dev, generator=g))
            layout = CandidateLayout(1, triton.cdiv(V, 128), B)
            n_tiles = triton.cdiv(V, 128) * triton.cdiv(B, 128)
            programs = min(n_tiles, sm_count(dev))  # (launch_fused_pp's grid)
            row = {"D": D, "V": V, "B": B, "ws_stages": cfg.num_stages, "cases": {}}
            for case in args.cases.split(","):
                prm = RowParams(0.0, 0, 0) if case == "greedy" else serving
                ref = BufferPair.alloc(layout, dev)
                launch_fused_ws(h, W, prm, layout, ref, vocab_size=V, stages=cfg.num_stages, epilogue_warps=8)
                methods = {"ws|plain": lambda prm=prm, ref=ref: launch_fused_ws(
                    h, W, prm, layout, ref, vocab_size=V, stages=cfg.num_stages, epilogue_warps=8),
                    "cublas|plain": lambda: torch.matmul(h, W.t())}
                cells = {}
                for vname, kw in args.variant_kwargs.items():
                    plain, probed = BufferPair.alloc(layout, dev), BufferPair.alloc(layout, dev)
                    probe = new_pp_wait_probe(dev)

                    def launch(dest, probe=None, prm=prm, kw=kw):
                        launch_fused_pp(h, W, prm, layout, dest, vocab_size=V, wait_probe=probe, **kw)

                    launch(plain)
                    launch(probed, probe)
                    torch.cuda.synchronize(dev)
                    if not C.same_candidates(plain, probed):
                        failures.append(f"{label} {case}/{vname}: the probed launch wrote other candidates")
                    if not C.same_candidates(plain, ref):
                        failures.append(f"{label} {case}/{vname}: other candidates than the ws kernel's")
                    runs = []
                    for _ in range(args.probe_runs):
                        probe.fill_(-1)
                        flush()
                        launch(probed, probe)
                        torch.cuda.synchronize(dev)
                        runs.append(per_tile(probe.cpu(), programs, n_tiles))
                    if any(r is None for r in runs):
                        failures.append(f"{label} {case}/{vname}: a probed launch left fields unset, or "
                                        f"wrote rows past its {programs} programs")
                        continue
                    cells[vname] = dict({k: statistics.median(r[k] for r in runs) for k in runs[0]}, runs=runs,
                                        kwargs=kw)
                    methods[f"{vname}|plain"] = lambda launch=launch, plain=plain: launch(plain)
                    methods[f"{vname}|probed"] = lambda launch=launch, probed=probed, probe=probe: launch(probed, probe)
                    C.log(f"{label} {case}/{vname}: " + ", ".join(f"{k} {v:.3g}" for k, v in cells[vname].items()
                                                                   if isinstance(v, float)))
                timed = [C.time_methods(methods, [()], warmup=args.warmup, reps=args.reps, flush=flush, device=dev,
                                        failures=failures, label=f"{label} {case}") for _ in range(3)]
                us = {m: statistics.median(t[m]["median_us"] for t in timed if m in t)
                      for m in methods if any(m in t for t in timed)}
                row["cases"][case] = {"variants": cells, "times_us": us}
            out.data["cells"].append(row)
            out.flush()
            table.append(row)
        W = None  # (frees the weight before the next shape)
        torch.cuda.empty_cache()
    out.data["failures"] = failures
    out.flush()
    print("\nper consumer tile, kilocycles (medians over programs and both consumers); µs without / with the probe, "
          "the ws kernel's and cuBLAS's")
    print(f"{'cell':15s} {'case':7s} {'variant':8s} {'total':>7s} {'operands':>9s} {'turn':>6s} {'tail':>6s} "
          f"{'loop':>6s} {'us':>8s} {'probed':>8s} {'ws us':>8s} {'cuBLAS':>8s}")
    for r in table:
        for case, c in r["cases"].items():
            t = c["times_us"]
            for vname, f in c["variants"].items():
                print(f"D={r['D']} B={r['B']:<5d} {case:7s} {vname:8s} {f['total']:7.1f} {f['operands']:9.1f} "
                      f"{f['turn']:6.1f} {f['tail']:6.1f} {f['loop']:6.1f} "
                      f"{t.get(vname + '|plain', float('nan')):8.1f} {t.get(vname + '|probed', float('nan')):8.1f} "
                      f"{t.get('ws|plain', float('nan')):8.1f} {t.get('cublas|plain', float('nan')):8.1f}")
    return C.report_checks(failures, out)


if __name__ == "__main__":
    sys.exit(main())
