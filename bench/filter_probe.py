"""Filtered sampling, piece by piece: stage 1 with and without the kept logits (per tile
config and top-k implementation), stage 2's threshold search, and whole calls as CUDA-graph
replays, all in one run on the same inputs.

What it answers (docs/performance.md, v13): how much of a filtered call's extra time is the
extended stage-1 epilogue, how much stage 2's search, and which tile config suits the
epilogue. Stage 1: CUDA events around each launch, L2 flushed before each, medians
(fsdist.timing); small kernels: device time from torch.profiler; whole calls: CUDA graphs.

    python3 bench/filter_probe.py [--shape 4096x151936] [--batches 1,16,64] [--configs ...]

``--ab`` also runs ``--variant packed-topk`` in a subprocess, which swaps in a top-k that
packs (order key, reversed column) into one int64 (one row reduction per kept logit instead
of two) before anything compiles: the A/B of v13, kept for the record. Stage 2 is timed with
each ``--caps`` search cap (v14: the packed search over each row's kept logits above its
boundary against the search over all of them), each ``--select-warps`` warp count and each
``--wide-caps`` lane count of the min-p-only draw (v31; 0: off). ``--pdl off,on,off`` times every whole-call case
with and without the programmatic dependent launches of stage 2 and the fallback (v74), interleaved.
``--interleave 40`` captures every whole-call graph first and times them in turns, 40 rounds, each against its case
under the first ``--pdl`` setting round by round (v127: the lent H100s drift 2-5% between blocks, v126).
On a machine without a GPU it runs one tiny shape under the interpreter (smoke test).
"""
import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys

import common
import torch
import triton
import triton.language as tl

import fsdist
import fsdist.ops.configs as fs_configs
import fsdist.ops.fallback as fs_fallback
import fsdist.ops.fused_sample as fs_fused
import fsdist.sampling as fs_sampling
from fsdist.ops.configs import TileConfig, default_config
from fsdist.ops.layout import BufferPair
from fsdist.ops.merge_candidates import launch_merge
from fsdist.ops.plan import launch_stage1, plan_sample
from fsdist.ops.select_filtered import launch_select_filtered
from fsdist.ops.utils import flagged_count, pdl_args, pdl_prologue
from fsdist.params import RowParams
from fsdist.timing import CapturedGraph, L2Flusher, median_us, paired_ratio, time_graph, time_interleaved

# --pdl's settings: (configs.PDL_STAGE2, configs.PDL_FALLBACK, configs.PDL_SELECT_BESIDE_MERGE); "fallback" is v74's
# shipped setting, "beside" v76's (shipped)
PDL_SETTINGS = {"off": (False, False, False), "stage2": (True, False, False), "fallback": (False, True, False),
                "on": (True, True, True), "beside": (False, True, True),
                # a probe's upper bounds, not modes (FALLBACK_PATCHES): as shipped but the fallback's launches
                # left out of the graph (what a call with no row to resolve would save without them; its tokens
                # are wrong wherever a row falls back, which the token check against the first --pdl run then
                # reports), or only materialize's, only resolve's, or both replaced by one-program kernels
                "nofb": (False, True, False), "nomat": (False, True, False), "nores": (False, True, False),
                "tiny": (False, True, False),
                # v77: the shipped PDL setting, the warp-specialised kernel reading a one-tile batch's hidden in boxes
                # of 8 / 16 / 32 rows, or (box0) one box of the tile's rows on the padded copy, as before
                # (... and with a "w", on the 128-row tile too: one-tile batches of B = 65-127; v77: boxes of 8 lost
                # 2 µs there)
                **{f"box{n}": (False, True, True) for n in ("0", "8", "16", "32", "8w", "16w", "32w")},
                # v118: the shipped PDL setting with configs.WS_FIELDS_FULL_TILE on (logprob / kept-logit calls whose
                # config is the ws 128-row tile run on it instead of its Triton twin, and the default dispatch sends
                # extended calls of configs.FIELDS_FULL_TILE_MIN_BATCH rows or more there at D <= 4096; shipped
                # since v118), and "fields64" with it off (v117's dispatch: the 64-row ws tile or the Triton twin)
                "full": (False, True, True), "fields64": (False, True, True),
                # v120: the shipped setting ("beside") with the fallback left out ("bnofb"), with each of its launches
                # replaced by a one-warp flag count ("btiny"), or with its first round only ("bround1": what one
                # launch pair costs a call with nothing to resolve; upper bounds, tokens checked as above)
                "bnofb": (False, True, True), "btiny": (False, True, True), "bround1": (False, True, True),
                # v123: the shipped setting with configs.SKIP_FILTERED_NOISE off ("noskip": every tile of a filtered
                # call draws the noise, as before v123; since v125 it also turns off the plain calls' rule,
                # plan.asks_noise_skip) and on ("skip", shipped)
                "noskip": (False, True, True), "skip": (False, True, True),
                # v125: the skip asked in every sampled call (configs.SKIP_NOISE_EVERY_CALL: plain and min-p-only
                # calls run the skip's code, their tiles drawing unless all rows are greedy)
                "skipall": (False, True, True)}


