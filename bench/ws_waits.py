"""Issue 14: where the warp-specialised tile's MMA warpgroup waits, with and without noise.

v86-v101 (docs/performance.md) left the noise's ~15% on stage 1 at B = 1024 unexplained by pipes, issue slots or
memory traffic on average. This probe asks the kernel itself: ``launch_fused_ws(wait_probe=)`` has every persistent
program count cycles (``%clock64``) around its barrier waits, and this script reports, per case, the median over the
programs of

  mma_total      the MMA warpgroup's cycles from its first tile to its last
  mma_operands   the share of them spent waiting for the next operand stage. The previous k-step's wgmma may still
                 run meanwhile, so this is tensor-core idle time only where mma_wgmma is small: operands that arrive
                 just in time show here too
  mma_wgmma      the share spent waiting for wgmmas to retire (the tensor cores busy with this warpgroup's work)
  mma_wgmma_max  the same for whichever of the warpgroup's four warps waited longest (printed as "max"; the other
                 mma_* columns are warp 0's: the kernel stores one thread's counts; v109 found the warps' retire waits
                 unequal)
  mma_hand_off   the share spent waiting for the epilogue to free the hand-off buffer (the epilogue behind)
  mma_rest       what remains: issuing the wgmmas, the hand-off's stores, the loop's own instructions
  load_free      the load warp's share of its cycles waiting for a free stage (high in a pipeline whose loads keep
                 ahead; low where the loads themselves are the bottleneck)
  epi_idle       the epilogue's share of its cycles waiting for the accumulator's halves (low: the epilogue is what
                 the tile waits for)

and the launch's time with and without the probe (its own cost: two clock reads a wait; the two timed in turn, three
times), L2 flushed, medians. Cases:
``greedy`` (T = 0), ``noise`` ([B] temperatures, the serving case), ``legacy`` (the noise in the instructions before
v97), ``rounds7`` (7 Philox rounds: not the sampler's tokens). Variants of the launch (--variants, each case runs
every one; their launches timed side by side): ``shipped`` (the dispatch's stages), ``sN`` (N operand stages),
``e4`` (4 epilogue warps instead of 8), ``b64`` (64-row batch tiles: 1.5x the operand bytes a product), joined by
``+`` (``b64+s6``). (v104's ``retire``, each k-step's wgmma retired before the next stage is awaited, is in commit
6918d0f; v105's ``k2``, two 64-column k-slices a k-step, in commit 8606a02.) Checks first: the probed launch
writes the unprobed launch's candidates bit for bit, every variant the first listed variant's, and the programs'
tiles add up to the launch's.

    python3 bench/ws_waits.py [--shapes 4096x151936,8192x128256] [--batches 256,1024] [--cases greedy,noise]
                              [--variants shipped,b64]

Prints a table last; the JSON goes to bench/results/ws_waits_<gpu>_<date>.json (and $OUT). sm_90 only.
"""
import common as C  # first: the repo root on sys.path, fsdist.env.apply_safe_env() before torch

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402

from fsdist.ops.configs import default_config  # noqa: E402
from fsdist.ops.fused_sample_ws import launch_fused_ws, new_wait_probe  # noqa: E402
from fsdist.ops.layout import BufferPair, CandidateLayout  # noqa: E402
from fsdist.params import RowParams  # noqa: E402

CASES = {"greedy": "", "noise": "", "legacy": "legacy", "rounds7": "rounds7"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="4096x151936,8192x128256")
    p.add_argument("--batches", default="256,1024")
    p.add_argument("--cases", default="greedy,noise,legacy,rounds7")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--probe-runs", type=int, default=3, help="probed launches a case (the fields: their medians)")
    p.add_argument("--variants", default="shipped", help="launch variants: shipped, sN, e4, b64, joined by +")
    args = p.parse_args(argv)
    unknown = sorted(set(args.cases.split(",")) - set(CASES))
    if unknown:
        p.error(f"--cases: unknown {unknown}; choose from {', '.join(CASES)}")
    try:
        args.variant_kwargs = {v: variant_kwargs(v) for v in args.variants.split(",")}
    except ValueError as e:
        p.error(f"--variants: {e}")
    return args


