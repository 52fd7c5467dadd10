#!/usr/bin/env python
"""Tensor-parallel sweep: ShardedFlashLMHead against all-gather-the-logits baselines.

    torchrun --nproc-per-node N bench/tp_sweep.py [options]       # N = 1, 2, 4, 8
    mpirun -n 2 python bench/tp_sweep.py                          # CPU smoke run (gloo)

Every method samples the serving case: a [B] device tensor of distinct per-row
temperatures (``--temperature`` 0.8 +- ``--temperature-spread`` 25%, evenly spaced;
``--greedy-rows N`` adds greedy rows, none by default) and [B] seeds and offsets, the
same on every rank; the baselines get the same temperatures (fsdist.reference.baselines).

Methods (``--transports`` x ``--reductions`` for fsdist, ``--baselines`` for the rest):
  fsdist/<transport>/<reduction>  fsdist.ShardedFlashLMHead (transport nvshmem | symm_mem |
                                  collective | shm; reduction candidates | group_logmass)
  fsdist/single                   fsdist.sample on the whole weight (TP=1 only)
  fsdist_graph/<transport>/<red>  with --graph (GPU): the same head call captured once in a CUDA
                                  graph, the timed loop replays it (same hidden state every replay)
  <baseline>_graph                with --graph-baselines (GPU): each baseline captured in a CUDA graph too
                                  (its all-gather, compiled kernels and RNG included) and replayed, so the
                                  comparison with fsdist_graph is device time against device time (eager
                                  baselines with torch ops around a collective are often host-bound here)
  fsdist/<transport>/candidates_endk  with --ab-merge-end-step: the head with a separate end_step launch
                                  after the merge (HeadTestSeam(merge_ends_step=False)), the A/B of the merge
                                  that ends a plain step itself
  fsdist/<transport>/candidates_devbar  with --ab-device-barrier (nvshmem, symm_mem): the head with
                                  FSDIST_DEVICE_BARRIER=1 (its step barriers are fsdist's signal-pad
                                  barrier with a timeout), the unsuffixed head then with FSDIST_DEVICE_BARRIER=0
                                  (the libraries' barriers); without the flag every head takes the default
                                  (the device barrier on GPUs since v49)
  matmul_shard                    this rank's shard matmul alone (cuBLAS): the per-rank floor
  ag_matmul                       shard matmul + all-gather of the logits (no sampling)
  ag_multinomial                  shard matmul + all-gather + softmax + multinomial (torch.compile)
  ag_gumbel                       shard matmul + all-gather + Gumbel argmax (torch.compile)
  ag_fi2                          shard matmul + all-gather + FlashInfer sampling_from_logits
                                  (when importable)
  ag_filtered                     with --filters: shard matmul + all-gather + the same filters on the
                                  logits + exponential race (fsdist.reference.baselines, torch.compile,
                                  the top-p cumsum eager as in kernel_bench's torch_topk_topp_compiled_es);
                                  it replaces ag_multinomial / ag_gumbel / ag_fi2, which sample unfiltered

``--filters top_k_top_p`` (top-k 50 + top-p 0.9) or ``min_p`` (0.05) passes those filters as [B]
device tensors to every fsdist method and to ag_filtered (the serving case of issue 11); the JSON is
then tp_sweep_<filters>_tp<N>_..., and the speedup column reads the TP=1 JSON of the same filters.
``--filters bitmask``, ``bias_pen`` or ``processors_all`` passes logit processors instead (kernel_bench's
sets: the token bitmask, logit bias + penalties on 1,000 ids per row, or all; issue 12 across TP), the same
tensors on every rank; ag_filtered then applies them in torch after the all-gather.

Timing: every rank runs the same iterations in lock-step; each run is a barrier, then
``--iters`` back-to-back calls between CUDA events; a run's time per call is the
maximum over the ranks; the reported number is the minimum over ``--runs`` runs (the
paper's convention), the median is kept too. The speedup column divides the TP=1 time
(this run if N=1, else ``--baseline-json`` or the newest tp_sweep_tp1 JSON for this
GPU in bench/results/ or $OUT) by this run's time; 'ideal' is TP=1 time / N.

``--profile-breakdown`` adds, per fsdist method and B, (a) stream time from the start
of stage 1 to the start of stage 2 (stage 1 + fan-out + barrier / all-gather) and of
stage 2, from CUDA events recorded at the head's hook points (the heads are built with a
``fsdist.tensor_parallel.HeadTestSeam`` whose hook stamps them), and (b) device time per
kernel category from torch.profiler (stage-1 kernel, exchange/barrier, stage 2,
matmul, sampling kernels ...), also for the baselines.

Rank 0 prints a table last and writes bench/results/tp_sweep_tp<N>_<gpu>_<date>.json
(and $OUT/...). Correctness is checked before timing (tokens equal on every rank, in
range; candidates mode gives fsdist.sample's tokens on the full weight; greedy rows
give the argmax); failures are printed under the table and make the exit status 1.
"""
import common as C  # first: the repo root on sys.path, fsdist.env.apply_safe_env() before torch/NCCL

import argparse  # noqa: E402
import glob  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from datetime import timedelta  # noqa: E402
from typing import Callable, Dict, List, Optional  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import fsdist  # noqa: E402
from fsdist.distributed import init_distributed, shutdown  # noqa: E402
from fsdist.reference import baselines as bl  # noqa: E402
from fsdist.tensor_parallel import HeadTestSeam, vocab_partition  # noqa: E402

GPU_SHAPES = "8192x128256,4096x151936"
CPU_SHAPES = "64x1000"
GPU_BATCHES = "1,16,64,256"
CPU_BATCHES = "1,4"

RANK = 0  # set in main


def log(*a):
    C.log(*a, rank=RANK)


