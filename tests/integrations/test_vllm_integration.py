"""fsdist.integrations.vllm against vLLM 0.33.0's own input batch and Sampler, on CPU.

Skipped when vLLM is not importable (a ~2 GB local reference, not a CI dependency; the
set-up is in test_vllm_reference.py's docstring). Run from the repository root with

    TRITON_INTERPRET=1 /work/venv-vllm/bin/python -m pytest tests/integrations/test_vllm_integration.py -v

The SamplingMetadata here is vLLM's own: requests (SamplingParams, prompt, output so far,
a torch generator for seeded ones) go through vLLM's InputBatch.add_request and
refresh_metadata, with vLLM's built-in logits processors (min-p, logit bias, min-tokens).
fsdist.integrations.vllm.sampling_kwargs turns that metadata into fsdist's arguments, and
fsdist.sample draws from hidden @ weight.T without writing the logits, while vLLM's Sampler
draws from the same logits (hidden @ weight[:V].T, the width vLLM's logits have; fsdist's
weight has 40 padding rows that must never be sampled).

* Distribution: 5 configurations of 4,000 requests each (penalties + logit bias; top-k + an
  allowed-token list; top-p + min-p; bad words + min-tokens; plain), half of them seeded,
  in one batch of 20,008 rows: a two-sample chi-squared test (statcheck.chi2_two_sample,
  ids below 10 draws pooled) of fsdist's draws against vLLM's for every configuration,
  p > 1e-3 (fixed seeds, so deterministic). Power: the same test rejects draws made with a
  conversion that drops the penalties (p < 1e-3), while the right conversion of that
  sub-batch (a different batch composition) still passes.
* Greedy rows (T = 0) with penalties, bias, allowed-token lists and bad words: tokens equal
  vLLM's, in a mixed batch and in an all-greedy one (temperature None in the metadata).
* max_num_logprobs: the top-N lists of "processed_logprobs" and of "raw_logprobs" (batch
  without processors) equal vLLM's; to_sampler_output has vLLM's layout.
* The intended difference: a request's fsdist token depends on (seed, position) only, not
  on its batch slot or the other requests.
* Unsupported fields raise UnsupportedFeatureError naming the field.
"""
import dataclasses
import math
import random
import types
from typing import List, NamedTuple

import pytest
import torch

try:
    import vllm
    import vllm.platforms.interface as _vllm_platform
except ImportError as exc:  # pragma: no cover - depends on the environment
    pytest.skip(f"vLLM is not importable ({exc}); see test_vllm_reference.py's docstring", allow_module_level=True)

if vllm.__version__ != "0.33.0":  # pragma: no cover
    pytest.skip(f"written against vLLM 0.33.0's InputBatch and SamplingMetadata, found {vllm.__version__}",
                allow_module_level=True)

_vllm_platform.Platform.is_pin_memory_available = classmethod(lambda cls: False)
torch._dynamo.config.disable = True  # vLLM's compiled rank counter runs eagerly

from vllm import SamplingParams  # noqa: E402
from vllm.v1.sample.logits_processor import build_logitsprocs  # noqa: E402
from vllm.v1.sample.sampler import Sampler  # noqa: E402
from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch  # noqa: E402

import fsdist  # noqa: E402
from fsdist.integrations import vllm as fsv  # noqa: E402
from statcheck import P_MIN, chi2_two_sample  # noqa: E402

V, V_PADDED, D = 600, 640, 32   # V is not a multiple of 32: the last bitmask word is partial
N_PER_CONFIG = 4000
CPU = torch.device("cpu")
# Under the interpreter a batch tile of 8192 rows keeps the 20,008-row call to seconds.
TILES = fsdist.TileConfig(8192, 64, 32, num_stages=1)


