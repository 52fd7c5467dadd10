"""The float64 serving-semantics reference, checked on small hand-computed cases.

Each stage (bitmask, logit bias, penalties, temperature, min-p, top-k, top-p), the order
of the stages, ties, greedy rows, padding ids, rows without a distribution, the logprobs
modes, top-N ordering and the argument checks. CPU only, plain torch, a few seconds.
"""
import math

import pytest
import torch

from fsdist.reference.semantics import (GREEDY_EPS, Penalties, SparseLogits, allowed_from_bitmask,
                                        bitmask_from_allowed, bitmask_words, filtered_distribution,
                                        process_logits, reference_filtered_sample, reference_logprobs,
                                        reference_top_logprobs, serving_semantics)
from statcheck import P_MIN, chi2_gof

INF = float("inf")


def t64(*rows):
    return torch.tensor(rows, dtype=torch.float64)


def logits_of(*probs_rows):
    """Logits whose softmax is exactly the given probabilities (up to float64 rounding)."""
    return t64(*probs_rows).log()


def kept(logits, **params):
    """The ids each row keeps after the filters, as sorted Python lists."""
    f = serving_semantics(logits, **params).filtered
    return [torch.nonzero(torch.isfinite(row)).flatten().tolist() for row in f]


# --------------------------------------------------------------------------------------------
# Token bitmask
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("vocab", [1, 5, 31, 32, 33, 64, 100])
def test_bitmask_round_trip(vocab):
    g = torch.Generator().manual_seed(vocab)
    allowed = torch.rand(3, vocab, generator=g) < 0.5
    allowed[0] = True
    bm = bitmask_from_allowed(allowed)
    assert bm.dtype == torch.int32 and bm.shape == (3, bitmask_words(vocab)) == (3, math.ceil(vocab / 32))
    assert torch.equal(allowed_from_bitmask(bm, vocab), allowed)


def test_bitmask_layout_is_xgrammars():
    allowed = torch.zeros(4, 40, dtype=torch.bool)
    allowed[0, 0] = True    # bit 0 of word 0
    allowed[1, 31] = True   # bit 31 of word 0: the int32 sign bit
    allowed[2, 32] = True   # bit 0 of word 1
    allowed[3, :] = True    # bits 40..63 (past the vocabulary) stay clear
    bm = bitmask_from_allowed(allowed)
    assert bm.tolist() == [[1, 0], [-(2**31), 0], [0, 1], [-1, 2**8 - 1]]
    # An all-ones word, as xgrammar allocates it, allows all 32 ids.
    assert allowed_from_bitmask(torch.full((1, 2), -1, dtype=torch.int32), 40).all()


def test_bitmask_masks_to_minus_inf():
    logits = t64([1.0, 2.0, 3.0, 4.0])
    bm = bitmask_from_allowed(torch.tensor([[True, False, True, False]]))
    assert process_logits(logits, token_bitmask=bm).tolist() == [[1.0, -INF, 3.0, -INF]]
    probs = filtered_distribution(logits, token_bitmask=bm)
    assert probs[0, 1] == 0 and probs[0, 3] == 0
    torch.testing.assert_close(probs[0, 2] / probs[0, 0], torch.tensor(math.e**2, dtype=torch.float64))


def test_bitmask_sized_for_true_or_padded_vocab():
    logits = torch.zeros(1, 70, dtype=torch.float64)
    allowed = torch.zeros(1, 70, dtype=torch.bool)
    allowed[0, 3] = True
    for bm in (bitmask_from_allowed(allowed[:, :40]), bitmask_from_allowed(allowed)):  # 2 or 3 words
        probs = filtered_distribution(logits, vocab_size=40, token_bitmask=bm)
        assert probs[0, 3] == 1.0 and probs.sum() == 1.0


# --------------------------------------------------------------------------------------------
# Logit bias
# --------------------------------------------------------------------------------------------

def test_logit_bias_adds_skips_empty_slots_and_sums_duplicates():
    logits = t64([0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0])
    bias = SparseLogits(torch.tensor([[2, -1, 2], [0, 3, -1]]), torch.tensor([[1.5, 9.0, 0.25], [-1.0, 2.0, 7.0]]))
    assert process_logits(logits, logit_bias=bias).tolist() == [[0.0, 0.0, 1.75, 0.0], [0.0, 1.0, 1.0, 3.0]]


