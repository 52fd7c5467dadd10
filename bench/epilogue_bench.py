"""Large-batch study: where the chunked path's time goes, and which sampling pass to use.

At B >= 128 fsdist can let cuBLAS write fp32 logits per vocabulary chunk and then
run a sampling pass over them (fsdist/ops/sample_logits.py). This script times the
pieces side by side in one run, per shape and batch size:

  cublas            F.linear(h, W), bf16 logits, no sampling (the matmul alone)
  cublas_fp32       the same GEMM writing fp32 logits for the whole vocabulary
  gemm_<MB>         the chunk loop's GEMMs alone, chunks of <= MB MiB of fp32 logits
  pass_<variant>    sample_logits_kernel over full fp32 logits (row block, warps, tiles per program)
  chunked_<MB>      chunk GEMM + sample_logits pass, then stage 2 (MB = 0: one GEMM, no chunks)
  greedy_pass       sample_logits_kernel with no noise: its load + reduction floor
  sample_<MB>       fsdist.sample as shipped (its own path and budget), timed next to chunked_<MB>
  gemm_fn_/chunked_fn_<MB>  the same with torch.mm returning a new tensor per chunk, not out=
  fused             the fused Triton GEMM + epilogue with pick_config's tile, then stage 2
  fused_<cfg>       the same with another tile config, e.g. 128x128x64w8s3 (block_b x block_v x
                    block_k, warps, stages; a trailing t feeds the GEMM through TMA descriptors,
                    rN caps the registers per thread at N)
  gumbel_compiled   the best materialized baseline: cuBLAS + compiled Gumbel argmax
                    (fsdist.reference.baselines.compiled_sampler("gumbel"))

Before timing it checks that every pass variant writes the default pass's candidates bit
for bit, and reports how many rows the chunked variants and the fused path disagree on
(fp32 summation-order near-ties only).

(The runs of 2026-11-21 before commit "drop FROM_LOGITS" also timed `pass_epi`, the fused
kernel's epilogue run over materialized logits, which was v4's chunked pass, and a
two-stream variant; their JSONs in bench/results keep those rows.) Prints a table last; the JSON
(bench/results/epilogue_bench_<gpu>_<date>.json, mirrored to $OUT) keeps everything.

    python3 bench/epilogue_bench.py [--shapes 4096x151936,8192x128256] [--batches 64,128,256]

GPU only: on a machine without one it says so and exits 0 (nothing to measure).
"""
import common as C  # first: the repo root on sys.path, fsdist.env.apply_safe_env() before torch

import argparse  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402

import fsdist  # noqa: E402
from fsdist.ops.configs import TileConfig, chunk_rows_for, default_config  # noqa: E402
from fsdist.ops.fused_sample import launch_fused  # noqa: E402
from fsdist.ops.layout import BufferPair, CandidateLayout  # noqa: E402
from fsdist.ops.merge_candidates import launch_merge  # noqa: E402
from fsdist.ops.sample_logits import chunk_logits, launch_sample_logits  # noqa: E402
from fsdist.params import RowParams  # noqa: E402
from fsdist.reference import baselines  # noqa: E402

