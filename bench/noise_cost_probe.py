"""Issue 14: why the warp-specialised tile's noise is not hidden behind its main loop past 64 rows.

The ws kernel (fsdist/ops/fused_sample_ws.py) runs the sampling epilogue on warps of their own, beside the next
tile's wgmmas. v82 measured its epilogue alone (main loop skipped) at well under the main loop's time per tile, yet
the noise still adds 10-19% to stage 1 at B = 256-1024. Two explanations predict different levers:

* contention inside the SM (issue slots, register file, shared memory): the fix is overlap (ping-pong warpgroups,
  fewer instructions beside the wgmmas);
* power: the card runs at its power limit in a compute-bound GEMM, and the epilogue's integer and MUFU work lowers
  the SM clock for everything: the only fix is less energy per id (a cheaper generator, fewer operations).

This probe times stage 1 alone on the shipped 128-row ws tile (8 epilogue warps, the shipped stages), side by side,
L2 flushed, CUDA events, medians (``fsdist.timing``):

  cublas      F.linear(h, W): the bf16 matmul alone
  ws          the shipped kernel, `[B]` temperature / seed / offset tensors (T = 1)
  ws_greedy   T = 0: no noise, the main loop with the lightest epilogue (scalar parameters, so the kernel compiles
              without noise: its gap to ws also holds the per-row parameters' loads, a few hundred bytes a tile)
  ws_epi      the epilogue alone (main loop skipped, zero logits)
  ws_philox   the Philox bits without the two logs (noise_probe="philox"; not the sampler's tokens)
  ws_logs     the two logs of a cheap hash instead of Philox (noise_probe="logs")
  ws_rounds7  Philox-4x32 with 7 rounds instead of 10 (noise_probe="rounds7")
  ws_legacy   the sampler's noise in the instructions before v97 (noise_probe="legacy": tl.philox's separate high and
              low multiplies, lg2.approx without .ftz, x + 0.5 then a multiply): the same candidates bit for bit;
              ws_legacy_philox only tl.philox's multiplies (noise_probe="legacy_philox")
  ws_ab2      the accumulator handed off through a buffer per column half (acc_buffers=2, 64 KB): the MMA warpgroup
              stores the second half without waiting for the epilogue to read the first (the shipped stages, and
              ws_ab2s4 with 4); ws_ab2_greedy with T = 0
  ws_s<N>     N operand stages (3-6; the copy engine's lead over the wgmmas), whatever the dispatch gives the cell
              (it prints its config); *_greedy T = 0. (v91-v94 ran these relative to the shipped count: see
              docs/performance.md v94)
  ws_cap128   at most 128 persistent programs (grid_cap=128: the round robin then keeps each program on one batch
              tile up to 8 batch tiles; v101); ws_cap128_greedy with T = 0; ws_cap120 (120 = 15 x 8) a control
  ws_c<N>     the chunked epilogue (epilogue_chunk=N: N columns at a time in a rolled loop, a fraction of the code);
              ws_c<N>ab2 with a buffer per column half, ws_c<N>ab2_greedy with T = 0
  pp          the ping-pong kernel (fsdist/ops/fused_sample_pp.py, v111b: two MMA warpgroups, each sampling its own
              tile through shared memory in 8 column chunks while the other multiplies: the shipped greedy path),
              5 stages; pp_s<N> N stages; pp_greedy / pp_s6_greedy with T = 0; pp_sh4 4 column chunks; pp_epi its
              epilogues alone (main loops skipped, zero logits: both consumers' side by side). (pp_sh8* name the
              same launches as pp*, the names of v111b-v113's runs; before v117 pp, pp_greedy, pp_s<N> and pp_epi
              named v111's register epilogue: results of earlier sessions under those names are that kernel's.)
  (v110's ws_lock<K>, the programs held within K rounds of each other, is in commit 9c28d51; v111's register
  epilogue, pp_la<N>, and v113 / v115's epilogue warps, pp_ew<N>*, in commit ef07ffb)

then runs each method back to back for --seconds while ``nvidia-smi`` samples the SM clock and the power draw
(every 50 ms; read only: the card's settings are left alone), and reports each method's median clock and power.
Checks first: the probe's shipped variant, the legacy instructions and the acc_buffers=2 variants write the
dispatched launch's candidates bit for bit, and each other noise variant changes them (so the switch took effect).

    python3 bench/noise_cost_probe.py [--shapes 4096x151936,8192x128256] [--batches 256,1024] [--seconds 1.5]

Prints a table last; the JSON goes to bench/results/noise_cost_probe_<gpu>_<date>.json (and $OUT). sm_90 only.
"""
import common as C  # first: the repo root on sys.path, fsdist.env.apply_safe_env() before torch

import argparse  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402

