"""plan_sample's cache (fsdist/ops/plan.py): keyed by every argument and by the device's answers, asked anew at each
call, so a cached plan is always the plan the uncached code would make."""
import pytest
import torch

from fsdist.ops import plan
from fsdist.ops.configs import TileConfig

CPU = torch.device("cpu")
BASE = dict(batch=16, hidden_size=64, weight_rows=4096, device=CPU, dtype=torch.bfloat16)


def uncached(**kw):
    """The plan the decisions make without the cache."""
    monkey = pytest.MonkeyPatch()
    monkey.setattr(plan, "_cached_plan", plan._plan)
    try:
        return plan.plan_sample(**kw)
    finally:
        monkey.undo()


def test_the_same_arguments_give_the_same_plan_object():
    a = plan.plan_sample(**BASE)
    assert plan.plan_sample(**BASE) is a
    assert a == uncached(**BASE)


# (CUDA cases pass fast_memory, and the test a stand-in ws_device: no GPU is asked)
CUDA = dict(BASE, device=torch.device("cuda", 0), fast_memory=True, batch=24, hidden_size=4096)


@pytest.mark.parametrize("base,change", [
    (BASE, dict(batch=64)), (BASE, dict(batch=600)), (BASE, dict(hidden_size=4096)), (BASE, dict(weight_rows=1000)),
    (BASE, dict(logprobs=True)), (BASE, dict(extended=True)), (dict(BASE, extended=True), dict(raw_sums=False)),
    (BASE, dict(winner_logits=True)), (BASE, dict(n_shards=2)), (BASE, dict(batch_cap=40)),
    (BASE, dict(checked=True)), (BASE, dict(config=TileConfig(32, 512, 64))), (BASE, dict(path="chunked")),
    (BASE, dict(block_v=256)), (BASE, dict(n_fields=6)), (BASE, dict(device=torch.device("cuda", 0))),
    (CUDA, dict(sparse_processors=True)), (dict(CUDA, batch=200), dict(fast_memory=False)),
    (dict(CUDA, batch=100), dict(dtype=torch.float32)), (dict(CUDA, extended=True), dict(checked=True))])
def test_every_argument_is_in_the_key(base, change, monkeypatch):
    """Each changed argument gives the plan the uncached code makes for it, which differs from the base's."""
    monkeypatch.setattr(plan, "ws_device", lambda device, dtype=None: True)
    before = plan.plan_sample(**base)
    kw = dict(base, **change)
    p = plan.plan_sample(**kw)
    assert p == uncached(**kw) and p != before
    assert plan.plan_sample(**kw) is p and plan.plan_sample(**base) is before


def test_device_answers_are_asked_at_every_call(monkeypatch):
    """fast_memory and ws_device are asked on every call, outside the cache: a changed answer (here, tests' stand-ins)
    changes the plan of the same arguments at once."""
    kw = dict(batch=24, hidden_size=4096, weight_rows=151936, device=torch.device("cuda", 0), dtype=torch.bfloat16,
              sparse_processors=True)
    monkeypatch.setattr(plan, "ws_device", lambda device, dtype=None: True)
    monkeypatch.setattr(plan, "device_fast_memory", lambda device: True)
    fast_ws = plan.plan_sample(**kw)
    assert fast_ws.config.block_b == 64  # the ws 64-row tile from 17 rows with entries, on fast memory
    monkeypatch.setattr(plan, "device_fast_memory", lambda device: False)
    assert plan.plan_sample(**kw).config.block_b == 32
    monkeypatch.setattr(plan, "device_fast_memory", lambda device: True)
    monkeypatch.setattr(plan, "ws_device", lambda device, dtype=None: False)
    assert plan.plan_sample(**kw).config.block_b == 32
    monkeypatch.setattr(plan, "ws_device", lambda device, dtype=None: True)
    assert plan.plan_sample(**kw) is fast_ws


