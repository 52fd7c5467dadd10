"""fsdist.sample: exactness, the RNG contract, edge cases and input validation.

Runs under Triton's interpreter on CPU and unchanged on CUDA. Distribution tests
use the threshold in statcheck.P_MIN with fixed seeds.
"""
import dataclasses
import math

import pytest
import torch
import triton

import fsdist
from fsdist.ops.configs import TileConfig, default_config
from fsdist.ops.fused_sample import launch_fused, tma_operands
from fsdist.ops.layout import BufferPair, CandidateLayout
from fsdist.ops.merge_candidates import launch_merge
from fsdist.ops.sample_logits import launch_chunked
from fsdist.params import RowParams
from fsdist.reference import materialize_logits, reference_gumbel
from statcheck import P_MIN, assert_samples_match, chi2_gof, pairs_independence, top_tokens_pvalue
from scipy import stats

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def make_problem(B, D, V, dtype, device, scale=3.0, seed=0):
    """Random hidden [B, D] and weight [V, D] whose logits have std ~ `scale`."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, D, generator=g)
    weight = torch.randn(V, D, generator=g) * (scale / math.sqrt(D))
    return hidden.to(device=device, dtype=dtype), weight.to(device=device, dtype=dtype)


def many_draws_config(n, D, device):
    """The tile an n-row call of hidden size D takes by default, with as many rows as Triton allows on CPU (2**20
    elements): under the interpreter each program costs Python overhead, and the tokens do not depend on the tile
    (test_same_key_same_token_across_tile_configs_and_positions). A GPU keeps its default (None)."""
    if device.type != "cpu":
        return None
    cfg = default_config(n, D, device)
    return dataclasses.replace(cfg, block_b=(1 << 20) // cfg.block_v)


def exact_logits(hidden, weight, vocab_size=None):
    """float64 logits of the *quantized* inputs: what the kernel is meant to compute."""
    return materialize_logits(hidden.cpu(), weight.cpu(), vocab_size)


# --------------------------------------------------------------------------- distribution


@pytest.mark.parametrize("V", [1000, 4099])
@pytest.mark.parametrize("T", [0.5, 1.0, 2.0])
def test_chi_squared_goodness_of_fit(device, V, T):
    n = 20_000
    h, w = make_problem(1, 32, V, torch.float32, device, seed=V)
    hidden = h.expand(n, -1).contiguous()
    # Half the draws vary the seed at a fixed offset, half vary the offset at a fixed seed.
    half = n // 2
    seeds = torch.cat([torch.arange(half) + 1000, torch.full((n - half,), 77)]).to(device)
    offsets = torch.cat([torch.full((half,), 5), torch.arange(n - half) + 10**9]).to(device)
    out = fsdist.sample(hidden, w, temperature=T, seed=seeds, offset=offsets, config=many_draws_config(n, 32, device))
    probs = torch.softmax(exact_logits(h, w)[0] / T, dim=-1)
    assert_samples_match(out.tokens, probs, f"V={V} T={T}")


def test_chi_squared_detects_a_one_percent_bias(device):
    """Power check: moving 1% of mass between the two likeliest tokens must fail the checks above."""
    V, n, T = 1000, 20_000, 1.0
    h, w = make_problem(1, 32, V, torch.float32, device, seed=V)
    out = fsdist.sample(h.expand(n, -1).contiguous(), w, temperature=T, seed=torch.arange(n, device=device))
    probs = torch.softmax(exact_logits(h, w)[0] / T, dim=-1)
    top = probs.argsort(descending=True)[:2]
    biased = probs.clone()
    biased[top[0]] -= 0.01
    biased[top[1]] += 0.01
    assert_samples_match(out.tokens, probs, "unbiased")
    assert top_tokens_pvalue(out.tokens, biased) < P_MIN
    with pytest.raises(AssertionError):
        assert_samples_match(out.tokens, biased)


# --------------------------------------------------------------------------- pathwise exactness


@pytest.mark.parametrize("dtype", DTYPES)
def test_tokens_match_materialized_gumbel_argmax(device, dtype):
    # Sizes off every tile boundary: B, D and V are not multiples of any block.
    B, D, V, vocab = 37, 40, 4099, 4000
    h, w = make_problem(B, D, V, dtype, device, seed=3)
    temp = torch.rand(B, generator=torch.Generator().manual_seed(1)) * 2 + 0.25
    temp[::5] = 0.0  # greedy rows mixed into the batch
    seeds = torch.arange(B) * 7919 + 3
    offsets = torch.arange(B) + 2**33
    out = fsdist.sample(h, w, temperature=temp.to(device), seed=seeds.to(device), offset=offsets.to(device),
                        vocab_size=vocab)
    ref, margin = reference_gumbel(h.cpu(), w.cpu(), temperature=temp, seed=seeds, offset=offsets,
                                   vocab_size=vocab)
    # Rows whose best and second-best perturbed scores are far apart compared with fp32
    # accumulation error must pick exactly the reference token.
    clear = margin > 1e-3
    assert clear.float().mean() > 0.9
    assert torch.equal(out.tokens.cpu()[clear], ref[clear])


@pytest.mark.parametrize("dtype", DTYPES)
def test_greedy_rows_are_argmax(device, dtype):
    B, D, V = 24, 64, 1500
    h, w = make_problem(B, D, V, dtype, device, seed=4)
    temp = torch.where(torch.arange(B) % 2 == 0, 0.0, 1.0)
    out = fsdist.sample(h, w, temperature=temp.to(device), seed=1)
    logits = exact_logits(h, w)
    top2 = logits.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 1e-3
    greedy = temp == 0
    assert torch.equal(out.tokens.cpu()[greedy & clear], logits.argmax(-1)[greedy & clear])
    # Scalar temperature 0 takes the no-noise kernel variant: same answer.
    all_greedy = fsdist.sample(h, w, temperature=0.0).tokens.cpu()
    assert torch.equal(all_greedy[clear], logits.argmax(-1)[clear])


def test_padding_ids_never_sampled(device):
    B, D, V, vocab = 64, 32, 1024, 1000
    h, w = make_problem(B, D, V, torch.float32, device, seed=5)
    # Padding rows aligned with every hidden row: they would win every draw if unmasked.
    w[vocab:] = h.mean(0, keepdim=True) * 1000
    for T in (0.0, 1.0, 5.0):
        out = fsdist.sample(h, w, temperature=T, seed=torch.arange(B, device=device), vocab_size=vocab,
                            return_logprobs=True)
        assert int(out.tokens.max()) < vocab
        ref = torch.logsumexp(exact_logits(h, w, vocab) / (T or 1.0), dim=-1)
        torch.testing.assert_close(out.logsumexp.cpu().double(), ref, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", DTYPES)
def test_logprobs_and_logsumexp(device, dtype):
    B, D, V = 33, 48, 4099
    h, w = make_problem(B, D, V, dtype, device, seed=6)
    temp = torch.linspace(0, 2, B)
    out = fsdist.sample(h, w, temperature=temp.to(device), seed=9, return_logprobs=True)
    scaled = exact_logits(h, w) / torch.where(temp == 0, 1.0, temp).double()[:, None]
    logp = torch.log_softmax(scaled, dim=-1)
    got_lp = out.logprobs.cpu().double()
    want_lp = logp.gather(1, out.tokens.cpu()[:, None]).squeeze(1)
    torch.testing.assert_close(got_lp, want_lp, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(out.logsumexp.cpu().double(), torch.logsumexp(scaled, -1), rtol=1e-5, atol=1e-4)
    assert out.tokens.dtype == torch.int64 and out.logprobs.dtype == torch.float32


# --------------------------------------------------------------------------- RNG contract


def test_same_key_same_token_across_tile_configs_and_positions(device):
    B, D, V = 48, 32, 2100
    h, w = make_problem(B, D, V, torch.float32, device, seed=7)
    seeds = torch.arange(B, device=device) * 3 + 1
    offsets = torch.arange(B, device=device) % 5
    configs = [TileConfig(16, 128, 16, num_stages=1), TileConfig(64, 512, 32, num_stages=1)]
    outs = [fsdist.sample(h, w, seed=seeds, offset=offsets, config=c).tokens for c in configs]
    assert torch.equal(outs[0], outs[1])
    perm = torch.randperm(B, generator=torch.Generator().manual_seed(0)).to(device)
    shuffled = fsdist.sample(h[perm], w, seed=seeds[perm], offset=offsets[perm]).tokens
    assert torch.equal(shuffled, outs[0][perm])
    # A row alone gives the same token as inside the batch.
    single = fsdist.sample(h[5:6], w, seed=int(seeds[5]), offset=int(offsets[5])).tokens
    assert int(single) == int(outs[0][5])


def test_new_offset_gives_independent_draw(device):
    n, V = 20_000, 1000
    h, w = make_problem(1, 32, V, torch.float32, device, seed=8, scale=2.0)
    hidden = h.expand(n, -1).contiguous()
    seeds = torch.arange(n, device=device)
    cfg = many_draws_config(n, 32, device)
    a = fsdist.sample(hidden, w, seed=seeds, offset=0, config=cfg).tokens
    b = fsdist.sample(hidden, w, seed=seeds, offset=1, config=cfg).tokens
    c = fsdist.sample(hidden, w, seed=seeds + n, offset=0, config=cfg).tokens
    probs = torch.softmax(exact_logits(h, w)[0], -1)
    collide = float((probs**2).sum())  # P(two independent draws agree)
    for other in (b, c):
        assert pairs_independence(a, other) > P_MIN
        same = int((a == other).sum())
        assert stats.binomtest(same, n, collide).pvalue > P_MIN, (same, n * collide)
    # And re-running a key reproduces it exactly.
    assert torch.equal(a, fsdist.sample(hidden, w, seed=seeds, offset=0).tokens)


def test_scalar_and_tensor_parameters_agree(device):
    B, D, V = 16, 32, 700
    h, w = make_problem(B, D, V, torch.float32, device, seed=9)
    full = lambda x, dt: torch.full((B,), x, dtype=dt, device=device)  # noqa: E731
    a = fsdist.sample(h, w, temperature=0.7, seed=2**40 + 3, offset=2**35)
    b = fsdist.sample(h, w, temperature=full(0.7, torch.float32), seed=full(2**40 + 3, torch.int64),
                      offset=full(2**35, torch.int64))
    assert torch.equal(a.tokens, b.tokens)


# --------------------------------------------------------------------------- degenerate rows


def test_nan_rows_return_minus_one(device):
    B, D, V = 8, 32, 600
    h, w = make_problem(B, D, V, torch.float32, device, seed=10)
    h[3, 0] = float("nan")
    out = fsdist.sample(h, w, seed=1, return_logprobs=True)
    assert int(out.tokens[3]) == -1 and math.isnan(float(out.logprobs[3]))
    ok = torch.arange(B) != 3
    assert (out.tokens.cpu()[ok] >= 0).all() and torch.isfinite(out.logprobs.cpu()[ok]).all()
    clean = fsdist.sample(h[ok.to(device)], w, seed=torch.full((B - 1,), 1, device=device)).tokens
    assert torch.equal(out.tokens[ok.to(device)], clean)


def test_all_masked_row_returns_minus_one(device):
    h, w = make_problem(1, 16, 300, torch.float32, device, seed=11)
    h = torch.zeros_like(h)
    h[0, 0] = 1.0
    w[:, 0] = float("-inf")  # every logit is -inf: no id has probability mass
    for T in (0.0, 1.0):
        assert int(fsdist.sample(h, w, temperature=T).tokens[0]) == -1


@pytest.mark.parametrize("path", ["fused", "chunked"])
def test_rows_without_a_finite_distribution_return_minus_one(device, path):
    """+inf in a hidden state makes every logit +-inf or NaN; a single +inf logit leaves
    softmax undefined too. Both return -1 with NaN logprob on both stage-1 paths; -inf
    logits are fine (probability 0)."""
    B, D, V = 6, 32, 600
    h, w = make_problem(B, D, V, torch.float32, device, seed=21)
    h[1, 5] = float("inf")
    w2 = w.clone()
    h[:, 30:] = 0.0
    w2[:, 30:] = 0.0
    w2[17, 31] = 3e38
    h[2, 31] = 10.0  # row 2: exactly one logit overflows to +inf (id 17), the rest finite
    w2[100:, 30] = -3e38
    h[3, 30] = 10.0  # row 3: ids >= 100 get -inf logits, still a valid distribution over ids < 100
    for T in (0.0, 1.0):
        out = fsdist.sample(h, w2, temperature=T, seed=4, return_logprobs=True, path=path)
        tok = out.tokens.cpu()
        assert tok[1] == -1 and tok[2] == -1, (T, tok)
        assert bool(torch.isnan(out.logprobs.cpu()[[1, 2]]).all())
        assert 0 <= tok[3] < 100 and math.isfinite(float(out.logprobs[3]))
        assert bool((tok[[0, 4, 5]] >= 0).all())


@pytest.mark.parametrize("path", ["fused", "chunked"])
def test_tiny_temperatures_are_greedy_and_never_overflow(device, path):
    """T < 1e-5 is greedy (vLLM's epsilon). Just above it, or with logits near the fp32 limit,
    logits / T would overflow fp32; the kernels never form it, so the token is still the
    argmax (the distribution is a point mass there) and the logprob stays finite."""
    B, D, V = 4, 32, 700
    h, w = make_problem(B, D, V, torch.float32, device, seed=22)
    argmax = exact_logits(h, w).argmax(-1).cpu()
    greedy = fsdist.sample(h, w, temperature=0.0, return_logprobs=True, path=path)
    for T in (1e-38, 1e-7, 9.9e-6):  # greedy: the argmax, logprobs of log_softmax(logits) (T = 1)
        out = fsdist.sample(h, w, temperature=T, seed=9, return_logprobs=True, path=path)
        assert torch.equal(out.tokens.cpu(), argmax), T
        assert torch.equal(out.logprobs, greedy.logprobs), T
    for T in (1e-5, 2e-5):  # sampled, but the distribution is a point mass in fp32
        out = fsdist.sample(h, w, temperature=T, seed=9, return_logprobs=True, path=path)
        assert torch.equal(out.tokens.cpu(), argmax), T
        assert bool((out.logprobs.cpu() > -1e-3).all()) and bool((out.logprobs.cpu() <= 0).all()), (T, out.logprobs)
    # Huge logits with a small temperature: logits / T ~ 1e36 / 1e-4 overflows fp32.
    big = h * 1e34
    out = fsdist.sample(big, w, temperature=1e-4, seed=9, return_logprobs=True, path=path)
    assert torch.equal(out.tokens.cpu(), exact_logits(big, w).argmax(-1).cpu())
    assert bool(torch.isfinite(out.logprobs).all())
    assert bool(torch.isinf(out.logsumexp).all()), "logsumexp(logits / T) itself leaves the fp32 range"


def test_bad_temperature_inside_kernel_poisons_row(device):
    """When host checks are skipped (CUDA-graph capture) the kernel must still not sample wrongly."""
    B, D, V = 4, 32, 300
    h, w = make_problem(B, D, V, torch.float32, device, seed=12)
    temp = torch.tensor([1.0, -1.0, float("nan"), 0.0], device=device)
    cfg = fsdist.ops.configs.pick_config(B, D, device.type)
    layout = CandidateLayout(1, -(-V // cfg.block_v), B)
    cand_f, cand_i = layout.alloc(device)
    launch_fused(h, w, RowParams(temp, 0, 0), cfg, layout, BufferPair(cand_f, cand_i), vocab_size=V)
    tokens = launch_merge(layout, BufferPair(cand_f, cand_i), B, RowParams(temp, 0, 0))[0].cpu()
    assert tokens[1] == -1 and tokens[2] == -1 and tokens[0] >= 0 and tokens[3] >= 0


def test_empty_batch(device):
    h, w = make_problem(0, 32, 100, torch.float32, device)
    out = fsdist.sample(h, w, return_logprobs=True)
    assert out.tokens.shape == (0,) and out.logprobs.shape == (0,)


# --------------------------------------------------------------------------- validation


def _bad_inputs(device):
    h, w = make_problem(4, 32, 100, torch.float32, device)
    hb, wb = h.bfloat16(), w.bfloat16()
    other = torch.device("meta")
    return [
        ("hidden-not-tensor", dict(hidden=h.tolist(), weight=w), TypeError, "hidden must be a torch.Tensor"),
        ("hidden-1d", dict(hidden=h[0], weight=w), ValueError, "hidden must be 2-D"),
        ("hidden-int", dict(hidden=h.long(), weight=w.long()), TypeError, "hidden dtype"),
        ("dtype-mismatch", dict(hidden=hb, weight=w), TypeError, "weight dtype"),
        ("weight-3d", dict(hidden=h, weight=w[None]), ValueError, "weight must be 2-D"),
        ("D-mismatch", dict(hidden=h, weight=w[:, :16].contiguous()), ValueError, "weight has D=16"),
        ("weight-transposed", dict(hidden=h[:, :32], weight=torch.randn(32, 100, device=device).T),
         ValueError, "weight must be contiguous"),
        ("device-mismatch", dict(hidden=h, weight=torch.empty(100, 32, device=other)), ValueError, "is on meta"),
        ("temperature-negative", dict(hidden=h, weight=w, temperature=-0.5), ValueError,
         "temperature must be in [0, 1e+30]"),
        ("temperature-nan", dict(hidden=h, weight=w, temperature=float("nan")), ValueError, "temperature"),
        ("temperature-inf", dict(hidden=h, weight=w, temperature=float("inf")), ValueError,
         "temperature must be in [0, 1e+30] (finite, not NaN), got inf"),
        ("temperature-huge", dict(hidden=h, weight=w, temperature=3e30), ValueError, "temperature must be in"),
        ("temperature-row-inf-checked", dict(hidden=h, weight=w, check=True,
                                             temperature=torch.tensor([1.0, 1.0, float("inf"), 1.0], device=device)),
         ValueError, "bad rows: [2]"),
        ("temperature-row-nan-checked", dict(hidden=h, weight=w, check=True,
                                             temperature=torch.tensor([1.0, float("nan"), 1.0, 1.0], device=device)),
         ValueError, "bad rows: [1]"),
        ("hidden-D0", dict(hidden=h[:, :0], weight=w[:, :0]), ValueError, "D=0"),
        ("temperature-bool", dict(hidden=h, weight=w, temperature=True), TypeError, "temperature"),
        ("temperature-shape", dict(hidden=h, weight=w, temperature=torch.ones(3, device=device)),
         ValueError, "temperature tensor must have shape [4]"),
        ("temperature-type", dict(hidden=h, weight=w, temperature="hot"), TypeError, "temperature"),
        ("seed-shape", dict(hidden=h, weight=w, seed=torch.zeros(4, 1, dtype=torch.int64, device=device)),
         ValueError, "seed tensor must have shape [4]"),
        ("seed-dtype", dict(hidden=h, weight=w, seed=torch.zeros(4, dtype=torch.int32, device=device)),
         TypeError, "seed tensor must be int64"),
        ("seed-float", dict(hidden=h, weight=w, seed=1.5), TypeError, "seed must be an int"),
        ("seed-range", dict(hidden=h, weight=w, seed=2**64), ValueError, "seed must fit in int64"),
        ("offset-shape", dict(hidden=h, weight=w, offset=torch.zeros(5, dtype=torch.int64, device=device)),
         ValueError, "offset tensor must have shape [4]"),
        ("offset-device", dict(hidden=h, weight=w, offset=torch.zeros(4, dtype=torch.int64, device=other)),
         ValueError, "offset is on meta"),
        ("vocab-too-big", dict(hidden=h, weight=w, vocab_size=101), ValueError, "vocab_size must be in [1, 100]"),
        ("vocab-zero", dict(hidden=h, weight=w, vocab_size=0), ValueError, "vocab_size must be in"),
        ("vocab-type", dict(hidden=h, weight=w, vocab_size=10.0), TypeError, "vocab_size must be an int"),
    ]


BAD_INPUT_NAMES = [case[0] for case in _bad_inputs(torch.device("cpu"))]


@pytest.mark.parametrize("name", BAD_INPUT_NAMES)
def test_validation_errors(device, name):
    _, kwargs, exc, match = next(c for c in _bad_inputs(device) if c[0] == name)
    with pytest.raises(exc) as info:
        fsdist.sample(**kwargs)
    assert match in str(info.value), f"{name}: {info.value}"


@pytest.mark.parametrize("path", ["fused", "chunked"])
def test_bad_row_temperature_is_handled_on_the_device(device, path):
    """Without check=True a NaN, negative or too large (> 1e30, +inf) temperature in a [B] tensor
    costs no sync: that row returns token -1 (NaN logprob), the others are untouched. (+inf once
    returned id V, past the vocabulary: T * Gumbel overflowed and -inf padding became NaN.)"""
    h, w = make_problem(6, 32, 100, torch.float32, device)
    t = torch.tensor([1.0, float("nan"), -2.0, 0.5, float("inf"), 2e30], device=device)
    out = fsdist.sample(h, w, temperature=t, seed=3, return_logprobs=True, path=path)
    ref = fsdist.sample(h, w, temperature=torch.tensor([1.0, 1.0, 1.0, 0.5, 1.0, 1.0], device=device), seed=3,
                        return_logprobs=True, path=path)
    assert out.tokens.tolist()[1:3] == [-1, -1] and out.tokens.tolist()[4:] == [-1, -1]
    assert bool(torch.isnan(out.logprobs[[1, 2, 4, 5]]).all())
    assert out.tokens[[0, 3]].tolist() == ref.tokens[[0, 3]].tolist()


@pytest.mark.parametrize("path", ["fused", "chunked"])
def test_the_largest_temperature_samples_a_real_token(device, path):
    """T = 1e30 (the largest accepted) is in range: every row gets an id of the vocabulary (the
    noise dominates the logits, so the draw is uniform in the contract's rounding)."""
    h, w = make_problem(8, 32, 100, torch.float32, device)
    t = torch.full((8,), 1e30, device=device)
    out = fsdist.sample(h, w, temperature=t, seed=torch.arange(8, device=device), path=path)
    assert bool(((out.tokens >= 0) & (out.tokens < 100)).all())
    assert out.tokens.unique().numel() > 1
    scalar = fsdist.sample(h, w, temperature=1e30, seed=5, path=path)
    assert bool(((scalar.tokens >= 0) & (scalar.tokens < 100)).all())


def test_numpy_scalars_are_accepted(device):
    np = pytest.importorskip("numpy")
    h, w = make_problem(4, 32, 100, torch.float32, device)
    a = fsdist.sample(h, w, temperature=np.float32(0.5), seed=np.int64(3), offset=np.int32(2))
    b = fsdist.sample(h, w, temperature=0.5, seed=3, offset=2)
    assert torch.equal(a.tokens, b.tokens)


# --------------------------------------------------------------------------- large-batch path


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_path_matches_fused_path(device, dtype):
    """Same noise, same layout: the cuBLAS-chunk path must return the fused path's tokens."""

    B, D, V, vocab = 40, 48, 3000, 2990
    h, w = make_problem(B, D, V, dtype, device, seed=13)
    temp = torch.linspace(0, 2, B, device=device)
    kw = dict(temperature=temp, seed=torch.arange(B, device=device) + 5, offset=3, vocab_size=vocab,
              return_logprobs=True)
    fused = fsdist.sample(h, w, path="fused", **kw)
    chunked = fsdist.sample(h, w, path="chunked", **kw)
    ref, margin = reference_gumbel(h.cpu(), w.cpu(), temperature=temp.cpu(), seed=torch.arange(B) + 5, offset=3,
                                   vocab_size=vocab)
    clear = margin > 1e-3
    assert clear.float().mean() > 0.9
    assert torch.equal(fused.tokens.cpu()[clear], chunked.tokens.cpu()[clear])
    torch.testing.assert_close(fused.logsumexp, chunked.logsumexp, rtol=1e-5, atol=1e-4)
    # Several chunks, one of them partial (3000 = 2 x 1024 + 952 rows at block_v 512 / 128).
    cfg = fsdist.ops.configs.pick_config(B, D, device.type)
    params = fsdist.validation.row_params(temp, torch.arange(B, device=device) + 5, 3, B, h.device)
    layout = CandidateLayout(1, -(-V // cfg.block_v), B)
    cand_f, cand_i = layout.alloc(device)
    launch_chunked(h, w, params, cfg, layout, BufferPair(cand_f, cand_i), vocab_size=vocab, chunk_rows=2 * cfg.block_v)
    small_chunks = launch_merge(layout, BufferPair(cand_f, cand_i), B, RowParams(1.0, 0, 0))[0]
    assert torch.equal(small_chunks.cpu()[clear], fused.tokens.cpu()[clear])


def test_bad_path_name(device):
    h, w = make_problem(2, 16, 64, torch.float32, device)
    with pytest.raises(ValueError, match="path must be"):
        fsdist.sample(h, w, path="magic")
    with pytest.raises(TypeError, match="config must be a fsdist.TileConfig or None, got dict"):
        fsdist.sample(h, w, config={"block_b": 16})
    with pytest.raises(TypeError, match="return_logprobs must be a bool, got 'no'"):
        fsdist.sample(h, w, return_logprobs="no")
    with pytest.raises(TypeError, match="check must be a bool"):
        fsdist.sample(h, w, check="yes")
    # a 0-d tensor is every row's value, on the device (as a [B] tensor of it)
    B = h.shape[0]
    zero_d = fsdist.sample(h, w, temperature=torch.tensor(0.7, device=device), seed=torch.tensor(3, device=device),
                           offset=torch.tensor(5, device=device), top_p=torch.tensor(0.9, device=device))
    rows = fsdist.sample(h, w, temperature=torch.full((B,), 0.7, device=device),
                         seed=torch.full((B,), 3, device=device), offset=torch.full((B,), 5, device=device),
                         top_p=torch.full((B,), 0.9, device=device))
    assert torch.equal(zero_d.tokens, rows.tokens)
    # numpy scalars are ints and bools like any other
    import numpy as np
    out = fsdist.sample(h, w, vocab_size=np.int64(60), return_logprobs=np.bool_(True))
    assert out.logprobs is not None and int(out.tokens.max()) < 60


@pytest.mark.parametrize("blocks", [(2, 16), (4, 64), (1, 1024)])
def test_stage2_block_shapes_agree(device, blocks):
    """Stage 2 with the GPU's small row blocks and several slot chunks equals the default."""
    B, D, V = 9, 32, 3000
    h, w = make_problem(B, D, V, torch.float32, device, seed=14)
    h[4, 0] = float("nan")  # a poisoned row must stay poisoned whatever the chunking
    cfg = TileConfig(16, 64, 32, num_stages=1)
    layout = CandidateLayout(4, -(-V // cfg.block_v), B)
    cand_f, cand_i = layout.alloc(device)
    params = fsdist.validation.row_params(torch.linspace(0, 2, B, device=device), 3, 4, B, h.device)
    launch_fused(h, w, params, cfg, layout, BufferPair(cand_f, cand_i), vocab_size=V - 5, logprobs=True)
    ref = launch_merge(layout, BufferPair(cand_f, cand_i), B, params, logprobs=True)
    got = launch_merge(layout, BufferPair(cand_f, cand_i), B, params, logprobs=True, blocks=blocks)
    assert torch.equal(ref[0], got[0]) and int(got[0][4]) == -1
    torch.testing.assert_close(ref[1], got[1], equal_nan=True, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(ref[2], got[2], equal_nan=True, rtol=1e-6, atol=1e-5)


# --------------------------------------------------------------------------- TMA operand path


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B,D,V", [(5, 64, 1000), (33, 48, 777), (16, 128, 1024)])
def test_tma_operands_write_the_pointer_path_candidates(device, dtype, B, D, V):
    """Tensor-descriptor loads (zero-filled past the edges) give bit-identical candidates:
    ragged batch tiles, a ragged last vocabulary tile, K not a multiple of block_k (D=48
    with block_k 32), a strided hidden view, logprobs, NaN and greedy rows."""

    h_full, w = make_problem(B, 2 * D, V, dtype, device, seed=B + D)
    h = h_full[:, :D]  # row stride 2*D: descriptors take the stride, the pointer path too
    w = w[:, :D].contiguous()
    h[1 % B, 3] = float("nan")
    temp = torch.linspace(0, 1.5, B, device=device)  # row 0 greedy
    params = fsdist.validation.row_params(temp, torch.arange(B, device=device) + 11, 7, B, h.device)
    got = []
    for tma in (False, True):
        cfg = TileConfig(16, 128, 32, num_stages=1, tma=tma)
        assert tma_operands(h, w, cfg)[2] == (tma and (device.type == "cuda" and
                                                       torch.cuda.get_device_capability(device)[0] >= 9
                                                       or device.type == "cpu"))
        layout = CandidateLayout(4, -(-V // cfg.block_v), B)
        cand_f, cand_i = layout.alloc(device)
        cand_f.fill_(-7.0)
        cand_i.fill_(-7)
        launch_fused(h, w, params, cfg, layout, BufferPair(cand_f, cand_i), vocab_size=V - 3, logprobs=True)
        got.append((cand_f.clone(), cand_i.clone()))
    assert torch.equal(got[0][1], got[1][1])
    assert torch.equal(got[0][0].nan_to_num(-9.0), got[1][0].nan_to_num(-9.0))


def test_a_partial_128_row_tile_reads_a_padded_hidden(device, monkeypatch):
    """A TMA tile of >= configs.PAD_TILE_ROWS rows whose last tile the batch leaves partly empty reads a copy
    of the hidden zero-padded to whole tiles (v35); the kernel still samples only the batch's rows, so the
    candidates are those of the unpadded launch (and of the pointer path), bit for bit."""
    from fsdist.ops import fused_sample

    B, D, V = 130, 64, 700
    h_full, w = make_problem(B, 2 * D, V, torch.bfloat16, device, seed=21)
    h = h_full[:, :D]  # a strided view: the padded copy is contiguous
    w = w[:, :D].contiguous()
    temp = torch.linspace(0, 1.5, B, device=device)
    params = fsdist.validation.row_params(temp, torch.arange(B, device=device) + 3, 5, B, h.device)
    tma = TileConfig(128, 128, 32, num_stages=1, tma=True)
    padded = fused_sample.tile_operand(h, 128)
    assert padded.shape == (256, D) and torch.equal(padded[:B], h) and not padded[B:].any()
    whole = h[:128]
    assert fused_sample.tile_operand(whole, 128) is whole  # whole tiles: no copy
    # 64-row tiles: padded when the batch is one tile at least half empty (PAD_HALF_TILE_ROWS, v65 / v68)
    assert fused_sample.tile_operand(h, 64) is h  # two tiles (2 of 64 rows in the last): not measured, no copy
    assert fused_sample.tile_operand(h[:32], 64).shape == (64, D)  # one tile, half empty
    assert fused_sample.tile_operand(h[:17], 64).shape == (64, D)
    narrow = torch.zeros(5, 36, dtype=torch.bfloat16, device=device)  # 72-byte rows: a copy could not feed TMA
    assert fused_sample.tile_operand(narrow, 64) is narrow and fused_sample.tile_operand(narrow, 128) is narrow
    assert fused_sample.tile_operand(h[:33], 64).shape[0] == 33  # just under half empty: no copy
    assert fused_sample.tile_operand(h[:48], 64).shape[0] == 48  # a quarter empty: no copy
    assert fused_sample.tile_operand(h, 32) is h  # smaller tiles: no copy
    assert fused_sample.tile_operand(h, 32, min_rows=1).shape == (160, D)  # unless asked (bench/ws_probe.py --pad)
    # the launch pads exactly where the copy engine reads the hidden (tensor descriptors)
    made = []
    real = fused_sample.tile_operand

    def spy(x, block_b):
        out = real(x, block_b)
        made.append(out.shape[0])
        return out

    monkeypatch.setattr(fused_sample, "tile_operand", spy)

    def candidates(cfg):
        layout = CandidateLayout(4, -(-V // cfg.block_v), B)  # 4 fields: the logprob ones too
        cand_f, cand_i = layout.alloc(device)
        cand_f.fill_(-7.0)
        cand_i.fill_(-7)
        launch_fused(h, w, params, cfg, layout, BufferPair(cand_f, cand_i), vocab_size=V - 2, logprobs=True)
        return cand_f.nan_to_num(-9.0), cand_i

    got = candidates(tma)
    assert made == ([256] if fused_sample._tma_capable(h.device) else [])
    ref = candidates(dataclasses.replace(tma, tma=False))
    assert len(made) <= 1  # the pointer path makes no copy
    monkeypatch.setattr(fused_sample, "PAD_TILE_ROWS", 1 << 30)
    monkeypatch.setattr(fused_sample, "PAD_HALF_TILE_ROWS", 1 << 30)
    unpadded = candidates(tma)
    for other in (ref, unpadded):
        assert torch.equal(got[1], other[1]) and torch.equal(got[0], other[0])


def test_tma_falls_back_to_pointers_when_rows_are_misaligned(device):
    """TMA needs 16-byte aligned row strides: a bf16 hidden with D = 36 (72-byte rows) must
    take the pointer path, and still sample."""

    h, w = make_problem(4, 36, 300, torch.bfloat16, device, seed=3)
    cfg = TileConfig(16, 128, 32, num_stages=1, tma=True)
    assert tma_operands(h, w, cfg)[2] is False
    out = fsdist.sample(h, w, seed=1, config=cfg)
    ref = fsdist.sample(h, w, seed=1, config=TileConfig(16, 128, 32, num_stages=1))
    assert torch.equal(out.tokens, ref.tokens)
    with pytest.raises(ValueError, match="tma must be a bool"):
        TileConfig(16, 128, 32, tma=1)


def test_ws_config_without_a_hopper_gpu_runs_the_triton_kernel(device, monkeypatch):
    """TileConfig.ws asks for the warp-specialised kernel; where it cannot run (here: no sm_90 GPU,
    or fp32 operands it does not take) the Triton kernel runs the same tile: same candidates, and the
    warp-specialised launcher is never reached (it raises if it is)."""
    from fsdist.ops import fused_sample

    def refuse(*a, **k):
        raise AssertionError("the warp-specialised kernel was launched")

    monkeypatch.setattr(fused_sample, "launch_fused_ws", refuse)
    dtypes = [torch.float32] + ([torch.bfloat16] if device.type == "cpu" else [])
    for dtype in dtypes:
        h, w = make_problem(5, 64, 700, dtype, device, seed=8)
        cfg = TileConfig(128, 128, 64, num_warps=8, num_stages=5, tma=True)  # the tile pick_config names
        params = RowParams(torch.full((5,), 0.9, device=device), 3, 4)
        layout = CandidateLayout(1, triton.cdiv(700, 128), 5)
        got = []
        for c in (cfg, dataclasses.replace(cfg, ws=True)):
            dest = BufferPair.alloc(layout, device)
            launch_fused(h, w, params, c, layout, dest, vocab_size=697)
            got.append((dest.f.clone(), dest.i.clone()))
        assert torch.equal(got[0][1], got[1][1]) and torch.equal(got[0][0], got[1][0])


def test_hidden_boxes_cover_a_one_tile_batch():
    """launch_fused_ws's box_rows: a batch of one partial tile loads as few boxes of box_rows rows as cover it (the
    last may end past the hidden), whole tiles and box_rows = 0 one box of the tile's rows; bad sizes are refused."""
    from fsdist.ops.fused_sample_ws import hidden_boxes

    assert hidden_boxes(24, 64, 8) == (8, 3)
    assert hidden_boxes(17, 64, 8) == (8, 3)
    assert hidden_boxes(1, 64, 8) == (8, 1)
    assert hidden_boxes(63, 64, 16) == (16, 4)
    assert hidden_boxes(96, 128, 8) == (8, 12)
    assert hidden_boxes(64, 64, 8) == (64, 1)  # a whole tile
    assert hidden_boxes(200, 128, 8) == (128, 1)  # several tiles: one box each
    assert hidden_boxes(24, 64, 0) == (64, 1)
    for bad in (12, 48, -8):
        with pytest.raises(ValueError, match="box_rows"):
            hidden_boxes(24, 64, bad)


def test_last_tile_boxes_cover_a_short_last_tile():
    """launch_fused_ws's last_box_rows: on 128-row tiles a last tile of 1-64 rows loads as few boxes of last_box_rows
    rows as cover it (the last box may end past the hidden); a last tile of more than 64 rows, whole tiles, the 64-row
    tile and last_box_rows = 0 none (the last tile whole); bad sizes are refused."""
    from fsdist.ops.fused_sample_ws import last_tile_boxes

    assert last_tile_boxes(129, 128, 8) == (8, 1)
    assert last_tile_boxes(150, 128, 8) == (8, 3)
    assert last_tile_boxes(192, 128, 8) == (8, 8)
    assert last_tile_boxes(192, 128, 64) == (64, 1)
    assert last_tile_boxes(320, 128, 16) == (16, 4)
    assert last_tile_boxes(24, 128, 8) == (8, 3)  # one tile: the kernel accepts it (the dispatch never asks)
    for batch, block_b, rows in ((193, 128, 8), (256, 128, 8), (200, 128, 8), (96, 64, 8), (150, 128, 0)):
        assert last_tile_boxes(batch, block_b, rows) == (0, 0), (batch, block_b, rows)
    for bad in (12, 48, -8, 128):
        for batch in (150, 256):  # (refused whatever the batch)
            with pytest.raises(ValueError, match="last_box_rows"):
                last_tile_boxes(batch, 128, bad)


@pytest.mark.parametrize("kw, match", [
    (dict(acc_buffers=3), "acc_buffers"), (dict(epilogue_chunk=8), "epilogue_chunk"),
    (dict(epilogue_chunk=16, block_b=64, logprobs=True), "plain calls only"),
    (dict(epilogue_chunk=16, noise_probe="philox"), "plain calls only"), (dict(noise_probe="cheap"), "noise_probe"),
    (dict(epilogue_chunk=32, block_b=64, extended=True), "plain calls only"), ("processors", "plain calls only"),
    (dict(wait_probe=torch.zeros(4, 7, dtype=torch.int64)), "wait_probe"),
    (dict(wait_probe=torch.zeros(4, 8, dtype=torch.int32)), "wait_probe"),
    (dict(wait_probe=torch.zeros(8, 4, dtype=torch.int64).t()), "wait_probe")])
def test_launch_fused_ws_refuses_bad_hand_off_options(kw, match):
    """launch_fused_ws's benchmark options (the hand-off buffers, the chunked epilogue, the noise and wait probes) are
    checked before anything is launched, each error naming its argument; the chunked epilogue serves plain calls
    only; the wait probe takes a contiguous int64 [programs, WAIT_FIELDS] tensor."""
    from fsdist.ops.fused_sample_ws import launch_fused_ws

    from fsdist.processing import prepare_processing

    h, w = torch.zeros(4, 64, dtype=torch.bfloat16), torch.zeros(256, 64, dtype=torch.bfloat16)
    layout = CandidateLayout(CandidateLayout.fields(True, extended=True), 2, 4, n_ifields=5)
    params = RowParams(1.0, 0, 0)
    if kw == "processors":  # a token bitmask: a processed call
        bm = torch.full((4, 8), -1, dtype=torch.int32)
        params = dataclasses.replace(params, processing=prepare_processing(token_bitmask=bm, batch=4, vocab_size=256,
                                                                           device="cpu"))
        kw = dict(epilogue_chunk=16)
    with pytest.raises(ValueError, match=match):
        launch_fused_ws(h, w, params, layout, BufferPair.alloc(layout, "cpu"), vocab_size=256, **kw)


def test_persistent_grid_cycles_every_program_through_the_batch_tiles():
    """fused_sample_ws.persistent_grid with a short last tile: 132 SMs and 2, 3, 4 or 6 batch tiles (a multiple) keep
    132 programs with the batch tiles rotating by round; 5 or 7 (coprime) 132 unrotated; 8, 18 or 50 (a common
    divisor, not a multiple) 131 unrotated; a cap counts as the SMs. Each way, with 1,000 vocabulary tiles, the
    launch's tiles are a permutation of them all and every program visits every batch tile equally often, +-1 (the
    kernel's _tile_coords, mirrored here). Without a short tile: one program per SM or the cap, unrotated; never more
    programs than tiles."""
    from fsdist.ops.fused_sample_ws import persistent_grid

    grid = {n: persistent_grid(132, n, 1000 * n, True) for n in (1, 2, 3, 4, 5, 6, 7, 8, 18, 50)}
    assert grid == {1: (132, False), 2: (132, True), 3: (132, True), 4: (132, True), 5: (132, False),
                    6: (132, True), 7: (132, False), 8: (131, False), 18: (131, False), 50: (131, False)}
    assert persistent_grid(132, 2, 1000, False) == (132, False)
    assert persistent_grid(132, 2, 1000, False, grid_cap=7) == (7, False)
    assert persistent_grid(132, 2, 1000, True, grid_cap=64) == (64, True)
    assert persistent_grid(132, 2, 1000, True, grid_cap=63) == (63, False)
    assert persistent_grid(132, 2, 10, True) == (10, True)  # fewer tiles than SMs
    for sms, n, cap in ((132, 2, 0), (132, 3, 0), (132, 5, 0), (132, 8, 0), (114, 4, 0), (132, 2, 63), (132, 6, 60)):
        p, rotate = persistent_grid(sms, n, 1000 * n, True, cap)
        seen, visits = [], {q: [0] * n for q in range(p)}
        for q in range(p):
            for t in range(q, 1000 * n, p):
                b = (t % n + (t // p if rotate else 0)) % n
                seen.append((t // n, b))
                visits[q][b] += 1
        assert sorted(seen) == [(v, b) for v in range(1000) for b in range(n)], (sms, n, cap)
        assert all(max(c) - min(c) <= 1 for c in visits.values()), (sms, n, cap)


def test_ws_last_box_rows_past_one_tile(monkeypatch):
    """fused_sample.ws_last_box_rows (docs/performance.md v78): configs.WS_LAST_BOX_ROWS for a batch of more than one
    128-row tile whose last tile holds 1-64 rows; 0 for one-tile batches, a last tile of 65-127 rows, whole tiles, the
    64-row tile, and when WS_LAST_BOX_ROWS is 0."""
    from fsdist.ops import fused_sample

    assert fused_sample.WS_LAST_BOX_ROWS == 8
    assert [fused_sample.ws_last_box_rows(b, 128) for b in (129, 150, 192, 257, 320, 1050)] == [8] * 6
    assert [fused_sample.ws_last_box_rows(b, 128) for b in (64, 100, 128, 193, 256, 383)] == [0] * 6
    assert fused_sample.ws_last_box_rows(150, 64) == 0
    monkeypatch.setattr(fused_sample, "WS_LAST_BOX_ROWS", 0)
    assert fused_sample.ws_last_box_rows(150, 128) == 0


def test_ws_box_rows_where_the_boxes_were_measured(monkeypatch):
    """fused_sample.ws_box_rows, the shipped rule (docs/performance.md v77): boxes of configs.WS_BOX_ROWS rows for a
    one-tile batch on the 64-row tile whose boxes cover at most three quarters of it (B <= 48); one box of the
    tile's rows for B = 49-64, several tiles, and the 128-row tile (whose padded copy was faster); none when
    WS_BOX_ROWS is 0."""
    from fsdist.ops import fused_sample

    assert fused_sample.WS_BOX_ROWS == 8
    assert [fused_sample.ws_box_rows(b, 64) for b in (1, 17, 24, 32, 40, 48)] == [8] * 6
    assert [fused_sample.ws_box_rows(b, 64) for b in (49, 56, 63, 64, 65, 200)] == [0] * 6
    assert [fused_sample.ws_box_rows(b, 128) for b in (24, 96, 127)] == [0] * 3
    monkeypatch.setattr(fused_sample, "WS_BOX_ROWS", 0)
    assert fused_sample.ws_box_rows(24, 64) == 0


def test_ws_takes_fields_rule(monkeypatch):
    """launch_fused's rule for logprob / kept-logit fields on the warp-specialised tiles: plain calls and the 64-row
    tile always; the 128-row tile only with configs.WS_FIELDS_FULL_TILE on, and never with raw sums."""
    from fsdist.ops import configs
    from fsdist.ops.fused_sample import ws_takes_fields
    for on in (False, True):
        monkeypatch.setattr(configs, "WS_FIELDS_FULL_TILE", on)
        assert ws_takes_fields(128, False, False, True)  # plain (raw_sums is only read with kept logits)
        assert ws_takes_fields(64, True, True, True)
        assert ws_takes_fields(128, True, False, False) == on
        assert ws_takes_fields(128, True, True, False) == on
        assert ws_takes_fields(128, False, True, False) == on
        assert not ws_takes_fields(128, True, True, True)
