"""Clear errors, never hangs: bad names, rank-dependent configs, bad weights and inputs.

Multi-rank cases construct heads whose arguments differ between ranks; every rank must
raise a ValueError naming the offending field (the check is an all-gather, so nobody
is left waiting in a later collective). After each error the ranks must still be in
step: the tests finish with a working head.
"""
import pytest
import torch
import torch.distributed as dist

import fsdist
from fsdist.tensor_parallel import HeadTestSeam
from tp_helpers import ON_GPU, grid, problem

mpi = pytest.mark.mpi(min_size=2)


# ---- single process (no torch.distributed needed) ---------------------------------------
@pytest.mark.parametrize("kwargs,match", [
    (dict(transport="bogus"), "unknown transport 'bogus'"),
    (dict(transport="NVSHMEM"), "unknown transport"),
    (dict(reduction="topk"), "unknown reduction 'topk'"),
    (dict(block_v=100), "block_v"),
    (dict(block_v=0), r"block_v must be a power of two >= 32, got 0"),
    (dict(params_dtype=torch.int32), "params_dtype"),
    (dict(make_vocab_size_divisible_by=0), "make_vocab_size_divisible_by"),
    (dict(test_seam=HeadTestSeam(num_buffers=3)), "num_buffers must be 1 or 2"),
])
def test_invalid_arguments_raise_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        fsdist.ShardedFlashLMHead(32, 1000, **kwargs)


@pytest.mark.parametrize("group", [[0, 1], (0,), "tp"])
def test_a_tp_group_that_is_not_a_process_group_is_refused(group):
    with pytest.raises(TypeError, match="tp_group must be a torch.distributed.ProcessGroup or None") as e:
        fsdist.ShardedFlashLMHead(32, 1000, tp_group=group)
    assert ("new_group(ranks)" in str(e.value)) == (not isinstance(group, str))


def test_needs_torch_distributed():
    if dist.is_initialized():
        pytest.skip("torch.distributed is initialised in this session")
    with pytest.raises(RuntimeError, match="torch.distributed"):
        fsdist.ShardedFlashLMHead(32, 1000, transport="collective")


def test_lazy_export():
    from fsdist.tensor_parallel import ShardedFlashLMHead

    assert fsdist.ShardedFlashLMHead is ShardedFlashLMHead


# ---- across ranks ------------------------------------------------------------------------
def _ok_head(ctx, **kw):
    """A small working head: proves the ranks are still in step after an error."""
    V, D = 1000, 16
    W, h = problem(V, D, 4, torch.float32, seed=31, device=ctx.device)
    head = fsdist.ShardedFlashLMHead(D, V, params_dtype=torch.float32, transport="collective", device=ctx.device,
                                     **kw)
    head.load_full_weight(W)
    assert torch.equal(head(h, seed=1).tokens, fsdist.sample(h, W, seed=1, vocab_size=V).tokens)
    return head


FIELDS = ["hidden_size", "vocab_size", "block_v", "params_dtype", "reduction", "transport",
          "make_vocab_size_divisible_by", "max_batch_size"]


@mpi
@grid("field", [(f,) for f in FIELDS], lambda field: field == "hidden_size",
      "the agreement compares every field alike: beyond 2 ranks hidden_size, which differs on every rank, shows "
      "that a group of four names the field")
def test_rank_dependent_config_names_the_field(dist_ctx, field):
    r = dist_ctx.rank
    kw = dict(hidden_size=32, vocab_size=1000, transport="collective", reduction="candidates",
              params_dtype=torch.float32, device=dist_ctx.device)
    if field == "hidden_size":
        kw["hidden_size"] = 32 + r
    elif field == "vocab_size":
        kw["vocab_size"] = 1000 + r  # same padded size (1024), still a mismatch
    elif field == "block_v":
        kw["block_v"] = 128 if r == 0 else 256
    elif field == "params_dtype":
        kw["params_dtype"] = torch.float32 if r == 0 else torch.bfloat16
    elif field == "reduction":
        kw["reduction"] = "candidates" if r == 0 else "group_logmass"
    elif field == "transport":
        kw["transport"] = "collective" if r == 0 else "auto"
    elif field == "max_batch_size":
        kw["max_batch_size"] = 16 * (r + 1)  # buffer sizes would differ: collective allocations must not
    else:
        kw["make_vocab_size_divisible_by"] = 128 if r == 0 else 64
    with pytest.raises(ValueError, match=rf"differs across tensor-parallel ranks: .*{field} \(rank 0="):
        fsdist.ShardedFlashLMHead(kw.pop("hidden_size"), kw.pop("vocab_size"), **kw)
    _ok_head(dist_ctx).close()