def test_bias_on_a_masked_id_stays_minus_inf():
    logits = t64([0.0, 0.0, 0.0])
    bm = bitmask_from_allowed(torch.tensor([[True, False, True]]))
    bias = SparseLogits(torch.tensor([[1]]), torch.tensor([[100.0]]))
    out = process_logits(logits, token_bitmask=bm, logit_bias=bias)
    assert out.tolist() == [[0.0, -INF, 0.0]]
    assert filtered_distribution(logits, token_bitmask=bm, logit_bias=bias)[0, 1] == 0


def test_bias_applies_before_penalties():
    # bias 1 then repetition 2: (0 + 1) / 2 = 0.5; the other order would give 0 * 2 + 1 = 1.
    out = process_logits(t64([0.0, 0.0]), logit_bias=SparseLogits(torch.tensor([[0]]), torch.tensor([[1.0]])),
                         penalties=Penalties(repetition=2.0, prompt_ids=torch.tensor([[0]])))
    assert out.tolist() == [[0.5, 0.0]]


# --------------------------------------------------------------------------------------------
# Penalties
# --------------------------------------------------------------------------------------------

def test_penalties_hand_computed():
    logits = t64([2.0, -1.0, 0.0, 3.0, 1.0])
    pen = Penalties(repetition=2.0, frequency=0.5, presence=0.25,
                    output_ids=torch.tensor([[2, 2, -1, 3]]), prompt_ids=torch.tensor([[0, 1, -1]]))
    # id 0: prompt, positive: 2 / 2 = 1          id 1: prompt, negative: -1 * 2 = -2
    # id 2: output twice, zero: 0 * 2 - 0.5 * 2 - 0.25 = -1.25
    # id 3: output once, positive: 3 / 2 - 0.5 - 0.25 = 0.75        id 4: untouched
    assert process_logits(logits, penalties=pen).tolist() == [[1.0, -2.0, -1.25, 0.75, 1.0]]


def test_repetition_on_negative_zero_positive_and_masked_logits():
    logits = t64([-2.0, 0.0, 2.0, -0.0, 5.0])
    bm = bitmask_from_allowed(torch.tensor([[True, True, True, True, False]]))
    seen = torch.tensor([[0, 1, 2, 3, 4]])
    for rep, want in ((2.0, [-4.0, 0.0, 1.0, 0.0, -INF]), (0.5, [-1.0, 0.0, 4.0, 0.0, -INF])):
        out = process_logits(logits, token_bitmask=bm, penalties=Penalties(repetition=rep, prompt_ids=seen))
        assert out.tolist() == [want]
        # Zero is "not positive": multiplied, so it stays exactly zero whatever the penalty.
        assert out[0, 1] == 0 and out[0, 3] == 0


def test_repetition_applies_once_for_an_id_in_prompt_and_output():
    pen = Penalties(repetition=2.0, output_ids=torch.tensor([[0, 0, 0]]), prompt_ids=torch.tensor([[0, 0]]))
    assert process_logits(t64([8.0, 1.0]), penalties=pen).tolist() == [[4.0, 1.0]]


def test_frequency_and_presence_read_output_only_and_can_be_negative():
    pen = Penalties(frequency=-1.0, presence=0.5, output_ids=torch.tensor([[1, 1, 1]]),
                    prompt_ids=torch.tensor([[0]]))
    assert process_logits(t64([0.0, 0.0]), penalties=pen).tolist() == [[0.0, 2.5]]


def test_penalties_per_row():
    logits = t64([1.0, 1.0], [1.0, 1.0])
    pen = Penalties(repetition=torch.tensor([1.0, 4.0]), frequency=torch.tensor([0.0, 0.125]), presence=0.0,
                    output_ids=torch.tensor([[1, -1], [1, 1]]))
    assert process_logits(logits, penalties=pen).tolist() == [[1.0, 1.0], [1.0, 0.0]]


# --------------------------------------------------------------------------------------------
# Temperature, min-p, top-k, top-p
# --------------------------------------------------------------------------------------------

def test_temperature_divides_processed_logits():
    sem = serving_semantics(t64([1.0, 2.0, 4.0]), temperature=0.5)
    assert sem.scaled.tolist() == [[2.0, 4.0, 8.0]]
    torch.testing.assert_close(sem.probs, torch.softmax(t64([2.0, 4.0, 8.0]), dim=1))


