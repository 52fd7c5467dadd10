"""Shared helpers for the fsdist benchmarks: environment, ceilings, results, tables.

Every bench script imports this module first, before anything that touches CUDA: it
puts the repository root on ``sys.path`` (no install needed) and applies
``fsdist.env.apply_safe_env()`` (NVLink multicast off in NCCL, torch symmetric memory
and NVSHMEM) before torch is imported. The module is usable on a machine without a
GPU: timing then falls back to a host clock and the ceilings are measured on the CPU
(labelled as such), so smoke runs exercise the same code paths as a GPU run.

Timing is ``fsdist.timing`` (per-call CUDA events with an L2 flush and input rotation,
CUDA-graph replay, medians; see its docstring), re-exported here as ``time_calls``,
``time_graph``, ``CapturedGraph``, ``L2Flusher`` and ``Stamp``. A [V, D] weight much
larger than L2 (151936 x 4096 bf16 = 1.24 GB against 50/60 MB of L2) is cold on every
call anyway; rotating the hidden states keeps them from being L2-resident from the
previous call, and the L2 flush removes whatever the last call left.
"""
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if sys.path[:1] != [str(REPO)]:
    sys.path.insert(0, str(REPO))  # the working tree's fsdist, ahead of an installed one

from fsdist.env import SAFE_ENV, apply_safe_env  # noqa: E402  (standard library only, no torch)

apply_safe_env()

import datetime as _dt  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import shlex  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from typing import Dict, List, Optional, Sequence  # noqa: E402

import torch  # noqa: E402

from fsdist.timing import (CapturedGraph, L2Flusher, Stamp, default_device, nearest_rank,  # noqa: E402,F401
                           paired_ratio, synchronize, time_calls, time_graph, time_interleaved)

RESULTS_DIR = REPO / "bench" / "results"
SCHEMA = "fsdist-bench/1"
_T0 = time.perf_counter()


# --------------------------------------------------------------------------- profiler
def per_kernel_us(prof, device, iters: int) -> Dict[str, float]:
    """µs per call of each kernel or op of a torch.profiler run over ``iters`` calls: device time
    on CUDA, CPU time otherwise."""
    on_gpu = getattr(device, "type", None) == "cuda"
    out: Dict[str, float] = {}
    for ev in prof.key_averages():
        if on_gpu:
            us = getattr(ev, "self_device_time_total", None)
            if us is None:
                us = getattr(ev, "self_cuda_time_total", 0.0)
        else:
            us = getattr(ev, "self_cpu_time_total", 0.0)
        if us and us > 0:
            out[ev.key] = out.get(ev.key, 0.0) + us / iters
    return out


def profile_top(fn, calls: int, n: int = 25) -> str:
    """cProfile's top ``n`` functions by own time over ``calls`` calls of fn, as text (the host overhead probes)."""
    import cProfile
    import io
    import pstats

    pr = cProfile.Profile()
    pr.enable()
    for _ in range(calls):
        fn()
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(n)
    return s.getvalue()


# --------------------------------------------------------------------------- logging
def log(*parts, rank: Optional[int] = None):
    """Progress line with the seconds since start, flushed at once (the GPU tool keeps only the tail)."""
    if rank not in (None, 0):
        return
    print(f"[{time.perf_counter() - _T0:7.1f}s]", *parts, flush=True)


class Budget:
    """Wall-clock budget: scripts stop starting new work once it is spent, and still write results."""

    def __init__(self, seconds: float):
        self.seconds = float(seconds)
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        return self.seconds - self.elapsed()

    def exceeded(self) -> bool:
        return self.left() <= 0


# --------------------------------------------------------------------------- device
def has_gpu() -> bool:
    return torch.cuda.is_available()


def bench_device() -> torch.device:
    return default_device()


def hopper_device(name: str) -> Optional[torch.device]:
    """The benchmark device when it is a Hopper (sm_90) GPU, the only one the Gluon kernels run on; else None, after
    printing that benchmark ``name`` is skipped (its caller then returns 0: a CPU run is not a failure)."""
    dev = bench_device()
    if dev.type != "cuda" or torch.cuda.get_device_capability(dev) != (9, 0):
        print(f"{name}: skipped, needs a Hopper (sm_90) GPU.", flush=True)
        return None
    return dev


def seeded_weight(D: int, V: int, device: torch.device, dtype: torch.dtype = torch.bfloat16):
    """A random LM-head weight [V, D] of logits' scale ~1 (entries N(0, 1 / D)), and the device generator, seeded with
    D, that drew it: the issue-14 probes draw their hidden states from it next, so each shape's inputs are the same
    from run to run. Returns (weight, generator)."""
    g = torch.Generator(device=device).manual_seed(D)
    return (torch.randn(V, D, device=device, generator=g) * D ** -0.5).to(dtype), g