class Request(NamedTuple):
    req_id: str
    params: SamplingParams
    prompt: List[int]
    output: List[int]
    row: int           # which hidden state (logits row) the request samples from
    noise_seed: int    # the fsdist seed of an unseeded request (drawn once, at admission)

    @property
    def seed(self) -> int:
        return self.params.seed if self.params.seed is not None else self.noise_seed

    @property
    def position(self) -> int:
        return len(self.prompt) + len(self.output)


def head(n_rows: int, seed: int = 0):
    """hidden [n_rows, D] and a weight [V_PADDED, D] whose padding rows give large logits."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n_rows, D, generator=g)
    weight = torch.randn(V_PADDED, D, generator=g) * (3.0 / math.sqrt(D))
    weight[V:] *= 8.0
    return hidden, weight


def top_ids(hidden, weight, row: int, k: int = 8) -> List[int]:
    return (hidden[row] @ weight[:V].T).topk(k).indices.tolist()


def input_batch(requests: List[Request]) -> InputBatch:
    """vLLM's own persistent batch holding the requests, metadata refreshed."""
    n = len(requests)
    config = types.SimpleNamespace(scheduler_config=types.SimpleNamespace(max_num_seqs=n), speculative_config=None)
    batch = InputBatch(max_num_reqs=n, max_model_len=64, max_num_batched_tokens=64 * n, device=CPU, vocab_size=V,
                       block_sizes=[16], max_num_blocks_per_req=[4],
                       logitsprocs=build_logitsprocs(config, CPU, False, False))
    for r in requests:
        generator = None if r.params.seed is None else torch.Generator().manual_seed(r.params.seed)
        batch.add_request(CachedRequestState(
            req_id=r.req_id, prompt_token_ids=list(r.prompt), mm_features=[], sampling_params=r.params,
            generator=generator, block_ids=([0],), num_computed_tokens=r.position, output_token_ids=list(r.output)))
    batch.refresh_metadata()
    assert batch.req_ids == [r.req_id for r in requests]
    return batch


def run_vllm(requests, hidden, weight, logprobs_mode="raw_logprobs", torch_seed=0):
    batch = input_batch(requests)
    logits = hidden[[r.row for r in requests]] @ weight[:V].T
    torch.manual_seed(torch_seed)  # the unseeded requests' noise
    return Sampler(logprobs_mode=logprobs_mode)(logits, batch.sampling_metadata)


def run_fsdist(requests, hidden, weight, logprobs_mode="raw_logprobs", edit=None):
    meta = input_batch(requests).sampling_metadata
    kw = fsv.sampling_kwargs(meta, seeds=[r.seed for r in requests], positions=[r.position for r in requests],
                             vocab_size=V, logprobs_mode=logprobs_mode)
    if edit is not None:
        edit(kw)
    out = fsdist.sample(hidden[[r.row for r in requests]].contiguous(), weight, vocab_size=V, config=TILES, **kw)
    return out, meta


# --------------------------------------------------------------------------- the requests

CONFIGS = ["penalties+bias", "top_k+allowed", "top_p+min_p", "bad_words+min_tokens", "plain"]
N_GREEDY = 8


def config_request(name: str, i: int, hidden, weight, rng: random.Random, row=None) -> Request:
    """Request i of configuration `name`; odd i are seeded (vLLM gives those a generator)."""
    c = CONFIGS.index(name) if row is None else row
    top = top_ids(hidden, weight, c)
    seed = 1000 + i if i % 2 else None
    prompt, output = [1, 2, 3], []
    if name == "penalties+bias":
        kw = dict(temperature=0.9, repetition_penalty=1.4, frequency_penalty=0.4, presence_penalty=0.3,
                  logit_bias={top[2]: 1.0, top[5]: 1.5, 17: -3.0})
        prompt, output = [top[3], top[4], 9, 10], [top[0], top[0], top[1], 5]
    elif name == "top_k+allowed":
        kw = dict(temperature=1.1, top_k=6, allowed_token_ids=[t for t in range(V) if t not in (top[0], top[2])])
        output = [11, 12]
    elif name == "top_p+min_p":
        kw = dict(temperature=0.8, top_p=0.85, min_p=0.03)
    elif name == "bad_words+min_tokens":
        # [top1] always banned; [4, top3] banned after a 4 (the output ends in one); [8, top4] not now.
        kw = dict(temperature=1.0, _bad_words_token_ids=[[top[1]], [4, top[3]], [8, top[4]]], min_tokens=8,
                  stop_token_ids=[top[0]])
        output = [7, 4]
    else:
        kw = dict(temperature=0.7)
    return Request(f"{name}-{i}", SamplingParams(seed=seed, **kw), prompt, output, c, rng.getrandbits(63))


