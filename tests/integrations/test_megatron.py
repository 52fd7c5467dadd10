"""ShardedFlashLMHead.from_megatron on a tiny real Megatron-Core GPTModel, at TP=2 on CPU (gloo).

The model: 2 layers, hidden 64, 4 heads, the local layer spec, learned absolute positions,
vocabulary 1000 padded by Megatron's rule (make_vocab_size_divisible_by=128 x tp=2) to 1024;
fp32, and bf16 through Float16Module; tied and untied embeddings. From its real decoder output
([s, b, h], taken through GPTModel.forward's output_processor hook):

* the head shares Megatron's Parameter (the output layer's, or the embedding's when tied),
  owns the same vocabulary rows and has no parameter of its own;
* sampled tokens (per-row temperatures and seeds, [s, b]) equal fsdist.sample on the gathered
  [V_pad, D] weight with vocab_size = 1000, logprobs too;
* greedy tokens equal the argmax of Megatron's own gathered logits over the true vocabulary
  (rows whose top two logits are closer than the dtype's rounding are checked to be a near-max
  instead);
* fsdist.integrations.megatron.output_processor samples inside GPTModel.forward, through
  Float16Module(fp32_output=True) (a plain tuple, turned back into a SampleOutput);
* GPTModel.vocab_size (padded) and a tied model's bare output_layer are refused on every rank.

Run: ``mpirun -n 2 python -m pytest -q -p no:warnings --with-mpi tests/integrations/test_megatron.py``
(at -n 4 Megatron makes two TP groups of 2, DP=2). Skipped in a single process and without
megatron-core (an optional extra: ``pip install --no-deps --ignore-requires-python
megatron-core==0.19.2`` on Python 3.11). The CPU workarounds used here are the ones
docs/integration.md lists.
"""
import importlib.util
import pathlib

import pytest
import torch
import torch.distributed as dist

import fsdist


def _tensor_parallel_conftest():
    """tests/tensor_parallel/conftest.py, loaded by path under its own name: its fixtures
    (dist_ctx, the hard per-test timeout) serve this module too. (A conftest.py here would
    shadow that one for ``from conftest import ...`` in a session that collects both.)"""
    path = pathlib.Path(__file__).resolve().parent.parent / "tensor_parallel" / "conftest.py"
    spec = importlib.util.spec_from_file_location("fsdist_tests_tensor_parallel_conftest", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_tp = _tensor_parallel_conftest()
dist_ctx, hard_timeout, _watchdog_stream = _tp.dist_ctx, _tp.hard_timeout, _tp._watchdog_stream

mpi = pytest.mark.mpi(min_size=2)
TP, LAYERS, D, HEADS = 2, 2, 64, 4
V_TRUE, V_PAD = 1000, 1024
S, B = 4, 3  # sequence, batch: Megatron's hidden states are [S, B, D]


@pytest.fixture(scope="module")
def megatron_tp(dist_ctx):
    """Megatron's parallel state at TP=2 (DP = world / 2), with the CPU workarounds."""
    if dist_ctx.world_size % TP:
        pytest.skip(f"needs a multiple of {TP} ranks")
    if dist_ctx.device.type != "cpu":
        pytest.skip("the CPU/gloo recipe (on GPUs, Megatron needs none of its workarounds)")
    pytest.importorskip("megatron.core", reason="megatron-core is an optional extra (fsdist[megatron])")
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    ps.initialize_model_parallel(tensor_model_parallel_size=TP)
    # CPU workarounds: an RNG tracker that needs no CUDA generator, and a CPU tensor already in
    # the global memory buffer the local attention takes its scores buffer from.
    model_parallel_cuda_manual_seed(1234, inference_rng_tracker=True)
    buffer = ps.get_global_memory_buffer()
    for dtype in (torch.float32, torch.bfloat16):
        buffer.buffer[("mpu", dtype)] = torch.empty(1 << 16, dtype=dtype)
    yield ps
    ps.destroy_model_parallel()


def build_model(dtype, tied, seed=0):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.module import Float16Module

    torch.manual_seed(seed)  # same replicated weights on every rank (CPU initialisation)
    config = TransformerConfig(num_layers=LAYERS, hidden_size=D, num_attention_heads=HEADS,
                               tensor_model_parallel_size=TP, use_cpu_initialization=True,
                               params_dtype=torch.float32, bf16=dtype == torch.bfloat16,
                               hidden_dropout=0.0, attention_dropout=0.0, init_method_std=0.5)
    model = GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=V_PAD,
                     max_sequence_length=S, position_embedding_type="learned_absolute",
                     share_embeddings_and_output_weights=tied)
    if dtype == torch.bfloat16:
        model = Float16Module(config, model)
    return model.eval()


