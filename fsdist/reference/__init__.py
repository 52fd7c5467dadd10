"""Plain PyTorch references: the noise mirror, materialize-then-sample baselines, semantics.

* ``noise``     -- the Philox / Gumbel noise of ``fsdist.ops.noise``, bit for bit, in torch;
* ``baselines`` -- materialize logits, then sample: the test oracles (``reference_sample``,
  ``reference_gumbel``) and the baselines every benchmark compares to
  (``matmul_multinomial``, ``matmul_gumbel_argmax``, the sort-based filtered samplers
  ``matmul_top_k_top_p`` and ``matmul_min_p``, their ``*_from_logits`` forms and
  ``compiled_sampler``), all with a real-number or a per-row ``[B]`` temperature (and filters);
* ``semantics`` -- serving parameters (bitmask, logit bias, penalties, temperature, min-p,
  top-k, top-p, logprobs modes) in vLLM V1's order, float64: the oracle of the fused filters;
  its logit processors live in ``processors``, its argument checks in ``arguments``.
"""
from .baselines import (FILTERED_SAMPLERS, MATERIALIZED_SAMPLERS, compiled_sampler, exponential_race,
                        gumbel_argmax_from_logits, materialize_logits, matmul_gumbel_argmax, matmul_min_p,
                        matmul_multinomial, matmul_top_k_top_p, matmul_top_k_top_p_eager_scan, min_p_filter,
                        eager_row_cumsum, min_p_from_logits,
                        multinomial_from_logits, reference_gumbel, reference_sample, sample_from_logits, scale_logits,
                        top_k_top_p_filter, top_k_top_p_from_logits)
from .noise import (gumbel_from_bits, gumbel_noise, philox_uniform_bits, philox_words, vocab_gumbel,
                    vocab_uniform_bits)
from .semantics import (GREEDY_EPS, LOGPROBS_MODES, MAX_TOP_LOGPROBS, Penalties, ServingSemantics, SparseLogits,
                        allowed_from_bitmask, bitmask_from_allowed, bitmask_words, filtered_distribution,
                        process_logits, reference_filtered_sample, reference_logprobs, reference_top_logprobs,
                        serving_semantics)

__all__ = ["FILTERED_SAMPLERS", "MATERIALIZED_SAMPLERS", "compiled_sampler", "exponential_race",
           "gumbel_argmax_from_logits", "materialize_logits", "matmul_gumbel_argmax", "matmul_min_p",
           "matmul_multinomial", "matmul_top_k_top_p", "min_p_filter", "min_p_from_logits",
           "multinomial_from_logits", "reference_gumbel", "reference_sample", "sample_from_logits", "scale_logits",
           "top_k_top_p_filter", "top_k_top_p_from_logits", "matmul_top_k_top_p_eager_scan", "eager_row_cumsum", "gumbel_from_bits", "gumbel_noise",
           "philox_uniform_bits", "philox_words", "vocab_gumbel", "vocab_uniform_bits",
           "GREEDY_EPS", "LOGPROBS_MODES", "MAX_TOP_LOGPROBS", "Penalties", "ServingSemantics", "SparseLogits",
           "allowed_from_bitmask", "bitmask_from_allowed", "bitmask_words", "filtered_distribution",
           "process_logits", "reference_filtered_sample", "reference_logprobs", "reference_top_logprobs",
           "serving_semantics"]
