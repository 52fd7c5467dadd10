"""fsdist's float64 semantics reference against vLLM V1's own sampler (vLLM 0.33.0, on CPU).

Skipped when vLLM is not importable: vLLM is a ~2 GB local reference, not a CI dependency.

What is compared, for random logits and random per-row parameters (temperature, top-k,
top-p, min-p, repetition/frequency/presence penalties with prompt and output ids, logit
bias, an allowed-token mask), with padding columns beyond vocab_size on fsdist's side:

* vLLM's pieces, called directly in vLLM's order -- xgrammar's bitmask kernel (or the
  sampler's allowed-token mask), LogitBiasLogitsProcessor, apply_all_penalties,
  Sampler.apply_temperature, MinPLogitsProcessor, apply_top_k_top_p_pytorch /
  apply_top_k_only -- against process_logits / serving_semantics: processed logits, the
  kept set (exactly; an id on which they disagree must sit within 1e-5 of a filter
  boundary) and the final probabilities (1e-6 in float32, 1e-12 when vLLM's pieces run on
  float64 logits);
* vLLM's full Sampler (SamplingMetadata of 0.33.0) drawing 20,000 tokens per row
  configuration: chi-squared goodness of fit against the reference distribution
  (p > 1e-3, fixed seeds), no draw outside the reference's kept set, greedy rows equal to
  the reference argmax, and its raw_logprobs / processed_logprobs (token and top-N)
  against the reference's "raw" / "processed" modes;
* the documented differences (see docs/semantics.md): vLLM's raw logprobs see the grammar
  bitmask that its model runner applies before the sampler; vLLM's sort-based top-p keeps
  only part of a tie group; SamplingParams raises temperatures in (0, 0.01) to 0.01.

Set-up (a venv outside the repository; torch 2.13.0 is the local CPU build):

    python3 -m venv /work/venv-vllm
    /work/venv-vllm/bin/pip install torch==2.13.0 numpy scipy pytest
    /work/venv-vllm/bin/pip install --no-deps vllm==0.33.0
    echo "torch==2.13.0" > /tmp/vllm-constraints.txt
    /work/venv-vllm/bin/pip install -c /tmp/vllm-constraints.txt regex requests psutil pyzmq pydantic \\
        cbor2 "transformers>=5.16.1,<5.21.0" aiohttp openai-harmony openai pillow pybase64 cachetools \\
        msgspec cloudpickle uvloop py-cpuinfo prometheus_client "fastapi>=0.133.0,<0.137.0" \\
        partial_json_parser apache-tvm-ffi
    /work/venv-vllm/bin/pip install --no-deps xgrammar==0.2.8 "llguidance>=1.7,<1.8" triton==3.6.0

(vLLM 0.33.0 declares torch==2.14.0; its pure-torch sampler runs on 2.13.0. Never run a
plain `pip install vllm` there: it pulls torch 2.14 and CUDA wheels, and downgrades vLLM.
Triton is for fsdist's import; with no GPU driver vLLM keeps HAS_TRITON False and uses its
pure-torch top-k/top-p.) Then, from the repository root:

    /work/venv-vllm/bin/python -m pytest tests/integrations/test_vllm_reference.py -v

The module patches Platform.is_pin_memory_available to False before vLLM's sampler is
imported, and does not set VLLM_TARGET_DEVICE (vLLM resolves UnspecifiedPlatform and its
portable paths: torch argmax for greedy, exponential race for random rows).
"""
import types
from typing import NamedTuple

import pytest
import torch

try:
    import vllm
    import vllm.platforms.interface as _vllm_platform
except ImportError as exc:  # pragma: no cover - depends on the environment
    pytest.skip(f"vLLM is not importable ({exc}); see this module's docstring", allow_module_level=True)

if vllm.__version__ != "0.33.0":  # pragma: no cover
    pytest.skip(f"written against vLLM 0.33.0's SamplingMetadata, found {vllm.__version__}",
                allow_module_level=True)

_vllm_platform.Platform.is_pin_memory_available = classmethod(lambda cls: False)
torch._dynamo.config.disable = True  # vLLM's compiled rank counter runs eagerly (no 20 s compile)