def variant_kwargs(name: str) -> dict:
    """launch_fused_ws's keyword arguments of a --variants entry (stages None: the dispatch's)."""
    kw = {"stages": None, "epilogue_warps": 8, "block_b": 128}
    for part in name.split("+"):
        if part.startswith("s") and part[1:].isdigit() and 2 <= int(part[1:]) <= 6:
            kw["stages"] = int(part[1:])
        elif part == "b64":
            kw["block_b"] = 64
        elif part in ("e4", "e8"):
            kw["epilogue_warps"] = int(part[1:])
        elif part != "shipped":
            raise ValueError(f"unknown part {part!r} of {name!r} (shipped, s2-s6, e4, e8, b64)")
    return kw


FIELDS_USED = list(range(10))  # (launch_fused_ws's wait_probe)


def shares(probe: torch.Tensor) -> dict:
    """The medians over the programs that ran (field 0 set) of the wait shares, from one probed launch's rows; None
    when no program wrote, or one left a field it must write unset (-1)."""
    rows = probe[probe[:, 0] != -1]
    if rows.shape[0] == 0 or (rows[:, FIELDS_USED] < 0).any() or (rows[:, [0, 4, 6]] <= 0).any():
        return None
    rows = rows.double()
    mma, load = rows[:, 0], rows[:, 4]
    med = lambda x: float(x.median())  # noqa: E731
    return {"programs": int(rows.shape[0]), "tiles": int(rows[:, 3].sum()), "mma_total": med(mma),
            "mma_operands": med(rows[:, 1] / mma), "mma_wgmma": med(rows[:, 8] / mma),
            "mma_wgmma_max": med(rows[:, 9] / mma),
            "mma_hand_off": med(rows[:, 2] / mma), "mma_rest": med((mma - rows[:, 1] - rows[:, 2] - rows[:, 8]) / mma),
            "load_free": med(rows[:, 5] / load), "epi_idle": med(rows[:, 7] / rows[:, 6])}