# --------------------------------------------------------------------------- collectives helpers
class Comm:
    def __init__(self, device: torch.device):
        self.device = device
        self.world = dist.get_world_size()
        self.rank = dist.get_rank()
        # NCCL reduces CUDA tensors only; gloo CPU tensors.
        self.tdev = device if dist.get_backend() == "nccl" else torch.device("cpu")

    def agree(self, ok: bool) -> bool:
        """True only if ok on every rank (keeps all ranks on the same path)."""
        t = torch.tensor([1 if ok else 0], dtype=torch.int32, device=self.tdev)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return bool(t.item())

    def max_list(self, xs: List[float]) -> List[float]:
        t = torch.tensor(xs, dtype=torch.float64, device=self.tdev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    def same_everywhere(self, t: torch.Tensor) -> bool:
        t = t.to(self.tdev, torch.int64).reshape(-1)
        hi, lo = t.clone(), t.clone()
        dist.all_reduce(hi, op=dist.ReduceOp.MAX)
        dist.all_reduce(lo, op=dist.ReduceOp.MIN)
        return torch.equal(hi, lo)

    def barrier(self):
        dist.barrier()
        C.sync(self.device)


def _all_gather_fn():
    import torch.distributed._functional_collectives as funcol

    return getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor


# --------------------------------------------------------------------------- baselines
def make_baselines(group, world: int, V: int, has_greedy: bool):
    """Plain functions (h, shard, temperature, **filters) -> tokens or logits; the compiled methods wrap them.

    The sampling after the all-gather is fsdist.reference.baselines', as in kernel_bench.py;
    has_greedy: whether the batches hold greedy rows (a serving stack knows). filters: top_k / top_p
    or min_p [B] tensors (ag_filtered only; the others take no filters).
    """
    ag = _all_gather_fn()

    def gather_logits(h, Ws):
        local = F.linear(h, Ws)  # [B, Vp / N]
        if world == 1:
            return local[:, :V]
        full = ag(local, 1, group)  # [B, Vp]
        return full[:, :V]  # padding rows are never sampled

    def ag_matmul(h, Ws, temperature):
        return gather_logits(h, Ws)

    def ag_multinomial(h, Ws, temperature):
        return bl.multinomial_from_logits(gather_logits(h, Ws), temperature, has_greedy=has_greedy)

    def ag_gumbel(h, Ws, temperature):
        return bl.gumbel_argmax_from_logits(gather_logits(h, Ws), temperature)

    def filtered(logits, temperature, top_k=0, top_p=1.0, min_p=None, **processors):
        if processors:  # --filters bitmask / bias_pen: the processors in torch, then the Gumbel argmax
            from kernel_bench import torch_processed_logits

            return bl.gumbel_argmax_from_logits(torch_processed_logits(logits, **processors), temperature)
        if min_p is not None:
            return bl.min_p_from_logits(logits, temperature, min_p, has_greedy=has_greedy)
        # the top-p cumsum stays eager, as in kernel_bench's torch_topk_topp_compiled_es: torch 2.11's Inductor
        # fails on its split scan over a 150k-wide row at B >= 16 (bl.eager_row_cumsum)
        return bl.top_k_top_p_from_logits(logits, temperature, top_k, top_p, has_greedy=has_greedy,
                                          cumsum=bl.eager_row_cumsum)

    def ag_filtered(h, Ws, temperature, top_k=0, top_p=1.0, min_p=None, **processors):
        return filtered(gather_logits(h, Ws), temperature, top_k=top_k, top_p=top_p, min_p=min_p, **processors)

    return {"ag_matmul": ag_matmul, "ag_multinomial": ag_multinomial, "ag_gumbel": ag_gumbel,
            "ag_filtered": ag_filtered, "gather_logits": gather_logits, "filtered": filtered}


# The filters of --filters, as (name, dtype, value) per argument: every row the same value, passed as [B] tensors.
FILTERS = {"none": [], "top_k_top_p": [("top_k", torch.int32, 50), ("top_p", torch.float32, 0.9)],
           "min_p": [("min_p", torch.float32, 0.05)]}
# Logit processors as --filters sets (issue 12 across TP): kernel_bench's processor groups, built by its
# ShapeCtx.set_processors (bitmask density 0.5 with row 0 all ones; 500 bias + 250 output + 250 prompt ids per
# row on GPUs, 20 + 10 + 10 on CPU), the same tensors on every rank (a seeded generator).
PROCESSOR_SETS = {"bitmask": "bitmask", "bias_pen": "bias_pen", "processors_all": "all"}
# Baselines that sample without filters: refused with --filters (they would not do the same work).
UNFILTERED_BASELINES = ("ag_multinomial", "ag_gumbel", "ag_fi2")


def processor_rows(name: str, batches, D: int, V: int, dtype, device, on_gpu: bool):
    """Per batch size: (the head's / fsdist.sample's processor arguments, ag_filtered's tensors)."""
    from kernel_bench import ShapeCtx

    ctx = ShapeCtx(D=D, V=V, dtype=dtype, device=device, T=1.0,
                   proc_cfg={"density": 0.5, "n_bias": 500 if on_gpu else 20, "n_output": 250 if on_gpu else 10,
                             "n_prompt": 250 if on_gpu else 10})
    group, head_kw, bl_kw = PROCESSOR_SETS[name], {}, {}
    for B in batches:
        gen = torch.Generator(device=device).manual_seed(1000 + B)  # the same on every rank
        ctx.set_processors(B, gen)
        head_kw[B] = ctx.processor_kwargs(group)
        kw = {}
        if "token_bitmask" in head_kw[B]:
            kw["token_bitmask"] = ctx.bitmask_t
        if "logit_bias" in head_kw[B]:
            kw.update(bias_ids=ctx.bias_ids_t, bias_vals=ctx.bias_vals_t)
        if "penalties" in head_kw[B]:
            kw.update(rep=ctx.rep_t, freq=ctx.freq_t, pres=ctx.pres_t, output_ids=ctx.out_ids_t,
                      prompt_ids=ctx.prompt_ids_t)
        bl_kw[B] = kw
    return head_kw, bl_kw


def sweep_name(filters: str) -> str:
    """The JSON's name prefix (before _tp<N>): tp_sweep, or tp_sweep_<filters>."""
    return "tp_sweep" if filters == "none" else f"tp_sweep_{filters}"


# --------------------------------------------------------------------------- timing
def time_lockstep(comm: Comm, fn: Callable, hs: List[torch.Tensor], *, warmup: int, iters: int, runs: int):
    """Per-call time (µs) of each run, max over ranks; and the host's submit time per call of
    each run (µs, max over ranks): when it is about the stream time, the GPU waited on Python."""
    for i in range(warmup):
        fn(hs[i % len(hs)])
    per_run, host = [], []
    for _ in range(runs):
        comm.barrier()
        start = C.Stamp(comm.device)
        t0 = time.perf_counter()
        for i in range(iters):
            fn(hs[i % len(hs)])
        host.append((time.perf_counter() - t0) / iters * 1e6)
        end = C.Stamp(comm.device)
        C.sync(comm.device)
        per_run.append(start.us_to(end) / iters)
    return comm.max_list(per_run), comm.max_list(host)


def hook_breakdown(comm: Comm, seam: Optional[HeadTestSeam], call: Callable, hs, iters: int) -> Optional[Dict]:
    """Stream time stage1 start -> stage2 start (stage 1 + exchange) and stage2 start -> end,
    stamped by the head's test seam at its hook points."""
    if seam is None:
        return None
    stamps: Dict[str, C.Stamp] = {}
    a, b = [], []

    def hook(point, step):
        stamps[point] = C.Stamp(comm.device)

    old = seam.hook
    seam.hook = hook
    try:
        comm.barrier()
        rows = []
        for i in range(iters):
            stamps.clear()
            call(hs[i % len(hs)])
            end = C.Stamp(comm.device)
            rows.append((stamps.get("before_stage1"), stamps.get("before_stage2"), end))
        C.sync(comm.device)
        for s1, s2, e in rows:
            if s1 is None or s2 is None:
                return None
            a.append(s1.us_to(s2))
            b.append(s2.us_to(e))
    finally:
        seam.hook = old
    return {"stage1_plus_exchange_us": comm.max_list([statistics.median(a)])[0],
            "stage2_us": comm.max_list([statistics.median(b)])[0]}


KERNEL_CATEGORIES = [  # first match wins; names as CUPTI reports the kernels
    ("fused_sample(stage1)", r"fused_sample"),
    ("sample_logits(stage1)", r"sample_logits"),  # the chunked path's pass over cuBLAS logits
    # stage 2 (candidates) / local merge (group_logmass); reduce_candidates before 2026-11-23
    ("merge_candidates", r"merge_candidates|reduce_candidates"),
    ("group_publish", r"group_publish"),
    ("group_select(stage2)", r"group_select"),
    ("exchange/barrier", r"nccl|nvshmem|barrier|signal|symm|all_?gather|allgather"),
    ("matmul", r"gemm|cutlass|cublas|xmma|nvjet|gmma|matmul|sm\d+_"),
    ("sampling", r"softmax|multinomial|argmax|triton_|exponential|random|philox|sampling|reduce|max"),
]


def profile_breakdown(comm: Comm, call: Callable, hs, iters: int) -> Optional[Dict]:
    """Device time per kernel (and per category) per call, from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CUDA] if comm.device.type == "cuda" else [ProfilerActivity.CPU]
    comm.barrier()
    try:
        with profile(activities=acts) as prof:
            for i in range(iters):
                call(hs[i % len(hs)])
            C.sync(comm.device)
    except Exception as e:  # noqa: BLE001  (profiler unavailable)
        return {"error": f"{type(e).__name__}: {e}"}
    per_kernel = C.per_kernel_us(prof, comm.device, iters)
    cats: Dict[str, float] = {}
    for name, us in per_kernel.items():
        cat = next((c for c, pat in KERNEL_CATEGORIES if re.search(pat, name, re.I)), "other")
        cats[cat] = cats.get(cat, 0.0) + us
    top = dict(sorted(per_kernel.items(), key=lambda kv: -kv[1])[:12])
    return {"categories_us": cats, "top_kernels_us": top, "total_device_us": sum(per_kernel.values())}


# --------------------------------------------------------------------------- main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", help=f"DxV list (GPU default {GPU_SHAPES}; CPU {CPU_SHAPES})")
    p.add_argument("--batches", help=f"GPU default {GPU_BATCHES}; CPU {CPU_BATCHES}")
    p.add_argument("--transports", help="fsdist transports (GPU default nvshmem,symm_mem,collective; CPU shm,collective)")
    p.add_argument("--reductions", default="candidates,group_logmass")
    p.add_argument("--baselines", default="default",
                   help="comma list of matmul_shard,ag_matmul,ag_multinomial,ag_gumbel,ag_fi2,fsdist_single; "
                        "'default' = all available, 'none'")
    p.add_argument("--eager-baselines", action="store_true", help="no torch.compile for the baselines")
    p.add_argument("--force-compile", action="store_true", help="compile the baselines on CPU too (testing)")
    p.add_argument("--quick", action="store_true",
                   help="GPU: D=8192 V=128256, B in 16,64,256, nvshmem+collective candidates, 3 runs of 50")
    p.add_argument("--dtype", help="bf16 (GPU default) | fp16 | fp32 (CPU default)")
    p.add_argument("--temperature", type=float, default=0.8, help="center of the per-row temperatures")
    p.add_argument("--temperature-spread", type=float, default=0.25,
                   help="per-row temperatures evenly spaced over T * [1 - spread, 1 + spread]")
    p.add_argument("--greedy-rows", type=int, default=0, help="rows per batch with temperature 0 (greedy)")
    p.add_argument("--runs", type=int, help="timed runs per cell (GPU 5, CPU 2)")
    p.add_argument("--iters", type=int, help="calls per run (GPU 100, CPU 2)")
    p.add_argument("--warmup", type=int, help="warm-up calls (GPU 10, CPU 1)")
    p.add_argument("--rotate", type=int, default=4, help="hidden-state buffers rotated over")
    p.add_argument("--logprobs", action="store_true", help="fsdist methods also return logprobs")
    p.add_argument("--filters", default="none", choices=list(FILTERS) + list(PROCESSOR_SETS),
                   help="per-row filters ([B] device tensors) for fsdist and ag_filtered: top_k_top_p (50, 0.9) "
                        "or min_p (0.05); or logit processors: bitmask, bias_pen (logit bias + penalties on 1,000 "
                        "ids per row) or processors_all (ag_filtered then applies them in torch)")
    p.add_argument("--graph", action="store_true",
                   help="GPU: also time every fsdist head as a CUDA-graph replay (method fsdist_graph/...)")
    p.add_argument("--graph-baselines", action="store_true",
                   help="GPU: with --graph, also time every baseline as a CUDA-graph replay (method <name>_graph); "
                        "run it in its own invocation: a capture the collective refuses can spoil the process")
    p.add_argument("--ab-device-barrier", action="store_true",
                   help="also time each nvshmem / symm_mem candidates head with FSDIST_DEVICE_BARRIER=1 (suffix "
                        "_devbar)")
    p.add_argument("--ab-merge-end-step", action="store_true",
                   help="also time each candidates head with a separate end_step launch (method suffix _endk)")
    p.add_argument("--profile-breakdown", action="store_true",
                   help="also time stage 1 + exchange / stage 2 and per-kernel device time")
    p.add_argument("--breakdown-iters", type=int, default=20)
    p.add_argument("--baseline-json", help="TP=1 tp_sweep JSON for the speedup column")
    p.add_argument("--max-minutes", type=float, help="stop starting new cells after this (GPU 8, CPU 30)")
    p.add_argument("--timeout-minutes", type=float, default=4.0, help="collective timeout")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="JSON path or directory (default bench/results/)")
    p.add_argument("--no-json", action="store_true")
    return p.parse_args(argv)


def row_params_mode(d: Dict) -> str:
    """'rows' for runs with [B] temperatures (from 2026-11-23), 'scalar' for the older JSONs."""
    return "rows" if (d.get("args") or {}).get("fsdist_row_params") else "scalar"


def find_tp1(gpu: str, explicit: Optional[str], filters: str = "none") -> Optional[Dict]:
    """The TP=1 JSON for the speedup column: `explicit`, else the newest one for this GPU with the
    same --filters, preferring one measured like this run (per-row [B] temperatures) over an older one."""
    paths = [explicit] if explicit else []
    if not explicit:
        name = f"{sweep_name(filters)}_tp1_{gpu}_*.json"
        pats = [str(C.RESULTS_DIR / name)]
        if os.environ.get("OUT"):
            pats.append(os.path.join(os.environ["OUT"], name))
        found = sorted({p for pat in pats for p in glob.glob(pat)}, key=os.path.basename)
        paths = list(reversed(found))
    fallback = None
    for p in paths:
        try:
            d = json.loads(open(p).read())
            d["_path"] = p
        except Exception as e:  # noqa: BLE001
            print(f"warning: could not read TP=1 JSON {p}: {e}", flush=True)
            continue
        if not explicit and (d.get("args") or {}).get("filters", "none") != filters:
            continue
        if explicit or row_params_mode(d) == "rows":
            return d
        fallback = fallback or d
    return fallback


def tp1_times(d: Optional[Dict]) -> Dict[tuple, float]:
    if not d:
        return {}
    return {(r["D"], r["V"], r["B"], r["method"]): r["min_us"] for r in d.get("results", [])
            if r.get("min_us") is not None and r.get("tp") == 1}


def print_table(data: Dict, world: int, tp1: Optional[Dict]):
    res = [r for r in data["results"] if r.get("min_us") is not None]
    t1 = tp1_times(tp1)
    if world == 1:
        t1.update({(r["D"], r["V"], r["B"], r["method"]): r["min_us"] for r in res})
    gpu = (data["env"].get("gpu") or {}).get("name", "cpu")
    if data.get("breakdown"):
        print("\n== breakdown per call (us): stream time from hook points; device time per kernel category ==")
        for b in data["breakdown"]:
            hk = b.get("hook") or {}
            cats = (b.get("profile") or {}).get("categories_us", {})
            cs = " ".join(f"{k}={v:.1f}" for k, v in sorted(cats.items(), key=lambda kv: -kv[1]))
            hs = (f"stage1+exchange={hk['stage1_plus_exchange_us']:.1f} stage2={hk['stage2_us']:.1f} | "
                  if hk else "")
            k1 = cats.get("fused_sample(stage1)")
            if hk and k1 and b["method"].endswith("/candidates"):
                # stream time between stage-1 start and stage-2 start not spent in the stage-1 kernel:
                # fan-out stores that outlast the kernel, the barrier / all-gather, waiting for peers
                hs += f"exchange~{hk['stage1_plus_exchange_us'] - k1:.1f} | "
            print(f"D={b['D']} B={b['B']:<4} {b['method']:<32} {hs}{cs}")
            top = (b.get("profile") or {}).get("top_kernels_us", {})
            if top:  # which kernels, not only their categories: where a filtered call's extra time goes
                print("    " + "; ".join(f"{k[:44]}={v:.1f}" for k, v in list(top.items())[:8]))
    filt = data["args"].get("filters", "none")
    print(f"\n== TP={world} on {gpu}: min over {data['args']['runs']} runs x {data['args']['iters']} calls, "
          f"us per call (max over ranks)" + (f", filters {filt}" if filt != "none" else "") + " ==")
    src = tp1.get("_path") if tp1 else None
    if world > 1:
        print(f"TP=1 times from: {src or 'none found (run N=1 first or pass --baseline-json)'}")
        if tp1 and row_params_mode(tp1) != "rows":
            print("  note: that TP=1 run passed one float temperature, this one [B] per-row temperatures")
    print(f"{'D':>5} {'V':>7} {'B':>4} {'method':<32} {'TP=1':>8} {f'TP={world}':>8} {'speedup':>7} "
          f"{'ideal':>8} {'eff':>5} {'vs best bl':>10} {'host':>8}")
    for D, V in sorted({(r["D"], r["V"]) for r in res}):
        for B in sorted({r["B"] for r in res if (r["D"], r["V"]) == (D, V)}):
            rows = [r for r in res if (r["D"], r["V"], r["B"]) == (D, V, B)]
            # the best sampling baseline: for fsdist's graph replays the best of the eager and (--graph-baselines)
            # replayed baselines, for its eager calls the best eager one (like for like)
            sampling = UNFILTERED_BASELINES + ("ag_filtered",)
            bl_eager = [r["min_us"] for r in rows if r["method"] in sampling]
            bl_any = bl_eager + [r["min_us"] for r in rows if r["method"].endswith("_graph")
                                 and r["method"].removesuffix("_graph") in sampling]
            for r in rows:
                base = t1.get((D, V, B, r["method"]))
                sp = f"{base / r['min_us']:.2f}x" if base else "-"
                ideal = base / world if base else None
                eff = f"{100 * ideal / r['min_us']:.0f}%" if ideal else "-"
                bl = bl_any if r["method"].startswith("fsdist_graph/") else bl_eager
                vs = f"{min(bl) / r['min_us']:.2f}x" if (bl and r["method"].startswith("fsdist")) else ""
                # host: the submit time per call; a '!' where it is >= 90% of the stream time (the GPU
                # waited on Python, so the cell measures the host, not the kernels)
                ht = r.get("host_us")
                hflag = "!" if ht and ht >= 0.9 * r["min_us"] else ""
                print(f"{D:>5} {V:>7} {B:>4} {r['method']:<32} {C.fmt_us(base):>8} {C.fmt_us(r['min_us']):>8} "
                      f"{sp:>7} {C.fmt_us(ideal):>8} {eff:>5} {vs:>10} {C.fmt_us(ht):>7}{hflag}")
    errs = [r for r in data["results"] if r.get("error")]
    for r in errs[:8]:
        print(f"error: D={r['D']} B={r['B']} {r['method']}: {r['error'][:160]}")
    if data.get("skipped"):
        print("skipped: " + "; ".join(f"{k}: {v}" for k, v in data["skipped"].items()))
    fails = [c for c in data["checks"] if not c["ok"] and c.get("fatal", True)]
    if fails:
        print(f"!!! CORRECTNESS CHECKS FAILED ({len(fails)}): the affected numbers are not valid !!!")
        for c in fails[:8]:
            print(f"  D={c['D']} B={c['B']} {c['check']}: {c['detail']}")
    else:
        print(f"correctness checks: {len(data['checks'])} run, 0 failed")
    if data.get("json_path"):
        print(f"results: {data['json_path']}")


def main(argv=None) -> int:
    global RANK
    args = parse_args(argv)
    ctx = init_distributed(timeout=timedelta(minutes=args.timeout_minutes))
    RANK = ctx.rank
    device, world = ctx.device, ctx.world_size
    on_gpu = device.type == "cuda"
    comm = Comm(device)
    group = dist.group.WORLD
    try:
        rc = run(args, ctx, comm, group, device, world, on_gpu)
        ok = True
    except BaseException:
        traceback.print_exc()
        ok, rc = False, 2
    try:
        shutdown(collective=ok)
    except Exception:  # noqa: BLE001
        traceback.print_exc()
    return rc


def run(args, ctx, comm: Comm, group, device, world: int, on_gpu: bool) -> int:
    if args.quick and on_gpu:
        args.shapes = args.shapes or "8192x128256"
        args.batches = args.batches or "16,64,256"
        args.transports = args.transports or "nvshmem,collective"
        args.reductions = "candidates" if args.reductions == "candidates,group_logmass" else args.reductions
        args.runs, args.iters = args.runs or 3, args.iters or 50
    shapes = C.parse_shapes(args.shapes or (GPU_SHAPES if on_gpu else CPU_SHAPES))
    batches = C.parse_int_list(args.batches or (GPU_BATCHES if on_gpu else CPU_BATCHES))
    dtype = C.parse_dtype(args.dtype or ("bf16" if on_gpu else "fp32"))
    runs = args.runs or (5 if on_gpu else 2)
    iters = args.iters or (100 if on_gpu else 2)
    warmup = args.warmup if args.warmup is not None else (10 if on_gpu else 1)
    transports = [t for t in (args.transports or ("nvshmem,symm_mem,collective" if on_gpu else "shm,collective"))
                  .split(",") if t]
    reductions = [r for r in args.reductions.split(",") if r]
    if args.filters in FILTERS and args.filters != "none" and "group_logmass" in reductions:
        if args.reductions != "candidates,group_logmass":  # asked for explicitly
            raise SystemExit("--filters: the group_logmass reduction takes no filters; use --reductions candidates")
        reductions = ["candidates"]
    compile_baselines = (on_gpu or args.force_compile) and not args.eager_baselines
    budget = C.Budget(60 * (args.max_minutes or (8.0 if on_gpu else 30.0)))
    skipped: Dict[str, str] = {}
    if args.temperature <= 0:
        raise SystemExit("--temperature must be > 0 (greedy decoding is not what is benchmarked)")
    if not 0 <= args.temperature_spread < 1:
        raise SystemExit("--temperature-spread must be in [0, 1): every sampled row keeps T > 0")
    if args.graph_baselines and not args.graph:
        raise SystemExit("--graph-baselines needs --graph")
    if args.graph and not on_gpu:
        args.graph = False
        skipped["fsdist_graph"] = "CUDA graphs need a GPU"

    known_bl = ["matmul_shard", "ag_matmul", "ag_multinomial", "ag_gumbel", "ag_fi2", "ag_filtered", "fsdist_single"]
    filtered = args.filters != "none"
    if args.baselines == "none":
        baselines = []
    elif args.baselines == "default":
        baselines = [b for b in known_bl if (b not in UNFILTERED_BASELINES if filtered else b != "ag_filtered")]
    else:
        baselines = [b for b in args.baselines.split(",") if b]
        bad = [b for b in baselines if b not in known_bl]
        if bad:
            raise SystemExit(f"unknown baseline(s) {bad}; known: {known_bl}")
        if filtered and any(b in UNFILTERED_BASELINES for b in baselines):
            raise SystemExit(f"--filters {args.filters}: {', '.join(UNFILTERED_BASELINES)} sample without filters; "
                             "use ag_filtered")
        if not filtered and "ag_filtered" in baselines:
            raise SystemExit("ag_filtered needs --filters")
    if "fsdist_single" in baselines and world != 1:
        baselines.remove("fsdist_single")
    fi = None
    if "ag_fi2" in baselines:
        try:
            import flashinfer.sampling as fi  # noqa: F811
        except Exception as e:  # noqa: BLE001
            fi = None
            skipped["ag_fi2"] = f"flashinfer not importable ({type(e).__name__})"
        if not on_gpu:
            fi = None
            skipped["ag_fi2"] = "flashinfer needs a GPU"
        if fi is None:
            baselines.remove("ag_fi2")
    if on_gpu:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch._dynamo.config.cache_size_limit = 64  # alias of recompile_limit in newer torch
        if hasattr(torch._dynamo.config, "recompile_limit"):
            torch._dynamo.config.recompile_limit = 64
        if hasattr(torch._dynamo.config, "accumulated_cache_size_limit"):
            torch._dynamo.config.accumulated_cache_size_limit = 512

    writer = C.ResultWriter(f"{sweep_name(args.filters)}_tp{world}", device, args.out, enabled=(ctx.rank == 0 and not args.no_json))
    data = writer.data
    env = C.env_info() if ctx.rank == 0 else {}
    env["world_size"] = world
    env["backend"] = ctx.backend
    env["launcher"] = ctx.launcher
    data.update(kind="tp", env=env, skipped=skipped, results=[], checks=[], breakdown=[],
                args={"tp": world, "shapes": [list(s) for s in shapes], "batches": batches, "dtype": C.dtype_name(dtype),
                      "transports": transports, "reductions": reductions, "baselines": baselines,
                      "compile_baselines": compile_baselines, "runs": runs, "iters": iters, "warmup": warmup,
                      "temperature": args.temperature, "temperature_spread": args.temperature_spread,
                      "greedy_rows": args.greedy_rows, "fsdist_row_params": True,
                      "row_temperatures": C.describe_row_temperatures(args.temperature, args.temperature_spread,
                                                                      args.greedy_rows),
                      "logprobs": args.logprobs, "rotate": args.rotate, "graph": args.graph,
                      "graph_baselines": args.graph_baselines,
                      "filters": args.filters, "filter_values": {k: v for k, _, v in FILTERS.get(args.filters, ())},
                      "ab_merge_end_step": args.ab_merge_end_step, "ab_device_barrier": args.ab_device_barrier},
                json_path=str(writer.path) if writer.enabled else None)
    tp1 = find_tp1(C.gpu_slug(device), args.baseline_json, args.filters) if world > 1 else None
    if tp1:
        data["tp1_source"] = tp1["_path"]
    log(f"tp_sweep TP={world} on {(env.get('gpu') or {}).get('name', 'cpu')} ({ctx.backend}): shapes {shapes} "
        f"batches {batches} transports {transports} reductions {reductions} baselines {baselines}")

    def check(D, V, B, name, ok, detail="", fatal=True):
        data["checks"].append({"D": D, "V": V, "B": B, "check": name, "ok": bool(ok), "fatal": fatal,
                               "detail": detail})
        if not ok:
            log(f"CHECK {'FAILED' if fatal else 'warning'}: D={D} B={B} {name}: {detail}")

    def record(row):
        row["tp"] = world
        data["results"].append(row)
        writer.flush()

    def graph_row(D, V, B, name, fn, hs):
        """Capture one call of the (already warm) head or baseline, time replays; a head's (or fsdist_single's)
        replay must give the tokens of an eager call with the same inputs (a baseline draws from torch's RNG:
        only the range is checked). The ranks agree on the capture before any replay: a baseline's graph holds
        an NCCL all-gather, which a rank whose capture failed would never join."""
        deterministic = name.startswith("fsdist")
        gname = ("fsdist_graph/" + name[len("fsdist/"):]) if name.startswith("fsdist/") else name + "_graph"
        row = {"D": D, "V": V, "B": B, "method": gname, "min_us": None, "median_us": None, "error": None}
        err, graph = None, None
        try:
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = fn(hs[0])
        except Exception as e:  # noqa: BLE001
            err = f"{type(e).__name__}: {str(e)[:300]}"
        if comm.agree(err is None):
            try:
                graph.replay()
                if deterministic:
                    eager = fn(hs[0])  # the next buffer copy, same inputs: same tokens
                    C.sync(device)
                    check(D, V, B, f"{gname} replay == eager call", torch.equal(out.tokens, eager.tokens),
                          f"{int((out.tokens != eager.tokens).sum())}/{B} rows differ")
                else:
                    C.sync(device)
                    tok = None if name in ("matmul_shard", "ag_matmul") else out.reshape(-1)
                    if tok is not None:
                        ok = tok.numel() == B and bool(((tok >= 0) & (tok < V)).all())
                        check(D, V, B, f"{gname} tokens in [0, V)", ok, f"n={tok.numel()}")
            except Exception as e:  # noqa: BLE001
                err = f"{type(e).__name__}: {str(e)[:300]}"
        else:
            err = err or "the capture failed on another rank"
        if comm.agree(err is None):
            try:
                per_run, host = time_lockstep(comm, lambda _x: graph.replay(), hs, warmup=warmup, iters=iters,
                                              runs=runs)
                row.update(min_us=min(per_run), median_us=statistics.median(per_run), runs_us=per_run, iters=iters,
                           host_us=min(host))
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        else:
            row["error"] = err or "failed on another rank"
        log(f"  D={D} B={B:<4} {gname:<32} min {C.fmt_us(row['min_us']):>9} us  median "
            f"{C.fmt_us(row['median_us']):>9} us" + (f"  ERROR {row['error']}" if row["error"] else ""))
        record(row)
        del graph
        C.sync(device)

    gen_dev = device
    stopped = False
    for D, V in shapes:
        if stopped:
            break
        torch._dynamo.reset()
        # The same full weight on every rank (same generator seed): rank r keeps its rows,
        # and fsdist.sample on the full weight is the reference for candidates mode.
        g = torch.Generator(device=gen_dev).manual_seed(args.seed * 1000 + D)
        W_full = torch.randn(V, D, device=device, generator=g, dtype=dtype).mul_(2.0 / math.sqrt(D))
        part = vocab_partition(V, world, ctx.rank)
        shard = torch.zeros(part.rows, D, device=device, dtype=dtype)
        n_valid = part.valid_rows
        if n_valid:
            shard[:n_valid].copy_(W_full[part.start:part.start + n_valid])
        hsets = {}
        for B in batches:
            hg = torch.Generator(device=gen_dev).manual_seed(args.seed * 7919 + B)
            hs = [torch.randn(B, D, device=device, generator=hg, dtype=dtype) for _ in range(max(1, args.rotate))]
            if compile_baselines and B >= 2:
                for h in hs:
                    torch._dynamo.mark_dynamic(h, 0)
            hsets[B] = hs
        seeds = {B: torch.arange(B, device=device, dtype=torch.int64) + 4242 for B in batches}
        offs = {B: torch.full((B,), 3, device=device, dtype=torch.int64) for B in batches}
        temps = {B: C.row_temperatures(B, args.temperature, args.temperature_spread, args.greedy_rows, device)
                 for B in batches}
        filt = {B: {k: torch.full((B,), v, dtype=dt, device=device) for k, dt, v in FILTERS.get(args.filters, ())}
                for B in batches}
        bl_filt = dict(filt)  # ag_filtered's keyword tensors (the processors unpacked)
        if args.filters in PROCESSOR_SETS:
            filt, bl_filt = processor_rows(args.filters, batches, D, V, dtype, device, on_gpu)
        if compile_baselines:
            for B in batches:
                if B >= 2:
                    for t in [temps[B], *filt[B].values()]:
                        if isinstance(t, torch.Tensor):
                            torch._dynamo.mark_dynamic(t, 0)
        log(f"shape D={D} V={V} (padded {part.padded_vocab_size}, {part.rows} rows per rank)")

        methods: List[tuple] = [(f"fsdist/{t}/{r}", t, r) for t in transports for r in reductions]
        if args.ab_device_barrier:
            methods += [(f"fsdist/{t}/candidates_devbar", t, "candidates") for t in transports
                        if t in ("nvshmem", "symm_mem", "shm") and "candidates" in reductions]
        if args.ab_merge_end_step:
            methods += [(f"fsdist/{t}/candidates_endk", t, "candidates") for t in transports
                        if "candidates" in reductions]
        methods += [(b, None, None) for b in baselines]
        has_greedy = args.greedy_rows > 0
        plain = make_baselines(group, world, V, has_greedy)
        for name, transport, reduction in methods:
            if budget.exceeded():
                skipped["budget"] = f"stopped before D={D} {name}"
                log(f"time budget spent: stopping before D={D} {name}")
                stopped = True
                break
            head = None
            seam = None
            fn = None
            err = None
            try:
                if name.startswith("fsdist/"):
                    # the seam's hook stamps stage 1 / stage 2 for --profile-breakdown; no seam otherwise
                    endk = name.endswith("_endk")
                    seam = HeadTestSeam(merge_ends_step=not endk) if (args.profile_breakdown or endk) else None
                    # The A/B pair differs in FSDIST_DEVICE_BARRIER alone (read by the transport the head builds):
                    # set for _devbar heads, cleared for the others, the caller's value restored after.
                    devbar = name.endswith("_devbar")
                    before = os.environ.get("FSDIST_DEVICE_BARRIER")
                    if args.ab_device_barrier:
                        os.environ["FSDIST_DEVICE_BARRIER"] = "1" if devbar else "0"
                    try:
                        head = fsdist.ShardedFlashLMHead(D, V, tp_group=group, transport=transport,
                                                         reduction=reduction, params_dtype=dtype, device=device,
                                                         max_batch_size=max(batches), test_seam=seam)
                    finally:
                        if before is None:
                            os.environ.pop("FSDIST_DEVICE_BARRIER", None)
                        else:
                            os.environ["FSDIST_DEVICE_BARRIER"] = before
                    if devbar and not head.transport.device_barrier:
                        raise RuntimeError("the head's transport did not take FSDIST_DEVICE_BARRIER=1")
                    head.load_full_weight(W_full)
                    fn_of = (lambda B, _h=head: (lambda x: _h(x, temperature=temps[B], seed=seeds[B],
                                                              offset=offs[B], return_logprobs=args.logprobs,
                                                              **filt[B])))
                elif name == "fsdist_single":
                    fn_of = (lambda B: (lambda x: fsdist.sample(x, shard, temperature=temps[B], seed=seeds[B],
                                                                offset=offs[B], vocab_size=V,
                                                                return_logprobs=args.logprobs, **filt[B])))
                elif name == "matmul_shard":
                    fn_of = (lambda B: (lambda x: F.linear(x, shard)))
                elif name == "ag_fi2":
                    gl = plain["gather_logits"]
                    fn_of = (lambda B: (lambda x: bl.sample_from_logits(gl(x, shard), temps[B], fi.sampling_from_logits,
                                                                        has_greedy=has_greedy, dtype=torch.float32)))
                else:
                    f = plain[name]
                    if compile_baselines and name == "ag_filtered":
                        # The filters compiled apart from the gather (a collective is never fused with the ops
                        # around it anyway), one static graph per batch size; their top-p cumsum stays eager.
                        # Views drop the dynamic marks put on the shared inputs above (a static compile refuses
                        # marked inputs: ConstraintViolationError on 2xH200), as kernel_bench's filtered baselines.
                        gl, ff = plain["gather_logits"], torch.compile(plain["filtered"], dynamic=False)
                        f = (lambda h, Ws, temperature, _gl=gl, _ff=ff, **kw: _ff(
                            _gl(h, Ws), temperature.view(temperature.shape), **{k: v.view(v.shape) for k, v in kw.items()}))
                    elif compile_baselines and name != "ag_matmul":
                        # matmul + functional all-gather + sampling in one graph (the collective
                        # traces through torch.distributed._functional_collectives)
                        f = torch.compile(f)
                    if name == "ag_filtered":
                        fn_of = (lambda B, _f=f: (lambda x: _f(x, shard, temps[B], **bl_filt[B])))
                    else:
                        fn_of = (lambda B, _f=f: (lambda x: _f(x, shard, temps[B])))
            except Exception as e:  # noqa: BLE001
                err = f"{type(e).__name__}: {str(e)[:300]}"
            if not comm.agree(err is None):
                err = err or "another rank failed to set this method up"
                log(f"  {name}: setup failed: {err}")
                record({"D": D, "V": V, "B": None, "method": name, "min_us": None, "error": err})
                if head is not None:
                    try:
                        head.close()
                    except Exception:  # noqa: BLE001
                        pass
                continue

            for B in batches:
                if budget.exceeded():
                    skipped["budget"] = f"stopped at D={D} {name} B={B}"
                    break
                hs = hsets[B]
                fn = fn_of(B)
                row = {"D": D, "V": V, "B": B, "method": name, "min_us": None, "median_us": None, "error": None}
                err = None
                t0 = time.perf_counter()
                try:
                    out = fn(hs[0])
                    C.sync(device)
                    row["first_call_s"] = time.perf_counter() - t0
                    tok = out.tokens if hasattr(out, "tokens") else (None if name in ("matmul_shard", "ag_matmul")
                                                                      else out.reshape(-1))
                    if tok is not None:
                        check(D, V, B, f"{name} tokens in [0, V)", tok.numel() == B and bool(((tok >= 0) & (tok < V)).all()),
                              f"n={tok.numel()}")
                except Exception as e:  # noqa: BLE001
                    err = f"{type(e).__name__}: {str(e)[:300]}"
                if not comm.agree(err is None):
                    row["error"] = err or "failed on another rank"
                    log(f"  {name} B={B}: {row['error']}")
                    record(row)
                    continue
                if name.startswith("fsdist"):
                    try:
                        check(D, V, B, f"{name} same tokens on every rank", comm.same_everywhere(tok), "")
                        ref = fsdist.sample(hs[0], W_full, temperature=temps[B], seed=seeds[B], offset=offs[B],
                                            **filt[B])
                        if name == "fsdist_single" or "/candidates" in name:
                            n = int((ref.tokens != tok).sum())
                            check(D, V, B, f"{name} == fsdist.sample on the full weight", n == 0, f"{n}/{B} rows differ")
                        if name != "fsdist_single":
                            gt = head(hs[0], temperature=0.0, seed=seeds[B], offset=offs[B]).tokens
                        else:
                            gt = fsdist.sample(hs[0], shard, temperature=0.0, vocab_size=V).tokens
                        want = fsdist.sample(hs[0], W_full, temperature=0.0).tokens
                        bad = (gt != want).nonzero().flatten().tolist()
                        worst = 0.0
                        if bad:  # near-ties may differ: compare fp32 reference logits
                            rows = bad[:8]
                            ref_l = hs[0][rows].float() @ W_full.float().T
                            gap = ref_l.max(dim=1).values - ref_l.gather(1, gt[rows][:, None].clamp(0, V - 1)).squeeze(1)
                            worst = float((gap / (1 + ref_l.abs().max(dim=1).values)).max())
                        check(D, V, B, f"{name} greedy == argmax", worst <= 1e-3,
                              f"{len(bad)}/{B} differ from fsdist.sample greedy, worst rel gap {worst:.2e}")
                    except Exception as e:  # noqa: BLE001
                        check(D, V, B, f"{name} check raised", False, f"{type(e).__name__}: {e}")
                    comm.agree(True)  # re-align ranks after the checks
                try:
                    per_run, host = time_lockstep(comm, fn, hs, warmup=warmup, iters=iters, runs=runs)
                    row.update(min_us=min(per_run), median_us=statistics.median(per_run), runs_us=per_run,
                               host_us=min(host),
                               iters=iters)
                except Exception as e:  # noqa: BLE001
                    row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                log(f"  D={D} B={B:<4} {name:<32} min {C.fmt_us(row['min_us']):>9} us  median "
                    f"{C.fmt_us(row['median_us']):>9} us  host {C.fmt_us(row.get('host_us')):>9} us"
                    + (f"  ERROR {row['error']}" if row["error"] else ""))
                record(row)
                if args.graph and (head is not None or args.graph_baselines) and row["min_us"] is not None:
                    graph_row(D, V, B, name, fn, hs)
                if args.profile_breakdown and row["min_us"] is not None:
                    bd = {"D": D, "V": V, "B": B, "method": name, "tp": world}
                    if head is not None:
                        bd["hook"] = hook_breakdown(comm, seam, fn, hs, args.breakdown_iters)
                    bd["profile"] = profile_breakdown(comm, fn, hs, args.breakdown_iters)
                    data["breakdown"].append(bd)
                    writer.flush()
            if head is not None:
                head.close()
            del fn_of
        del W_full, shard, hsets
        if on_gpu:
            torch.cuda.empty_cache()

    data["wall_s"] = budget.elapsed()
    # Checks ran on every rank: rank 0 reports the failures of all of them.
    mine = [dict(c, rank=ctx.rank) for c in data["checks"] if not c["ok"]]
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    if ctx.rank == 0:
        seen = {(c["D"], c["B"], c["check"]) for c in data["checks"] if not c["ok"]}
        for lst in everyone[1:]:
            for c in lst:
                if (c["D"], c["B"], c["check"]) not in seen:
                    data["checks"].append(c)
                    seen.add((c["D"], c["B"], c["check"]))
        writer.flush()
        log(f"done in {budget.elapsed():.0f}s")
        print_table(data, world, tp1)
    fails = [c for c in data["checks"] if not c["ok"] and c.get("fatal", True)]
    fails += [r for r in data["results"] if r.get("error") and r["method"].startswith("fsdist")]
    return 0 if comm.agree(not fails) else 1


if __name__ == "__main__":
    code = main()
    # Everything is written and the process group is shut down. Skip the interpreter's
    # teardown: a gloo/c10d thread race there has aborted CPU runs ("terminate called
    # without an active exception") after all work was done, turning exit 0 into SIGABRT.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
