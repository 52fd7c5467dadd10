"""Plain PyTorch references: the noise mirror, materialize-then-sample baselines, semantics.

* ``noise``     -- the Philox / Gumbel noise of ``fsdist.ops.noise``, bit for bit, in torch;
* ``baselines`` -- materialize logits, then sample (the baseline every benchmark compares to
  and the oracle of the tests).
"""
from .baselines import materialize_logits, reference_gumbel, reference_sample
from .noise import (gumbel_from_bits, gumbel_noise, philox_uniform_bits, philox_words, vocab_gumbel,
                    vocab_uniform_bits)

__all__ = ["materialize_logits", "reference_gumbel", "reference_sample", "gumbel_from_bits", "gumbel_noise",
           "philox_uniform_bits", "philox_words", "vocab_gumbel", "vocab_uniform_bits"]