def test_min_p_keeps_p_at_least_min_p_times_p_max():
    logits = logits_of([0.5, 0.25, 0.15, 0.1])
    assert kept(logits, min_p=0.29) == [[0, 1, 2]]   # threshold 0.145
    assert kept(logits, min_p=0.31) == [[0, 1]]      # threshold 0.155
    assert kept(logits, min_p=1.0) == [[0]]
    assert kept(logits, min_p=0.0) == [[0, 1, 2, 3]]
    torch.testing.assert_close(filtered_distribution(logits, min_p=0.31), t64([2 / 3, 1 / 3, 0, 0]))


def test_min_p_applies_after_temperature():
    # T = 2 takes square roots of the ratios to p_max: 0.1 / 0.5 = 0.2 becomes 0.447 >= 0.31.
    assert kept(logits_of([0.5, 0.25, 0.15, 0.1]), min_p=0.31, temperature=2.0) == [[0, 1, 2, 3]]


def test_min_p_keeps_ties_with_the_max():
    assert kept(t64([1.0, 3.0, 3.0, 2.9]), min_p=1.0) == [[1, 2]]


def test_top_k_basic_and_off_values():
    logits = t64([1.0, 5.0, 2.0, 4.0, 0.0])
    assert kept(logits, top_k=1) == [[1]]
    assert kept(logits, top_k=3) == [[1, 2, 3]]
    for off in (0, 5, 6, 1000):
        assert kept(logits, top_k=off) == [[0, 1, 2, 3, 4]]


def test_top_k_keeps_every_tie_at_the_kth_value():
    # k = 2: the 2nd largest value is 2, and both ids holding it stay (3 ids survive).
    assert kept(t64([3.0, 2.0, 2.0, 1.0]), top_k=2) == [[0, 1, 2]]
    assert kept(t64([2.0, 2.0, 2.0, 1.0]), top_k=1) == [[0, 1, 2]]


def test_top_p_keeps_ids_whose_strictly_higher_mass_is_below_p():
    logits = logits_of([0.4, 0.3, 0.2, 0.1])  # masses strictly above: 0, 0.4, 0.7, 0.9
    assert kept(logits, top_p=0.35) == [[0]]
    assert kept(logits, top_p=0.65) == [[0, 1]]
    assert kept(logits, top_p=0.75) == [[0, 1, 2]]
    assert kept(logits, top_p=0.95) == [[0, 1, 2, 3]]
    assert kept(logits, top_p=1e-12) == [[0]]   # the most likely id always stays
    torch.testing.assert_close(filtered_distribution(logits, top_p=0.65), t64([4 / 7, 3 / 7, 0, 0]))


def test_top_p_boundary_is_strict():
    # Dyadic probabilities make the masses exact: mass above id 2 is exactly 0.75.
    logits = logits_of([0.5, 0.25, 0.125, 0.125])
    assert kept(logits, top_p=0.75) == [[0, 1]]
    assert kept(logits, top_p=0.75 + 1e-12) == [[0, 1, 2, 3]]


def test_top_p_keeps_a_whole_tie_group():
    # The three 0.2 ids have mass 0.4 strictly above them, < 0.5: all three stay. (vLLM's
    # sort-based rule keeps only one of them, the first in its unstable sort order.)
    assert kept(logits_of([0.4, 0.2, 0.2, 0.2]), top_p=0.5) == [[0, 1, 2, 3]]
    assert kept(logits_of([0.4, 0.2, 0.2, 0.2]), top_p=0.4) == [[0]]
    assert kept(t64([1.0, 1.0, 0.0]), top_p=1e-9) == [[0, 1]]  # tied maxima always stay together


def test_top_p_one_is_off_even_for_underflowing_tails():
    # mass above id 1 is 1 - 1e-304, which rounds to exactly 1.0: p = 1 must still keep it.
    logits = t64([0.0, -700.0])
    assert kept(logits, top_p=1.0) == [[0, 1]]
    assert filtered_distribution(logits)[0, 1] > 0
    assert kept(logits, top_p=0.999999) == [[0]]


# --------------------------------------------------------------------------------------------
# Order of the stages
# --------------------------------------------------------------------------------------------

def test_top_p_is_renormalised_after_top_k():
    # top-k 2 keeps 0.35 and 0.3, renormalised to 0.538 and 0.462: the mass above id 1 is
    # then 0.538 >= 0.5 and id 1 goes. On the unrenormalised probabilities it would be 0.35.
    logits = logits_of([0.35, 0.3, 0.2, 0.15])
    assert kept(logits, top_k=2, top_p=0.5) == [[0]]
    assert kept(logits, top_p=0.5) == [[0, 1]]


