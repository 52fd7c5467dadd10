"""tests/sharding.py: the blocks of ``pytest --shard I/N`` cover every test once."""
import pytest

from sharding import parse_shard, shard_bounds


@pytest.mark.parametrize("n_items", [0, 1, 5, 12, 553])
@pytest.mark.parametrize("count", [1, 2, 7, 12])
def test_blocks_cover_every_item_once(n_items, count):
    seen = []
    sizes = []
    for index in range(count):
        start, stop = shard_bounds(n_items, index, count)
        seen.extend(range(start, stop))
        sizes.append(stop - start)
    assert seen == list(range(n_items))
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("text, expected", [("0/1", (0, 1)), ("3/12", (3, 12))])
def test_parse(text, expected):
    assert parse_shard(text) == expected


@pytest.mark.parametrize("text", ["12/12", "-1/4", "1/0", "a/4", "1", "1/2/3"])
def test_parse_rejects(text):
    with pytest.raises(ValueError, match="--shard"):
        parse_shard(text)