PASS_VARIANTS = {  # name: launch_sample_logits keyword arguments
    "pass_default": dict(),  # what launch_chunked runs
    "pass_b16w4": dict(block_b=16, num_warps=4),
    "pass_b16w4t2": dict(block_b=16, num_warps=4, tiles_per_program=2),
    "pass_b16w4t4": dict(block_b=16, num_warps=4, tiles_per_program=4),
    "pass_b16w4t8": dict(block_b=16, num_warps=4, tiles_per_program=8),
    "pass_b16w2t4": dict(block_b=16, num_warps=2, tiles_per_program=4),
    "pass_b8w2t4": dict(block_b=8, num_warps=2, tiles_per_program=4),
    "pass_b32w8t2": dict(block_b=32, num_warps=8, tiles_per_program=2),
    "pass_b32w8t4": dict(block_b=32, num_warps=8, tiles_per_program=4),
}
DEFAULT_PASS = "pass_default"
FULL = 1 << 40  # a budget no chunk reaches: one GEMM over the whole vocabulary


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="4096x151936,8192x128256")
    p.add_argument("--batches", default="64,96,128,192,256")
    p.add_argument("--budgets", default="64,128", help="chunk budgets in MiB of fp32 logits (0: no chunking)")
    p.add_argument("--reps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    p.add_argument("--fused-configs", default="",
                   help="extra fused tile configs, comma separated, as TileConfig.name writes them: "
                        "<bb>x<bv>x<bk>w<warps>s<stages>[t] (t: TMA), e.g. 128x128x64w8s3")
    p.add_argument("--only", default="",
                   help="time only these methods (comma separated prefixes); checks still run")
    return p.parse_args(argv)


def parse_fused_configs(text: str):
    """'128x128x64w8s3,64x128x64w8s5t' -> TileConfigs (TileConfig.parse; 't' = TMA)."""
    try:
        return [TileConfig.parse(t) for t in text.split(",") if t.strip()]
    except ValueError as e:
        raise SystemExit(f"--fused-configs: {e}") from None


class Cell:
    """Inputs and buffers for one (shape, B)."""

    def __init__(self, W, D, V, B, dev):
        self.W, self.D, self.V, self.B = W, D, V, B
        g = torch.Generator(device=dev).manual_seed(B)
        self.hs = [torch.randn(B, D, device=dev, generator=g).to(torch.bfloat16) for _ in range(4)]
        # The serving case: every parameter a [B] device tensor (no host sync on any path).
        self.params = RowParams(torch.ones(B, device=dev), torch.randint(0, 2**62, (B,), device=dev, generator=g),
                                torch.randint(0, 2**40, (B,), device=dev, generator=g))
        self.cfg = default_config(B, D, dev)
        self.bv = self.cfg.block_v
        self.n_tiles = triton.cdiv(V, self.bv)
        self.layout = CandidateLayout(1, self.n_tiles, B)
        self.cand = BufferPair.alloc(self.layout, dev)
        self.logits = torch.mm(self.hs[0], W.T, torch.float32)  # full fp32 logits for the pass-only rows
        self.bufs = {}

    def buf(self, key, numel):
        if key not in self.bufs:
            self.bufs[key] = torch.empty(numel, dtype=torch.float32, device=self.W.device)
        return self.bufs[key]

    def kw(self):
        return dict(vocab_size=self.V, vocab_start=0)


def pass_new(c: Cell, logits, tiles, cand: BufferPair, variant):
    launch_sample_logits(logits, c.params, c.layout, cand, block_v=c.bv, tiles=tiles, V_rows=c.V,
                         vocab_size=c.V, **PASS_VARIANTS[variant])


def budget_bytes(mib):
    return FULL if mib == 0 else mib << 20


