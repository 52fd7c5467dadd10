"""Sampling demo: `python -m fsdist.demo` (the README's main job).

On a GPU it uses a real LM head (D=4096, V=151936, bf16) and times fsdist.sample
against cuBLAS alone and a materialize + softmax + multinomial sampler (the benchmarks'
baseline, fsdist.reference.matmul_multinomial), through fsdist.timing as the benchmarks
do. Without a GPU it runs the same kernels under Triton's interpreter on a small head.
Either way it first checks the sampler against the exact distribution. Last, when
``transformers`` is installed (scripts/demo.sh installs it, and xgrammar) and
the checkout has ``examples/generate.py``, it runs that decode loop: a random-weight causal
LM whose LM head is fsdist (greedy equal to ``model.generate``, filtered sampling with
penalties, a JSON grammar through xgrammar).
"""
import argparse
import importlib.util
import math
import pathlib
import warnings

import torch

import fsdist
from fsdist import timing
from fsdist.reference import materialize_logits, matmul_multinomial


def _log(msg: str):
    print(msg, flush=True)


def _check_distribution(weight, hidden_row, draws: int):
    """Empirical frequencies of the likeliest tokens against softmax, with their standard errors."""
    hidden = hidden_row.expand(draws, -1).contiguous()
    tokens = fsdist.sample(hidden, weight, temperature=1.0, seed=torch.arange(draws, device=weight.device)).tokens
    probs = torch.softmax(materialize_logits(hidden_row, weight)[0], -1)
    freq = torch.bincount(tokens, minlength=probs.numel()).double() / draws
    _log(f"  {draws} draws for one row; the 5 likeliest tokens:")
    _log("     token    exact p   sampled   (sampled - exact) / stderr")
    worst = 0.0
    for t in probs.argsort(descending=True)[:5].tolist():
        p, f = probs[t].item(), freq[t].item()
        z = (f - p) / math.sqrt(p * (1 - p) / draws)
        worst = max(worst, abs(z))
        _log(f"  {t:8d}   {p:8.4f}  {f:8.4f}   {z:+.2f}")
    _log(f"  largest |z| = {worst:.2f} (|z| > 4 would point at a biased sampler)")


def _timer(gpu: bool):
    """time(fn) -> median seconds per call: on a GPU CUDA events with L2 flushed before every
    call (25 warm-up, 100 timed calls); under the interpreter the host clock (1 + 3 calls)."""
    if not gpu:
        return lambda fn: timing.median_us(fn, warmup=1, reps=3, flush=None) * 1e-6
    flush = timing.L2Flusher()
    return lambda fn: timing.median_us(fn, warmup=25, reps=100, flush=flush) * 1e-6


def _decode_loop():
    """Section 4: examples/generate.py at its default size (real on a GPU, small on CPU)."""
    example = pathlib.Path(__file__).resolve().parents[1] / "examples" / "generate.py"
    try:
        import transformers  # noqa: F401
    except ImportError:
        _log("  skipped: transformers is not installed (pip install -e '.[examples]')")
        return
    if not example.exists():
        _log(f"  skipped: {example} is not in this installation (it is in the repository)")
        return
    spec = importlib.util.spec_from_file_location("fsdist_example_generate", example)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main([])


def main(argv=None):
    gpu = torch.cuda.is_available()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden-size", type=int, default=4096 if gpu else 64)
    ap.add_argument("--vocab-size", type=int, default=151936 if gpu else 4099)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64, 256] if gpu else [1, 8])
    ap.add_argument("--draws", type=int, default=65536 if gpu else 4096)
    ap.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16" if gpu else "float32")
    ap.add_argument("--no-decode-loop", action="store_true", help="skip section 4 (examples/generate.py)")
    args = ap.parse_args(argv)

    if not gpu:
        # Philox multiplies wrap around on purpose; NumPy (under the interpreter) warns about it.
        warnings.filterwarnings("ignore", category=RuntimeWarning)
    device = torch.device("cuda" if gpu else "cpu")
    dtype = getattr(torch, args.dtype)
    D, V = args.hidden_size, args.vocab_size
    where = torch.cuda.get_device_name() if gpu else "CPU (Triton interpreter)"
    _log(f"fsdist {fsdist.__version__} on {where}: D={D}, V={V}, {args.dtype}")
    g = torch.Generator().manual_seed(0)
    weight = (torch.randn(V, D, generator=g) * (2.5 / math.sqrt(D))).to(device, dtype)

    _log("\n1. A batch with mixed temperatures (0 = greedy) and per-row seeds:")
    B = 4
    hidden = torch.randn(B, D, generator=g).to(device, dtype)
    temp = torch.tensor([0.0, 0.7, 1.0, 1.5], device=device)
    out = fsdist.sample(hidden, weight, temperature=temp, seed=torch.arange(B, device=device) + 42, offset=0,
                        return_logprobs=True)
    greedy = materialize_logits(hidden, weight).argmax(-1)
    for b in range(B):
        _log(f"  row {b}: T={temp[b].item():.1f} token={out.tokens[b].item():6d} "
             f"logprob={out.logprobs[b].item():7.3f}" + ("  (argmax: %d)" % greedy[b].item() if b == 0 else ""))

    _log("\n2. Exactness at a glance:")
    _check_distribution(weight, hidden[1:2], args.draws)

    _log("\n3. Time per call (median):")
    _log("     B    fsdist.sample   matmul alone   matmul+softmax+multinomial")
    time_call = _timer(gpu)
    for B in args.batch:
        h = torch.randn(B, D, generator=g).to(device, dtype)
        t_fs = time_call(lambda: fsdist.sample(h, weight, seed=1))
        t_mm = time_call(lambda: h @ weight.T)
        t_ref = time_call(lambda: matmul_multinomial(h, weight))
        unit, scale = ("us", 1e6) if gpu else ("ms", 1e3)
        _log(f"  {B:4d}   {t_fs * scale:10.1f} {unit}  {t_mm * scale:10.1f} {unit}  {t_ref * scale:10.1f} {unit}")
    if not gpu:
        _log("  (interpreter timings only show the demo runs; real figures: docs/benchmarks.md)")

    if not args.no_decode_loop:
        _log("\n4. A decode loop: a transformers causal LM with fsdist as its LM head (examples/generate.py):")
        _decode_loop()


if __name__ == "__main__":
    main()