def sync(device: Optional[torch.device] = None):
    synchronize(device)


def parse_dtype(name: str) -> torch.dtype:
    table = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16,
             "float16": torch.float16, "half": torch.float16, "fp32": torch.float32, "float32": torch.float32}
    if name not in table:
        raise SystemExit(f"unknown dtype {name!r}; one of {sorted(table)}")
    return table[name]


def dtype_name(dtype: torch.dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}.get(dtype, str(dtype))


def parse_int_list(text: str) -> List[int]:
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if ".." in part:  # 1..256 = powers of two from 1 to 256
            lo, hi = (int(x) for x in part.split(".."))
            v = lo
            while v <= hi:
                out.append(v)
                v *= 2
        else:
            out.append(int(part))
    return out


def parse_shapes(text: str) -> List[tuple]:
    """'4096x151936,8192x128256' -> [(4096, 151936), (8192, 128256)] as (D, V)."""
    shapes = []
    for part in text.split(","):
        part = part.strip().lower()
        if not part:
            continue
        m = re.fullmatch(r"(\d+)x(\d+)", part)
        if not m:
            raise SystemExit(f"bad shape {part!r}: expected DxV, e.g. 4096x151936")
        shapes.append((int(m.group(1)), int(m.group(2))))
    return shapes


def add_problem_options(parser) -> None:
    """--shape, --batches, --iters and --out of the one-shape breakdown scripts (host_overhead.py,
    processors_breakdown.py); read them back with problem_from_args."""
    parser.add_argument("--shape", default=None, help="DxV (GPU default 4096x151936, CPU 64x2048)")
    parser.add_argument("--batches", default=None, help="GPU default 1,16,64,256; CPU 1,4")
    parser.add_argument("--iters", type=int, default=None)
    parser.add_argument("--out", default=os.environ.get("OUT") or str(RESULTS_DIR))


def problem_from_args(args, gpu_iters: int, cpu_iters: int):
    """(device, D, V, batches, iters, dtype) from add_problem_options' arguments: the GPU
    defaults on a GPU (bf16), a small fp32 problem on CPU."""
    device = bench_device()
    on_gpu = device.type == "cuda"
    D, V = parse_shapes(args.shape or ("4096x151936" if on_gpu else "64x2048"))[0]
    batches = parse_int_list(args.batches or ("1,16,64,256" if on_gpu else "1,4"))
    iters = args.iters or (gpu_iters if on_gpu else cpu_iters)
    return device, D, V, batches, iters, (torch.bfloat16 if on_gpu else torch.float32)


# --------------------------------------------------------------------------- sampling parameters
def row_temperatures(batch: int, center: float, spread: float = 0.25, greedy_rows: int = 0,
                     device: Optional[torch.device] = None) -> torch.Tensor:
    """The serving case's per-row temperatures, fp32 [B] on `device`.

    Distinct values evenly spaced over center * [1 - spread, 1 + spread] (center alone at
    B = 1), then `greedy_rows` rows, evenly spaced through the batch, set to 0 (greedy).
    A pure function of its arguments: every rank and every run gets the same rows.
    """
    if batch == 1:
        t = torch.full((1,), float(center))
    else:
        t = center * (1.0 + spread * torch.linspace(-1.0, 1.0, batch, dtype=torch.float64))
    n = min(max(int(greedy_rows), 0), batch)
    if n:
        t[torch.linspace(0, batch - 1, n, dtype=torch.float64).round().long()] = 0.0
    return t.to(device=device or bench_device(), dtype=torch.float32)


def describe_row_temperatures(center: float, spread: float, greedy_rows: int) -> str:
    lo, hi = center * (1 - spread), center * (1 + spread)
    greedy = f", {greedy_rows} greedy row(s) (T=0) per batch" if greedy_rows else ", no greedy rows"
    return f"[B] fp32 tensor, evenly spaced over [{lo:.3g}, {hi:.3g}] (center {center:g} at B=1){greedy}"


# --------------------------------------------------------------------------- statistics
def same_candidates(a, b) -> bool:
    """Two candidate buffers (fsdist.ops.layout.BufferPair) hold the same ids and scores bit for bit, NaN scores
    (poisoned rows) counted equal to NaN."""
    return torch.equal(a.i, b.i) and torch.equal(a.f.nan_to_num(-7.0), b.f.nan_to_num(-7.0))


def summarize(samples_us: Sequence[float]) -> Dict[str, float]:
    xs = sorted(float(x) for x in samples_us if x is not None and math.isfinite(x))
    if not xs:
        return {"n": 0}
    return {"n": len(xs), "median_us": statistics.median(xs), "min_us": xs[0], "max_us": xs[-1],
            "mean_us": statistics.fmean(xs), "p10_us": nearest_rank(xs, 0.1), "p90_us": nearest_rank(xs, 0.9)}