def greedy_request(j: int, hidden, weight, rng: random.Random, row=None) -> Request:
    """Greedy requests (T = 0) with processors that change the argmax; rows after CONFIGS'."""
    row = len(CONFIGS) + j if row is None else row
    top = top_ids(hidden, weight, row)
    kinds = [dict(), dict(logit_bias={top[1]: 5.0}), dict(allowed_token_ids=list(range(V))[::3]),
             dict(repetition_penalty=3.0), dict(frequency_penalty=2.0), dict(presence_penalty=2.0),
             dict(_bad_words_token_ids=[[top[0]]]), dict(logit_bias={top[0]: -1.0}, repetition_penalty=1.5)]
    params = SamplingParams(temperature=0.0, **kinds[j % len(kinds)])
    return Request(f"greedy-{j}", params, [top[0], 5], [top[0], top[1], top[0]], row, rng.getrandbits(63))


@pytest.fixture(scope="module")
def big_batch():
    hidden, weight = head(len(CONFIGS) + N_GREEDY)
    rng = random.Random(0)
    requests = [config_request(name, i, hidden, weight, rng) for name in CONFIGS for i in range(N_PER_CONFIG)]
    requests += [greedy_request(j, hidden, weight, rng) for j in range(N_GREEDY)]
    theirs = run_vllm(requests, hidden, weight).sampled_token_ids[:, 0].long()
    ours, _ = run_fsdist(requests, hidden, weight)
    return types.SimpleNamespace(hidden=hidden, weight=weight, requests=requests, theirs=theirs, ours=ours)


def config_rows(name: str) -> slice:
    c = CONFIGS.index(name)
    return slice(c * N_PER_CONFIG, (c + 1) * N_PER_CONFIG)


# --------------------------------------------------------------------------- distribution


@pytest.mark.parametrize("name", CONFIGS)
def test_draws_agree_with_vllm_sampler(big_batch, name):
    rows = config_rows(name)
    ours, theirs = big_batch.ours.tokens[rows], big_batch.theirs[rows]
    assert bool(((ours >= 0) & (ours < V)).all()), "fsdist drew a padding id or failed a row"
    p, stat, dof = chi2_two_sample(ours, theirs, V)
    fell_back = int(big_batch.ours.fallback[rows].sum())
    print(f"{name}: {int(torch.unique(ours).numel())} / {int(torch.unique(theirs).numel())} distinct ids "
          f"(fsdist / vLLM), chi2 {stat:.1f} on {dof} dof, p = {p:.3f}; {fell_back} rows took fsdist's fallback")
    assert p > P_MIN, f"{name}: chi2 {stat:.1f} on {dof} dof, p = {p:.2e}"


def test_banned_ids_are_never_drawn(big_batch):
    top = [top_ids(big_batch.hidden, big_batch.weight, c) for c in range(len(CONFIGS))]
    allowed = big_batch.ours.tokens[config_rows("top_k+allowed")]
    assert not bool(torch.isin(allowed, torch.tensor([top[1][0], top[1][2]])).any())
    c = CONFIGS.index("bad_words+min_tokens")
    banned = torch.tensor([top[c][1], top[c][3], top[c][0]])  # two bad words, min-tokens' stop id
    assert not bool(torch.isin(big_batch.ours.tokens[config_rows("bad_words+min_tokens")], banned).any())
    # ... which vLLM does not draw either, while the bad word that does not apply now is drawn.
    assert not bool(torch.isin(big_batch.theirs[config_rows("bad_words+min_tokens")], banned).any())
    assert bool((big_batch.ours.tokens[config_rows("bad_words+min_tokens")] == top[c][4]).any())