def _nothing(*args, **kwargs):
    """A fallback launch left out (--pdl nofb / nomat / nores: a probe's upper bound; see PDL_SETTINGS)."""


@triton.jit
def _tiny_kernel(flags_ptr, B, out_ptr, PDL_WAIT: tl.constexpr, TRIGGER: tl.constexpr):
    # what an empty fallback launch must do at least: wait for the launch before it, read the flags, exit
    pdl_prologue(PDL_WAIT, TRIGGER)
    n = flagged_count(flags_ptr, B, 128)
    if n < 0:  # never: keeps the count alive
        tl.store(out_ptr, n)


def _tiny(*args, flags, pdl_wait=False, trigger=False, **kwargs):
    """--pdl tiny: a fallback launch replaced by one program of one warp that only counts the flags."""
    _tiny_kernel[(1,)](flags, flags.shape[0], flags, **pdl_args(flags.device, wait=pdl_wait, trigger=trigger),
                       num_warps=1)


def _first_round(hidden, weight, params, *, vocab_size, flags, tokens, kept, logprobs=None, top_n=0,
                 mode="scaled", top_ids=None, top_lp=None, block_k=64, pdl=False):
    """--pdl bround1: run_fallback's first round only (rows ranked past POOL_ROWS are left unresolved)."""
    pool = fs_fallback.PoolLayout(fs_fallback.POOL_ROWS, weight.shape[0])
    buf = torch.empty(pool.numel, dtype=torch.float32, device=hidden.device)
    fs_fallback.launch_materialize(hidden, weight, pool, buf, flags=flags, start=0, vocab_size=vocab_size, kept=kept,
                                   block_k=block_k, processing=params.processing, pdl_wait=pdl, trigger=pdl)
    fs_fallback.launch_resolve(pool, buf, params, flags=flags, start=0, vocab_size=vocab_size, tokens=tokens,
                               kept=kept, logprobs=logprobs, top_n=top_n, mode=mode, top_ids=top_ids, top_lp=top_lp,
                               pdl_wait=pdl, trigger=False)


# --pdl settings that patch the fallback or a module constant (module, attribute, replacement)
FALLBACK_PATCHES = {"nofb": [(fs_sampling, "run_fallback", _nothing)],
                    "nomat": [(fs_fallback, "launch_materialize", _nothing)],
                    "nores": [(fs_fallback, "launch_resolve", _nothing)],
                    "tiny": [(fs_fallback, "launch_materialize", _tiny), (fs_fallback, "launch_resolve", _tiny)],
                    **{f"box{n}": [(fs_fused, "WS_BOX_ROWS", n)] for n in (0, 8, 16, 32)},
                    **{f"box{n}w": [(fs_fused, "WS_BOX_ROWS", n), (fs_fused, "WS_BOX_TILE_ROWS", 128)]
                       for n in (8, 16, 32)},
                    "full": [(fs_configs, "WS_FIELDS_FULL_TILE", True)],
                    "fields64": [(fs_configs, "WS_FIELDS_FULL_TILE", False)],
                    "bnofb": [(fs_sampling, "run_fallback", _nothing)],
                    "btiny": [(fs_fallback, "launch_materialize", _tiny), (fs_fallback, "launch_resolve", _tiny)],
                    "bround1": [(fs_sampling, "run_fallback", _first_round)],
                    "noskip": [(fs_configs, "SKIP_FILTERED_NOISE", False)],
                    "skip": [(fs_configs, "SKIP_FILTERED_NOISE", True)],
                    "skipall": [(fs_configs, "SKIP_FILTERED_NOISE", True), (fs_configs, "SKIP_NOISE_EVERY_CALL", True)]}