@mpi
def test_bad_argument_on_one_rank_raises_on_every_rank(dist_ctx):
    last = dist_ctx.world_size - 1
    transport = "bogus" if dist_ctx.rank == last else "collective"
    with pytest.raises(ValueError, match=rf"rank {last}: ValueError: unknown transport 'bogus'"):
        fsdist.ShardedFlashLMHead(16, 1000, transport=transport, params_dtype=torch.float32, device=dist_ctx.device)
    _ok_head(dist_ctx).close()


@mpi
@pytest.mark.parametrize("transport", ["nvshmem", "symm_mem", "shm"])
def test_unavailable_transport_is_a_clear_error(dist_ctx, transport):
    if (transport == "shm") != ON_GPU:
        pytest.skip(f"{transport} is available here")
    with pytest.raises(ValueError, match=rf"transport '{transport}' is unavailable on rank\(s\) 0:"):
        fsdist.ShardedFlashLMHead(16, 1000, transport=transport, params_dtype=torch.float32, device=dist_ctx.device)
    _ok_head(dist_ctx).close()


@mpi
def test_auto_on_cpu_is_collective(dist_ctx):
    if ON_GPU:
        pytest.skip("CPU behaviour")
    head = fsdist.ShardedFlashLMHead(16, 1000, params_dtype=torch.float32, device=dist_ctx.device)
    assert head.transport_name == "collective"
    head.close()


@mpi
def test_weight_and_input_errors(dist_ctx):
    head = _ok_head(dist_ctx)
    V, D, dev = 1000, 16, dist_ctx.device
    h = torch.randn(4, D, device=dev)
    shard = head.weight.detach()
    with pytest.raises(ValueError, match="full weight must be"):
        head.load_full_weight(torch.zeros(999, D, device=dev))
    with pytest.raises(ValueError, match="full weight must be"):
        head.load_full_weight(torch.zeros(V, D + 1, device=dev))
    with pytest.raises(TypeError, match="params_dtype"):
        head.load_full_weight(torch.zeros(V, D, dtype=torch.bfloat16, device=dev))
    with pytest.raises(TypeError):
        head.load_full_weight(None)
    with pytest.raises(ValueError, match="weight override must be this rank's shard"):
        head(h, weight=torch.zeros(V, D, device=dev))
    with pytest.raises(TypeError, match="dtype"):
        head(h, weight=shard.to(torch.bfloat16))
    with pytest.raises(ValueError, match="contiguous"):
        head(h, weight=torch.zeros(D, shard.shape[0], device=dev).t())
    with pytest.raises(ValueError, match="D=17"):
        head(torch.randn(4, D + 1, device=dev))
    with pytest.raises(TypeError, match="dtype"):
        head(h.to(torch.bfloat16))
    with pytest.raises(ValueError, match="temperature"):
        head(h, temperature=-1.0)
    with pytest.raises(ValueError, match="temperature"):
        head(h, temperature=torch.tensor([1.0, float("nan"), 1.0, 1.0], device=dev), check=True)
    with pytest.raises(ValueError, match="seed"):
        head(h, seed=torch.zeros(3, dtype=torch.int64, device=dev))
    with pytest.raises(ValueError, match="path"):
        head(h, path="tiled")
    # Every rank made the same bad calls: each one still took part in its step (an error
    # header instead of candidates), so the ranks stayed in step and the head is healthy.
    assert head.step == 10  # the first good call + 9 bad forward calls (load_full_weight is no step)
    out = head(h, seed=3)
    assert out.tokens.shape == (4,) and bool((out.tokens >= 0).all())
    head.check()
    head.close()
    with pytest.raises(RuntimeError, match="closed"):
        head(h)