def inputs():
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, V_TRUE, (B, S), generator=g)
    positions = torch.arange(S).expand(B, S)
    mask = torch.triu(torch.ones(S, S, dtype=torch.bool), 1)[None, None]  # Megatron's default mask is built on CUDA
    return ids, positions, mask


def gather_last(x, group):
    """Concatenate every TP rank's x along the last dim (a plain all_gather works on gloo)."""
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=-1)


def same_on_group(x, group):
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return all(torch.equal(p, parts[0]) for p in parts)


# Beyond 2 ranks (two TP groups of 2) two of the four cases run: each dtype once, each embedding once.
AT_TWO_RANKS = pytest.mark.world_sizes(2, why="the dtype and the tied embedding do not depend on the group size: "
                                              "beyond 2 ranks (fp32, untied) and (bf16, tied) run")


@mpi
@pytest.mark.parametrize("dtype,tied", [
    pytest.param(torch.float32, False, id="fp32-untied"),
    pytest.param(torch.float32, True, id="fp32-tied", marks=AT_TWO_RANKS),
    pytest.param(torch.bfloat16, False, id="bf16-untied", marks=AT_TWO_RANKS),
    pytest.param(torch.bfloat16, True, id="bf16-tied")])
def test_from_megatron_samples_like_the_gathered_weight(megatron_tp, dtype, tied):
    from fsdist.integrations.megatron import output_processor

    ps = megatron_tp
    model = build_model(dtype, tied)
    gpt = model.module if dtype == torch.bfloat16 else model
    group, tp_rank = ps.get_tensor_model_parallel_group(), ps.get_tensor_model_parallel_rank()
    head = fsdist.ShardedFlashLMHead.from_megatron(model, V_TRUE, max_batch_size=S * B)

    # One weight: Megatron's own Parameter, same rows, nothing allocated by the head.
    shared = gpt.embedding.word_embeddings.weight if tied else gpt.output_layer.weight
    assert head.weight is shared and not head.owns_weight and list(head.parameters()) == []
    assert (head.tp_size, head.tp_rank, head.padded_vocab_size, head.hidden_size) == (TP, tp_rank, V_PAD, D)
    assert (head.vocab_start, head.vocab_end) == (tp_rank * V_PAD // TP, (tp_rank + 1) * V_PAD // TP)
    assert head.params_dtype == dtype and gpt.vocab_size == V_PAD

    ids, positions, mask = inputs()
    with torch.no_grad():
        fp16_kw = dict(fp32_output=False) if dtype == torch.bfloat16 else {}
        hidden = model(ids, positions, mask, output_processor=lambda *, hidden_states, **_: hidden_states, **fp16_kw)
        logits = model(ids, positions, mask, **fp16_kw)  # this rank's [B, S, V_pad / tp]
    assert hidden.shape == (S, B, D) and hidden.dtype == dtype and same_on_group(hidden, group)
    full_weight = gather_last(shared.detach().t(), group).t().contiguous()  # [V_pad, D]
    full_logits = gather_last(logits, group).transpose(0, 1)[..., :V_TRUE].float()  # [S, B, V]

    g = torch.Generator().manual_seed(3)
    temperature = torch.rand(S, B, generator=g) + 0.5
    seeds = torch.randint(0, 2**40, (S, B), generator=g)
    out = head(hidden, temperature=temperature, seed=seeds, offset=5, return_logprobs=True)
    ref = fsdist.sample(hidden, full_weight, temperature=temperature, seed=seeds, offset=5, vocab_size=V_TRUE,
                        return_logprobs=True)
    assert out.tokens.shape == (S, B) and torch.equal(out.tokens, ref.tokens)
    torch.testing.assert_close(out.logprobs, ref.logprobs, atol=1e-5, rtol=0)
    assert bool((out.tokens < V_TRUE).all() and (out.tokens >= 0).all())

    greedy = head(hidden, temperature=0.0).tokens
    top2 = full_logits.topk(2, dim=-1).values
    tol = 1e-4 + (2.0 ** -7 * top2[..., 0].abs() if dtype == torch.bfloat16 else 0.0)
    decided = top2[..., 0] - top2[..., 1] > tol
    assert int(decided.sum()) >= S * B - 2
    assert torch.equal(greedy[decided], full_logits.argmax(dim=-1)[decided])
    picked = full_logits.gather(-1, greedy[..., None]).squeeze(-1)
    assert bool((picked >= top2[..., 0] - tol).all())  # undecided rows: a near-max token

    # Sampling inside GPTModel.forward; Float16Module(fp32_output=True) hands back a plain tuple.
    ctx = dict(temperature=temperature, seed=seeds, offset=5)
    with torch.no_grad():
        got = model(ids, positions, mask, output_processor=output_processor(head), output_processor_context=ctx)
        last = model(ids, positions, mask, output_processor=output_processor(head, last_token_only=True),
                     output_processor_context=dict(ctx, temperature=temperature[-1], seed=seeds[-1]))
    if dtype == torch.bfloat16:
        assert type(got) is tuple
    got, last = fsdist.SampleOutput(*got), fsdist.SampleOutput(*last)
    assert torch.equal(got.tokens, out.tokens) and torch.equal(last.tokens, out.tokens[-1:])
    head.check()
    head.close()


@mpi
def test_from_megatron_refuses_the_padded_vocab_and_a_bare_tied_layer(megatron_tp):
    untied, tied = build_model(torch.float32, False), build_model(torch.float32, True)
    with pytest.raises(ValueError, match=r"equals the output layer's padded vocabulary .*vocab_size_is_true=True"):
        fsdist.ShardedFlashLMHead.from_megatron(untied, untied.vocab_size)
    with pytest.raises(ValueError, match=r"exceeds the output layer's padded vocabulary 1024"):
        fsdist.ShardedFlashLMHead.from_megatron(untied, 2000)
    with pytest.raises((TypeError, ValueError), match=r"vocab_size_is_true must be a bool, got 'no'"):
        fsdist.ShardedFlashLMHead.from_megatron(untied, untied.vocab_size, vocab_size_is_true="no")
    with pytest.raises(ValueError, match=r"output_layer.weight is None .*pass the GPTModel"):
        fsdist.ShardedFlashLMHead.from_megatron(tied.output_layer, V_TRUE)
    with pytest.raises(TypeError, match=r"reads hidden_size, params_dtype from the model"):
        fsdist.ShardedFlashLMHead.from_megatron(untied, V_TRUE, hidden_size=D, params_dtype=torch.float32)
    with pytest.raises(TypeError, match=r"needs a Megatron GPTModel"):
        fsdist.ShardedFlashLMHead.from_megatron(torch.nn.Linear(4, 4), V_TRUE)
    # The bare untied layer works; the padded size works when declared true (no padding rows).
    head = fsdist.ShardedFlashLMHead.from_megatron(untied.output_layer, V_TRUE, transport="collective")
    assert head.weight is untied.output_layer.weight and head.vocab_size == V_TRUE
    head.close()
    head = fsdist.ShardedFlashLMHead.from_megatron(untied, V_PAD, vocab_size_is_true=True)
    assert head.vocab_size == V_PAD
    head.close()


@mpi
def test_output_processor_gathers_sequence_parallel_chunks(dist_ctx):
    """With sequence parallelism each TP rank holds [s / tp, b, h]; the hook gathers the sequence
    before sampling (Megatron's own output layer does the same gather). Needs no megatron-core."""
    import types

    from fsdist.integrations.megatron import output_processor

    world, rank, dev = dist_ctx.world_size, dist_ctx.rank, dist_ctx.device
    V, D, S_full, b = 1000, 16, 2 * dist_ctx.world_size, 3
    g = torch.Generator().manual_seed(11)
    W = torch.randn(V, D, generator=g).to(dev)
    h = torch.randn(S_full, b, D, generator=g).to(dev)
    seeds = torch.randint(0, 2**40, (S_full, b), generator=g).to(dev)
    head = fsdist.ShardedFlashLMHead(D, V, params_dtype=torch.float32, transport="collective", device=dev)
    head.load_full_weight(W)
    chunk = h[rank * 2:(rank + 1) * 2]
    sp_layer = types.SimpleNamespace(sequence_parallel=True)
    out = output_processor(head)(hidden_states=chunk, output_layer=sp_layer, context=dict(seed=seeds, offset=1))
    assert out.tokens.shape == (S_full, b)
    assert torch.equal(out.tokens, fsdist.sample(h, W, seed=seeds, offset=1, vocab_size=V).tokens)
    last = output_processor(head, last_token_only=True)(hidden_states=chunk, output_layer=sp_layer,
                                                        context=dict(seed=seeds[-1], offset=1))
    assert torch.equal(last.tokens, out.tokens[-1:])
    head.close()