def chunk_loop(c: Cell, h, budget_mib, sample_pass, functional=False):
    """functional: torch.mm(h, Wc.T, torch.float32) returning a fresh tensor per chunk (the
    caching allocator recycles it) instead of writing into one buffer through out=."""
    rows = chunk_rows_for(c.B, c.V, c.bv, budget_bytes(mib=budget_mib))
    buf = None if functional else c.buf(("one", rows), c.B * min(rows, c.V))
    for r0 in range(0, c.V, rows):
        r1 = min(r0 + rows, c.V)
        if functional:
            lg = torch.mm(h, c.W[r0:r1].T, torch.float32)
        else:
            lg = chunk_logits(h, c.W[r0:r1], buf[: c.B * (r1 - r0)].view(c.B, r1 - r0))
        if sample_pass is not None:
            sample_pass(lg, (r0 // c.bv, triton.cdiv(r1, c.bv)))
        del lg


class FusedVariant:
    """The fused path with its own tile config (and so its own candidate layout)."""

    def __init__(self, c: Cell, cfg: TileConfig):
        self.cfg = cfg
        self.layout = CandidateLayout(1, triton.cdiv(c.V, cfg.block_v), c.B)
        self.cand = BufferPair.alloc(self.layout, c.W.device)
        self.c = c

    def __call__(self, h):
        c = self.c
        launch_fused(h, c.W, c.params, self.cfg, self.layout, self.cand, **c.kw())
        return launch_merge(self.layout, self.cand, c.B, c.params)[0]


def build_methods(c: Cell, budgets, baseline, fused_configs=()):
    m = {}
    m["cublas"] = lambda h: F.linear(h, c.W)
    m["cublas_fp32"] = lambda h: torch.mm(h, c.W.T, torch.float32)
    m["cublas_fp32_T"] = lambda h: torch.mm(c.W, h.T, torch.float32)  # [V, B]: another cuBLAS kernel choice?
    for mb in budgets:
        m[f"gemm_{mb}"] = lambda h, mb=mb: chunk_loop(c, h, mb, None)
        m[f"gemm_fn_{mb}"] = lambda h, mb=mb: chunk_loop(c, h, mb, None, functional=True)
    for v in PASS_VARIANTS:
        m[v] = lambda h, v=v: pass_new(c, c.logits, (0, c.n_tiles), c.cand, v)

    def reduce_():
        return launch_merge(c.layout, c.cand, c.B, c.params)[0]

    for mb in budgets:
        def chunked(h, mb=mb):
            chunk_loop(c, h, mb, lambda lg, t: pass_new(c, lg, t, c.cand, DEFAULT_PASS))
            return reduce_()
        m[f"chunked_{mb}"] = chunked

        def chunked_fn(h, mb=mb):
            chunk_loop(c, h, mb, lambda lg, t: pass_new(c, lg, t, c.cand, DEFAULT_PASS), functional=True)
            return reduce_()
        m[f"chunked_fn_{mb}"] = chunked_fn
        m[f"sample_{mb}"] = lambda h: fsdist.sample(h, c.W, temperature=c.params.temperature, seed=c.params.seed,
                                                    offset=c.params.offset).tokens
    m["greedy_pass"] = lambda h: launch_sample_logits(  # no noise: the pass's load + reduction floor
        c.logits, RowParams(0.0, 0, 0), c.layout, c.cand, block_v=c.bv, tiles=(0, c.n_tiles),
        V_rows=c.V, vocab_size=c.V, block_b=16, num_warps=4)

    m["fused"] = FusedVariant(c, c.cfg)
    for cfg in fused_configs:
        m[f"fused_{cfg.name}"] = FusedVariant(c, cfg)
    if baseline is not None:
        m["gumbel_compiled"] = lambda h: baseline(h, c.W, c.params.temperature, has_greedy=False)
    return m


def check(c: Cell, methods, failures):
    """Every pass variant writes the default pass's candidates bit for bit; token disagreements
    between chunk sizes and with the fused path (fp32 summation-order near-ties) are counted."""
    ref_cand = BufferPair.alloc(c.layout, c.W.device)
    pass_new(c, c.logits, (0, c.n_tiles), ref_cand, "pass_default")
    for v in PASS_VARIANTS:
        cand = BufferPair.alloc(c.layout, c.W.device)
        try:
            pass_new(c, c.logits, (0, c.n_tiles), cand, v)
        except Exception as e:  # noqa: BLE001  (a variant that does not compile is dropped, not fatal)
            failures.append(f"B={c.B} D={c.D}: {v} failed: {type(e).__name__}: {str(e)[:300]}")
            methods.pop(v, None)
            continue
        same = torch.equal(cand.i, ref_cand.i) and torch.equal(cand.f, ref_cand.f)
        if not same:
            failures.append(f"B={c.B} D={c.D}: {v} candidates differ from pass_default")
    h = c.hs[0]
    chunked = [n for n in methods if n.startswith("chunked") or n.startswith("sample")]
    ref = methods[chunked[0]](h).clone()
    c.mismatch = {n: int((methods[n](h) != ref).sum()) for n in chunked[1:]}
    # Tile configs change the fp32 summation order (near-ties only); TMA must change nothing.
    for name, fn in methods.items():
        if isinstance(fn, FusedVariant):
            c.mismatch[name] = int((fn(h) != ref).sum())
            # A twin that must write the same candidates bit for bit: TMA against pointers, a
            # register cap against none.
            if fn.cfg.max_regs:
                twin_name = "fused_" + fn.cfg.name[: fn.cfg.name.rindex("r")]
            elif name.endswith("t"):
                twin_name = name[:-1]
            else:
                twin_name = None
            twin = methods.get(twin_name)
            if twin is not None:
                twin(h)
                fn(h)
                if not (torch.equal(fn.cand.i, twin.cand.i) and torch.equal(fn.cand.f, twin.cand.f)):
                    failures.append(f"B={c.B} D={c.D}: {name} candidates differ from {twin_name}")
    c.fused_vs_chunked_mismatch = c.mismatch.pop("fused")


def main(argv=None) -> int:
    args = parse_args(argv)
    dev = C.bench_device()
    if dev.type != "cuda":
        print("epilogue_bench: skipped, no CUDA GPU here. It times cuBLAS GEMMs against Triton sampling "
              "passes, which means nothing under the interpreter; run it on a GPU (bench/README.md).", flush=True)
        return 0
    shapes = C.parse_shapes(args.shapes)
    batches = C.parse_int_list(args.batches)
    budgets = C.parse_int_list(args.budgets)
    fused_configs = parse_fused_configs(args.fused_configs)
    only = tuple(t.strip() for t in args.only.split(",") if t.strip())
    out = C.ResultWriter("epilogue_bench", dev)
    out.data.update(env=C.env_info(), args=vars(args), cells=[])
    flush = C.L2Flusher(dev)
    baseline = None
    if not args.no_compile:
        baseline = baselines.compiled_sampler("gumbel", dynamic=None)
    failures = []
    table = []
    for D, V in shapes:
        W = (torch.randn(V, D, device=dev) * D ** -0.5).to(torch.bfloat16)
        for B in batches:
            c = Cell(W, D, V, B, dev)
            methods = build_methods(c, budgets, baseline, fused_configs)
            C.log(f"D={D} V={V} B={B}: checking {len(methods)} methods")
            check(c, methods, failures)
            if only:
                methods = {k: v for k, v in methods.items() if k.startswith(only)}
            row = {"D": D, "V": V, "B": B, "fused_vs_chunked_mismatch_rows": c.fused_vs_chunked_mismatch,
                   "chunked_vs_v4_mismatch_rows": c.mismatch}
            row["times"] = C.time_methods(methods, [(h,) for h in c.hs], warmup=args.warmup, reps=args.reps,
                                          flush=flush, device=dev, failures=failures, label=f"B={B} D={D}")
            out.data["cells"].append(row)
            out.flush()
            table.append(row)
            C.log(f"D={D} B={B}: " + ", ".join(f"{k} {v['median_us']:.1f}" for k, v in row["times"].items()))
            del c, methods
            torch.cuda.empty_cache()
        del W
        torch.cuda.empty_cache()
    out.data["failures"] = failures
    out.flush()
    names = list(table[0]["times"]) if table else []
    print("\nmedian us per call (L2 flushed)")
    for name in names:
        print(f"{name:18s}" + "".join(f" D{r['D']}/B{r['B']}:{r['times'].get(name, {}).get('median_us', float('nan')):8.1f}"
                                      for r in table))
    print("fused vs chunked token mismatches (near-ties):", [r["fused_vs_chunked_mismatch_rows"] for r in table])
    return C.report_checks(failures, out)


if __name__ == "__main__":
    sys.exit(main())