def main(argv=None) -> int:
    args = parse_args(argv)
    dev = C.hopper_device("ws_waits")
    if dev is None:
        return 0
    out = C.ResultWriter("ws_waits", dev)
    out.data.update(env=C.env_info(), args=vars(args), cells=[])
    failures = []
    flush = C.L2Flusher(dev)
    table = []
    for D, V in C.parse_shapes(args.shapes):
        W, g = C.seeded_weight(D, V, dev)
        for B in C.parse_int_list(args.batches):
            label = f"D={D} B={B}"
            cfg = default_config(B, D, dev)
            if not (cfg.ws and cfg.block_b == 128):
                failures.append(f"{label}: the dispatch runs {cfg}, not the ws 128-row tile: cell skipped")
                continue
            h = torch.randn(B, D, device=dev, generator=g).to(torch.bfloat16)
            serving = RowParams(torch.ones(B, device=dev), torch.randint(0, 2**62, (B,), device=dev, generator=g),
                                torch.randint(0, 2**40, (B,), device=dev, generator=g))
            layout = CandidateLayout(1, triton.cdiv(V, 128), B)
            cells = {}
            cublas = []
            for case in args.cases.split(","):
                prm = RowParams(0.0, 0, 0) if case == "greedy" else serving
                ref = None
                plains = {}
                for vname, kw in args.variant_kwargs.items():
                    key = case if vname == "shipped" else f"{case}/{vname}"

                    def launch(probe=None, prm=prm, case=case, dest=None, kw=kw):
                        launch_fused_ws(h, W, prm, layout, dest, vocab_size=V, stages=kw["stages"] or cfg.num_stages,
                                        epilogue_warps=kw["epilogue_warps"], noise_probe=CASES[case], wait_probe=probe,
                                        block_b=kw["block_b"])

                    plain, probed = BufferPair.alloc(layout, dev), BufferPair.alloc(layout, dev)
                    probe = new_wait_probe(dev)
                    launch(dest=plain)
                    launch(probe, dest=probed)
                    torch.cuda.synchronize(dev)
                    if not C.same_candidates(plain, probed):
                        failures.append(f"{label} {key}: the probed launch wrote other candidates")
                    if ref is None:
                        ref = plain
                    if not C.same_candidates(ref, plain):
                        failures.append(f"{label} {key}: other candidates than {case}'s first variant")
                    runs = []
                    for _ in range(args.probe_runs):
                        probe.fill_(-1)
                        flush()
                        launch(probe, dest=probed)
                        torch.cuda.synchronize(dev)
                        runs.append(shares(probe.cpu()))
                    if any(r is None for r in runs):
                        failures.append(f"{label} {key}: a probed launch left fields unset (a partition did not "
                                        "store)")
                        continue
                    n_tiles = triton.cdiv(V, 128) * triton.cdiv(B, kw["block_b"])
                    if any(r["tiles"] != n_tiles for r in runs):
                        failures.append(f"{label} {key}: the programs' tiles add up to {[r['tiles'] for r in runs]}, "
                                        f"not {n_tiles}")
                    fields = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
                    cells[key] = dict(fields, runs=runs, variant=vname, kwargs=kw)
                    plains[key] = (lambda launch=launch, plain=plain: launch(dest=plain),
                                   lambda launch=launch, probe=probe, probed=probed: launch(probe, dest=probed))
                    C.log(f"{label} {key}: " + ", ".join(f"{k} {v:.3g}" for k, v in fields.items()))
                # every variant's launch with and without the probe, side by side, three times
                both = {f"{k}|{m}": f for k, pair in plains.items() for m, f in zip(("plain", "probed"), pair)}
                both["cublas|plain"] = lambda: torch.matmul(h, W.t())  # (the matmul alone: issue 14's line)
                timed = [C.time_methods(both, [()], warmup=args.warmup, reps=args.reps, flush=flush, device=dev,
                                        failures=failures, label=f"{label} {case}") for _ in range(3)]
                cublas.extend(t["cublas|plain"]["median_us"] for t in timed if "cublas|plain" in t)
                for key in plains:
                    cells[key]["times_us"] = {m: statistics.median(t[f"{key}|{m}"]["median_us"] for t in timed
                                                                   if f"{key}|{m}" in t)
                                              for m in ("plain", "probed") if any(f"{key}|{m}" in t for t in timed)}
            row = {"D": D, "V": V, "B": B, "config": str(cfg), "cases": cells,
                   "cublas_us": statistics.median(cublas) if cublas else None}
            out.data["cells"].append(row)
            out.flush()
            table.append(row)
        W = None  # (frees the weight before the next shape)
        torch.cuda.empty_cache()
    out.data["failures"] = failures
    out.flush()
    print("\nMMA warpgroup's cycles (median over programs) and their shares; the load warp's share waiting for a free"
          " stage; the epilogue's share waiting for the accumulator; the launch's µs without / with the probe")
    print(f"{'cell':16s} {'case':18s} {'mma cycles':>11s} {'operands':>9s} {'wgmma':>7s} {'max':>6s} {'hand-off':>9s} "
          f"{'rest':>6s} "
          f"{'load free':>9s} {'epi idle':>9s} {'us':>8s} {'probed':>8s} {'/cuBLAS':>8s}")
    for r in table:
        cub = r["cublas_us"] or float("nan")
        print(f"D={r['D']} B={r['B']:<6d} {'cuBLAS matmul':18s} {'':>73s} {cub:8.1f}")
        for case, c in r["cases"].items():
            t = c["times_us"]
            print(f"D={r['D']} B={r['B']:<6d} {case:18s} {c['mma_total']:11.3g} {c['mma_operands']:9.1%} "
                  f"{c['mma_wgmma']:7.1%} {c.get('mma_wgmma_max', float('nan')):6.1%} {c['mma_hand_off']:9.1%} "
                  f"{c['mma_rest']:6.1%} {c['load_free']:9.1%} "
                  f"{c['epi_idle']:9.1%} "
                  f"{t.get('plain', float('nan')):8.1f} {t.get('probed', float('nan')):8.1f} "
                  f"{t.get('plain', float('nan')) / cub:8.3f}")
    return C.report_checks(failures, out)


if __name__ == "__main__":
    sys.exit(main())