@mpi
def test_shared_weight_shape_errors_name_tp_group(dist_ctx):
    """A shard made for another TP degree (tp_group=None in a DP x TP job is the usual cause):
    the error gives the partition and the group size, and names tp_group. Every rank raises."""
    world, dev = dist_ctx.world_size, dist_ctx.device
    V, D = 1000, 16
    rows = 1024 // world
    wrong = torch.zeros(rows * 2, D, device=dev)  # what a TP group half the world's size would hold
    with pytest.raises(ValueError, match=rf"weight must be this rank's shard .* = \[{rows}, {D}\].*tp_group=None, "
                                         rf"i\.e\. the whole world of {world} ranks"):
        fsdist.ShardedFlashLMHead(D, V, weight=wrong, params_dtype=torch.float32, transport="collective")
    group = dist.new_group(list(range(world)))
    with pytest.raises(ValueError, match=rf"tp_group of {world} ranks"):
        fsdist.ShardedFlashLMHead(D, V, weight=wrong, params_dtype=torch.float32, transport="collective",
                                  tp_group=group)
    dist.destroy_process_group(group)
    good = torch.zeros(rows, D, device=dev)
    with pytest.raises(ValueError, match="weight dtype torch.float32 does not match params_dtype torch.bfloat16"):
        fsdist.ShardedFlashLMHead(D, V, weight=good, transport="collective")
    with pytest.raises(ValueError, match="weight must be contiguous"):
        fsdist.ShardedFlashLMHead(D, V, weight=torch.zeros(D, rows, device=dev).t(), params_dtype=torch.float32,
                                  transport="collective")
    with pytest.raises(ValueError, match="weight must be a torch.Tensor"):
        fsdist.ShardedFlashLMHead(D, V, weight=[1.0], params_dtype=torch.float32, transport="collective")
    head = fsdist.ShardedFlashLMHead(D, V, weight=good, params_dtype=torch.float32, transport="collective")
    assert head.weight is good and head.device == good.device
    with pytest.raises(ValueError, match="load_full_weight would overwrite a weight this head shares"):
        head.load_full_weight(torch.zeros(V, D, device=dev))
    with pytest.raises(ValueError, match=rf"weight override must be this rank's shard .*tp_group=None, i\.e\. the "
                                         rf"whole world of {world} ranks"):
        head(torch.zeros(2, D, device=dev), weight=wrong)
    head.close()
    _ok_head(dist_ctx).close()


@mpi
def test_vocab_size_on_a_padding_boundary_warns_unless_declared_true(dist_ctx):
    """Megatron's GPTModel.vocab_size is the padded size; a vocab_size that is a multiple of
    make_vocab_size_divisible_by * tp may be one (padding rows could then be sampled)."""
    import warnings

    unit = 128 * dist_ctx.world_size
    kw = dict(params_dtype=torch.float32, transport="collective", device=dist_ctx.device)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        fsdist.ShardedFlashLMHead(16, 4 * unit, **kw).close()
        fsdist.ShardedFlashLMHead(16, 4 * unit, vocab_size_is_true=True, **kw).close()
        fsdist.ShardedFlashLMHead(16, 4 * unit - 3, **kw).close()
    with pytest.raises(ValueError, match=r"vocab_size_is_true must be a bool, got 'no'"):
        fsdist.ShardedFlashLMHead(16, 4 * unit, vocab_size_is_true="no", **kw)
    padded = [w for w in seen if "padding unit" in str(w.message)]
    if dist_ctx.rank == 0:
        assert len(padded) == 1 and "vocab_size_is_true=True" in str(padded[0].message)
    else:
        assert not padded  # one warning per group, from its rank 0


@mpi
def test_numpy_integers_are_accepted_where_ints_are(dist_ctx):
    """Sizes often come from numpy or a JSON config: np.int64 / np.int32 work as ints (and agree across ranks)."""
    import numpy as np

    V, D, dev = 1000, 16, dist_ctx.device
    W, h = problem(V, D, 4, torch.float32, seed=32, device=dev)
    head = fsdist.ShardedFlashLMHead(np.int64(D), np.int64(V), max_batch_size=np.int32(4),
                                     make_vocab_size_divisible_by=np.int64(64), params_dtype=torch.float32,
                                     transport="collective", device=dev)
    assert type(head.hidden_size) is int and type(head.vocab_size) is int
    head.reserve(np.int64(8))  # rank-equal values, whatever their Python type
    head.load_full_weight(W)
    assert torch.equal(head(h, seed=2).tokens, fsdist.sample(h, W, seed=2, vocab_size=V).tokens)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        head.reserve(np.int64(0))
    head.close()


@mpi
def test_params_dtype_follows_a_cast_of_the_module(dist_ctx):
    """head.bfloat16() (as model.bfloat16() does to every submodule) casts the owned shard; params_dtype and the
    checks that use it follow, and the head samples from the cast weight."""
    V, D, dev = 1000, 16, dist_ctx.device
    W, h = problem(V, D, 4, torch.float32, seed=33, device=dev)
    head = fsdist.ShardedFlashLMHead(D, V, params_dtype=torch.float32, transport="collective", device=dev)
    head.bfloat16()
    assert head.params_dtype == torch.bfloat16 == head.weight.dtype
    with pytest.raises(TypeError, match="does not match the head's params_dtype torch.bfloat16"):
        head.load_full_weight(W)
    Wb, hb = W.bfloat16(), h.bfloat16()
    head.load_full_weight(Wb)
    assert torch.equal(head(hb, seed=3).tokens, fsdist.sample(hb, Wb, seed=3, vocab_size=V).tokens)
    assert "dtype=torch.bfloat16" in repr(head)
    head.close()