def test_power_a_dropped_penalty_is_rejected(big_batch):
    """The conversion without the penalties fails the same test against vLLM's draws; the
    right conversion of the same requests, now in a batch of their own, passes."""
    requests = big_batch.requests[config_rows("penalties+bias")]
    theirs = big_batch.theirs[config_rows("penalties+bias")]
    right, _ = run_fsdist(requests, big_batch.hidden, big_batch.weight)
    wrong, _ = run_fsdist(requests, big_batch.hidden, big_batch.weight, edit=lambda kw: kw.update(penalties=None))
    p_right, _, _ = chi2_two_sample(right.tokens, theirs, V)
    p_wrong, stat, dof = chi2_two_sample(wrong.tokens, theirs, V)
    print(f"penalties kept: p = {p_right:.3f}; penalties dropped: chi2 {stat:.1f} on {dof} dof, p = {p_wrong:.1e}")
    assert p_right > P_MIN
    assert p_wrong < P_MIN


# --------------------------------------------------------------------------- greedy


def test_greedy_rows_in_a_mixed_batch_equal_vllm(big_batch):
    greedy = slice(len(CONFIGS) * N_PER_CONFIG, None)
    assert torch.equal(big_batch.ours.tokens[greedy], big_batch.theirs[greedy])


def test_all_greedy_batch_equals_vllm():
    hidden, weight = head(24, seed=3)
    rng = random.Random(1)
    requests = [greedy_request(j, hidden, weight, rng, row=j) for j in range(24)]
    res = run_vllm(requests, hidden, weight)
    out, meta = run_fsdist(requests, hidden, weight)
    assert meta.all_greedy and meta.temperature is None
    assert torch.equal(out.tokens, res.sampled_token_ids[:, 0].long())


# --------------------------------------------------------------------------- logprobs


def logprob_requests(hidden, weight, processors: bool) -> List[Request]:
    rng = random.Random(2)
    reqs = []
    for j in range(10):
        kw = [dict(temperature=0.0), dict(temperature=0.8, top_k=5), dict(temperature=1.2, top_p=0.7),
              dict(temperature=0.9, min_p=0.1), dict(temperature=1.0)][j % 5]
        if processors and j % 2:
            kw.update(repetition_penalty=1.3, logit_bias={3: 2.0})
        top = top_ids(hidden, weight, j)
        reqs.append(Request(f"lp{j}", SamplingParams(seed=j, logprobs=5, **kw), [1, 2], [top[0], top[1]], j,
                            rng.getrandbits(63)))
    return reqs


@pytest.mark.parametrize("vllm_mode", ["processed_logprobs", "raw_logprobs"])
def test_top_logprobs_equal_vllm(vllm_mode):
    hidden, weight = head(10, seed=4)
    requests = logprob_requests(hidden, weight, processors=vllm_mode == "processed_logprobs")
    theirs = run_vllm(requests, hidden, weight, logprobs_mode=vllm_mode).logprobs_tensors
    out, meta = run_fsdist(requests, hidden, weight, logprobs_mode=vllm_mode)
    ours = fsv.to_sampler_output(out, meta.max_num_logprobs)
    assert ours.sampled_token_ids.shape == (10, 1) and ours.sampled_token_ids.dtype == torch.int32
    lt = ours.logprobs_tensors
    assert lt.logprob_token_ids.shape == theirs.logprob_token_ids.shape == (10, 6)
    assert lt.logprob_token_ids.dtype == torch.int32 and lt.logprobs.dtype == torch.float32
    # The top-5 lists do not depend on the drawn token (column 0), so they must be equal.
    finite = torch.isfinite(theirs.logprobs[:, 1:])
    torch.testing.assert_close(lt.logprobs[:, 1:], theirs.logprobs[:, 1:], atol=2e-5, rtol=0)
    assert torch.equal(lt.logprob_token_ids[:, 1:][finite], theirs.logprob_token_ids[:, 1:][finite])
    # Column 0: the drawn token's logprob, equal where both drew the same token (greedy rows at least).
    same = ours.sampled_token_ids[:, 0] == theirs.logprob_token_ids[:, 0]
    assert bool(same[::5].all())
    torch.testing.assert_close(lt.logprobs[same, 0], theirs.logprobs[same, 0], atol=2e-5, rtol=0)
    listed = (lt.logprob_token_ids[:, 1:] == lt.logprob_token_ids[:, :1]).any(dim=1)
    assert torch.equal(lt.selected_token_ranks[same & listed], theirs.selected_token_ranks[same & listed])