@pytest.mark.parametrize("n_shards", [1, 2])
def test_large_batches_take_four_stages_where_the_ws_kernel_runs_without_fast_memory(n_shards, monkeypatch):
    """The 4-stage rule (configs.WS_FEWER_STAGES_FROM) reaches plan_sample, for one GPU and a tensor-parallel shard
    (checked layout) alike: only where the device runs the ws kernel for the dtype and its memory is not fast."""
    kw = dict(batch=1024, hidden_size=4096, weight_rows=151936 // n_shards, device=torch.device("cuda", 0),
              dtype=torch.bfloat16, n_shards=n_shards, checked=n_shards > 1)
    for ws, fast, stages in ((True, False, 4), (True, True, 5), (False, False, 5)):
        monkeypatch.setattr(plan, "ws_device", lambda device, dtype=None, ws=ws: ws)
        p = plan.plan_sample(**kw, fast_memory=fast)
        assert (p.path, p.config.block_b, p.config.num_stages) == ("fused", 128, stages), (ws, fast)
        assert p == uncached(**kw, fast_memory=fast)
    monkeypatch.setattr(plan, "ws_device", lambda device, dtype=None: True)
    assert plan.plan_sample(**dict(kw, batch=768), fast_memory=False).config.num_stages == 5


@pytest.mark.parametrize("n_shards", [1, 2])
def test_the_fields_switch_is_read_at_every_call(n_shards, monkeypatch):
    """configs.WS_FIELDS_FULL_TILE (on since v118) is read at each call: with it on, one GPU's filtered call
    of FIELDS_FULL_TILE_MIN_BATCH rows or more at D = 4096 takes the ws 128-row tile instead of the 64-row one, but
    not with raw sums ("raw" logprobs: one GPU's keep the 64-row tile; launch_fused leaves a 128-row config's to its
    Triton twin) and not below that batch; a
    tensor-parallel shard's checked layout takes the 128-row config either way (launch_fused decides there)."""
    from fsdist.ops import configs
    monkeypatch.setattr(plan, "ws_device", lambda device, dtype=None: True)
    big = configs.FIELDS_FULL_TILE_MIN_BATCH
    kw = dict(batch=big, hidden_size=4096, weight_rows=151936 // n_shards, device=torch.device("cuda", 0),
              dtype=torch.bfloat16, extended=True, raw_sums=False, n_shards=n_shards, checked=n_shards > 1,
              fast_memory=False)
    rows = {True: 128, False: 64 if n_shards == 1 else 128}
    for on in (False, True, False):
        monkeypatch.setattr(configs, "WS_FIELDS_FULL_TILE", on)
        p = plan.plan_sample(**kw)
        assert p.config.block_b == rows[on] and p.config.ws, on
        assert p == uncached(**kw)
        assert plan.plan_sample(**dict(kw, raw_sums=True)).config.block_b == rows[False]
        assert plan.plan_sample(**dict(kw, batch=big - 1)).config.block_b == (64 if n_shards == 1 else 128)


def test_the_interpreter_switch_is_read_at_every_call(monkeypatch):
    """A CPU's default vocabulary tile follows TRITON_INTERPRET (512 under the interpreter) from call to call."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert plan.plan_sample(**BASE).config.block_v == 512
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert plan.plan_sample(**BASE).config.block_v == 128


def test_errors_are_raised_at_every_call():
    for _ in range(2):
        with pytest.raises(ValueError, match="path must be"):
            plan.plan_sample(**BASE, path="nope")
        with pytest.raises(ValueError, match="block_v"):
            plan.plan_sample(**BASE, config=TileConfig(16, 128, 64), block_v=512)


class Unhashable(int):
    __hash__ = None


def test_an_unhashable_argument_is_planned_uncached():
    """(e.g. a symbolic batch size while a compiler traces the call)"""
    p = plan.plan_sample(**dict(BASE, batch=Unhashable(16)))
    assert p == plan.plan_sample(**BASE)