def test_top_p_is_renormalised_after_min_p():
    # min-p 0.6 keeps 0.4 and 0.3 (threshold 0.24); renormalised 4/7, 3/7; top-p 0.5 keeps
    # only id 0. top-p first would keep {0, 1} and min-p would leave it so.
    logits = logits_of([0.4, 0.3, 0.2, 0.1])
    assert kept(logits, min_p=0.6, top_p=0.5) == [[0]]
    assert kept(logits, top_p=0.5) == [[0, 1]] and kept(logits, min_p=0.6) == [[0, 1]]


def test_min_p_and_top_k_commute():
    # Both keep an upper set of the logits, and min-p only reads the ratio to the maximum,
    # which top-k never removes: the survivors are the same in either order.
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        s = (torch.randn(1, 30, generator=g, dtype=torch.float64) * 2).round(decimals=1)  # many ties
        k = int(torch.randint(1, 31, (1,), generator=g))
        m = float(torch.rand(1, generator=g, dtype=torch.float64))
        by_k = s >= s.sort(descending=True).values[:, k - 1:k]
        by_m = torch.exp(s - s.max()) >= m
        ours = torch.isfinite(serving_semantics(s, top_k=k, min_p=m).filtered)
        assert torch.equal(ours, by_k & by_m)


def test_penalties_come_before_temperature_and_filters():
    # Repetition makes id 0 (logit 4) fall to 1 < 3: top-k 1 then keeps id 1.
    pen = Penalties(repetition=4.0, output_ids=torch.tensor([[0]]))
    assert kept(t64([4.0, 3.0]), penalties=pen, top_k=1, temperature=0.7) == [[1]]


def test_worked_example_of_docs_semantics_md():
    logits = t64([2.0, 1.5, 1.0, 0.5, 0.0, -1.0, 9.0, 9.0])
    bm = bitmask_from_allowed(torch.tensor([[True, True, True, False, True, True]]))
    assert bm.tolist() == [[55]]
    params = dict(vocab_size=6, token_bitmask=bm, logit_bias=SparseLogits(torch.tensor([[4]]), torch.tensor([[1.0]])),
                  penalties=Penalties(repetition=2.0, frequency=0.25, presence=0.5, output_ids=torch.tensor([[2, 2]]),
                                      prompt_ids=torch.tensor([[0, -1]])),
                  temperature=0.5, min_p=0.01, top_k=2, top_p=0.7)
    sem = serving_semantics(logits, **params)
    assert sem.processed.tolist() == [[1.0, 1.5, -0.5, -INF, 1.0, -1.0, -INF, -INF]]
    assert sem.scaled.tolist() == [[2.0, 3.0, -1.0, -INF, 2.0, -2.0, -INF, -INF]]
    assert kept(logits, **params) == [[0, 1, 4]]
    e = math.e
    torch.testing.assert_close(sem.probs, t64([1 / (2 + e), e / (2 + e), 0, 0, 1 / (2 + e), 0, 0, 0]))
    assert kept(logits, **dict(params, top_p=0.5)) == [[1]]
    assert serving_semantics(logits, **dict(params, temperature=0.0)).tokens.tolist() == [1]
    ids, vals = reference_top_logprobs(logits, 3, mode="scaled", **params)
    assert ids.tolist() == [[1, 0, 4]]
    torch.testing.assert_close(vals, t64([-0.5658, -1.5658, -1.5658]), atol=1e-4, rtol=0)


# --------------------------------------------------------------------------------------------
# Greedy rows
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_greedy_epsilon(dtype):
    logits = t64([0.0, 1.0, 0.5]).expand(4, 3)
    sem = serving_semantics(logits, temperature=torch.tensor([0.0, 0.5 * GREEDY_EPS, GREEDY_EPS, 1.0], dtype=dtype))
    assert sem.greedy.tolist() == [True, True, False, False]
    assert sem.tokens.tolist() == [1, 1, -1, -1]
    assert sem.probs[0].tolist() == [0.0, 1.0, 0.0] and sem.probs[1].tolist() == [0.0, 1.0, 0.0]
    assert sem.scaled[1].tolist() == [0.0, 1.0, 0.5]  # T = 1 for greedy rows
    # As scalars: compared in float64.
    assert serving_semantics(logits[:1], temperature=GREEDY_EPS).greedy.tolist() == [False]
    assert serving_semantics(logits[:1], temperature=math.nextafter(GREEDY_EPS, 0)).greedy.tolist() == [True]
    # float32(1e-5) is below the float64 1e-5: compared in float32 (as vLLM's sampler does) it is not greedy.
    assert float(torch.tensor(GREEDY_EPS, dtype=torch.float32)) < GREEDY_EPS