@triton.jit
def _packed_tile_topk(logit, cols, KEEP: tl.constexpr):
    # v13's candidate (measured no faster, not adopted): (order key, reversed column) in one
    # int64, so one max per kept logit finds the value and its lowest column.
    W: tl.constexpr = logit.shape[1]
    b = (logit + 0.0).to(tl.int32, bitcast=True)
    okey = tl.where(b >= 0, b, b ^ 0x7FFFFFFF)
    rev = (W - 1) - cols.to(tl.int64)
    packed = (okey.to(tl.int64) << 32) | rev[None, :]
    slot = tl.arange(0, KEEP)[None, :]
    vals = tl.full([logit.shape[0], KEEP], float("-inf"), tl.float32)
    idx = tl.zeros([logit.shape[0], KEEP], tl.int32)
    for j in tl.static_range(KEEP):
        m = tl.max(packed, axis=1)
        k = (m >> 32).to(tl.int32)
        vals = tl.where(slot == j, tl.where(k >= 0, k, k ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)[:, None], vals)
        col = (W - 1) - (m & 0xFFFFFFFF)
        idx = tl.where(slot == j, col.to(tl.int32)[:, None], idx)
        packed = tl.where(packed == m[:, None], -9223372036854775807 - 1, packed)
    k = (tl.max(packed, axis=1) >> 32).to(tl.int32)
    return vals, idx, tl.where(k >= 0, k, k ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)


def _inputs(D, V, B, device):
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(V, D, generator=g) * (2.0 / D ** 0.5)).to(device, torch.bfloat16)
    h = torch.randn(B, D, generator=g).to(device, torch.bfloat16)
    rows = torch.arange(B, device=device)
    temp = torch.full((B,), 0.8, device=device)
    filt = dict(top_k=torch.full((B,), 50, device=device, dtype=torch.int32), top_p=torch.full((B,), 0.9, device=device))
    return w, h, rows, temp, filt


def stage1_times(D, V, B, configs, args, device):
    w, h, rows, temp, filt = _inputs(D, V, B, device)
    flush = L2Flusher(device)
    params = RowParams(temp, rows + 1, rows * 0)
    fparams = RowParams(temp, rows + 1, rows * 0, **filt)
    out = {}
    # (None: the default config of that kind of call; configs[0] names the plain one)
    cases = [("plain", False, None), ("extended", True, None)] + [("extended", True, c) for c in configs[1:]]
    cases += [("plain", False, c) for c in configs[1:]]  # the extra configs on the plain call too
    gparams = RowParams(0.0, rows + 1, rows * 0)  # a scalar temperature 0: the kernels draw no noise at all
    gfparams = RowParams(0.0, rows + 1, rows * 0, **filt)
    if args.stage1_greedy:
        # v122: what stage 1 costs without the noise, plain and extended (the fields of a filtered call), on the
        # default configs, in A/B/B/A order beside the sampled cases; each name's last time is kept, both printed
        cases = [("plain", False, None), ("extended", True, None), ("greedy", False, None),
                 ("ext-greedy", True, None), ("ext-greedy", True, None), ("greedy", False, None),
                 ("extended", True, None), ("plain", False, None)]
    for label, extended, cfg in cases:
        cfg = cfg or default_config(B, D, device, extended=extended)
        # (raw_sums=False: a filtered call without "raw" logprobs, as fsdist.sample plans it; with raw sums a 128-row
        # config's extended call would run the Triton twin, not the ws tile the call itself runs since v118)
        plan = plan_sample(batch=B, hidden_size=D, weight_rows=V, device=device, config=cfg, path="fused",
                           extended=extended, raw_sums=False)
        bufs = BufferPair.alloc(plan.layout, device)
        p = fparams if extended else params
        if label.endswith("greedy"):
            p = gfparams if extended else gparams
        t = median_us(lambda: launch_stage1(plan, h, w, p, bufs, vocab_size=V), warmup=args.warmup, reps=args.reps,
                      flush=flush, device=device)
        out[f"{label} {cfg.name}"] = t
        common.log(f"  B={B} stage1 {label:8s} {cfg.name:16s} {t:9.1f} us")
    return out


