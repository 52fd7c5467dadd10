"""Plain PyTorch references: the noise mirror, materialize-then-sample baselines, semantics.

* ``noise``     -- the Philox / Gumbel noise of ``fsdist.ops.noise``, bit for bit, in torch;
* ``baselines`` -- materialize logits, then sample (the baseline every benchmark compares to
  and the oracle of the tests);
* ``semantics`` -- serving parameters (bitmask, logit bias, penalties, temperature, min-p,
  top-k, top-p, logprobs modes) in vLLM V1's order, float64: the oracle of the fused filters.
"""
from .baselines import materialize_logits, reference_gumbel, reference_sample
from .noise import (gumbel_from_bits, gumbel_noise, philox_uniform_bits, philox_words, vocab_gumbel,
                    vocab_uniform_bits)
from .semantics import (GREEDY_EPS, LOGPROBS_MODES, MAX_TOP_LOGPROBS, Penalties, ServingSemantics, SparseLogits,
                        allowed_from_bitmask, bitmask_from_allowed, bitmask_words, filtered_distribution,
                        process_logits, reference_filtered_sample, reference_logprobs, reference_top_logprobs,
                        serving_semantics)

__all__ = ["materialize_logits", "reference_gumbel", "reference_sample", "gumbel_from_bits", "gumbel_noise",
           "philox_uniform_bits", "philox_words", "vocab_gumbel", "vocab_uniform_bits",
           "GREEDY_EPS", "LOGPROBS_MODES", "MAX_TOP_LOGPROBS", "Penalties", "ServingSemantics", "SparseLogits",
           "allowed_from_bitmask", "bitmask_from_allowed", "bitmask_words", "filtered_distribution",
           "process_logits", "reference_filtered_sample", "reference_logprobs", "reference_top_logprobs",
           "serving_semantics"]