def test_greedy_follows_bitmask_bias_and_penalties_and_ignores_filters():
    logits = t64([5.0, 4.0, 3.0, 2.0])
    bm = bitmask_from_allowed(torch.tensor([[False, True, True, True]]))
    bias = SparseLogits(torch.tensor([[2]]), torch.tensor([[0.5]]))
    pen = Penalties(repetition=2.0, prompt_ids=torch.tensor([[2]]))  # id 2: (3 + 0.5) / 2 = 1.75
    params = dict(temperature=0.0, token_bitmask=bm, logit_bias=bias, penalties=pen)
    assert reference_filtered_sample(logits, **params).tolist() == [1]
    # min-p / top-k / top-p do not apply to a greedy row: its processed logprobs are its scaled ones.
    filt = dict(params, top_k=1, top_p=0.01, min_p=1.0)
    sem = serving_semantics(logits, **filt)
    assert sem.tokens.tolist() == [1] and torch.equal(sem.filtered, sem.scaled)
    ids = torch.tensor([[1, 2, 3]])
    torch.testing.assert_close(reference_logprobs(logits, ids, mode="processed", **filt),
                               reference_logprobs(logits, ids, mode="scaled", **filt))


def test_greedy_ties_go_to_the_lowest_id():
    logits = t64([1.0, 3.0, 2.0, 3.0], [7.0, 7.0, 7.0, 7.0])
    assert reference_filtered_sample(logits, temperature=0.0).tolist() == [1, 0]


# --------------------------------------------------------------------------------------------
# Padding and rows without a distribution
# --------------------------------------------------------------------------------------------

def test_padding_ids_are_never_sampled_nor_listed():
    logits = t64([0.0, 1.0, 100.0, 100.0])  # ids 2 and 3 are padding columns
    sem = serving_semantics(logits, vocab_size=2)
    assert sem.probs[0, 2:].tolist() == [0.0, 0.0] and torch.isneginf(sem.raw[0, 2:]).all()
    assert reference_filtered_sample(logits, vocab_size=2, temperature=0.0).tolist() == [1]
    for mode in ("raw", "scaled", "processed"):
        lp = reference_logprobs(logits, torch.tensor([[0, 1, 2, 3]]), mode=mode, vocab_size=2)
        assert torch.isneginf(lp[0, 2:]).all() and torch.isfinite(lp[0, :2]).all()
    ids, _ = reference_top_logprobs(logits, 2, vocab_size=2)
    assert ids.tolist() == [[1, 0]]
    with pytest.raises(ValueError, match="top_logprobs"):
        reference_top_logprobs(logits, 3, vocab_size=2)
    g = torch.Generator().manual_seed(1)
    draws = reference_filtered_sample(logits.expand(2000, 4), vocab_size=2, generator=g)
    assert set(draws.tolist()) == {0, 1}


def test_nan_in_a_padding_column_is_ignored():
    sem = serving_semantics(t64([0.0, 0.0, float("nan")]), vocab_size=2)
    assert sem.valid.tolist() == [True] and sem.probs[0].tolist() == [0.5, 0.5, 0.0]


def test_rows_without_a_distribution():
    logits = t64([0.0, 1.0, 2.0], [0.0, float("nan"), 2.0], [0.0, INF, 2.0], [-INF, -INF, -INF],
                 [0.0, float("nan"), 2.0], [1.0, 2.0, 3.0])
    allowed = torch.ones(6, 3, dtype=torch.bool)
    allowed[0] = False                    # the mask allows nothing
    allowed[4, 1] = False                 # a NaN logit counts even where the mask forbids the id
    params = dict(token_bitmask=bitmask_from_allowed(allowed), temperature=torch.tensor([1.0, 1, 0, 1, 1, 0]))
    sem = serving_semantics(logits, **params)
    assert sem.valid.tolist() == [False] * 5 + [True]
    assert torch.isnan(sem.probs[:5]).all() and sem.probs[5].tolist() == [0.0, 0.0, 1.0]
    assert reference_filtered_sample(logits, **params).tolist() == [-1] * 5 + [2]
    for mode in ("raw", "scaled", "processed"):
        lp = reference_logprobs(logits, torch.tensor([0, 0, 0, 0, 0, 2]), mode=mode, **params)
        assert torch.isnan(lp[:5]).all()
        assert lp[5] == torch.log_softmax(logits[5], dim=0)[2]  # greedy row: every mode is log_softmax
        ids, vals = reference_top_logprobs(logits, 2, mode=mode, **params)
        assert (ids[:5] == -1).all() and torch.isnan(vals[:5]).all() and ids[5].tolist() == [2, 1]


