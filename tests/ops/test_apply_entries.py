"""Bias and penalties applied in place to a logits chunk (fsdist/ops/apply_entries.py).

The chunked path applies a call's bias and penalties to each cuBLAS chunk with this per-entry
kernel, then runs its sampling pass with only the bitmask left in the tiles. Checked:

* against the float64 reference (``fsdist.reference.apply_bias`` / ``apply_penalties``) on
  chunks that start mid-vocabulary, cut through runs of repeated ids and hold ids on their
  first and last column; ids without entries keep their value bit for bit;
* against the tiles: candidates of the pass with the processors in its tiles equal, bit for
  bit, those of apply_entries + the pass without them (the same ``processed_logit``);
* power: the same comparison fails when the chunk's first id is given one off;
* end to end: ``fsdist.sample(path="chunked")`` with many small chunks returns the tokens of
  one big chunk.
Runs under Triton's interpreter on CPU and unchanged on CUDA.
"""
import pytest
import torch

import fsdist
from fsdist.ops.apply_entries import launch_apply_entries
from fsdist.ops.layout import BufferPair, CandidateLayout
from fsdist.ops.sample_logits import launch_sample_logits
from fsdist.params import RowParams
from fsdist.processing import prepare_processing
from fsdist.reference import bitmask_from_allowed
from fsdist.reference.processors import apply_bias, apply_penalties

B, V, BLOCK_V = 12, 700, 128


def processors(device, seed=0, n_bias=9, n_out=20, n_prompt=25):
    """A bias with repeats and ids on chunk edges, penalties with repeated output ids, -1 slots."""
    g = torch.Generator().manual_seed(seed)
    bias_ids = torch.randint(0, V, (B, n_bias), generator=g)
    bias_ids[:, 0] = torch.tensor([0, 127, 128, 255, 256, 299, 300, 511, 512, 698, 699, 3])[:B]
    bias_ids[:, 1] = bias_ids[:, 0]  # the same id twice: both values, in the order given
    bias_ids[::3, -1] = -1
    vals = torch.randn(B, n_bias, generator=g) * 2
    out = torch.randint(0, V, (B, n_out), generator=g)
    out[:, 1:4] = out[:, :1]  # a run of four occurrences
    out[:, 5] = bias_ids[:, 0]  # an id with a bias and an occurrence
    out[::4, -3:] = -1
    prompt = torch.randint(-1, V, (B, n_prompt), generator=g)
    rep = 0.6 + torch.rand(B, generator=g)
    rep[::5] = 1.0
    freq = torch.rand(B, generator=g) * 1.5 - 0.5
    pres = torch.rand(B, generator=g) - 0.3
    pen = fsdist.Penalties(rep.to(device), freq.to(device), pres.to(device), out.to(device), prompt.to(device))
    return fsdist.SparseLogits(bias_ids.to(device), vals.to(device)), pen


def reference(logits, bias, pen):
    x = logits.double().cpu()
    cpu = lambda t: t.cpu() if isinstance(t, torch.Tensor) else t  # noqa: E731
    apply_bias(x, fsdist.SparseLogits(cpu(bias.ids), cpu(bias.values)), V)
    apply_penalties(x, fsdist.Penalties(*(cpu(t) for t in pen)), V)
    return x


@pytest.mark.parametrize("cuts", [(0, V), (0, 128, 300, 512, V), (0, 299, 300, 699, V)],
                         ids=["one-chunk", "tile-chunks", "odd-chunks"])
def test_chunks_get_the_reference_processed_logits(device, cuts):
    bias, pen = processors(device)
    logits = torch.randn(B, V, generator=torch.Generator().manual_seed(1)) * 4
    logits[2, 5] = float("-inf")  # a masked id stays -inf
    proc = prepare_processing(logit_bias=bias, penalties=pen, batch=B, vocab_size=V, device=device)
    ref = reference(logits, bias, pen).float()
    got = torch.empty_like(logits)
    for c0, c1 in zip(cuts[:-1], cuts[1:]):
        chunk = logits[:, c0:c1].clone().to(device)  # clone: in place must not touch logits
        launch_apply_entries(chunk, proc, c0)
        got[:, c0:c1] = chunk.cpu()
    touched = ref.double() != logits.double()
    assert int(touched.sum()) > B * 20  # the case has real work
    assert torch.equal(got[~touched], logits[~touched])  # untouched ids: bit for bit
    torch.testing.assert_close(got, ref, rtol=2e-6, atol=1e-6)


