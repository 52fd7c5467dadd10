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


def _collected(*args):
    """The node ids `pytest --collect-only -q` selects from this file with the given arguments (a subprocess: the
    option acts at collection)."""
    import os
    import subprocess
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          os.path.join(here, "test_sharding.py"), *args], capture_output=True, text=True,
                         cwd=os.path.dirname(here), timeout=120)
    return out.returncode, [line for line in out.stdout.splitlines() if "::" in line], out.stdout + out.stderr


def test_the_option_splits_what_k_selected():
    """Blocks are cut after -k (the plugin's hook runs last): the two halves of "-k parse" are its 8 tests, 4 each;
    cut before -k, one half would hold none of them."""
    halves = [_collected("-k", "parse", "--shard", f"{i}/2")[1] for i in range(2)]
    assert [len(half) for half in halves] == [4, 4]
    assert len(set(halves[0] + halves[1])) == 8 and all("parse" in node for node in halves[0] + halves[1])


def test_a_bad_value_is_a_usage_error():
    rc, _, text = _collected("--shard", "2/2")
    assert rc == 4 and "--shard I/N needs" in text
