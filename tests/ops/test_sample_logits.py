"""The chunked path's sampling pass (fsdist/ops/sample_logits.py) against the fused epilogue.

The pass must write the candidates the fused kernel writes for the same logits (score, id
and, with logprobs, the log-sum-exp fields), whatever its row block or tiles per program:
that is what makes the fused and the chunked paths return the same token for the
same (seed, offset). To give both kernels the same logits exactly, hidden is a one-hot
matrix in fp32: the fused kernel's dot product then reproduces the weight's entries (one
product by 1, the rest by 0), and the pass is fed torch's product of the same operands.
Runs under Triton's interpreter on CPU and unchanged on CUDA.
"""
import pytest
import torch

from fsdist.ops.configs import TileConfig
from fsdist.ops.configs import chunk_rows_for
from fsdist.ops.fused_sample import launch_fused
from fsdist.ops.layout import BufferPair, CandidateLayout
from fsdist.ops.merge_candidates import launch_merge
from fsdist.ops.sample_logits import launch_sample_logits
from fsdist.params import RowParams

BLOCK_V = 128
D = 64  # >= B: room for a one-hot hidden row per batch row


def _case(device, B=37, V_rows=1000, seed=0):
    """(hidden, weight, logits = hidden @ weight.T exactly, params)."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.zeros(B, D)
    hidden[torch.arange(B), torch.arange(B)] = 1.0
    hidden[3, 3] = float("nan")  # poisoned row: every logit of row 3 is NaN
    weight = torch.randn(V_rows, D, generator=g) * 3.0
    # Near-ties inside one Philox quad and across quads stress the lowest-id tie rule.
    weight[8:12, 1] = 5.0
    weight[:, 2] = 0.0
    hidden, weight = hidden.to(device), weight.to(device)
    logits = torch.mm(hidden, weight.T)
    seeds = torch.randint(0, 2**62, (B,), generator=g).to(device)
    offsets = torch.randint(0, 2**40, (B,), generator=g).to(device)
    temps = (torch.rand(B, generator=g) * 1.5 + 0.25).to(device)
    temps[0] = 0.0  # greedy row
    temps[5] = -1.0  # bad temperature reaching the kernel: poisoned row
    return hidden, weight, logits, RowParams(temps, seeds, offsets)


def _fused_candidates(hidden, weight, params, layout, vocab_size, vocab_start, logprobs):
    cand_f, cand_i = layout.alloc(hidden.device)
    cand_f.fill_(123.0)
    cand_i.fill_(-7)
    cfg = TileConfig(block_b=64, block_v=BLOCK_V, block_k=64, num_warps=4, num_stages=1)
    launch_fused(hidden, weight, params, cfg, layout, BufferPair(cand_f, cand_i), vocab_size=vocab_size, vocab_start=vocab_start, logprobs=logprobs)
    return cand_f, cand_i


def _pass_candidates(logits, params, layout, vocab_size, vocab_start, tiles, logprobs, V_rows, **kw):
    cand_f, cand_i = layout.alloc(logits.device)
    cand_f.fill_(123.0)
    cand_i.fill_(-7)
    launch_sample_logits(logits, params, layout, BufferPair(cand_f, cand_i), block_v=BLOCK_V, tiles=tiles, V_rows=V_rows,
                         vocab_size=vocab_size, vocab_start=vocab_start, logprobs=logprobs, **kw)
    return cand_f, cand_i


@pytest.mark.parametrize("logprobs", [False, True])
@pytest.mark.parametrize("kw", [dict(), dict(block_b=16, tiles_per_program=1), dict(block_b=32, tiles_per_program=3)],
                         ids=["default", "bb16-1tile", "bb32-3tiles"])
def test_pass_writes_the_fused_epilogue_candidates(device, logprobs, kw):
    V_rows = 1000  # 8 tiles of 128, the last one partial
    hidden, weight, logits, params = _case(device, V_rows=V_rows)
    vocab_size, vocab_start = 996, 4  # padding ids inside the last tile; a non-zero start (TP rank)
    B = logits.shape[0]
    layout = CandidateLayout(CandidateLayout.fields(logprobs), 8, B)
    ref_f, ref_i = _fused_candidates(hidden, weight, params, layout, vocab_size + vocab_start, vocab_start, logprobs)
    f, i = _pass_candidates(logits, params, layout, vocab_size + vocab_start, vocab_start, (0, 8), logprobs,
                            V_rows, **kw)
    assert torch.equal(i.cpu(), ref_i.cpu())
    f, ref_f = f.view(layout.n_fields, -1).cpu(), ref_f.view(layout.n_fields, -1).cpu()
    # A poisoned tile (NaN score) carries no meaningful logprob fields: stage 2 returns -1.
    torch.testing.assert_close(f[0], ref_f[0], rtol=0, atol=0, equal_nan=True)
    if logprobs:
        # Score, logit and tile max are the same floats; the tile's exp-sum is added up lane
        # by lane instead of across the row: a different fp32 summation order (<= 128 terms).
        live = ~torch.isnan(ref_f[0])
        torch.testing.assert_close(f[1:3][:, live], ref_f[1:3][:, live], rtol=0, atol=0)
        torch.testing.assert_close(f[3][live], ref_f[3][live], rtol=2e-5, atol=0)
    ids = i.view(-1, B).cpu()
    assert (ids[:, 3] == -1).all() and (ids[:, 5] == -1).all()  # NaN row, bad temperature
    for t in range(8):  # the greedy row's candidates are the tile argmax
        cols = logits[0, t * BLOCK_V:(t + 1) * BLOCK_V].cpu()
        valid = (torch.arange(t * BLOCK_V, t * BLOCK_V + cols.numel()) + vocab_start) < vocab_size + vocab_start
        assert int(ids[t, 0]) == vocab_start + t * BLOCK_V + int(torch.where(valid, cols, -torch.inf).argmax())


def test_pass_over_a_chunk_that_starts_mid_vocabulary(device):
    """A chunk = tiles [t0, t1) of the weight; column 0 of its logits is row t0 * block_v."""
    V_rows = 1000
    hidden, weight, logits, params = _case(device, V_rows=V_rows, seed=1)
    B = logits.shape[0]
    layout = CandidateLayout(1, 8, B)
    ref_f, ref_i = _fused_candidates(hidden, weight, params, layout, V_rows, 0, False)
    f, i = layout.alloc(device)
    f.fill_(0.0)
    i.fill_(0)
    for t0, t1 in [(0, 3), (3, 5), (5, 8)]:
        chunk = logits[:, t0 * BLOCK_V:min(t1 * BLOCK_V, V_rows)].contiguous()
        launch_sample_logits(chunk, params, layout, BufferPair(f, i), block_v=BLOCK_V, tiles=(t0, t1), V_rows=V_rows,
                             vocab_size=V_rows, tiles_per_program=2)
    assert torch.equal(i.cpu(), ref_i.cpu())
    torch.testing.assert_close(f.cpu(), ref_f.cpu(), rtol=0, atol=0, equal_nan=True)
    tokens = launch_merge(layout, BufferPair(f, i), B, RowParams(1.0, 0, 0))[0].cpu()
    assert tokens[3] == -1 and tokens[5] == -1 and tokens[0] == int(logits[0].cpu().argmax())


def test_all_greedy_scalar_temperature(device):
    """temperature = 0.0 as a scalar: no noise at all (NOISE=False), tokens = argmax."""
    _, _, logits, _ = _case(device, seed=2)
    logits = torch.nan_to_num(logits, nan=0.0)
    B = logits.shape[0]
    layout = CandidateLayout(1, 8, B)
    f, i = _pass_candidates(logits, RowParams(0.0, 0, 0), layout, 1000, 0, (0, 8), False, 1000)
    tokens = launch_merge(layout, BufferPair(f, i), B, RowParams(1.0, 0, 0))[0].cpu()
    assert torch.equal(tokens, logits.cpu().argmax(dim=1))


@pytest.mark.parametrize("B", [1, 65, 256, 4096])
@pytest.mark.parametrize("V_rows", [1000, 128256, 151936])
@pytest.mark.parametrize("budget", [1 << 20, 16 << 20, 64 << 20])
def test_chunks_fit_the_budget_and_are_even(B, V_rows, budget):
    rows = chunk_rows_for(B, V_rows, 128, budget)
    assert rows % 128 == 0 and rows >= 128
    if 128 * B * 4 <= budget:  # one tile fits: every chunk must
        assert rows * B * 4 <= budget
    n = -(-V_rows // rows)
    last = V_rows - (n - 1) * rows
    assert last >= rows - 128 * n  # chunks differ by less than a tile each: no tiny tail chunk
    if V_rows * B * 4 <= budget:
        assert n == 1


def test_workspace_budget_override_keeps_tokens(device, monkeypatch):
    """CHUNK_WORKSPACE_BYTES set by the user: more, smaller chunks, same tokens."""
    import fsdist
    from fsdist.ops import configs

    g = torch.Generator().manual_seed(7)
    h = torch.randn(24, 64, generator=g).to(device)
    w = (torch.randn(1500, 64, generator=g) * 0.3).to(device)
    kw = dict(temperature=0.9, seed=torch.arange(24, device=device), offset=3)
    default = fsdist.sample(h, w, path="chunked", **kw).tokens
    monkeypatch.setattr(configs, "CHUNK_WORKSPACE_BYTES", 4 * 24 * 256)  # two tiles of 128 rows
    assert configs.chunk_workspace_bytes(h.device) == 4 * 24 * 256
    small = fsdist.sample(h, w, path="chunked", **kw).tokens
    assert torch.equal(small, default)