# --------------------------------------------------------------------------------------------
# Per-row parameters
# --------------------------------------------------------------------------------------------

def test_mixed_per_row_parameters_match_rows_alone():
    g = torch.Generator().manual_seed(3)
    batch, vocab = 6, 50
    logits = torch.randn(batch, vocab, generator=g, dtype=torch.float32) * 3
    rows = dict(temperature=torch.tensor([0.0, 0.7, 1.0, 1.3, 2.0, 0.9]),
                top_k=torch.tensor([0, 5, 1, 50, 10, 3], dtype=torch.int32),
                top_p=torch.tensor([1.0, 0.9, 0.5, 0.3, 1.0, 0.8]),
                min_p=torch.tensor([0.0, 0.05, 0.0, 0.2, 0.5, 0.0]))
    allowed = torch.rand(batch, vocab, generator=g) < 0.8
    allowed[:, 0] = True
    bias = SparseLogits(torch.randint(-1, vocab, (batch, 4), generator=g), torch.randn(batch, 4, generator=g))
    pen = Penalties(repetition=torch.tensor([1.0, 1.2, 0.8, 1.5, 1.0, 2.0]),
                    frequency=torch.tensor([0.0, 0.5, -0.5, 1.0, 0.0, 0.2]),
                    presence=torch.tensor([0.0, 0.1, 0.0, 0.5, 0.0, -0.2]),
                    output_ids=torch.randint(-1, vocab, (batch, 8), generator=g),
                    prompt_ids=torch.randint(-1, vocab, (batch, 5), generator=g))
    full = serving_semantics(logits, token_bitmask=bitmask_from_allowed(allowed), logit_bias=bias, penalties=pen,
                             **rows)
    for b in range(batch):
        alone = serving_semantics(
            logits[b:b + 1], token_bitmask=bitmask_from_allowed(allowed[b:b + 1]),
            logit_bias=SparseLogits(bias.ids[b:b + 1], bias.values[b:b + 1]),
            penalties=Penalties(*(float(x[b]) for x in pen[:3]), pen.output_ids[b:b + 1], pen.prompt_ids[b:b + 1]),
            **{k: (int(v[b]) if k == "top_k" else float(v[b])) for k, v in rows.items()})
        for name in ("processed", "scaled", "filtered", "probs"):
            assert torch.equal(getattr(full, name)[b], getattr(alone, name)[0]), (b, name)
        assert full.tokens[b] == alone.tokens[0]


def test_input_dtypes_give_float64():
    for dtype in (torch.bfloat16, torch.float16, torch.float32, torch.float64):
        sem = serving_semantics(torch.tensor([[1.0, 2.0]], dtype=dtype), temperature=0.5)
        assert sem.probs.dtype == sem.processed.dtype == torch.float64


# --------------------------------------------------------------------------------------------
# Logprobs modes and top-N
# --------------------------------------------------------------------------------------------

def test_logprobs_modes_hand_computed():
    logits = logits_of([0.5, 0.3, 0.2])
    ids = torch.tensor([[0, 1, 2]])
    bias = SparseLogits(torch.tensor([[2]]), torch.tensor([[math.log(2.0)]]))  # 0.2 -> 0.4 before renorm
    params = dict(top_k=2, logit_bias=bias)
    raw = reference_logprobs(logits, ids, mode="raw", **params)
    scaled = reference_logprobs(logits, ids, mode="scaled", **params)
    processed = reference_logprobs(logits, ids, mode="processed", **params)
    torch.testing.assert_close(raw, t64([0.5, 0.3, 0.2]).log())                    # nothing applied
    torch.testing.assert_close(scaled, t64([0.5 / 1.2, 0.3 / 1.2, 0.4 / 1.2]).log())  # bias, no top-k
    torch.testing.assert_close(processed, t64([0.5 / 0.9, 0.0, 0.4 / 0.9]).log())  # top-k 2 keeps 0 and 2
    t = reference_logprobs(logits, ids, mode="scaled", temperature=2.0)
    torch.testing.assert_close(t, torch.log_softmax(logits / 2, dim=1))