def time_methods(methods: Dict, arg_sets: Sequence[tuple], *, warmup: int, reps: int, flush, device,
                 failures: List[str], label: str) -> Dict[str, Dict[str, float]]:
    """{name: summarize(time_calls(fn, arg_sets, ...))} for each method, side by side in one run. A method
    that raises is left out and reported in failures as '<label>: timing <name> failed: ...'."""
    times = {}
    for name, fn in methods.items():
        try:
            xs = time_calls(fn, arg_sets, warmup=warmup, reps=reps, flush=flush, device=device)
        except Exception as e:  # noqa: BLE001  (one broken method must not end the run)
            failures.append(f"{label}: timing {name} failed: {type(e).__name__}: {str(e)[:300]}")
            continue
        times[name] = summarize(xs)
    return times


# --------------------------------------------------------------------------- ceilings
def measure_copy_bandwidth(device: torch.device, nbytes: Optional[int] = None, reps: int = 20) -> Dict:
    """Device-to-device copy rate, counting bytes read plus bytes written (bytes/s)."""
    nbytes = nbytes or ((1 << 30) if device.type == "cuda" else (64 << 20))
    src = torch.randint(-100, 100, (nbytes // 4,), dtype=torch.int32, device=device)
    dst = torch.empty_like(src)
    ts = time_calls(lambda: dst.copy_(src), [()], warmup=3, reps=reps, device=device)
    s = summarize(ts)
    moved = 2 * src.numel() * src.element_size()
    del src, dst
    return {"bytes_per_s": moved / (s["median_us"] * 1e-6), "best_bytes_per_s": moved / (s["min_us"] * 1e-6),
            "bytes_moved": moved, "how": "dst.copy_(src), int32, bytes read + bytes written, median"}


def measure_read_bandwidth(device: torch.device, nbytes: Optional[int] = None, reps: int = 20) -> Dict:
    """Read-only rate through a full reduction (x.sum()), informational."""
    nbytes = nbytes or ((1 << 30) if device.type == "cuda" else (64 << 20))
    x = torch.randn(nbytes // 4, dtype=torch.float32, device=device)
    ts = time_calls(lambda: x.sum(), [()], warmup=3, reps=reps, device=device)
    s = summarize(ts)
    moved = x.numel() * 4
    del x
    return {"bytes_per_s": moved / (s["median_us"] * 1e-6), "bytes_moved": moved,
            "how": "x.sum() over fp32, bytes read, median"}


def measure_matmul_rate(device: torch.device, dtype=torch.bfloat16, n: Optional[int] = None,
                        reps: int = 10) -> Dict:
    """Dense n x n x n matrix product on random data (FLOP/s), through torch (cuBLAS on GPU)."""
    if device.type != "cuda":
        dtype, n = torch.float32, n or 512
    n = n or 8192
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    ts = time_calls(lambda: a @ b, [()], warmup=3, reps=reps, device=device)
    s = summarize(ts)
    flops = 2.0 * n ** 3
    del a, b
    return {"flop_per_s": flops / (s["median_us"] * 1e-6), "n": n, "dtype": dtype_name(dtype),
            "how": "a @ b, random data, median"}


def measure_ceilings(device: torch.device, dtype=torch.bfloat16) -> Dict:
    ceil = {"copy": measure_copy_bandwidth(device), "read": measure_read_bandwidth(device),
            "matmul": measure_matmul_rate(device, dtype)}
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return ceil


def floor_us(D: int, V: int, B: int, elem: int, copy_bps: float, flop_ps: float) -> Dict[str, float]:
    """Lower bounds for one LM-head + sample call.

    memory: the minimum bytes (weight V*D, hidden B*D read once; B tokens written) over the
    measured copy bandwidth (which counts read + write, so a pure read stream at that rate
    is the convention here); compute: 2*B*D*V FLOP over the measured matmul rate.
    """
    nbytes = V * D * elem + B * D * elem + B * 8
    mem = nbytes / copy_bps * 1e6
    comp = 2.0 * B * D * V / flop_ps * 1e6
    return {"bytes": nbytes, "mem_us": mem, "compute_us": comp, "floor_us": max(mem, comp)}


# --------------------------------------------------------------------------- environment
def _nvidia_smi(query: str) -> Optional[str]:
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0].strip() if out.returncode == 0 and out.stdout.strip() else None
    except Exception:  # no nvidia-smi, or it hung
        return None


def _source_hash() -> str:
    """sha256 over fsdist/**/*.py and bench/*.py: identifies the code that produced a result."""
    h = hashlib.sha256()
    for root in (REPO / "fsdist", REPO / "bench"):
        for p in sorted(root.rglob("*.py")):
            h.update(str(p.relative_to(REPO)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


def gpu_slug(device: Optional[torch.device] = None) -> str:
    """Short file-name-safe GPU name: 'h100', 'h200', ... or 'cpu'."""
    if not has_gpu() or (device is not None and device.type != "cuda"):
        return "cpu"
    name = torch.cuda.get_device_name(device)
    m = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Z]?)\b", name)
    slug = m.group(1) if m else name
    return re.sub(r"[^a-z0-9]+", "-", slug.lower()).strip("-") or "gpu"


def env_info(argv: Optional[Sequence[str]] = None) -> Dict:
    """What produced a result, without the host name."""
    import triton

    argv = list(sys.argv if argv is None else argv)
    info = {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(shlex.quote(a) for a in [os.path.basename(sys.executable)] + argv),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "triton": triton.__version__,
        "platform": platform.platform(terse=True),
        "cpu_count": os.cpu_count(),
        "source_sha256_16": _source_hash(),
        "env": {k: os.environ.get(k) for k in
                ("TRITON_INTERPRET", "CUDA_VISIBLE_DEVICES", "WORLD_SIZE", "LOCAL_WORLD_SIZE", *SAFE_ENV)
                if os.environ.get(k) is not None},
    }
    try:
        import fsdist

        info["fsdist"] = fsdist.__version__
    except Exception as e:  # noqa: BLE001
        info["fsdist"] = f"import failed: {e}"
    try:
        import numpy

        info["numpy"] = numpy.__version__
    except Exception:
        pass
    if has_gpu():
        dev = torch.cuda.current_device()
        p = torch.cuda.get_device_properties(dev)
        info["gpu"] = {
            "name": p.name, "count": torch.cuda.device_count(),
            "capability": f"{p.major}.{p.minor}", "sms": p.multi_processor_count,
            "memory_gib": round(p.total_memory / 2**30, 1),
            "l2_bytes": getattr(p, "L2_cache_size", None),
            "driver": _nvidia_smi("driver_version"),
            "clocks_sm_max_mhz": _nvidia_smi("clocks.max.sm"),
            "power_limit": _nvidia_smi("power.limit"),
        }
        info["cudnn"] = torch.backends.cudnn.version()
    else:
        info["gpu"] = None
    return info


# --------------------------------------------------------------------------- results
class ResultWriter:
    """One JSON document per run, rewritten atomically after every update.

    Written to ``bench/results/<name>_<gpu>_<date>.json`` (or ``--out``) and, when the
    environment variable OUT is set (the GPU tool sends back only what is under $OUT),
    to ``$OUT/<same name>`` too.
    """

    def __init__(self, name: str, device: torch.device, out: Optional[str] = None, enabled: bool = True):
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        fname = f"{name}_{gpu_slug(device)}_{stamp}.json"
        self.enabled = enabled
        if out:
            p = Path(out)
            self.path = p / fname if (p.is_dir() or out.endswith("/")) else p
        else:
            self.path = RESULTS_DIR / fname
        self.mirror = Path(os.environ["OUT"]) / self.path.name if os.environ.get("OUT") else None
        self.data: Dict = {"schema": SCHEMA, "name": name}

    def flush(self):
        if not self.enabled:
            return
        text = json.dumps(self.data, indent=1, default=_json_default)
        for p in (self.path, self.mirror):
            if p is None:
                continue
            try:
                p.parent.mkdir(parents=True, exist_ok=True)
                tmp = p.with_suffix(p.suffix + ".tmp")
                tmp.write_text(text)
                os.replace(tmp, p)
            except OSError as e:
                print(f"warning: could not write {p}: {e}", flush=True)


def report_checks(failures: List[str], out: ResultWriter) -> int:
    """A bench's closing lines: its checks (all passed, or each failure), where its JSON went; the exit status
    (1 when a check failed)."""
    print("checks:", "all passed" if not failures else "\n  ".join(["FAILED"] + failures))
    print("results:", out.path)
    return 1 if failures else 0


def _json_default(x):
    if isinstance(x, torch.dtype):
        return dtype_name(x)
    if isinstance(x, torch.device):
        return str(x)
    if isinstance(x, Path):
        return str(x)
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if hasattr(x, "item"):
        return x.item()
    return str(x)


def fmt_us(x: Optional[float]) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x:.1f}" if x < 10000 else f"{x:.0f}"


def fmt_rate(bps: float, unit: str = "B/s") -> str:
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M")):
        if bps >= scale:
            return f"{bps / scale:.2f} {prefix}{unit}"
    return f"{bps:.0f} {unit}"
