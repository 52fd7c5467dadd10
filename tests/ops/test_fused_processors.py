"""The fused kernel's processors against the tiles that search (fsdist/ops/processors.py).

The fused GEMM reads each tile's bias / penalty entries from a per-launch table
(entry_offsets.py: offsets plus the first HEAD entries, loaded before its main loop) and, where
its tiles start on a bitmask word, the tile's bitmask words; the chunked pass and the fallback
search the entry list and gather the bitmask per element. Both must write the same candidates
bit for bit. As in test_sample_logits.py, hidden is one-hot in fp32 so that the fused kernel's
logits are exactly the weight's entries, which the pass is given directly.

Cases: entries of one row spread over tiles, a tile with more entries than HEAD (the loop past
the heads), runs of one id (bias values twice, repeated output ids), ids on tile edges, a
vocabulary start that is a multiple of 32 (words loaded up front) and one that is not (the
per-element gather), padding ids in the last tile; a power check (one bias value changed).
"""
import pytest
import torch

from fsdist.ops.configs import TileConfig
from fsdist.ops.entry_offsets import HEAD
from fsdist.ops.fused_sample import launch_fused
from fsdist.ops.layout import BufferPair, CandidateLayout
from fsdist.ops.sample_logits import launch_sample_logits
from fsdist.params import RowParams
from fsdist.processing import prepare_processing
from fsdist.reference import bitmask_from_allowed
import fsdist

BLOCK_V, D, B, V_ROWS = 128, 16, 9, 1000


def _case(device, vocab_start, seed=0, bias_shift=0.0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.zeros(B, D)
    hidden[torch.arange(B), torch.arange(B)] = 1.0
    weight = torch.randn(V_ROWS, D, generator=g) * 3.0
    vocab_size = vocab_start + 990  # padding ids in the last tile
    lo, hi = vocab_start, vocab_size
    bias_ids = torch.randint(lo, hi, (B, 12), generator=g)
    bias_ids[:, 0] = lo + 130  # tile 1 of every row ...
    bias_ids[:, 1] = lo + 130  # ... twice: both values, in order
    bias_ids[:, 2:9] = lo + 140 + torch.arange(7)  # 9 entries in tile 1: more than HEAD
    bias_ids[0, 9] = lo + 127  # tile edges
    bias_ids[1, 9] = lo + 128
    bias_ids[2, 9] = hi - 1
    bias_ids[3, 10:] = -1
    vals = torch.randn(B, 12, generator=g) * 2
    vals[:, 0] += bias_shift
    out = torch.randint(lo, hi, (B, 20), generator=g)
    out[:, 1:5] = lo + 140  # a run of four occurrences beside the bias entries
    prompt = torch.randint(lo, hi, (B, 15), generator=g)
    allowed = torch.rand(B, vocab_size, generator=g) < 0.8
    allowed[:, :vocab_start] = False
    pen = fsdist.Penalties(torch.linspace(1.1, 1.6, B).to(device), torch.linspace(0.0, 0.5, B).to(device),
                           torch.linspace(-0.3, 0.3, B).to(device), out.to(device), prompt.to(device))
    proc = prepare_processing(token_bitmask=bitmask_from_allowed(allowed).to(device),
                              logit_bias=fsdist.SparseLogits(bias_ids.to(device), vals.to(device)),
                              penalties=pen, batch=B, vocab_size=vocab_size, device=device)
    temps = (torch.rand(B, generator=g) + 0.3)
    temps[0] = 0.0
    params = RowParams(temps.to(device), (torch.arange(B) * 7 + 1).to(device), 5, processing=proc)
    hidden, weight = hidden.to(device), weight.to(device)
    return hidden, weight, torch.mm(hidden, weight.T), params, vocab_size


def _candidates(device, vocab_start, fused, **kw):
    hidden, weight, logits, params, vocab_size = _case(device, vocab_start, **kw)
    n_tiles = -(-V_ROWS // BLOCK_V)
    layout = CandidateLayout(CandidateLayout.fields(True), n_tiles, B)
    f, i = layout.alloc(device)
    f.fill_(123.0)
    i.fill_(-7)
    if fused:
        cfg = TileConfig(block_b=16, block_v=BLOCK_V, block_k=16, num_warps=4, num_stages=1)
        launch_fused(hidden, weight, params, cfg, layout, BufferPair(f, i), vocab_size=vocab_size,
                     vocab_start=vocab_start, logprobs=True)
    else:
        launch_sample_logits(logits, params, layout, BufferPair(f, i), block_v=BLOCK_V, tiles=(0, n_tiles),
                             V_rows=V_ROWS, vocab_size=vocab_size, vocab_start=vocab_start, logprobs=True,
                             sparse_in_tile=True)
    return f.view(layout.n_fields, -1).cpu(), i.cpu(), params


@pytest.mark.parametrize("vocab_start", [0, 32, 4], ids=["start0-words", "start32-words", "start4-gather"])
def test_fused_table_equals_searched_tiles(device, vocab_start):
    f_fused, i_fused, params = _candidates(device, vocab_start, fused=True)
    f_pass, i_pass, _ = _candidates(device, vocab_start, fused=False)
    ent = params.processing.entries.cpu()
    tile1 = ((ent >> 2) >= vocab_start + 128) & ((ent >> 2) < vocab_start + 256)
    assert int(tile1.sum(dim=1).min()) > HEAD  # the loop past the heads runs
    assert torch.equal(i_fused, i_pass)
    # score, logit, tile max: the same floats (the exp-sum field is summed in another order)
    torch.testing.assert_close(f_fused[:3], f_pass[:3], rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(f_fused[3], f_pass[3], rtol=2e-5, atol=0, equal_nan=True)


def test_power_a_changed_bias_value_changes_candidates(device):
    f_a, _, _ = _candidates(device, 0, fused=True)
    f_b, _, _ = _candidates(device, 0, fused=True, bias_shift=0.5)
    assert not torch.equal(f_a[1], f_b[1])