# --------------------------------------------------------------------------- the intended difference


def test_a_requests_token_does_not_depend_on_the_batch():
    """fsdist's noise is keyed by (seed, position, id): the same requests reversed and mixed
    with others give every request the same token (vLLM's generators promise no such thing)."""
    hidden, weight = head(len(CONFIGS), seed=5)
    rng = random.Random(3)
    requests = [config_request(name, i, hidden, weight, rng) for name in CONFIGS for i in range(4)]
    others = [config_request("plain", 100 + i, hidden, weight, rng) for i in range(6)]
    mixed = list(reversed(requests))
    for i, r in enumerate(others):
        mixed.insert(2 * i + 1, r)
    a, _ = run_fsdist(requests, hidden, weight)
    b, _ = run_fsdist(mixed, hidden, weight)
    token_in_b = {r.req_id: int(t) for r, t in zip(mixed, b.tokens)}
    assert [token_in_b[r.req_id] for r in requests] == a.tokens.tolist()


# --------------------------------------------------------------------------- unsupported


def test_unsupported_fields_raise_naming_the_field():
    hidden, weight = head(len(CONFIGS), seed=6)
    rng = random.Random(4)
    requests = [config_request(name, 1, hidden, weight, rng) for name in CONFIGS]
    meta = input_batch(requests).sampling_metadata
    kw = dict(seeds=[1] * 5, positions=[3] * 5, vocab_size=V)
    cases = [
        (dict(spec_token_ids=[[1]] + [[]] * 4), "spec_token_ids"),
        (dict(logprob_token_ids={0: [1, 2]}), "logprob_token_ids"),
        (dict(max_num_logprobs=-1), "max_num_logprobs=-1"),
        (dict(max_num_logprobs=21), "max_num_logprobs=21"),
    ]
    for change, match in cases:
        with pytest.raises(fsv.UnsupportedFeatureError, match=match):
            fsv.sampling_kwargs(dataclasses.replace(meta, **change), **kw)
    with pytest.raises(fsv.UnsupportedFeatureError, match="raw_logits"):
        fsv.sampling_kwargs(meta, logprobs_mode="raw_logits", **kw)
    with pytest.raises(fsv.UnsupportedFeatureError, match="processed_logprobs"):  # raw + penalties
        fsv.sampling_kwargs(dataclasses.replace(meta, max_num_logprobs=2), **kw)

    class MyProcessor:
        def is_argmax_invariant(self):
            return False

    procs = type(meta.logitsprocs)(list(meta.logitsprocs.all) + [MyProcessor()])
    with pytest.raises(fsv.UnsupportedFeatureError, match="logitsprocs holds MyProcessor"):
        fsv.sampling_kwargs(dataclasses.replace(meta, logitsprocs=procs), **kw)
    with pytest.raises(ValueError, match="positions has 4 rows"):
        fsv.sampling_kwargs(meta, seeds=[1] * 5, positions=[3] * 4, vocab_size=V)
