"""GPU-only checks of the logit processors at real sizes (skipped without CUDA).

V = 151936, D = 4096, bf16 weight; a real-sized token bitmask (about half the ids allowed)
and 1,000 listed ids per row (500 logit-bias ids, 250 output ids, 250 prompt ids), every
processor argument a device tensor, as a serving stack passes them:

* in distribution: 2**20 draws (8192 rows x 128 calls, seeds per row, offset per call; and on
  the fused path 64 rows x 16,384 calls too: the warp-specialised 64-row tile on an H100 / H200) of
  one row's processed distribution on each stage-1 path, chi-squared + top-token binomial
  (``statcheck``: each p-value must exceed P_MIN = 1e-3) against
  ``fsdist.reference.filtered_distribution`` in float64, no draw outside the support; and a
  power check: the same test rejects draws made without the presence penalty (the smallest
  of the three here: its non-centrality is ~2,900 on ~9,000 bins in a CPU model of this
  family, ~20 standard deviations);
* pathwise: tokens equal the float64 mirror (processed logits / T + fsdist's noise) on every
  row whose perturbed-score margin exceeds 1e-2, at B = 1, 37, 64 (fused) and 200 (chunked),
  greedy rows included, with the bias and penalties on each row's likeliest ids;
* a CUDA graph captured with all processors as device tensors (with and without filters)
  replays like eager calls when the offsets and the processors' values change in place;
* no host synchronisation: warm calls with processors run under
  ``torch.cuda.set_sync_debug_mode("error")`` on both paths (bias without penalties too:
  its neutral-penalty default once was a host-to-device copy).
"""
import math

import pytest
import torch

import fsdist
from fsdist.reference import filtered_distribution, serving_semantics, vocab_gumbel
from statcheck import P_MIN, assert_samples_match, chi2_gof, top_tokens_pvalue

pytestmark = pytest.mark.gpu
# Module constants, read at call time (a CPU smoke run of this file's logic can shrink them).
DEV, DTYPE = "cuda", torch.bfloat16
V_REAL, D_REAL = 151936, 4096
N_BIAS, N_OUTPUT, N_PROMPT = 500, 250, 250  # 1,000 listed ids per row


def _gen(seed):
    return torch.Generator(device=DEV).manual_seed(seed)


@pytest.fixture(scope="module")
def weight():
    """[V, D] bf16: the logits of a unit-normal hidden state have std 3 (as the other 1M-draw tests)."""
    w = torch.randn(V_REAL, D_REAL, device=DEV, generator=_gen(2031)) * (3.0 / math.sqrt(D_REAL))
    return w.to(DTYPE)


def logits64(h, w, chunk=16384):
    """float64 [B, V] logits of the bf16 inputs, upcast (the weight in chunks: bounded memory)."""
    hd = h.double()
    return torch.cat([hd @ w[i:i + chunk].double().T for i in range(0, w.shape[0], chunk)], dim=1)


def random_bitmask(B, V, gen):
    """int32 [B, ceil(V/32)] in xgrammar's layout: every bit of the first V set with probability
    1/2 (uniform random words), bits past V clear."""
    words = (V + 31) // 32
    u = torch.randint(0, 2**32, (B, words), device=DEV, generator=gen, dtype=torch.int64)
    tail = V - 32 * (words - 1)
    if tail < 32:
        u[:, -1] &= (1 << tail) - 1
    return torch.where(u >= 2**31, u - 2**32, u).to(torch.int32)


def row_processors(B, V, seed, top=None):
    """Per-row processors of B rows: a random bitmask (row 0 allows everything), 500 bias ids
    (5 empty slots), 250 output ids (a repeat, some empty slots), 250 prompt ids, per-row
    penalties (rows 1, 6, 11, ... without repetition penalty, a negative presence penalty on some).
    top: int64 [B, >= 16], each row's likeliest ids: biased, repeated and prompted first."""
    gen = _gen(seed)

    def ids(n):
        return torch.randint(0, V, (B, n), device=DEV, generator=gen)

    bm = random_bitmask(B, V, gen)
    bm[0] = -1
    bias_ids, out_ids, prompt_ids = ids(N_BIAS), ids(N_OUTPUT), ids(N_PROMPT)
    if top is not None:
        bias_ids[:, :8] = top[:, :8]
        out_ids[:, 2:10] = top[:, :8]
        prompt_ids[:, :8] = top[:, 8:16]
    bias_ids[:, -5:] = -1
    out_ids[:, 1] = out_ids[:, 0]  # repeats count twice
    out_ids[1::2, -10:] = -1
    bias_vals = torch.randn(B, N_BIAS, device=DEV, generator=gen) * 1.5
    rep = torch.linspace(1.05, 1.4, B, device=DEV) if B > 1 else torch.full((1,), 1.2, device=DEV)
    rep[1::5] = 1.0
    freq = torch.linspace(0.0, 0.5, B, device=DEV) if B > 1 else torch.full((1,), 0.3, device=DEV)
    pres = torch.linspace(0.3, -0.1, B, device=DEV) if B > 1 else torch.full((1,), 0.2, device=DEV)
    return dict(token_bitmask=bm, logit_bias=fsdist.SparseLogits(bias_ids, bias_vals),
                penalties=fsdist.Penalties(rep, freq, pres, out_ids, prompt_ids))


