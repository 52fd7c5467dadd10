"""Diagnostic for the GPU: one filtered call of each kind, with tracebacks (development aid)."""
import math
import traceback

import torch

import fsdist
from fsdist import TileConfig

g = torch.Generator().manual_seed(0)
B, D, V = 8, 64, 1000
h = torch.randn(B, D, generator=g).cuda()
w = (torch.randn(V, D, generator=g) * (3 / math.sqrt(D))).cuda()
for name, kw in [("plain", dict()), ("top_k", dict(top_k=5)), ("top_p", dict(top_p=0.9)),
                 ("top_n", dict(top_logprobs=3)), ("raw", dict(return_logprobs=True, logprobs_mode="raw")),
                 ("fallback", dict(top_p=0.9, config=TileConfig(16, 512, 64))),
                 ("chunked", dict(top_p=0.9, path="chunked"))]:
    try:
        out = fsdist.sample(h, w, seed=1, **kw)
        torch.cuda.synchronize()
        print(name, "ok", out.tokens.tolist(), None if out.fallback is None else out.fallback.tolist(), flush=True)
    except Exception:
        print(name, "FAILED", flush=True)
        traceback.print_exc()