from fsdist.ops.configs import default_config  # noqa: E402
from fsdist.ops.fused_sample import launch_fused  # noqa: E402
from fsdist.ops.fused_sample_pp import launch_fused_pp  # noqa: E402
from fsdist.ops.fused_sample_ws import NOISE_PROBES, launch_fused_ws  # noqa: E402
from fsdist.ops.layout import BufferPair, CandidateLayout  # noqa: E402
from fsdist.params import RowParams  # noqa: E402

SMI_FIELDS = "clocks.sm,power.draw,temperature.gpu"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="4096x151936,8192x128256")
    p.add_argument("--batches", default="256,1024")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--seconds", type=float, default=1.5,
                   help="back-to-back calls per method while clocks are read (0: no clock readings)")
    p.add_argument("--methods", default="", help="comma-separated subset of the methods (default: all); cublas and ws "
                   "are always timed")
    p.add_argument("--repeat", type=int, default=1,
                   help="time every method this many times in turn (the table: the median of the runs' medians, and "
                        "their range), to see how far a cell moves between runs")
    p.add_argument("--check", choices=("all", "pp"), default="all",
                   help="the checks before the timing: every variant's (all), or the ping-pong kernel's alone (pp: "
                        "fewer compiles)")
    p.add_argument("--smi-ms", type=int, default=50, help="nvidia-smi's sampling period")
    return p.parse_args(argv)


def smi_index() -> str:
    """nvidia-smi's index of the bench's GPU (torch's current device, through CUDA_VISIBLE_DEVICES when it is set)."""
    index = torch.cuda.current_device()
    visible = [x.strip() for x in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if x.strip()]
    return visible[index] if index < len(visible) else str(index)


