"""Recorded tokens and logprobs of fsdist.sample, to prove a refactor changes no behaviour.

``python tests/golden_cases.py --write`` records every case below (CPU, Triton's
interpreter) into ``tests/data/golden_sample.json``; ``tests/test_golden.py`` recomputes
them and compares. Tokens must be equal; logprobs too, to the last bit with
``--exact`` (same machine) and to 1e-6 in the test (another CPU's BLAS may round the
interpreter's matmul differently). Record again only when behaviour changes on purpose,
and say so in the commit.
"""
import argparse
import json
import math
import os
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

GOLDEN = Path(__file__).resolve().parent / "data" / "golden_sample.json"


def _problem(B, D, V, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, D, generator=g)
    weight = torch.randn(V, D, generator=g) * (3.0 / math.sqrt(D))
    return hidden.to(dtype), weight.to(dtype)


def cases():
    """name -> (kwargs for fsdist.sample). Small, but every branch: dtypes, ragged tiles,
    padding ids, scalar and per-row parameters, greedy / tiny / bad temperatures, NaN rows,
    logprobs, both stage-1 paths, several tile configs."""
    from fsdist import TileConfig

    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        for B, D, V in ((1, 64, 1000), (5, 48, 4099), (37, 32, 2000)):
            h, w = _problem(B, D, V, dtype, seed=B * 1000 + V)
            g = torch.Generator().manual_seed(V)
            temp = torch.rand(B, generator=g) * 2
            temp[::4] = 0.0
            if B > 2:
                temp[1] = 3e-6
                temp[2] = float("nan")
            seed = torch.randint(0, 2**62, (B,), generator=g)
            offset = torch.randint(0, 2**40, (B,), generator=g)
            hn = h.clone()
            if B > 3:
                hn[3, 0] = float("nan")
            tag = f"{str(dtype)[6:]}_B{B}_D{D}_V{V}"
            out[f"{tag}_scalar"] = dict(hidden=h, weight=w, temperature=0.8, seed=7, offset=3)
            out[f"{tag}_rows_lp"] = dict(hidden=hn, weight=w, temperature=temp, seed=seed, offset=offset,
                                         vocab_size=V - 7, return_logprobs=True)
            out[f"{tag}_chunked_lp"] = dict(hidden=hn, weight=w, temperature=temp, seed=seed, offset=offset,
                                            vocab_size=V - 7, return_logprobs=True, path="chunked")
            out[f"{tag}_greedy_lp"] = dict(hidden=h, weight=w, temperature=0.0, return_logprobs=True)
            out[f"{tag}_tiles"] = dict(hidden=h, weight=w, temperature=1.3, seed=seed, offset=5,
                                       config=TileConfig(16, 64, 16, num_stages=1), return_logprobs=True)
    return out


def run_all():
    import fsdist

    results = {}
    for name, kw in cases().items():
        o = fsdist.sample(**kw)
        results[name] = {"tokens": o.tokens.tolist(),
                         "logprobs": None if o.logprobs is None else [float(x).hex() for x in o.logprobs.tolist()],
                         "logsumexp": None if o.logsumexp is None else [float(x).hex() for x in o.logsumexp.tolist()]}
    return results


def compare(got, want, exact: bool):
    """List of human-readable differences (empty when equal)."""
    diffs = []
    for name in sorted(set(want) | set(got)):
        if name not in got or name not in want:
            diffs.append(f"{name}: missing on one side")
            continue
        g, w = got[name], want[name]
        if g["tokens"] != w["tokens"]:
            diffs.append(f"{name}: tokens {g['tokens']} != {w['tokens']}")
        for field in ("logprobs", "logsumexp"):
            if (g[field] is None) != (w[field] is None):
                diffs.append(f"{name}: {field} presence differs")
                continue
            if g[field] is None:
                continue
            a = [float.fromhex(x) for x in g[field]]
            b = [float.fromhex(x) for x in w[field]]
            for i, (x, y) in enumerate(zip(a, b)):
                same = (x == y) or (math.isnan(x) and math.isnan(y))
                close = same or (math.isfinite(x) and math.isfinite(y) and abs(x - y) <= 1e-6 * max(1.0, abs(y)))
                if not (same if exact else close):
                    diffs.append(f"{name}: {field}[{i}] {x!r} != {y!r}")
    return diffs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help="record the golden file")
    ap.add_argument("--exact", action="store_true", help="compare logprobs bit for bit")
    args = ap.parse_args(argv)
    got = run_all()
    if args.write:
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps(got, indent=0, sort_keys=True) + "\n")
        print(f"wrote {len(got)} cases to {GOLDEN}")
        return 0
    diffs = compare(got, json.loads(GOLDEN.read_text()), args.exact)
    print("\n".join(diffs[:50]) or f"all {len(got)} cases equal ({'bit for bit' if args.exact else 'tokens; logprobs to 1e-6'})")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main())
