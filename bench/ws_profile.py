"""Issue 14: a target for Nsight Compute (ncu) — the warp-specialised stage 1 and cuBLAS, one call each.

Runs, after one warm-up round of the same calls (compiles, cuBLAS heuristics), one call per case in a
fixed order, each call in an NVTX range named "<round>:<case>", so that ncu with
``--nvtx --nvtx-include "regex:profiled:.*/"`` profiles exactly the second round:

  cublas_B<B>   F.linear(h, W), bf16 (issue 14's yardstick)
  greedy_B<B>   fused_sample_ws_kernel, T = 0 (the main loop with the lightest epilogue)
  noise_B<B>    fused_sample_ws_kernel, [B] temperatures (the serving case)
  legacy_B<B>   the same noise in the instructions before v97 (noise_probe="legacy"; the same candidates)
  legacy_philox_B<B>  only its Philox in those instructions (noise_probe="legacy_philox")
  rounds7_B<B>  Philox with 7 rounds instead of 10 (noise_probe="rounds7"; not the sampler's tokens)
  padded_B<B>   the same on a hidden zero-padded to whole batch tiles (the copy not profiled)
  short_B<B>    the same with a short last tile run as half a tile (last_box_rows=8; B % 128 in 1-64)

for each B of --batches at one shape. GPU (sm_90) only; prints the case order and the kernels launched.
Used by scripts/gpu_profile_ws.sh; the question it answers (v19 in docs/performance.md) is what the noise
epilogue competes with when it slows the wgmma main loop, and why B = 192 is slower than B = 256; with
``--cases padded,short`` (v78) whether a short last tile's pairs of programs read each weight tile twice from DRAM
(the MemoryWorkloadAnalysis section's DRAM bytes against the padded launch's).
"""
import common as C  # first: the repo root on sys.path, fsdist.env.apply_safe_env() before torch

import argparse  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402

from fsdist.ops.configs import pick_config  # noqa: E402
from fsdist.ops.fused_sample import tile_operand  # noqa: E402
from fsdist.ops.fused_sample_ws import launch_fused_ws, new_wait_probe  # noqa: E402
from fsdist.ops.layout import BufferPair, CandidateLayout  # noqa: E402
from fsdist.params import RowParams  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="4096x151936")
    p.add_argument("--batches", default="1024,256,192")
    p.add_argument("--cases", default="cublas,greedy,noise")
    p.add_argument("--wait-probe", action="store_true",
                   help="the greedy / noise / legacy launches also count their waits (launch_fused_ws's wait_probe) "
                   "and print ws_waits.py's shares of the profiled round's launch: the probe and ncu's samples on the same launch (v109)")
    args = p.parse_args(argv)
    cases = args.cases.split(",")
    known = ("cublas", "greedy", "noise", "padded", "short", "legacy", "legacy_philox", "rounds7")
    unknown = sorted(set(cases) - set(known))
    if unknown:
        p.error(f"--cases: unknown {unknown}; choose from {', '.join(known)}")
    dev = C.hopper_device("ws_profile")
    if dev is None:
        return 0
    (D, V), = C.parse_shapes(args.shape)
    cfg = pick_config(1024, D, "cuda")  # the shipped large-batch tile: its stages and warps
    if not cfg.ws:
        print(f"ws_profile: the shipped config {cfg.name} is not the warp-specialised kernel.", flush=True)
        return 1
    epilogue_warps = 8 if cfg.num_warps >= 8 else 4
    g = torch.Generator(device=dev).manual_seed(0)
    W = (torch.randn(V, D, device=dev, generator=g) * D ** -0.5).to(torch.bfloat16)
    calls = []
    probes = {}  # --wait-probe: each ws case's probe rows (refilled before every launch: the profiled round's)
    for B in C.parse_int_list(args.batches):
        h = torch.randn(B, D, device=dev, generator=g).to(torch.bfloat16)
        layout = CandidateLayout(1, triton.cdiv(V, 128), B)
        cand = BufferPair.alloc(layout, dev)
        serving = RowParams(torch.ones(B, device=dev), torch.randint(0, 2**62, (B,), device=dev, generator=g),
                            torch.randint(0, 2**40, (B,), device=dev, generator=g))
        greedy = RowParams(0.0, 0, 0)
        for case in cases:
            if case == "cublas":
                calls.append((f"cublas_B{B}", lambda h=h: F.linear(h, W)))
            elif case in ("padded", "short"):
                hp = tile_operand(h, cfg.block_b, min_rows=1) if case == "padded" else h  # (padded once, here)
                last = 8 if case == "short" else 0
                calls.append((f"{case}_B{B}", lambda hp=hp, B=B, layout=layout, cand=cand, prm=serving, last=last:
                              launch_fused_ws(hp, W, prm, layout, cand, vocab_size=V, stages=cfg.num_stages,
                                              epilogue_warps=epilogue_warps, batch=B, last_box_rows=last)))
            else:
                prm = greedy if case == "greedy" else serving
                probe = case if case in ("legacy", "legacy_philox", "rounds7") else ""
                waits = new_wait_probe(dev) if args.wait_probe else None
                if waits is not None:
                    probes[f"{case}_B{B}"] = waits
                calls.append((f"{case}_B{B}", lambda h=h, layout=layout, cand=cand, prm=prm, probe=probe, waits=waits:
                              launch_fused_ws(h, W, prm, layout, cand, vocab_size=V, stages=cfg.num_stages,
                                              epilogue_warps=epilogue_warps, noise_probe=probe, wait_probe=waits)))
    for _round in ("warm-up", "profiled"):
        for waits in probes.values():
            waits.fill_(-1)  # (field 9 is an atomic max: the warm-up's must not stay; the fill is not profiled)
        for name, fn in calls:
            torch.cuda.nvtx.range_push(f"{_round}:{name}")  # ncu --nvtx-include "regex:profiled:.*/": round 2
            fn()
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_pop()
        C.log(f"{_round} round done")
    print("cases, in launch order (each round):", ", ".join(n for n, _ in calls), flush=True)
    if probes:
        from ws_waits import shares  # (bench/: the probe's medians over programs, as ws_waits.py prints them)
        for name, waits in probes.items():
            sh = shares(waits.cpu())
            print(f"wait probe {name}: " + ("no program wrote every field" if sh is None else ", ".join(
                f"{k} {v:.4g}" for k, v in sh.items())), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