class ClockReader:
    """nvidia-smi in the background, each line stamped with the host's clock on arrival."""

    def __init__(self, period_ms: int):
        self.samples = []  # (host time, sm MHz, watts, deg C)
        try:
            self.proc = subprocess.Popen(["nvidia-smi", "-i", smi_index(), f"--query-gpu={SMI_FIELDS}",
                                          "--format=csv,noheader,nounits", f"-lms={period_ms}"],
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            self.proc = None
            return
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                mhz, watts, temp = (float(x) for x in line.strip().split(","))
            except ValueError:
                continue
            self.samples.append((time.time(), mhz, watts, temp))

    def window(self, t0: float, t1: float) -> dict:
        """Median clock / power / temperature of the samples inside [t0, t1] (the first 20% left out: the ramp)."""
        t0 = t0 + 0.2 * (t1 - t0)
        xs = [s for s in self.samples if t0 <= s[0] <= t1]
        if not xs:
            return {"n": 0}
        return {"n": len(xs), "sm_mhz": statistics.median(s[1] for s in xs),
                "watts": statistics.median(s[2] for s in xs), "temp_c": statistics.median(s[3] for s in xs)}

    def close(self):
        if self.proc is not None:
            self.proc.terminate()


def sustained(fn, args, seconds: float, dev) -> tuple:
    """Back-to-back calls for about ``seconds``: (host start, host end, µs per call)."""
    torch.cuda.synchronize(dev)
    t0 = time.time()
    n = 0
    while time.time() - t0 < seconds:
        for _ in range(8):
            fn(*args)
        n += 8
        torch.cuda.synchronize(dev)  # (keeps the host from queueing more than a few calls ahead)
    t1 = time.time()
    return t0, t1, (t1 - t0) * 1e6 / n


def zeroed(layout, dev) -> BufferPair:
    """Candidate buffers with every slot zero, so that slots no launch writes compare equal."""
    pair = BufferPair.alloc(layout, dev)
    pair.f.zero_()
    pair.i.zero_()
    return pair


def check(h, W, params, layout, V, shipped, dev, failures, label, only_pp=False):
    """The probe's shipped variant and the legacy instructions against the dispatched launch, bit for bit; each
    other noise variant must differ. only_pp: the ping-pong kernel's check alone."""
    ref = zeroed(layout, dev)
    launch_fused(h, W, params, shipped, layout, ref, vocab_size=V)
    for stages, sh in ((5, 8), (4, 8), (6, 8), (5, 4)):
        cand = zeroed(layout, dev)
        launch_fused_pp(h, W, params, layout, cand, vocab_size=V, stages=stages, shared_epilogue=sh)
        torch.cuda.synchronize(dev)
        if not C.same_candidates(cand, ref):
            failures.append(f"{label}: the ping-pong kernel with {stages} stages, shared_epilogue {sh} differs from "
                            "the dispatched launch")
    greedy = RowParams(0.0, 0, 0)  # (the timed *_greedy methods: the kernels compile without noise)
    ref_g = zeroed(layout, dev)
    launch_fused_ws(h, W, greedy, layout, ref_g, vocab_size=V, stages=shipped.num_stages, epilogue_warps=8)
    for sh in (8, 4):
        cand = zeroed(layout, dev)
        launch_fused_pp(h, W, greedy, layout, cand, vocab_size=V, shared_epilogue=sh)
        torch.cuda.synchronize(dev)
        if not C.same_candidates(cand, ref_g):
            failures.append(f"{label}: the greedy ping-pong kernel (shared_epilogue {sh}) differs from the ws kernel's")
    if only_pp:
        return
    got = {}
    for probe in NOISE_PROBES:
        cand = zeroed(layout, dev)
        launch_fused_ws(h, W, params, layout, cand, vocab_size=V, stages=shipped.num_stages, epilogue_warps=8,
                        noise_probe=probe)
        got[probe] = cand
    torch.cuda.synchronize(dev)
    if not C.same_candidates(got[""], ref):
        failures.append(f"{label}: the probe's shipped variant differs from the dispatched launch")
    same_bits = ("legacy", "legacy_philox")
    for probe in same_bits:
        if not C.same_candidates(got[probe], ref):
            failures.append(f"{label}: noise_probe={probe!r} gives other candidates than the shipped instructions")
    for probe in NOISE_PROBES:
        if probe and probe not in same_bits and torch.equal(got[probe].i, ref.i):
            failures.append(f"{label}: noise_probe={probe!r} left every candidate as it was (switch not applied?)")
    for stages, bufs, chunk in ((shipped.num_stages, 2, 0), (4, 2, 0), (shipped.num_stages, 1, 16),
                                (shipped.num_stages, 2, 16), (shipped.num_stages, 2, 32)):
        cand = zeroed(layout, dev)
        launch_fused_ws(h, W, params, layout, cand, vocab_size=V, stages=stages, epilogue_warps=8, acc_buffers=bufs,
                        epilogue_chunk=chunk)
        torch.cuda.synchronize(dev)
        if not C.same_candidates(cand, ref):
            failures.append(f"{label}: acc_buffers={bufs}, epilogue_chunk={chunk} with {stages} stages differs from "
                            "the dispatched launch")


def main(argv=None) -> int:
    args = parse_args(argv)
    dev = C.hopper_device("noise_cost_probe")
    if dev is None:
        return 0
    out = C.ResultWriter("noise_cost_probe", dev)
    out.data.update(env=C.env_info(), args=vars(args), cells=[])
    failures = []
    flush = C.L2Flusher(dev)
    clocks = ClockReader(args.smi_ms)
    table = []
    try:
        for D, V in C.parse_shapes(args.shapes):
            W, g = C.seeded_weight(D, V, dev)
            for B in C.parse_int_list(args.batches):
                hs = [torch.randn(B, D, device=dev, generator=g).to(torch.bfloat16) for _ in range(4)]
                params = RowParams(torch.ones(B, device=dev), torch.randint(0, 2**62, (B,), device=dev, generator=g),
                                   torch.randint(0, 2**40, (B,), device=dev, generator=g))
                greedy = RowParams(0.0, 0, 0)  # (scalar T = 0: the kernel compiles without noise)
                layout = CandidateLayout(1, triton.cdiv(V, 128), B)
                cand = BufferPair.alloc(layout, dev)
                shipped = default_config(B, D, dev)
                label = f"D={D} B={B}"
                if not (shipped.ws and shipped.block_b == 128):
                    failures.append(f"{label}: the dispatch runs {shipped}, not the ws 128-row tile: cell skipped")
                    continue
                check(hs[0], W, params, layout, V, shipped, dev, failures, label, args.check == "pp")

                def ws(h, p=params, probe="", epi=False, bufs=1, stages=shipped.num_stages, chunk=0, cap=0):
                    launch_fused_ws(h, W, p, layout, cand, vocab_size=V, stages=stages, epilogue_warps=8,
                                    noise_probe=probe, epilogue_only=epi, acc_buffers=bufs, epilogue_chunk=chunk,
                                    grid_cap=cap)

                def pp(h, p=params, stages=5, sh=8, epi=False):
                    launch_fused_pp(h, W, p, layout, cand, vocab_size=V, stages=stages, shared_epilogue=sh,
                                    epilogue_only=epi)

                methods = {"cublas": lambda h: F.linear(h, W), "ws": ws,
                           "ws_greedy": lambda h: ws(h, greedy), "ws_epi": lambda h: ws(h, epi=True),
                           "ws_philox": lambda h: ws(h, probe="philox"), "ws_logs": lambda h: ws(h, probe="logs"),
                           "ws_rounds7": lambda h: ws(h, probe="rounds7"),
                           "ws_legacy": lambda h: ws(h, probe="legacy"),
                           "ws_legacy_philox": lambda h: ws(h, probe="legacy_philox"),
                           "ws_ab2": lambda h: ws(h, bufs=2),
                           "ws_ab2s4": lambda h: ws(h, bufs=2, stages=4),
                           "ws_ab2_greedy": lambda h: ws(h, greedy, bufs=2),
                           "ws_c16": lambda h: ws(h, chunk=16), "ws_c16ab2": lambda h: ws(h, bufs=2, chunk=16),
                           "ws_c32ab2": lambda h: ws(h, bufs=2, chunk=32),
                           "ws_c16ab2_greedy": lambda h: ws(h, greedy, bufs=2, chunk=16),
                           "ws_s6": lambda h: ws(h, stages=6), "ws_s6_greedy": lambda h: ws(h, greedy, stages=6),
                           "ws_s5": lambda h: ws(h, stages=5), "ws_s5_greedy": lambda h: ws(h, greedy, stages=5),
                           "ws_s4": lambda h: ws(h, stages=4), "ws_s4_greedy": lambda h: ws(h, greedy, stages=4),
                           "ws_s3": lambda h: ws(h, stages=3),
                           "ws_cap128": lambda h: ws(h, cap=128), "ws_cap128_greedy": lambda h: ws(h, greedy, cap=128),
                           "ws_cap120": lambda h: ws(h, cap=120),
                           "pp": lambda h: pp(h), "pp_greedy": lambda h: pp(h, greedy),
                           "pp_s4": lambda h: pp(h, stages=4), "pp_s6": lambda h: pp(h, stages=6),
                           "pp_s6_greedy": lambda h: pp(h, greedy, stages=6),
                           "pp_sh4": lambda h: pp(h, sh=4), "pp_sh8": lambda h: pp(h),
                           "pp_sh8_s6": lambda h: pp(h, stages=6), "pp_sh8_greedy": lambda h: pp(h, greedy),
                           "pp_epi": lambda h: pp(h, epi=True), "pp_sh8_epi": lambda h: pp(h, epi=True)}
                if args.methods:
                    keep = {"cublas", "ws"} | set(args.methods.split(","))
                    unknown = keep - set(methods)
                    if unknown:
                        raise SystemExit(f"--methods: unknown {sorted(unknown)}")
                    methods = {k: v for k, v in methods.items() if k in keep}
                runs = [C.time_methods(methods, [(h,) for h in hs], warmup=args.warmup, reps=args.reps, flush=flush,
                                       device=dev, failures=failures, label=label) for _ in range(args.repeat)]
                times = {}
                for name in runs[0]:
                    meds = [r[name]["median_us"] for r in runs if name in r]
                    times[name] = dict(runs[0][name], median_us=statistics.median(meds), run_medians_us=meds)
                power = {}
                for name, fn in methods.items():
                    if name not in times or args.seconds <= 0:
                        continue
                    t0, t1, per_call = sustained(fn, (hs[0],), args.seconds, dev)
                    time.sleep(0.15)  # (the last samples of the window arrive)
                    power[name] = dict(clocks.window(t0, t1), sustained_us=per_call)
                    time.sleep(0.3)  # (a short idle gap, so that windows do not blend)
                row = {"D": D, "V": V, "B": B, "config": str(shipped), "times": times, "power": power}
                out.data["cells"].append(row)
                out.flush()
                table.append(row)
                C.log(f"{label}: " + ", ".join(
                    f"{k} {v['median_us']:.1f} us @ {power.get(k, {}).get('sm_mhz', 0):.0f} MHz"
                    f" {power.get(k, {}).get('watts', 0):.0f} W" for k, v in times.items()))
            del W
            torch.cuda.empty_cache()
    finally:
        clocks.close()
    out.data["failures"] = failures
    out.data["smi_samples"] = len(clocks.samples)
    out.flush()
    print("\nstage 1 alone: median us (L2 flushed) / cublas; then the sustained run's median SM MHz and watts")
    for r in table:
        print(f"D={r['D']} B={r['B']} ({r['config']})")
        base = r["times"]["cublas"]["median_us"]
        for name, t in r["times"].items():
            pw = r["power"].get(name, {})
            meds = t.get("run_medians_us", [t["median_us"]])
            spread = f" [{min(meds):8.1f}-{max(meds):8.1f}]" if len(meds) > 1 else ""
            print(f"  {name:13s} {t['median_us']:9.1f} us{spread} {t['median_us'] / base:6.3f}x   "
                  f"{pw.get('sm_mhz', float('nan')):6.0f} MHz {pw.get('watts', float('nan')):5.0f} W "
                  f"({pw.get('n', 0)} samples, {pw.get('sustained_us', float('nan')):.1f} us a call back to back)")
    return C.report_checks(failures, out)


if __name__ == "__main__":
    sys.exit(main())