import xgrammar  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.v1.sample.logits_processor import LogitsProcessors  # noqa: E402
from vllm.v1.sample.logits_processor.builtin import LogitBiasLogitsProcessor, MinPLogitsProcessor  # noqa: E402
from vllm.v1.sample.logits_processor.interface import BatchUpdate  # noqa: E402
from vllm.v1.sample.metadata import SamplingMetadata  # noqa: E402
from vllm.v1.sample.ops.penalties import apply_all_penalties  # noqa: E402
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_only, apply_top_k_top_p_pytorch  # noqa: E402
from vllm.v1.sample.sampler import Sampler  # noqa: E402

from fsdist.reference.semantics import (GREEDY_EPS, Penalties, SparseLogits, bitmask_from_allowed,  # noqa: E402
                                        process_logits, reference_logprobs, reference_top_logprobs,
                                        serving_semantics)
from statcheck import P_MIN, chi2_gof  # noqa: E402

VOCAB, PADDED = 300, 320
NEG_INF = float("-inf")


class Case(NamedTuple):
    """One batch of inputs, in fsdist's layout (padded logits, -1-padded ids, bitmask)."""

    logits: torch.Tensor        # float32 [B, PADDED]; padding columns hold large junk
    temperature: torch.Tensor   # float32 [B]; 0 for greedy rows
    top_k: torch.Tensor         # int32 [B]; 0 = off
    top_p: torch.Tensor         # float32 [B]
    min_p: torch.Tensor         # float32 [B]
    allowed: torch.Tensor       # bool [B, VOCAB]
    bias: SparseLogits          # ids unique per row (vLLM keeps a dict)
    penalties: Penalties

    @property
    def params(self):
        return dict(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p,
                    vocab_size=VOCAB, token_bitmask=bitmask_from_allowed(self.allowed), logit_bias=self.bias,
                    penalties=self.penalties)

    def rows(self, index):
        """The same case restricted (and possibly repeated) to the given row indices."""
        index = torch.as_tensor(index)
        pen = self.penalties
        return Case(self.logits[index], self.temperature[index], self.top_k[index], self.top_p[index],
                    self.min_p[index], self.allowed[index], SparseLogits(self.bias.ids[index], self.bias.values[index]),
                    Penalties(pen.repetition[index], pen.frequency[index], pen.presence[index],
                              pen.output_ids[index], pen.prompt_ids[index]))


