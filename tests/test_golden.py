"""fsdist.sample still returns the recorded tokens and logprobs (see golden_cases.py)."""
import json

import pytest
import torch

from golden_cases import GOLDEN, compare, run_all


@pytest.mark.skipif(torch.cuda.is_available(), reason="recorded under Triton's interpreter (CPU)")
def test_recorded_tokens_and_logprobs_are_unchanged():
    diffs = compare(run_all(), json.loads(GOLDEN.read_text()), exact=False)
    assert not diffs, "\n".join(diffs[:20])


def test_comparison_catches_a_changed_token():
    """The check itself can fail: one token moved, one logprob off by 1e-4."""
    want = {"case": {"tokens": [1, 2], "logprobs": [(-1.0).hex(), (-2.0).hex()], "logsumexp": None}}
    got = {"case": {"tokens": [1, 3], "logprobs": [(-1.0).hex(), (-2.0001).hex()], "logsumexp": None}}
    diffs = compare(got, want, exact=False)
    assert any("tokens" in d for d in diffs) and any("logprobs[1]" in d for d in diffs)