def test_processed_logprobs_are_the_log_of_the_final_distribution():
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(4, 40, generator=g, dtype=torch.float64)
    params = dict(temperature=0.8, top_k=torch.tensor([0, 7, 3, 40]), top_p=0.85, min_p=0.1)
    ids = torch.arange(40).expand(4, 40)
    torch.testing.assert_close(reference_logprobs(logits, ids, mode="processed", **params),
                               filtered_distribution(logits, **params).log())


def test_logprobs_of_one_token_per_row_and_of_no_token():
    logits = logits_of([0.5, 0.5], [0.25, 0.75])
    lp = reference_logprobs(logits, torch.tensor([1, -1]), mode="raw")
    assert lp[0] == math.log(0.5) and math.isnan(lp[1])


def test_top_logprobs_order_and_ties():
    logits = t64([1.0, 3.0, 2.0, 3.0, 2.0, -INF])
    ids, vals = reference_top_logprobs(logits, 6, mode="raw")
    assert ids.tolist() == [[1, 3, 2, 4, 0, 5]]            # most likely first, ties: lower id first
    torch.testing.assert_close(vals, torch.log_softmax(logits, dim=1)[:, [1, 3, 2, 4, 0, 5]])
    ids, vals = reference_top_logprobs(logits, 4, mode="processed", top_k=1)
    assert ids.tolist() == [[1, 3, 2, 4]]                  # dropped ids (-inf) after the kept ones, by logit
    assert vals[0, :2].tolist() == [math.log(0.5)] * 2 and torch.isneginf(vals[0, 2:]).all()
    ids, vals = reference_top_logprobs(logits, 0)
    assert ids.shape == (1, 0) and vals.shape == (1, 0) and ids.dtype == torch.int64


def test_top_logprobs_modes_differ_as_documented():
    logits = t64([0.0, 1.0, 2.0])
    bias = SparseLogits(torch.tensor([[0]]), torch.tensor([[5.0]]))
    assert reference_top_logprobs(logits, 1, mode="raw", logit_bias=bias)[0].tolist() == [[2]]
    assert reference_top_logprobs(logits, 1, mode="scaled", logit_bias=bias)[0].tolist() == [[0]]


# --------------------------------------------------------------------------------------------
# The sampler
# --------------------------------------------------------------------------------------------

def test_sampler_follows_the_final_distribution():
    logits = logits_of([0.3, 0.25, 0.2, 0.15, 0.1])
    params = dict(temperature=0.9, top_k=4, top_p=0.8)
    probs = filtered_distribution(logits, **params)[0]
    g = torch.Generator().manual_seed(7)
    draws = reference_filtered_sample(logits.expand(20000, 5), generator=g, **params)
    assert (probs[draws] > 0).all()
    assert chi2_gof(draws, probs)[0] > P_MIN


# --------------------------------------------------------------------------------------------
# Argument checks
# --------------------------------------------------------------------------------------------

_L = torch.zeros(2, 40)


