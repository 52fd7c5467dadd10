"""fsdist.integrations.vllm without vLLM: the module imports, and sampling_kwargs maps a
duck-typed SamplingMetadata (vLLM 0.33.0's fields, its built-in logits processors stood in
for by classes of the same names) field by field. Runs everywhere; the comparison with
vLLM's own Sampler is test_vllm_integration.py (skipped without vLLM).
"""
import inspect
import subprocess
import sys
import types

import numpy as np
import pytest
import torch

import fsdist
from fsdist.integrations import vllm as fsv
from fsdist.reference import allowed_from_bitmask, bitmask_from_allowed

V = 100  # not a multiple of 32


def test_module_imports_without_vllm():
    code = "import sys, fsdist.integrations.vllm; assert 'vllm' not in sys.modules, 'vllm was imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


class MinPLogitsProcessor:
    def __init__(self, min_p):
        self.min_p_count = int((min_p > 0).sum())
        self.min_p = min_p[:, None]  # vLLM keeps [B, 1]


class LogitBiasLogitsProcessor:
    def __init__(self, biases):
        self.biases = biases


class MinTokensLogitsProcessor:
    def __init__(self, min_toks):
        self.min_toks = min_toks


def metadata(**changes):
    """Four requests: row 1 greedy; penalties on; vLLM's conventions (top_k = V for off,
    prompts padded with V, output lists with an async -1 placeholder)."""
    procs = types.SimpleNamespace(
        argmax_invariant=[MinPLogitsProcessor(torch.tensor([0.0, 0.0, 0.1, 0.0]))],
        non_argmax_invariant=[MinTokensLogitsProcessor({3: (5, [1], {7, 9}, False)}),
                              LogitBiasLogitsProcessor({0: {4: 1.5, 99: -2.0}, 2: {5: 0.25}})])
    banned = torch.zeros(4, V, dtype=torch.bool)
    banned[2, 50:] = True
    fields = dict(
        temperature=torch.tensor([0.8, 0.0, 1.2, 1.0]), all_greedy=False, all_random=False,
        top_p=torch.tensor([0.9, 1.0, 1.0, 1.0]), top_k=torch.tensor([V, V, 5, V], dtype=torch.int32),
        generators={}, max_num_logprobs=None, no_penalties=False,
        prompt_token_ids=torch.tensor([[3, 4, V], [5, V, V], [6, 7, 8], [1, V, V]]),
        frequency_penalties=torch.tensor([0.5, 0.0, 0.0, 0.0]), presence_penalties=torch.tensor([0.0, 0.2, 0.0, 0.0]),
        repetition_penalties=torch.tensor([1.0, 1.0, 1.3, 1.0]),
        output_token_ids=[[4, 4], [], [8, -1, 6], [1]], allowed_token_ids_mask=banned,
        bad_words_token_ids={0: [[11], [4, 12], [3, 13]]}, logitsprocs=procs, logprob_token_ids=None,
        spec_token_ids=[[], [], [], []], thinking_budget_state_holder=None)
    fields.update(changes)
    return types.SimpleNamespace(**fields)