def make_case(seed: int, batch: int = 16, greedy_rows=(0,)) -> Case:
    g = torch.Generator().manual_seed(seed)

    def uniform(lo, hi, n=batch):
        return (lo + (hi - lo) * torch.rand(n, generator=g)).float()

    def sometimes(values, off, prob):
        return torch.where(torch.rand(batch, generator=g) < prob, values, torch.full_like(values, off))

    logits = (torch.randn(batch, PADDED, generator=g) * 2.5).float()
    logits[:, VOCAB:] = 50.0  # padding junk, larger than every real logit
    temperature = uniform(0.4, 1.6)
    top_k = sometimes(torch.randint(1, 60, (batch,), generator=g, dtype=torch.int32), 0, 0.6)
    top_p = sometimes(uniform(0.3, 0.97), 1.0, 0.6)
    min_p = sometimes(uniform(0.005, 0.3), 0.0, 0.5)
    greedy = torch.zeros(batch, dtype=torch.bool)
    greedy[list(greedy_rows)] = True
    # Greedy rows as vLLM's SamplingParams leaves them: T = 0 and every filter off.
    temperature[greedy], top_k[greedy], top_p[greedy], min_p[greedy] = 0.0, 0, 1.0, 0.0

    allowed = torch.rand(batch, VOCAB, generator=g) < 0.85
    bias_ids = torch.stack([torch.randperm(VOCAB, generator=g)[:6] for _ in range(batch)])
    bias_ids[:, -2:] = -1  # empty slots
    bias = SparseLogits(bias_ids, (torch.rand(batch, 6, generator=g) * 6 - 3).float())
    output_ids = torch.randint(0, 40, (batch, 24), generator=g)  # a small range: many duplicates
    output_ids[:, 20:] = -1
    prompt_ids = torch.randint(0, VOCAB, (batch, 30), generator=g)
    prompt_ids[: batch // 2, 25:] = -1
    pen = Penalties(repetition=sometimes(uniform(0.7, 1.6), 1.0, 0.7),
                    frequency=sometimes(uniform(-1.0, 1.0), 0.0, 0.7),
                    presence=sometimes(uniform(-1.0, 1.0), 0.0, 0.7),
                    output_ids=output_ids, prompt_ids=prompt_ids)
    return Case(logits, temperature, top_k, top_p, min_p, allowed, bias, pen)


# --------------------------------------------------------------------------------------------
# Case -> vLLM's inputs
# --------------------------------------------------------------------------------------------

def _sampling_params(case: Case, b: int) -> SamplingParams:
    ids, values = case.bias.ids[b], case.bias.values[b]
    pen = case.penalties
    return SamplingParams(
        temperature=float(case.temperature[b]), top_k=int(case.top_k[b]), top_p=float(case.top_p[b]),
        min_p=float(case.min_p[b]), repetition_penalty=float(pen.repetition[b]),
        frequency_penalty=float(pen.frequency[b]), presence_penalty=float(pen.presence[b]),
        logit_bias={int(i): float(v) for i, v in zip(ids, values) if i >= 0} or None)


def _output_lists(case: Case):
    return [[int(t) for t in row if t >= 0] for row in case.penalties.output_ids]


def _prompt_tensor(case: Case):
    """vLLM pads prompts with vocab_size (an id that does not exist)."""
    p = case.penalties.prompt_ids
    return torch.where(p < 0, torch.full_like(p, VOCAB), p)


def _logits_processors(case: Case):
    batch = case.logits.shape[0]
    config = types.SimpleNamespace(scheduler_config=types.SimpleNamespace(max_num_seqs=batch))
    outputs = _output_lists(case)
    update = BatchUpdate(batch_size=batch, removed=[], moved=[],
                         added=[(b, _sampling_params(case, b), None, outputs[b]) for b in range(batch)])
    min_p = MinPLogitsProcessor(config, torch.device("cpu"), False)
    bias = LogitBiasLogitsProcessor(config, torch.device("cpu"), False)
    min_p.update_state(update)
    bias.update_state(update)
    return min_p, bias


def _vllm_top_k(case: Case):
    """vLLM's input batch stores 'off' as top_k = vocab_size."""
    k = case.top_k
    return torch.where((k > 0) & (k < VOCAB), k, torch.full_like(k, VOCAB)).to(torch.int32)


def vllm_pieces(case: Case, dtype=torch.float32, grammar_kernel: bool = True):
    """vLLM's processing, piece by piece, in its order. Returns (processed, filtered) [B, VOCAB]."""
    x = case.logits[:, :VOCAB].to(dtype).clone()
    if grammar_kernel:   # the model runner's structured-output path (xgrammar's CPU kernel)
        xgrammar.apply_token_bitmask_inplace(x, bitmask_from_allowed(case.allowed))
    else:                # the sampler's allowed_token_ids path
        x.masked_fill_(~case.allowed, NEG_INF)
    min_p_proc, bias_proc = _logits_processors(case)
    x = bias_proc.apply(x)
    pen = case.penalties
    # The parameters in the logits' dtype: in float32 vLLM would compute 1 / repetition and
    # frequency * count in float32 even on float64 logits (a 1e-7 relative difference).
    x = apply_all_penalties(x, _prompt_tensor(case), pen.presence.to(dtype), pen.frequency.to(dtype),
                            pen.repetition.to(dtype), _output_lists(case))
    processed = x.clone()
    x = Sampler.apply_temperature(x, case.temperature.to(dtype), all_random=False)
    x = min_p_proc.apply(x)
    if bool((case.top_p < 1).any()):
        x = apply_top_k_top_p_pytorch(x, _vllm_top_k(case), case.top_p)
    else:  # vLLM's CPU platform takes this sort-free path for top-k only
        x = apply_top_k_only(x, _vllm_top_k(case))
    return processed, x


def vllm_metadata(case: Case, max_num_logprobs=None, use_allowed_mask: bool = True) -> SamplingMetadata:
    greedy = case.temperature < GREEDY_EPS
    pen = case.penalties
    min_p_proc, bias_proc = _logits_processors(case)
    return SamplingMetadata(
        temperature=None if bool(greedy.all()) else case.temperature.clone(),
        all_greedy=bool(greedy.all()), all_random=not bool(greedy.any()),
        top_p=case.top_p.clone() if bool((case.top_p < 1).any()) else None,
        top_k=_vllm_top_k(case) if bool(((case.top_k > 0) & (case.top_k < VOCAB)).any()) else None,
        generators={}, max_num_logprobs=max_num_logprobs, no_penalties=False,
        prompt_token_ids=_prompt_tensor(case), frequency_penalties=pen.frequency.clone(),
        presence_penalties=pen.presence.clone(), repetition_penalties=pen.repetition.clone(),
        output_token_ids=_output_lists(case),
        allowed_token_ids_mask=~case.allowed if use_allowed_mask else None,
        bad_words_token_ids={}, logitsprocs=LogitsProcessors([min_p_proc, bias_proc]))


# --------------------------------------------------------------------------------------------
# Comparisons
# --------------------------------------------------------------------------------------------

def boundary_distance(case: Case) -> torch.Tensor:
    """float64 [B, VOCAB]: how close each id sits to the min-p, top-k or top-p boundary."""
    sem = serving_semantics(case.logits, **case.params)
    s = sem.scaled[:, :VOCAB]
    far = torch.full_like(s, float("inf"))
    ratio = torch.exp(s - s.max(dim=1, keepdim=True).values)
    mp = case.min_p.double()[:, None]
    d_min_p = torch.where(mp > 0, (ratio - mp).abs(), far)
    f = s.masked_fill(ratio < mp, NEG_INF)
    k = case.top_k.long()
    kth = f.sort(dim=1, descending=True).values.gather(1, (k.clamp(1, VOCAB) - 1)[:, None])
    d_top_k = torch.where(((k > 0) & (k < VOCAB))[:, None], (s - kth).abs(), far)
    f = torch.where(((k > 0) & (k < VOCAB))[:, None] & (f < kth), NEG_INF, f)
    q = torch.softmax(f, dim=1)
    above = (q[:, None, :] * (q[:, None, :] > q[:, :, None])).sum(dim=-1)
    p = case.top_p.double()[:, None]
    d_top_p = torch.where(p < 1, (above - p).abs(), far)
    return torch.minimum(torch.minimum(d_min_p, d_top_k), d_top_p)


def assert_same_kept_set(case: Case, ours: torch.Tensor, theirs: torch.Tensor, tol: float = 1e-5):
    ours, theirs = torch.isfinite(ours[:, :VOCAB]), torch.isfinite(theirs)
    differ = ours != theirs
    if bool(differ.any()):
        dist = boundary_distance(case)[differ]
        assert bool((dist < tol).all()), (
            f"{int(differ.sum())} ids kept differently, boundary distances {dist.tolist()}")


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_pieces_match(seed, dtype):
    case = make_case(seed)
    if seed % 3 == 0:  # top-k without top-p: vLLM's sort-free apply_top_k_only
        case = case._replace(top_p=torch.ones_like(case.top_p))
    sem = serving_semantics(case.logits, **case.params)
    processed, filtered = vllm_pieces(case, dtype, grammar_kernel=(dtype == torch.float32))
    tol = dict(rtol=1e-6, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)

    ours = sem.processed[:, :VOCAB]
    assert torch.equal(torch.isneginf(ours), torch.isneginf(processed))
    torch.testing.assert_close(processed.double(), ours, **tol)
    assert (sem.processed[:, VOCAB:] == NEG_INF).all() and (sem.probs[:, VOCAB:] == 0).all()

    sampled = ~sem.greedy
    assert_same_kept_set(case, sem.filtered[sampled], filtered[sampled])
    theirs = torch.softmax(filtered.double(), dim=1)
    ptol = dict(rtol=0, atol=1e-6) if dtype == torch.float32 else dict(rtol=0, atol=1e-12)
    torch.testing.assert_close(theirs[sampled], sem.probs[sampled, :VOCAB], **ptol)
    kept = torch.isfinite(sem.filtered[sampled, :VOCAB]).sum(dim=1).tolist()
    err = float((theirs[sampled] - sem.probs[sampled, :VOCAB]).abs().max())
    print(f"seed {seed} {dtype}: ids kept per sampled row {kept}; max |p_vllm - p_ref| = {err:.1e}")
    # Greedy rows: vLLM's argmax of the processed logits, lowest id on ties.
    assert torch.equal(processed[sem.greedy].argmax(dim=1), sem.tokens[sem.greedy])


def test_kept_sets_are_exact_away_from_ties():
    """Across all seeds above, the float64 pieces keep exactly the reference's ids."""
    differing = 0
    for seed in range(6):
        case = make_case(seed)
        sem = serving_semantics(case.logits, **case.params)
        _, filtered = vllm_pieces(case, torch.float64, grammar_kernel=False)
        differing += int((torch.isfinite(sem.filtered[:, :VOCAB]) != torch.isfinite(filtered)).sum())
    assert differing == 0


def _draw(case: Case, rows, draws: int, chunk: int, seed: int):
    """`draws` tokens from vLLM's Sampler for each of `rows`, in mixed batches of `chunk` rows."""
    sampler = Sampler(logprobs_mode="raw_logprobs")
    greedy_token = int(serving_semantics(case.logits, **case.params).tokens[0])
    torch.manual_seed(seed)
    out = []
    for b in rows:
        got = []
        for start in range(0, draws, chunk):
            n = min(chunk, draws - start)
            # One greedy row rides along so the batch takes vLLM's mixed greedy/random path.
            index = [b] * n + [0]
            sub = case.rows(index)
            res = sampler(sub.logits[:, :VOCAB].clone(), vllm_metadata(sub))
            tokens = res.sampled_token_ids[:, 0].long()
            got.append(tokens[:n])
            assert int(tokens[n]) == greedy_token
        out.append(torch.cat(got))
    return out


def test_sampler_draws_follow_the_reference_distribution():
    case = make_case(11, greedy_rows=(0,))
    rows = [1, 2, 3, 4, 5]
    sem = serving_semantics(case.logits, **case.params)
    for b, tokens in zip(rows, _draw(case, rows, draws=20000, chunk=5000, seed=1234)):
        probs = sem.probs[b, :VOCAB]
        assert bool((probs[tokens] > 0).all()), f"row {b}: vLLM drew an id the reference filters out"
        p, stat, dof = chi2_gof(tokens, probs)
        print(f"row {b}: {int((probs > 0).sum())} ids kept, {tokens.numel()} vLLM draws, "
              f"chi2 {stat:.1f} on {dof} dof, p = {p:.3f}")
        assert p > P_MIN, f"row {b}: chi2 {stat:.1f} on {dof} dof, p = {p:.2e}"


def test_sampler_greedy_rows_equal_the_reference():
    case = make_case(21, batch=12, greedy_rows=range(12))
    sem = serving_semantics(case.logits, **case.params)
    res = Sampler()(case.logits[:, :VOCAB].clone(), vllm_metadata(case))  # an all-greedy batch
    assert torch.equal(res.sampled_token_ids[:, 0].long(), sem.tokens)
    mixed = make_case(22, batch=12, greedy_rows=(0, 3, 7))
    sem = serving_semantics(mixed.logits, **mixed.params)
    res = Sampler()(mixed.logits[:, :VOCAB].clone(), vllm_metadata(mixed))
    assert torch.equal(res.sampled_token_ids[sem.greedy, 0].long(), sem.tokens[sem.greedy])


@pytest.mark.parametrize("greedy_rows", [(0, 5), tuple(range(8))])
def test_sampler_logprobs_match_raw_and_processed_modes(greedy_rows):
    case = make_case(31, batch=8, greedy_rows=greedy_rows)
    n = 5
    for vllm_mode, ours in (("raw_logprobs", "raw"), ("processed_logprobs", "processed")):
        torch.manual_seed(0)
        res = Sampler(logprobs_mode=vllm_mode)(case.logits[:, :VOCAB].clone(), vllm_metadata(case, n))
        lt = res.logprobs_tensors
        tokens = lt.logprob_token_ids[:, 0].long()
        want = reference_logprobs(case.logits, tokens, mode=ours, **case.params)
        torch.testing.assert_close(lt.logprobs[:, 0].double(), want, rtol=0, atol=2e-5)
        ids, vals = reference_top_logprobs(case.logits, n, mode=ours, **case.params)
        torch.testing.assert_close(lt.logprobs[:, 1:].double(), vals, rtol=0, atol=2e-5)
        finite = torch.isfinite(vals)  # -inf entries come in any order from torch.topk
        assert torch.equal(lt.logprob_token_ids[:, 1:].long()[finite], ids[finite])


# --------------------------------------------------------------------------------------------
# The documented differences
# --------------------------------------------------------------------------------------------

def test_difference_vllm_raw_logprobs_see_the_grammar_bitmask():
    """vLLM's model runner applies the grammar bitmask before the sampler computes raw
    logprobs; fsdist's "raw" is before any processing (the design card's definition)."""
    case = make_case(41, batch=4, greedy_rows=())
    masked = case.logits[:, :VOCAB].clone()
    xgrammar.apply_token_bitmask_inplace(masked, bitmask_from_allowed(case.allowed))
    meta = vllm_metadata(case, max_num_logprobs=3, use_allowed_mask=False)
    res = Sampler(logprobs_mode="raw_logprobs")(masked.clone(), meta)  # the sampler works in place
    tokens = res.logprobs_tensors.logprob_token_ids[:, 0].long()
    ours = reference_logprobs(case.logits, tokens, mode="raw", **case.params)
    theirs = torch.log_softmax(masked.double(), dim=1).gather(1, tokens[:, None])[:, 0]
    torch.testing.assert_close(res.logprobs_tensors.logprobs[:, 0].double(), theirs, rtol=0, atol=2e-5)
    # The bitmask removes mass, so vLLM's raw logprob is larger by exactly that log-mass.
    allowed_mass = torch.softmax(case.logits[:, :VOCAB].double(), dim=1).masked_fill(~case.allowed, 0).sum(1)
    torch.testing.assert_close(theirs - ours, -allowed_mass.log(), rtol=0, atol=2e-5)
    assert bool((theirs > ours + 1e-3).all())


def test_difference_top_p_tie_groups():
    """Three ids tied at 0.2 below a 0.4 id, top_p = 0.5: the reference keeps the whole tie
    group (mass strictly above is 0.4 < 0.5); vLLM's sorted cumulative sum keeps one."""
    logits = torch.tensor([[0.4, 0.2, 0.2, 0.2]]).log()
    theirs = apply_top_k_top_p_pytorch(logits.clone(), None, torch.tensor([0.5]))
    ours = serving_semantics(logits, top_p=0.5).filtered
    assert int(torch.isfinite(ours).sum()) == 4
    assert int(torch.isfinite(theirs).sum()) == 2 and bool(torch.isfinite(theirs[0, 0]))


def test_difference_top_k_ties_agree():
    """Top-k: vLLM's torch paths keep every id tied at the k-th value, like the reference."""
    logits = torch.tensor([[3.0, 2.0, 2.0, 1.0]])
    k = torch.tensor([2], dtype=torch.int32)
    for theirs in (apply_top_k_top_p_pytorch(logits.clone(), k, None), apply_top_k_only(logits.clone(), k)):
        assert torch.isfinite(theirs).tolist() == [[True, True, True, False]]
    assert torch.isfinite(serving_semantics(logits, top_k=2).filtered).tolist() == [[True, True, True, False]]


def test_greedy_ties_agree():
    """Greedy ties: vLLM's argmax (torch's, on this platform) and the reference take the lowest id."""
    case = make_case(51, batch=2, greedy_rows=(0, 1))
    logits = torch.full((2, PADDED), -5.0)
    logits[0, [7, 3, 250]] = 2.0
    logits[1, [299, 11]] = 4.0
    logits[:, VOCAB:] = 50.0
    case = case._replace(logits=logits, allowed=torch.ones(2, VOCAB, dtype=torch.bool),
                         bias=SparseLogits(torch.full((2, 1), -1), torch.zeros(2, 1)),
                         penalties=case.penalties._replace(repetition=torch.ones(2), frequency=torch.zeros(2),
                                                           presence=torch.zeros(2)))
    res = Sampler()(case.logits[:, :VOCAB].clone(), vllm_metadata(case))
    assert res.sampled_token_ids[:, 0].tolist() == [3, 11]
    assert serving_semantics(case.logits, **case.params).tokens.tolist() == [3, 11]


def test_difference_sampling_params_temperature_floor():
    """SamplingParams raises 0 < T < 0.01 to 0.01 (so only T == 0 is greedy through vLLM's API);
    the reference, like vLLM's Sampler, takes the row's T as given and is greedy below 1e-5."""
    assert SamplingParams(temperature=5e-6).temperature == 0.01
    assert SamplingParams(temperature=0.005).temperature == 0.01
    assert SamplingParams(temperature=0.0).temperature == 0.0
    logits = torch.tensor([[0.0, 1.0]])
    assert serving_semantics(logits, temperature=5e-6).greedy.tolist() == [True]
    assert serving_semantics(logits, temperature=0.005).greedy.tolist() == [False]
