"""Issue 14, v112: all-greedy calls on the ping-pong stage 1 (fsdist/ops/fused_sample_pp.py) against the ws kernel.

With ``configs.PP_GREEDY_ON`` (on since this bench's v112 run), ``fused_sample.launch_fused`` runs an all-greedy
plain call (one scalar temperature 0, as vLLM passes for an all-greedy batch) of at least
``configs.PP_GREEDY_MIN_BATCH`` rows on the ping-pong kernel instead of the warp-specialised one (v111b / v111c:
stage 1 alone 6-16% faster at B >= 512). This bench (which turns the rule on for its "on" side) times whole
``fsdist.sample(temperature=0.0)`` calls with the rule on and off, side by side, L2 flushed, CUDA events, medians
(``bench/common.py``), beside cuBLAS's matmul alone and the materialized greedy baseline (cuBLAS logits, argmax):

  cublas          F.linear(h, W)
  cublas_argmax   F.linear(h, W).argmax(-1)
  fsdist_pp       fsdist.sample(h, W, temperature=0.0): the ping-pong kernel where the rule applies
  fsdist_ws       the same with the rule off (the ws kernel, as before v112)

Checks first: both give the same tokens, and the rule took effect (a counted launch of the ping-pong kernel).

    python3 bench/greedy_pp_ab.py [--shapes 4096x151936,8192x128256] [--batches 256,512,768,1024] [--repeat 3]

Prints a table last; the JSON goes to bench/results/greedy_pp_ab_<gpu>_<date>.json (and $OUT). sm_90 only.
"""
import common as C  # first: the repo root on sys.path, fsdist.env.apply_safe_env() before torch

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import fsdist  # noqa: E402
from fsdist.ops import configs, fused_sample  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="4096x151936,8192x128256")
    p.add_argument("--batches", default="256,512,768,1024")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--repeat", type=int, default=3, help="time every method this many times in turn")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    dev = C.hopper_device("greedy_pp_ab")
    if dev is None:
        return 0
    out = C.ResultWriter("greedy_pp_ab", dev)
    out.data.update(env=C.env_info(), args=vars(args), cells=[], fast_memory=configs.fast_memory(dev))
    failures = []
    flush = C.L2Flusher(dev)
    configs.PP_GREEDY_ON = True  # (the rule as shipped; set here too, so a run with it switched off still compares)
    real_rule = fused_sample.pp_greedy_rule
    real_pp = fused_sample.launch_fused_pp
    launches = []

    def counted_pp(*a, **k):
        launches.append(1)
        return real_pp(*a, **k)

    fused_sample.launch_fused_pp = counted_pp

    def rule(on):
        fused_sample.pp_greedy_rule = real_rule if on else (lambda batch, fast: False)

    def call(h, W, on):
        rule(on)
        return fsdist.sample(h, W, temperature=0.0).tokens

    table = []
    for D, V in C.parse_shapes(args.shapes):
        W, g = C.seeded_weight(D, V, dev)
        for B in C.parse_int_list(args.batches):
            label = f"D={D} B={B}"
            hs = [torch.randn(B, D, device=dev, generator=g).to(torch.bfloat16) for _ in range(4)]
            launches.clear()
            a = call(hs[0], W, True)
            took_pp = len(launches) > 0
            b = call(hs[0], W, False)
            torch.cuda.synchronize(dev)
            if not torch.equal(a, b):
                failures.append(f"{label}: the ping-pong and ws kernels give other tokens")
            if not took_pp and real_rule(B, configs.fast_memory(dev)):
                failures.append(f"{label}: the rule applies but the ping-pong kernel did not run")
            methods = {"cublas": lambda h: F.linear(h, W), "cublas_argmax": lambda h: F.linear(h, W).argmax(-1),
                       "fsdist_pp": lambda h: call(h, W, True), "fsdist_ws": lambda h: call(h, W, False)}
            runs = [C.time_methods(methods, [(h,) for h in hs], warmup=args.warmup, reps=args.reps, flush=flush,
                                   device=dev, failures=failures, label=label) for _ in range(args.repeat)]
            times = {}
            for name in runs[0]:
                meds = [r[name]["median_us"] for r in runs if name in r]
                times[name] = dict(runs[0][name], median_us=statistics.median(meds), run_medians_us=meds)
            row = {"D": D, "V": V, "B": B, "pp_ran": took_pp, "times": times}
            out.data["cells"].append(row)
            out.flush()
            table.append(row)
            C.log(f"{label}: " + ", ".join(f"{k} {v['median_us']:.1f} us" for k, v in times.items()))
        del W
        torch.cuda.empty_cache()
    rule(True)
    fused_sample.launch_fused_pp = real_pp
    out.data["failures"] = failures
    out.flush()
    print("\nwhole fsdist.sample(temperature=0.0) calls: median us (L2 flushed), / cublas, [runs' range]")
    for r in table:
        base = r["times"]["cublas"]["median_us"]
        print(f"D={r['D']} B={r['B']} (ping-pong ran: {r['pp_ran']})")
        for name, t in r["times"].items():
            meds = t["run_medians_us"]
            print(f"  {name:14s} {t['median_us']:9.1f} us [{min(meds):8.1f}-{max(meds):8.1f}] "
                  f"{t['median_us'] / base:6.3f}x")
    return C.report_checks(failures, out)


if __name__ == "__main__":
    sys.exit(main())