def _kernels_us(fn, iters, device):
    """Device µs per call of each kernel fn launches (torch.profiler / CUPTI: no host time)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    common.sync(device)
    with profile(activities=[ProfilerActivity.CUDA] if device.type == "cuda" else [ProfilerActivity.CPU]) as prof:
        for _ in range(iters):
            fn()
        common.sync(device)
    return common.per_kernel_us(prof, device, iters)


def select_times(D, V, B, args, device):
    """select_filtered's device time (eager launches of a small kernel are host bound, so CUDA
    events around them would time Python) for each search cap (0: all kept logits; the default
    packs each row's kept logits above its boundary), whether every cap gives the same tokens
    and flags, and how many kept logits each row's packed search ran over."""
    w, h, rows, temp, filt = _inputs(D, V, B, device)
    out = {}
    for name, kw in (("k50+p0.9", filt), ("min_p0.05", dict(min_p=torch.full((B,), 0.05, device=device)))):
        params = RowParams(temp, rows + 1, rows * 0, **kw)
        plan = plan_sample(batch=B, hidden_size=D, weight_rows=V, device=device, path="fused", extended=True,
                           raw_sums=False)  # (as fsdist.sample plans a filtered call without "raw" logprobs)
        bufs = BufferPair.alloc(plan.layout, device)
        launch_stage1(plan, h, w, params, bufs, vocab_size=V)
        tokens0, _, _ = launch_merge(plan.layout, bufs, B, params)
        tokens = tokens0.clone()
        searched = torch.zeros(B, dtype=torch.int32, device=device)
        results = {}
        drew = torch.zeros(B, dtype=torch.int32, device=device)
        for cap, warps, wide in [(c, nw, wc) for c in args.caps for nw in args.select_warps for wc in args.wide_caps]:
            def call():
                tokens.copy_(tokens0)
                return launch_select_filtered(plan.layout, bufs, B, params, vocab_size=V, tokens=tokens, cap=cap,
                                              searched=searched, num_warps=warps, wide_cap=wide, drew_small=drew)
            ks = _kernels_us(call, args.reps, device)
            t = sum(v for k, v in ks.items() if "select_filtered" in k)
            fb = call()
            results[(cap, warps, wide)] = (tokens.clone(), fb.clone())
            n = searched.cpu()
            packed = n[n >= 0]
            tag = f"{name} cap={cap}" + (f" warps={warps}" if warps else "") + (f" wide={wide}" if wide is not None
                                                                                else "")
            out[tag] = t
            out[f"{tag} packed rows"] = int(packed.numel())
            d = drew.cpu()
            out[f"{tag} draws small/wide/search"] = [int((d == 1).sum()), int((d == 2).sum()), int((d == 0).sum())]
            if packed.numel():
                out[f"{tag} searched median"] = float(packed.float().median())
                out[f"{tag} searched max"] = int(packed.max())
            common.log(f"  B={B} select {tag:28s} {t:8.1f} us (device), fallback rows "
                       f"{int(fb.sum())}/{B}, packed rows {packed.numel()}/{B}, draws small/wide/search "
                       f"{out[tag + ' draws small/wide/search']}"
                       + (f" (kept logits above the boundary: median {float(packed.float().median()):.0f}, "
                          f"max {int(packed.max())})" if packed.numel() else ""))
        ref = next(iter(results.values()))
        same = all(torch.equal(a, ref[0]) and torch.equal(b, ref[1]) for a, b in results.values())
        out[f"{name} identical"] = same
        common.log(f"  B={B} select {name}: every variant gives the same tokens and flags: {same}")
    return out


def call_kernels(D, V, B, args, device):
    """Device µs per kernel of whole calls (plain, top-k + top-p, min-p)."""
    w, h, rows, temp, filt = _inputs(D, V, B, device)
    out = {}
    for name, kw in (("plain", {}), ("k50+p0.9", filt), ("min_p0.05", dict(min_p=torch.full((B,), 0.05, device=device)))):
        ks = _kernels_us(lambda: fsdist.sample(h, w, temperature=temp, seed=rows + 1, offset=rows * 0, **kw),
                         max(3, args.reps // 5), device)
        out[name] = ks
        common.log(f"  B={B} kernels {name:10s} total {sum(ks.values()):8.1f} us: "
                   + ", ".join(f"{k[:40]} {v:.1f}" for k, v in sorted(ks.items(), key=lambda kv: -kv[1])[:8]))
    return out


def _bias_penalties(D, V, B, device):
    """fsdist.sample's logit bias + penalties as the kernel bench builds them (1,000 ids per row)."""
    from kernel_bench import ShapeCtx

    ctx = ShapeCtx(D=D, V=V, dtype=torch.bfloat16, device=device, T=0.8,
                   proc_cfg={"density": 0.5, "n_bias": 500, "n_output": 250, "n_prompt": 250})
    ctx.set_processors(B, torch.Generator(device=device).manual_seed(1))
    return ctx.processor_kwargs("bias_pen")


def graph_times(D, V, B, configs, args, device):
    """Whole calls as CUDA-graph replays (L2 flushed): plain, and the filtered ones with the default
    stage-1 config and search, with U's part above the boundary packed first (cap = SEARCH_CAP while
    capturing), with each extra stage-1 config in ``configs`` (config= of the call), and top-k + top-p / min-p
    with each --select-warps / --wide-caps setting of select_filtered, side by side."""
    import fsdist.ops.select_filtered as sf

    w, h, rows, temp, filt = _inputs(D, V, B, device)
    flush = L2Flusher(device)
    out = {}
    default_cap = sf.DEFAULT_SEARCH_CAP
    minp = dict(min_p=torch.full((B,), 0.05, device=device))
    cases = [("plain", {}, default_cap, None), ("k50+p0.9", filt, default_cap, None),
             ("min_p0.05", minp, default_cap, None),
             ("k50+p0.9 packed-U", filt, sf.SEARCH_CAP, None), ("min_p0.05 packed-U", minp, sf.SEARCH_CAP, None)]
    # bias + penalties on 1,000 ids per row (the kernel bench's processors, issue 12's target)
    proc = _bias_penalties(D, V, B, device)
    cases.append(("bias_pen", proc, default_cap, None))
    # v123's worst case: every 8th row unfiltered (top-k 0, top-p 1), so every tile still draws the noise and pays only
    # what the skip's code costs (its rows' top-k / top-p loads, the 64-row tile's late bits, the extra spills)
    mixed = dict(top_k=filt["top_k"].clone(), top_p=filt["top_p"].clone())
    mixed["top_k"][::8] = 0
    mixed["top_p"][::8] = 1.0
    cases.append(("k50+p0.9 mixed", mixed, default_cap, None))
    # select_filtered's warps and min-p draw width in whole calls (--select-warps / --wide-caps): module
    # globals the launcher reads at each call, set while the graph is captured
    knobs = [(nw, wc) for nw in args.select_warps for wc in args.wide_caps if (nw, wc) != (None, None)]
    for nw, wc in knobs:
        tag = (f" warps={nw}" if nw else "") + (f" wide={wc}" if wc is not None else "")
        cases += [(f"k50+p0.9{tag}", filt, default_cap, None, nw, wc),
                  (f"min_p0.05{tag}", minp, default_cap, None, nw, wc)]
    for cfg in configs:
        cases += [(f"plain {cfg.name}", {}, default_cap, cfg), (f"k50+p0.9 {cfg.name}", filt, default_cap, cfg),
                  (f"min_p0.05 {cfg.name}", minp, default_cap, cfg), (f"bias_pen {cfg.name}", proc, default_cap, cfg)]
    cases = [c if len(c) == 6 else c + (None, None) for c in cases]
    if args.graph_cases:
        # in the order given; a case named again runs again as "<name> #<k>" (an A/B/A in one process: the first case
        # timed has been seen to come out ahead, v93)
        wanted = args.graph_cases.split(",")
        unknown = sorted(set(wanted) - {c[0] for c in cases})
        if unknown:
            raise SystemExit(f"--graph-cases: unknown {unknown}; choose from {[c[0] for c in cases]}")
        by_name, times_named = {c[0]: c for c in cases}, {}
        cases = []
        for name in wanted:
            times_named[name] = times_named.get(name, 0) + 1
            k = times_named[name]
            cases.append(by_name[name] if k == 1 else (f"{name} #{k}",) + by_name[name][1:])
    tokens, graphs = {}, {}
    default_warps, default_wide = sf.SELECT_WARPS, sf.WIDE_CAP
    # --pdl: each case once per setting, in the order given (e.g. off,on,off: an A/B/A in one process)
    pdl_runs, seen = [], {}
    for setting in args.pdl or [None]:
        seen[setting] = seen.get(setting, 0) + 1
        tag = "" if setting is None else f" pdl={setting}" + (f"#{seen[setting]}" if seen[setting] > 1 else "")
        pdl_runs.append((setting, tag))
    default_pdl = fs_configs.PDL_STAGE2, fs_configs.PDL_FALLBACK, fs_configs.PDL_SELECT_BESIDE_MERGE
    for (case_name, kw, cap, cfg, warps, wide), (setting, tag) in itertools.product(cases, pdl_runs):
        name = case_name + tag

        def call(hh):
            return fsdist.sample(hh, w, temperature=temp, seed=rows + 1, offset=rows * 0, config=cfg, **kw)
        sf.DEFAULT_SEARCH_CAP = cap
        sf.SELECT_WARPS = warps or default_warps
        sf.WIDE_CAP = default_wide if wide is None else wide
        if setting is not None:
            (fs_configs.PDL_STAGE2, fs_configs.PDL_FALLBACK,
             fs_configs.PDL_SELECT_BESIDE_MERGE) = PDL_SETTINGS[setting]
        patched = [(mod, attr, getattr(mod, attr)) for mod, attr, _f in FALLBACK_PATCHES.get(setting, [])]
        for mod, attr, f in FALLBACK_PATCHES.get(setting, []):
            setattr(mod, attr, f)
        try:
            graph = CapturedGraph(call, [(h,)], calls=5)
        finally:
            sf.DEFAULT_SEARCH_CAP, sf.SELECT_WARPS, sf.WIDE_CAP = default_cap, default_warps, default_wide
            fs_configs.PDL_STAGE2, fs_configs.PDL_FALLBACK, fs_configs.PDL_SELECT_BESIDE_MERGE = default_pdl
            for mod, attr, f in patched:
                setattr(mod, attr, f)
        # (capture runs nothing: one replay first, so that the outputs read below, tokens and fallback flags, exist)
        graph.replay()
        torch.cuda.synchronize()
        tokens[name] = graph.outputs[0].tokens.clone()
        if args.interleave:  # timed below, every graph in turns (a CUDA graph keeps the launches it captured)
            graphs[name] = graph
        else:
            t = statistics.median(time_graph(graph, warmup=3, reps=max(5, args.reps // 5), flush=flush))
            out[name] = t
        # another stage-1 config, select's warps or draw width, PDL setting: the same candidates, the same tokens as
        # the first run of the base case (its kind of call, default config, first --pdl setting)
        base = case_name + pdl_runs[0][1]
        if base in tokens and base != name:
            same = torch.equal(tokens[name], tokens[base])
            out[f"{name} same tokens"] = same
            if not same:
                common.log(f"  B={B} graph {name}: TOKENS DIFFER from {base}'s")
        fb = graph.outputs[0].fallback
        common.log(f"  B={B} graph {name:34s} " + (f"{t:9.1f} us per call" if not args.interleave else "captured")
                   + (f", fallback rows {int(fb.sum())}/{B}" if fb is not None else ""))
    if graphs:
        out.update(_interleaved(graphs, pdl_runs, B, args, flush))
    return out


def _interleaved(graphs, pdl_runs, B, args, flush, time_one=None):
    """--interleave: the captured graphs timed in turns, ``args.interleave`` rounds of ``args.interleave_reps``
    replays each (fsdist.timing.time_interleaved), so that the machine's drift between blocks (v126: 2-5% on an H100)
    falls on every setting alike. Returns each graph's median over the rounds and, under "_interleaved", the rounds'
    samples and each graph against its case under the first --pdl run, round by round (fsdist.timing.paired_ratio).
    time_one(graph): one round's figure of a graph (default: the median of its replays; tests pass their own)."""
    if time_one is None:
        def time_one(g):
            return statistics.median(time_graph(g, warmup=1, reps=args.interleave_reps, flush=flush))
    samples = time_interleaved(
        {name: (lambda g=g: time_one(g)) for name, g in graphs.items()},
        rounds=args.interleave,
        progress=lambda r, n: common.log(f"  B={B} interleaved round {r}/{n}") if r % 10 == 0 or r == n else None)
    first = pdl_runs[0][1]
    out, paired = {}, {}
    for name, xs in samples.items():
        out[name] = statistics.median(xs)
        case = name[:len(name) - len(_tag_of(name, pdl_runs))]
        base = case + first
        if base != name and base in samples:
            paired[name] = dict(against=base, **paired_ratio(xs, samples[base]))
    for name, r in paired.items():
        common.log(f"  B={B} graph {name:34s} {out[name]:9.1f} us, {100 * (r['median'] - 1):+.1f}% against "
                   f"{r['against']} (rounds p10 {100 * (r['p10'] - 1):+.1f}%, p90 {100 * (r['p90'] - 1):+.1f}%, "
                   f"faster in {r['faster']}/{r['rounds']})")
    out["_interleaved"] = dict(rounds=args.interleave, reps=args.interleave_reps, samples=samples, paired=paired)
    return out


def _tag_of(name, pdl_runs):
    """The --pdl tag a graph's name ends with ("" without --pdl), the longest that fits ("x#2" before "x")."""
    tags = sorted((tag for _setting, tag in pdl_runs), key=len, reverse=True)
    return next((tag for tag in tags if tag and name.endswith(tag)), "")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default=None, help="DxV (default 4096x151936 on a GPU, 64x2000 on CPU)")
    ap.add_argument("--batches", default=None)
    ap.add_argument("--configs", default="", help="extended stage-1 tile configs to time besides the default "
                                                  "(names as TileConfig.parse reads them, comma-separated)")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--variant", default="", choices=["", "packed-topk"])
    ap.add_argument("--only", default="stage1,select,kernels,graph")
    ap.add_argument("--caps", default=None, help="select_filtered search caps to time (default: 0 and SEARCH_CAP)")
    ap.add_argument("--select-warps", default=None,
                    help="select_filtered warp counts to time with each cap (default: the launcher's, 16)")
    ap.add_argument("--wide-caps", default=None,
                    help="select_filtered wide caps (min-p alone) to time with each cap (default: the launcher's)")
    ap.add_argument("--graph-cases", default=None,
                    help="the whole-call cases to replay, in this order (comma-separated names as the log prints them, "
                         "e.g. plain,k50+p0.9,min_p0.05; a name given again runs again, as '<name> #2'; default: "
                         "all)")
    ap.add_argument("--pad-tile-rows", type=int, default=None,
                    help="batch tiles of at least this many rows read a zero-padded hidden whenever the batch "
                         "leaves them partly empty (default: configs.PAD_TILE_ROWS, and PAD_HALF_TILE_ROWS' "
                         "half-empty rule; v65 probes 64)")
    ap.add_argument("--pad-half-tile-rows", type=int, default=None,
                    help="one-tile batches of at least this many rows read a zero-padded hidden when at least half "
                         "empty (default: configs.PAD_HALF_TILE_ROWS; a large value turns that rule off)")
    ap.add_argument("--pdl", default=None,
                    help="time each whole-call case with these PDL settings, in order (comma-separated: off, stage2, "
                         "fallback, beside, on; e.g. off,on,off; nofb / nomat / nores / tiny: v74's fallback "
                         "setting with the fallback's launches left out or replaced, upper bounds; box0 / box8 / "
                         "box16 / box32: v76's, the ws kernel's one-tile hidden in boxes of that many rows "
                         "(0: padded; box8w / box16w / box32w: on the 128-row tile too); full: v76's with "
                         "configs.WS_FIELDS_FULL_TILE on (v118, shipped), fields64 with it off; bnofb / btiny / "
                         "bround1: v120's, the shipped setting with no fallback, one-warp fallback launches, or its "
                         "first round only (upper bounds); noskip / skip: v123's, the shipped setting with "
                         "configs.SKIP_FILTERED_NOISE off / on; default: the configs' as they are)")
    ap.add_argument("--interleave", type=int, default=0, metavar="ROUNDS",
                    help="graph part: capture every case and setting first, then time them in turns, ROUNDS rounds "
                         "of --interleave-reps replays each, the order reversed each round; reports each against its "
                         "case under the first --pdl setting round by round (median, p10, p90, rounds faster; "
                         "without --pdl nothing is paired, only each graph's median over the rounds). For "
                         "differences smaller than the machine's drift between blocks (v126). Default 0: one block "
                         "a graph, as before")
    ap.add_argument("--interleave-reps", type=int, default=5, help="--interleave: replays a graph a round (median)")
    ap.add_argument("--stage1-greedy", action="store_true",
                    help="stage1 part: the plain and extended calls with and without noise (a scalar temperature 0), "
                         "default configs, A/B/B/A (v122)")
    ap.add_argument("--ab", action="store_true", help="also time stage 1 with v13's packed top-k (a subprocess)")
    args = ap.parse_args()
    gpu = common.has_gpu()
    device = common.bench_device()
    D, V = common.parse_shapes(args.shape or ("4096x151936" if gpu else "64x2000"))[0]
    batches = common.parse_int_list(args.batches or ("1,16,64" if gpu else "2"))
    args.reps = args.reps or (50 if gpu else 2)
    args.warmup = args.warmup or (10 if gpu else 1)
    only = set(args.only.split(","))
    from fsdist.ops.select_filtered import SEARCH_CAP
    args.caps = common.parse_int_list(args.caps) if args.caps else [0, SEARCH_CAP]
    args.select_warps = common.parse_int_list(args.select_warps) if args.select_warps else [None]
    args.wide_caps = common.parse_int_list(args.wide_caps) if args.wide_caps else [None]
    if args.interleave < 0 or args.interleave_reps < 1:
        raise SystemExit(f"--interleave must be >= 0 and --interleave-reps >= 1, got {args.interleave} and "
                         f"{args.interleave_reps}")
    args.pdl = args.pdl.split(",") if args.pdl else None
    if args.pdl and set(args.pdl) - set(PDL_SETTINGS):
        raise SystemExit(f"--pdl: unknown {sorted(set(args.pdl) - set(PDL_SETTINGS))}; choose from {list(PDL_SETTINGS)}")
    if args.pad_tile_rows is not None:
        import fsdist.ops.fused_sample as fs

        fs.PAD_TILE_ROWS = args.pad_tile_rows  # read by tile_operand at each call
    if args.pad_half_tile_rows is not None:
        import fsdist.ops.fused_sample as fs

        fs.PAD_HALF_TILE_ROWS = args.pad_half_tile_rows
    if args.variant == "packed-topk":
        import fsdist.ops.fused_sample as fs

        fs.tile_topk = _packed_tile_topk  # before the first compile of the stage-1 kernel
    results = {"env": common.env_info(), "shape": [D, V], "variant": args.variant or "current", "batches": {}}
    for B in batches:
        # extra configs whose batch tile suits B: at least min(B, 16) rows, at most max(16, B) rounded up (a
        # warp-specialised 64-row tile at any B of 8-64: its smallest tile)
        extra = [TileConfig.parse(c) for c in args.configs.split(",") if c]
        configs = [default_config(B, D, device)] + [
            c for c in extra
            if min(B, 16) <= c.block_b <= max(16, triton.next_power_of_2(B), 64 if c.ws and B >= 8 else 0)]
        r = {}
        if "stage1" in only:
            r["stage1_us"] = stage1_times(D, V, B, configs if gpu else configs[:1], args, device)
        if "select" in only and not args.variant:
            r["select_us"] = select_times(D, V, B, args, device)
        if "kernels" in only and not args.variant:
            r["kernels_us"] = call_kernels(D, V, B, args, device)
        if "graph" in only and not args.variant and gpu:
            r["graph_us"] = graph_times(D, V, B, configs[1:], args, device)
        results["batches"][B] = r
    if args.variant:
        print("JSON " + json.dumps(results["batches"]))
        return
    if args.ab and "stage1" in only:
        cmd = [sys.executable, os.path.abspath(__file__), "--variant", "packed-topk", "--only", "stage1",
               "--batches", ",".join(map(str, batches)), "--shape", f"{D}x{V}", "--reps", str(args.reps),
               "--warmup", str(args.warmup)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("JSON ")]
        if line:
            for B, r in json.loads(line[-1][5:]).items():
                results["batches"][int(B)]["stage1_packed_topk_us"] = r["stage1_us"]
        else:
            print("packed-topk variant failed:", proc.stderr[-2000:])
    w = common.ResultWriter("filter_probe", device)
    w.data.update(results)
    w.flush()
    print(f"\nfilter_probe D={D} V={V} ({results['env'].get('gpu') or 'CPU'}) -> {w.path}")
    for B, r in results["batches"].items():
        for k, v in r.items():
            if k == "kernels_us":
                v = {n: sum(x.values()) for n, x in v.items()}
            shown = [f"{n}={x:.1f}" if isinstance(x, float) else f"{n}={x}" for n, x in v.items()
                     if not n.startswith("_")]
            print(f"B={B} {k}: " + ", ".join(shown))
            for n, pr in v.get("_interleaved", {}).get("paired", {}).items():
                print(f"B={B} {n} / {pr['against']}: median {pr['median']:.4f} (p10 {pr['p10']:.4f}, "
                      f"p90 {pr['p90']:.4f}; faster in {pr['faster']}/{pr['rounds']} rounds)")


if __name__ == "__main__":
    main()