def _candidates(logits, params, layout, id_lo=None, tiles=(0, 6)):
    f, i = layout.alloc(logits.device)
    f.fill_(0.0)
    i.fill_(0)
    x = logits.clone()
    if id_lo is not None:
        launch_apply_entries(x, params.processing, id_lo)
    launch_sample_logits(x, params, layout, BufferPair(f, i), block_v=BLOCK_V, tiles=tiles, V_rows=V,
                         vocab_size=V, logprobs=True, sparse_in_tile=id_lo is None)
    return f.cpu(), i.cpu()


@pytest.mark.parametrize("bitmask", [False, True], ids=["bias+pen", "all"])
def test_in_place_equals_the_tiles_bit_for_bit(device, bitmask):
    bias, pen = processors(device, seed=3)
    g = torch.Generator().manual_seed(4)
    logits = (torch.randn(B, V, generator=g) * 3).to(device)
    mask = None
    if bitmask:
        allowed = torch.rand(B, V, generator=g) < 0.7
        mask = bitmask_from_allowed(allowed).to(device)
    proc = prepare_processing(token_bitmask=mask, logit_bias=bias, penalties=pen, batch=B, vocab_size=V,
                              device=device)
    temp = (torch.rand(B, generator=g) + 0.3).to(device)
    temp[0] = 0.0
    params = RowParams(temp, torch.arange(B, device=device) * 7 + 1, 5, processing=proc)
    layout = CandidateLayout(CandidateLayout.fields(True), 6, B)
    f_tile, i_tile = _candidates(logits, params, layout)
    f_place, i_place = _candidates(logits, params, layout, id_lo=0)
    assert torch.equal(i_place, i_tile)
    torch.testing.assert_close(f_place, f_tile, rtol=0, atol=0, equal_nan=True)
    # Power: the chunk's first id one off moves every entry by one id; the candidates notice.
    f_off, i_off = _candidates(logits, params, layout, id_lo=1)
    assert not (torch.equal(i_off, i_tile) and torch.equal(f_off, f_tile))


def test_sample_with_many_small_chunks_keeps_tokens(device, monkeypatch):
    from fsdist.ops import configs

    bias, pen = processors(device, seed=5)
    g = torch.Generator().manual_seed(6)
    h = torch.randn(B, 32, generator=g).to(device)
    w = (torch.randn(V, 32, generator=g) * 0.5).to(device)
    kw = dict(temperature=0.8, seed=torch.arange(B, device=device) + 9, offset=2, logit_bias=bias, penalties=pen,
              path="chunked", config=fsdist.TileConfig(block_b=16, block_v=BLOCK_V, block_k=32, num_warps=4,
                                                       num_stages=1))
    one = fsdist.sample(h, w, **kw).tokens
    monkeypatch.setattr(configs, "CHUNK_WORKSPACE_BYTES", 4 * B * 2 * BLOCK_V)  # chunks of two tiles
    many = fsdist.sample(h, w, **kw).tokens
    assert torch.equal(many, one)


def test_rejects_a_chunk_it_cannot_address(device):
    bias, pen = processors(device)
    proc = prepare_processing(logit_bias=bias, penalties=pen, batch=B, vocab_size=V, device=device)
    with pytest.raises(ValueError, match="fp32"):
        launch_apply_entries(torch.zeros(B, 10, dtype=torch.float64, device=device), proc, 0)
    with pytest.raises(ValueError, match=r"\[12, n\]"):
        launch_apply_entries(torch.zeros(B + 1, 10, device=device), proc, 0)
    launch_apply_entries(torch.zeros(B, 10, device=device), None, 0)  # nothing to do: no error
