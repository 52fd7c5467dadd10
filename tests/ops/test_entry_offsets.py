"""Per-(row, tile) entry offsets and heads (fsdist/ops/entry_offsets.py), which the fused kernel
reads instead of searching each row's entry list from every tile.

Checked against torch.searchsorted on sorted rows with runs of one id, SENTINEL padding, an
empty row, tiles with more entries than HEAD and vocabulary starts that are not multiples of
the tile (a tensor-parallel rank's range); the heads against the list; bad arguments. The
end-to-end check (fused candidates with the table equal the searched tiles bit for bit) is in
tests/test_processors.py and tests/ops/test_apply_entries.py.
"""
import pytest
import torch

from fsdist.ops.entry_offsets import HEAD, launch_entry_offsets
from fsdist.ops.prepare_processors import SENTINEL


def _rows(device, n_rows=5, width=300, vocab=1000, seed=0):
    g = torch.Generator().manual_seed(seed)
    ent = torch.randint(0, vocab * 4, (n_rows, width), generator=g, dtype=torch.int64)
    ent[0, :40] = 4 * 130 + 1  # a run of one id, longer than HEAD, inside one tile
    ent[1, width // 2:] = SENTINEL  # padding
    ent[2, :] = SENTINEL  # no entries at all
    ent[3, :10] = 4 * (vocab - 1)  # the last id
    ent = torch.sort(ent, dim=1).values.to(torch.int32)
    vals = torch.randn(n_rows, width, generator=g)
    return ent.to(device), vals.to(device)


@pytest.mark.parametrize("first_id,tile,n_tiles", [(0, 128, 8), (0, 64, 16), (500, 128, 4), (36, 32, 31),
                                                   (0, 128, 1), (996, 128, 1)])
def test_offsets_and_heads_match_the_list(device, first_id, tile, n_tiles):
    ent, vals = _rows(device)
    got = launch_entry_offsets(ent, vals, first_id, tile, n_tiles)
    e, v = ent.cpu().long(), vals.cpu()
    bounds = (first_id + torch.arange(n_tiles + 1) * tile) * 4
    want = torch.searchsorted(e, bounds.clamp(max=SENTINEL).expand(e.shape[0], -1).contiguous(), side="left")
    assert torch.equal(got.offsets.cpu().long(), want)
    head, head_v = got.head.cpu(), got.head_values.cpu()
    assert head.shape == (e.shape[0], n_tiles, HEAD)
    for r in range(e.shape[0]):
        for t in range(n_tiles):
            lo, hi = int(want[r, t]), int(want[r, t + 1])
            k = min(HEAD, hi - lo)
            assert head[r, t, :k].tolist() == e[r, lo:lo + k].tolist()
            assert torch.equal(head_v[r, t, :k], v[r, lo:lo + k])
            assert (head[r, t, k:] == SENTINEL).all() and (head_v[r, t, k:] == 0).all()
    # the cases have work in them: some tile holds more than HEAD entries, some row none
    counts = want[:, 1:] - want[:, :-1]
    if first_id == 0 and tile == 128 and n_tiles == 8:
        assert int(counts.max()) > HEAD and int(counts[2].sum()) == 0


def test_power_one_id_off(device):
    """Power: a table built for ids one tile off gives other offsets."""
    ent, vals = _rows(device)
    a = launch_entry_offsets(ent, vals, 0, 128, 7).offsets
    b = launch_entry_offsets(ent, vals, 128, 128, 7).offsets
    assert not torch.equal(a, b)


def test_empty_and_bad_arguments():
    ent, vals = _rows("cpu")
    z = launch_entry_offsets(ent[:, :0], vals[:, :0], 0, 128, 3)
    assert (z.offsets == 0).all() and (z.head == SENTINEL).all()
    assert launch_entry_offsets(ent[:0], vals[:0], 0, 128, 3).offsets.shape == (0, 4)
    with pytest.raises(ValueError, match="entries must be int32"):
        launch_entry_offsets(ent.long(), vals, 0, 128, 3)
    with pytest.raises(ValueError, match="values must be fp32"):
        launch_entry_offsets(ent, vals.double(), 0, 128, 3)
    with pytest.raises(ValueError, match="tile > 0"):
        launch_entry_offsets(ent, vals, 0, 0, 3)