# --------------------------------------------------------------------------- distribution

ROWS, CALLS, T = 8192, 128, 0.9  # 2**20 draws


@pytest.fixture(scope="module")
def one_row(weight):
    """One hidden row, its float64 logits and its processors: a random half of the ids allowed;
    output ids = the 100 likeliest raw ids, the 50 likeliest again and 100 random ones; prompt
    ids = the next 100 likeliest and 150 random; bias on the next 100, on the 20 likeliest and
    on 380 random ids (values N(0, 1.5^2)); repetition 1.3, frequency 0.4, presence 0.3."""
    gen = _gen(77)
    h1 = torch.randn(1, D_REAL, device=DEV, generator=gen).to(DTYPE)
    x = logits64(h1, weight)
    top = x[0].argsort(descending=True)

    def rnd(n):
        return torch.randint(0, V_REAL, (n,), device=DEV, generator=gen)

    k_out, k_rep, k_prompt, k_bias, k_both = (2 * N_OUTPUT // 5, N_OUTPUT // 5, 2 * N_PROMPT // 5, N_BIAS // 5,
                                              N_BIAS // 25)  # 100, 50, 100, 100, 20 at the real sizes
    out_ids = torch.cat([top[:k_out], top[:k_rep], rnd(N_OUTPUT - k_out - k_rep)])[None]
    prompt_ids = torch.cat([top[k_out:k_out + k_prompt], rnd(N_PROMPT - k_prompt)])[None]
    bias_ids = torch.cat([top[k_out + k_prompt:k_out + k_prompt + k_bias], top[:k_both],
                          rnd(N_BIAS - k_bias - k_both)])[None]
    bias_vals = torch.randn(1, N_BIAS, device=DEV, generator=gen) * 1.5
    return dict(h1=h1, logits=x, bitmask=random_bitmask(1, V_REAL, gen), bias=(bias_ids, bias_vals),
                out_ids=out_ids, prompt_ids=prompt_ids, penalties=(1.3, 0.4, 0.3))


def _one_row_args(case, rows, penalties):
    """fsdist.sample's processor arguments for `rows` copies of the case's row (every argument a
    device tensor, penalties [rows])."""
    def rep_rows(t):
        return t.expand(rows, *t.shape[1:]).contiguous()

    rep, freq, pres = (torch.full((rows,), float(v), device=DEV) for v in penalties)
    return dict(token_bitmask=rep_rows(case["bitmask"]),
                logit_bias=fsdist.SparseLogits(*(rep_rows(t) for t in case["bias"])),
                penalties=fsdist.Penalties(rep, freq, pres, rep_rows(case["out_ids"]), rep_rows(case["prompt_ids"])))


def _one_row_probs(case):
    bias_ids, bias_vals = case["bias"]
    rep, freq, pres = case["penalties"]
    return filtered_distribution(case["logits"].cpu(), temperature=T, token_bitmask=case["bitmask"].cpu(),
                                 logit_bias=fsdist.SparseLogits(bias_ids.cpu(), bias_vals.cpu()),
                                 penalties=fsdist.Penalties(rep, freq, pres, case["out_ids"].cpu(),
                                                            case["prompt_ids"].cpu()))[0]


def _draws(case, weight, path, penalties, rows=ROWS):
    """ROWS x CALLS draws of the case's row: ``rows`` copies per call (64: the warp-specialised 64-row tile on
    an H100 / H200; 8192: 128-row tiles) and as many calls as make the same number of draws."""
    hidden = case["h1"].expand(rows, -1).contiguous()
    kw = _one_row_args(case, rows, penalties)
    temp = torch.full((rows,), T, device=DEV)
    seeds = torch.arange(rows, device=DEV) * 7 + 1
    offset = torch.zeros(rows, dtype=torch.int64, device=DEV)
    out = []
    for step in range(ROWS * CALLS // rows):
        offset.fill_(step)
        out.append(fsdist.sample(hidden, weight, temperature=temp, seed=seeds, offset=offset, path=path, **kw).tokens)
    return torch.cat(out)


@pytest.mark.parametrize("path, rows", [("chunked", ROWS), ("fused", ROWS), ("fused", 64)])
def test_processors_chi_squared_one_million_samples(one_row, weight, path, rows):
    probs = _one_row_probs(one_row)
    tokens = _draws(one_row, weight, path, one_row["penalties"], rows)
    assert tokens.numel() == ROWS * CALLS
    assert bool((tokens >= 0).all()), "a row returned -1"
    assert bool((probs[tokens.cpu()] > 0).all()), "a disallowed id was sampled"
    assert_samples_match(tokens, probs, f"bitmask + bias + penalties, {path}, V={V_REAL} D={D_REAL} "
                                        f"n={tokens.numel()}")


def test_chi_squared_catches_an_ignored_presence_penalty(one_row, weight):
    """Power: the same draws made without the presence penalty (0.3) fail the same checks."""
    probs = _one_row_probs(one_row)
    rep, freq, _ = one_row["penalties"]
    tokens = _draws(one_row, weight, "chunked", (rep, freq, 0.0))
    p_chi2, stat, dof = chi2_gof(tokens, probs)
    p_top = top_tokens_pvalue(tokens, probs)
    assert min(p_chi2, p_top) < P_MIN, f"not rejected: chi2={stat:.1f} dof={dof} p={p_chi2:.2e}, top p={p_top:.2e}"


# --------------------------------------------------------------------------- pathwise


# 24: on a fast-memory GPU (H200) the warp-specialised 64-row tile on a zero-padded hidden (configs.SPARSE_WS_MIN_BATCH)
@pytest.mark.parametrize("B", [1, 24, 37, 64, 200])
def test_real_shape_tokens_match_the_float64_mirror(weight, B):
    gen = _gen(100 + B)
    h = torch.randn(B, D_REAL, device=DEV, generator=gen).to(DTYPE)
    x = logits64(h, weight)
    procs = row_processors(B, V_REAL, seed=B, top=x.topk(16, dim=1).indices)
    temp = torch.rand(B, device=DEV, generator=gen) + 0.5
    temp[::4] = 0.0
    seeds, offsets = torch.arange(B, device=DEV) * 13 + 5, torch.arange(B, device=DEV) * 3
    out = fsdist.sample(h, weight, temperature=temp, seed=seeds, offset=offsets, return_logprobs=True, **procs)

    sem = serving_semantics(x, temperature=temp, **procs)
    noise = vocab_gumbel(seeds[:, None], offsets[:, None], torch.arange(V_REAL, device=DEV)[None, :])
    score = torch.where(sem.greedy[:, None], sem.scaled, sem.scaled + noise)
    score = torch.where(torch.isfinite(sem.processed), score, torch.full_like(score, float("-inf")))
    top2 = score.topk(2, dim=1)
    clear = (top2.values[:, 0] - top2.values[:, 1]) > 1e-2
    assert int(clear.sum()) >= int(0.8 * B)
    assert torch.equal(out.tokens[clear], top2.indices[clear, 0])
    allowed = torch.isfinite(sem.processed).gather(1, out.tokens.clamp(min=0)[:, None])[:, 0]
    assert bool(allowed.all()) and bool((out.tokens >= 0).all())
    torch.testing.assert_close(out.logsumexp.double(), torch.logsumexp(sem.scaled, dim=1), rtol=1e-5, atol=2e-4)


# --------------------------------------------------------------------------- serving: graphs, no sync


def _serving(B, weight, seed):
    gen = _gen(seed)
    h = torch.randn(B, D_REAL, device=DEV, generator=gen).to(DTYPE)
    rows = torch.arange(B, device=DEV)
    params = dict(temperature=0.6 + 0.4 * torch.rand(B, device=DEV, generator=gen), seed=rows * 31 + 7,
                  offset=torch.full((B,), 3, device=DEV, dtype=torch.int64))
    filters = dict(top_k=torch.full((B,), 50, dtype=torch.int32, device=DEV),
                   top_p=torch.full((B,), 0.9, device=DEV))
    return h, params, filters, row_processors(B, V_REAL, seed)


@pytest.mark.parametrize("filtered", [False, True], ids=["processors", "processors+top_k+top_p"])
@pytest.mark.parametrize("B", [32, 64, 128])
def test_cuda_graph_with_processor_tensors(weight, B, filtered):
    h, params, filters, procs = _serving(B, weight, seed=B)
    kw = dict(params, **procs, **(filters if filtered else {}), return_logprobs=True)
    fsdist.sample(h, weight, **kw)  # warm up (compile)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fsdist.sample(h, weight, **kw)
    bias, pen = procs["logit_bias"], procs["penalties"]
    seen = []
    for step in range(3):
        params["offset"].fill_(10 + step)
        # the processors' values change in place: the graph reads them at replay
        bias.values.mul_(-1.0)
        pen.frequency.fill_(0.2 * step)
        pen.output_ids[:, 3].copy_(pen.output_ids[:, 4])
        procs["token_bitmask"][1:, 7 + step] ^= 0x0F0F0F0F
        graph.replay()
        eager = fsdist.sample(h, weight, **kw)
        assert torch.equal(out.tokens, eager.tokens), f"step {step}: {int((out.tokens != eager.tokens).sum())} differ"
        torch.testing.assert_close(out.logprobs, eager.logprobs, equal_nan=True)
        seen.append(out.tokens.clone())
    assert not torch.equal(seen[0], seen[1])  # a new offset is a new draw
    assert bool((seen[-1] >= 0).all())


@pytest.mark.parametrize("B,path", [(16, "fused"), (64, "fused"), (128, "chunked")])
def test_processors_never_synchronise(weight, B, path):
    h, params, filters, procs = _serving(B, weight, seed=500 + B)
    bias_only = dict(logit_bias=procs["logit_bias"])
    scalar_pen = dict(penalties=fsdist.Penalties(1.2, 0.0, 0.1, procs["penalties"].output_ids, None))
    calls = [dict(token_bitmask=procs["token_bitmask"]), bias_only, scalar_pen, dict(procs),
             dict(procs, return_logprobs=True),
             dict(procs, **filters, return_logprobs=True, top_logprobs=5, logprobs_mode="processed")]
    for kw in calls:  # warm: compile every kernel outside the checked region
        fsdist.sample(h, weight, path=path, **params, **kw)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        outs = [fsdist.sample(h, weight, path=path, **params, **kw) for kw in calls]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert all(bool((o.tokens >= 0).all()) for o in outs)


@pytest.mark.parametrize("filtered", [False, True], ids=["processors", "processors+top_k+top_p"])
@pytest.mark.parametrize("B", [1, 16])
def test_pdl_after_entry_offsets_is_bit_for_bit(weight, B, filtered, monkeypatch):
    """The Triton fused kernel launched as a programmatic dependent of entry_offsets_kernel (configs.
    PDL_AFTER_ENTRY_OFFSETS, sm_90+) gives the tokens and logprobs of the two launches in order, bit for bit, in
    eager calls and in 20 graph replays whose processor values change in place before each (a fused kernel that
    read the entry table before its producer finished would apply stale or half-written entries); and the PDL
    launch does run here (else this could not fail)."""
    import fsdist.ops.configs as configs
    import fsdist.ops.fused_sample as fused_sample

    if not configs.pdl_after_entry_offsets(torch.device(DEV)):
        pytest.skip("programmatic dependent launch needs compute capability 9.0+")
    triggers = []
    launch = fused_sample.launch_entry_offsets

    def recording(*args, **kwargs):
        triggers.append(bool(kwargs.get("trigger", False)))
        return launch(*args, **kwargs)

    monkeypatch.setattr(fused_sample, "launch_entry_offsets", recording)
    h, params, filters, procs = _serving(B, weight, seed=900 + B)
    kw = dict(params, **procs, **(filters if filtered else {}), return_logprobs=True, path="fused")

    def run(pdl):
        monkeypatch.setattr(configs, "PDL_AFTER_ENTRY_OFFSETS", pdl)
        return fsdist.sample(h, weight, **kw)

    for pdl in (False, True):
        run(pdl)  # warm up (compile)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run(True)
    assert triggers and triggers[-1], "the PDL launch did not run"
    bias, pen = procs["logit_bias"], procs["penalties"]
    for step in range(20):
        params["offset"].fill_(40 + step)
        bias.values.mul_(-1.0)
        bias.ids[:, step % 8].copy_(bias.ids[:, 8 + step % 8])
        pen.frequency.fill_(0.05 * step)
        graph.replay()
        with_pdl, in_order = run(True), run(False)
        for out in (captured, with_pdl):
            assert torch.equal(out.tokens, in_order.tokens), f"step {step}: tokens differ"
            assert torch.equal(out.logprobs.view(torch.int32), in_order.logprobs.view(torch.int32)), \
                f"step {step}: logprobs differ"
    assert bool((in_order.tokens >= 0).all())