def test_fields_map_to_fsdist_arguments():
    meta = metadata()
    kw = fsv.sampling_kwargs(meta, seeds=[5, 6, 7, 8], positions=torch.tensor([10, 11, 12, 13]), vocab_size=V)
    assert kw["seed"].tolist() == [5, 6, 7, 8] and kw["offset"].tolist() == [10, 11, 12, 13]
    assert torch.equal(kw["temperature"], meta.temperature)
    assert torch.equal(kw["top_k"], meta.top_k) and torch.equal(kw["top_p"], meta.top_p)
    assert kw["min_p"].tolist() == pytest.approx([0.0, 0.0, 0.1, 0.0])
    bias = kw["logit_bias"]
    assert bias.ids.tolist() == [[4, 99], [-1, -1], [5, -1], [-1, -1]]
    assert bias.values.tolist() == [[1.5, -2.0], [0.0, 0.0], [0.25, 0.0], [0.0, 0.0]]
    pen = kw["penalties"]
    assert pen.prompt_ids.tolist() == [[3, 4, -1], [5, -1, -1], [6, 7, 8], [1, -1, -1]]
    assert pen.output_ids.tolist() == [[4, 4, -1], [-1, -1, -1], [8, -1, 6], [1, -1, -1]]
    assert pen.frequency is not None and pen.repetition.tolist() == pytest.approx([1.0, 1.0, 1.3, 1.0])
    allowed = allowed_from_bitmask(kw["token_bitmask"], V)
    want = ~meta.allowed_token_ids_mask
    want[0, [11, 12]] = False   # bad words: [11] always, [4, 12] after a 4; [3, 13] does not apply
    want[3, [7, 9]] = False     # min-tokens: stop ids while the output is short
    assert torch.equal(allowed, want)
    assert kw["return_logprobs"] is False and kw["top_logprobs"] == 0 and kw["logprobs_mode"] == "raw"


def test_off_and_absent_fields():
    procs = types.SimpleNamespace(argmax_invariant=[MinPLogitsProcessor(torch.zeros(4))], non_argmax_invariant=[])
    meta = metadata(temperature=None, all_greedy=True, top_k=None, top_p=None, no_penalties=True,
                    prompt_token_ids=None, output_token_ids=[], allowed_token_ids_mask=None, bad_words_token_ids={},
                    logitsprocs=procs, max_num_logprobs=3)
    kw = fsv.sampling_kwargs(meta, seeds=[0] * 4, positions=[0] * 4, vocab_size=V, logprobs_mode="processed_logprobs")
    assert (kw["temperature"], kw["top_k"], kw["top_p"], kw["min_p"]) == (0.0, 0, 1.0, 0.0)
    assert kw["logit_bias"] is None and kw["penalties"] is None and kw["token_bitmask"] is None
    assert (kw["return_logprobs"], kw["top_logprobs"], kw["logprobs_mode"]) == (True, 3, "processed")


def test_min_tokens_stop_ids_come_back_when_a_grammar_allows_nothing_else():
    """vLLM restores a structured request's stop ids when masking them left no id at all."""
    procs = types.SimpleNamespace(argmax_invariant=[], non_argmax_invariant=[
        MinTokensLogitsProcessor({0: (5, [], {7}, True), 1: (5, [], {7}, True), 2: (5, [], {7}, False)})])
    only_7 = torch.zeros(3, V, dtype=torch.bool)
    only_7[:, 7] = True
    only_7[1, 8] = True
    grammar = bitmask_from_allowed(only_7)
    meta = metadata(logitsprocs=procs, allowed_token_ids_mask=None, bad_words_token_ids={}, no_penalties=True,
                    temperature=torch.ones(3), top_k=None, top_p=None, output_token_ids=[[], [], []])
    kw = fsv.sampling_kwargs(meta, seeds=[0] * 3, positions=[0] * 3, vocab_size=V, grammar_bitmask=grammar)
    allowed = allowed_from_bitmask(kw["token_bitmask"], V)
    assert allowed[0].nonzero().flatten().tolist() == [7]   # restored: nothing else was left
    assert allowed[1].nonzero().flatten().tolist() == [8]   # 8 remains: 7 stays banned
    assert not bool(allowed[2].any())                       # not structured: no restore (vLLM's rule)


def test_grammar_bitmask_in_batch_order():
    words = (V + 31) // 32
    rows = np.arange(3 * 2 * words, dtype=np.int32).reshape(6, words)  # 2 rows per request (1 draft)
    out = types.SimpleNamespace(structured_output_request_ids=["c", "a", "z"], grammar_bitmask=rows)
    bm = fsv.grammar_bitmask(out, ["a", "b", "c"], V, "cpu")
    assert bm.dtype == torch.int32 and bm.shape == (3, words)
    assert bm[0].tolist() == rows[2].tolist() and bm[2].tolist() == rows[0].tolist()
    assert bm[1].tolist() == [-1] * words
    assert fsv.grammar_bitmask(None, ["a"], V, "cpu") is None