@pytest.mark.parametrize("call, error, match", [
    (lambda: serving_semantics(torch.zeros(3)), ValueError, "logits must be 2-D"),
    (lambda: serving_semantics(torch.zeros(2, 3, dtype=torch.int64)), TypeError, "logits must be a floating"),
    (lambda: serving_semantics(_L, vocab_size=41), ValueError, "vocab_size"),
    (lambda: serving_semantics(_L, vocab_size=0), ValueError, "vocab_size"),
    (lambda: serving_semantics(_L, temperature=-0.1), ValueError, "temperature"),
    (lambda: serving_semantics(_L, temperature=float("nan")), ValueError, "temperature"),
    (lambda: serving_semantics(_L, temperature=torch.tensor([1.0, float("nan")])), ValueError, "temperature"),
    (lambda: serving_semantics(_L, temperature=INF), ValueError, "temperature"),
    (lambda: serving_semantics(_L, temperature=torch.ones(3)), ValueError, r"temperature must be a scalar or a \[2\]"),
    (lambda: serving_semantics(_L, top_p=0.0), ValueError, "top_p"),
    (lambda: serving_semantics(_L, top_p=1.5), ValueError, "top_p"),
    (lambda: serving_semantics(_L, top_p=float("nan")), ValueError, "top_p"),
    (lambda: serving_semantics(_L, min_p=-0.1), ValueError, "min_p"),
    (lambda: serving_semantics(_L, min_p=1.1), ValueError, "min_p"),
    (lambda: serving_semantics(_L, min_p=torch.tensor([0.1, float("nan")])), ValueError, "min_p"),
    (lambda: serving_semantics(_L, top_k=-1), ValueError, "top_k"),
    (lambda: serving_semantics(_L, top_k=2.5), TypeError, "top_k"),
    (lambda: serving_semantics(_L, top_k=torch.tensor([1.0, 2.0])), TypeError, "top_k"),
    (lambda: serving_semantics(_L, top_k=True), TypeError, "top_k"),
    (lambda: serving_semantics(_L, token_bitmask=torch.zeros(2, 2, dtype=torch.int64)), TypeError, "token_bitmask"),
    (lambda: serving_semantics(_L, token_bitmask=torch.zeros(2, 3, dtype=torch.int32)), ValueError, "token_bitmask"),
    (lambda: serving_semantics(_L, token_bitmask=torch.zeros(1, 2, dtype=torch.int32)), ValueError, "token_bitmask"),
    (lambda: serving_semantics(_L, logit_bias=SparseLogits(torch.tensor([[40], [0]]), torch.ones(2, 1))),
     ValueError, "logit_bias.ids holds id 40"),
    (lambda: serving_semantics(_L, vocab_size=30, logit_bias=SparseLogits(torch.tensor([[30], [0]]), torch.ones(2, 1))),
     ValueError, "logit_bias.ids"),
    (lambda: serving_semantics(_L, logit_bias=SparseLogits(torch.tensor([[-2], [0]]), torch.ones(2, 1))),
     ValueError, "logit_bias.ids"),
    (lambda: serving_semantics(_L, logit_bias=SparseLogits(torch.tensor([[1], [0]], dtype=torch.int32),
                                                           torch.ones(2, 1))), TypeError, "logit_bias.ids"),
    (lambda: serving_semantics(_L, logit_bias=SparseLogits(torch.tensor([[1], [0]]), torch.ones(2, 2))),
     ValueError, "logit_bias.values"),
    (lambda: serving_semantics(_L, logit_bias=SparseLogits(torch.tensor([[1], [0]]), torch.tensor([[1.0], [INF]]))),
     ValueError, "logit_bias.values"),
    (lambda: serving_semantics(_L, logit_bias=SparseLogits(torch.tensor([[1]]), torch.ones(1, 1))),
     ValueError, "logit_bias.ids"),
    (lambda: serving_semantics(_L, logit_bias={1: 2.0}), TypeError, "logit_bias"),
    (lambda: serving_semantics(_L, penalties=Penalties(repetition=0.0)), ValueError, "repetition"),
    (lambda: serving_semantics(_L, penalties=Penalties(repetition=float("nan"))), ValueError, "repetition"),
    (lambda: serving_semantics(_L, penalties=Penalties(frequency=torch.tensor([0.0, float("nan")]))),
     ValueError, "frequency"),
    (lambda: serving_semantics(_L, penalties=Penalties(presence=INF)), ValueError, "presence"),
    (lambda: serving_semantics(_L, penalties=Penalties(output_ids=torch.tensor([[40], [1]]))),
     ValueError, "output_ids"),
    (lambda: serving_semantics(_L, penalties=Penalties(prompt_ids=torch.tensor([[0, 1]]))), ValueError, "prompt_ids"),
    (lambda: serving_semantics(_L, penalties=Penalties(prompt_ids=[[0], [1]])), TypeError, "prompt_ids"),
    (lambda: serving_semantics(_L, penalties=(1.0, 0.0, 0.0)), TypeError, "penalties"),
    (lambda: reference_logprobs(_L, torch.tensor([0, 40])), ValueError, "token_ids"),
    (lambda: reference_logprobs(_L, torch.tensor([0, 1]), mode="logits"), ValueError, "mode"),
    (lambda: reference_logprobs(_L, torch.tensor([0])), ValueError, "token_ids"),
    (lambda: reference_top_logprobs(_L, 21), ValueError, "top_logprobs"),
    (lambda: reference_top_logprobs(_L, -1), ValueError, "top_logprobs"),
    (lambda: reference_top_logprobs(_L, 2, mode="lp"), ValueError, "mode"),
    (lambda: bitmask_from_allowed(torch.ones(2, 3)), TypeError, "allowed"),
    (lambda: allowed_from_bitmask(torch.ones(2, 1, dtype=torch.int32), 33), ValueError, "token_bitmask"),
])
def test_bad_inputs_raise_naming_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()