def test_converted_arguments_sample_like_hand_written_ones(device):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(4, 16, generator=g).to(device)
    weight = (torch.randn(128, 16, generator=g) * 0.8).to(device)
    meta = metadata()
    kw = fsv.sampling_kwargs(meta, seeds=[5, 6, 7, 8], positions=[10, 11, 12, 13], vocab_size=V, device=device)
    got = fsdist.sample(hidden, weight, vocab_size=V, **kw)
    want = fsdist.sample(
        hidden, weight, vocab_size=V, temperature=meta.temperature.to(device),
        seed=torch.tensor([5, 6, 7, 8], device=device), offset=torch.tensor([10, 11, 12, 13], device=device),
        top_k=meta.top_k.to(device), top_p=meta.top_p.to(device), min_p=torch.tensor([0, 0, 0.1, 0], device=device),
        token_bitmask=kw["token_bitmask"], logit_bias=kw["logit_bias"], penalties=kw["penalties"])
    assert torch.equal(got.tokens, want.tokens) and bool((got.tokens >= 0).all())
    assert bool((got.tokens < V).all())


def test_bad_arguments():
    meta = metadata()
    with pytest.raises(ValueError, match="positions has 3 rows"):
        fsv.sampling_kwargs(meta, seeds=[1] * 4, positions=[1] * 3, vocab_size=V)
    with pytest.raises(ValueError, match=r"metadata.temperature has shape \(4,\), expected \[5\]"):
        fsv.sampling_kwargs(meta, seeds=[1] * 5, positions=[1] * 5, vocab_size=V)
    with pytest.raises(TypeError, match="seeds must be"):
        fsv.sampling_kwargs(meta, seeds=torch.zeros(4), positions=[1] * 4, vocab_size=V)
    with pytest.raises(fsv.UnsupportedFeatureError, match="spec_token_ids"):
        fsv.sampling_kwargs(metadata(spec_token_ids=[[3], [], [], []]), seeds=[1] * 4, positions=[1] * 4, vocab_size=V)
    with pytest.raises(ValueError, match="vocab_size must be a positive int, got 0"):
        fsv.sampling_kwargs(meta, seeds=[1] * 4, positions=[1] * 4, vocab_size=0)
    with pytest.raises(ValueError, match=r"bad_words_token_ids: request 0 bans id 100, outside \[0, 100\)"):
        fsv.sampling_kwargs(metadata(bad_words_token_ids={0: [[V]]}), seeds=[1] * 4, positions=[1] * 4, vocab_size=V)
    # to_sampler_output names a SampleOutput that lacks what max_num_logprobs asks (before importing vLLM)
    plain = fsdist.SampleOutput(torch.zeros(4, dtype=torch.int64), torch.zeros(4), torch.zeros(4))
    with pytest.raises(ValueError, match="max_num_logprobs is 3 but the SampleOutput lists 0 top ids"):
        fsv.to_sampler_output(plain, 3)
    with pytest.raises(ValueError, match="has no logprobs"):
        fsv.to_sampler_output(fsdist.SampleOutput(torch.zeros(4, dtype=torch.int64)), 0)


def test_the_head_takes_the_same_arguments():
    """sampling_kwargs' keys are keyword arguments of ShardedFlashLMHead.forward too."""
    kw = fsv.sampling_kwargs(metadata(), seeds=np.arange(4), positions=np.full(4, 7), vocab_size=V)
    params = inspect.signature(fsdist.ShardedFlashLMHead.forward).parameters
    assert set(kw) <= set(params), set(kw) - set(params)
    assert kw["seed"].dtype == torch.int64 and kw["offset"].tolist() == [7] * 4
