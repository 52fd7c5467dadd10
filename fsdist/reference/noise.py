"""Torch mirror of fsdist's counter-based noise (``fsdist.ops.noise``), bit for bit.

Tests use it to check the kernels token by token, not only in distribution; the
materialized baselines in ``baselines.py`` draw the same noise through it.
"""
import torch

_M32 = 0xFFFFFFFF
_KEY_A, _KEY_B = 0x9E3779B9, 0xBB67AE85
_ROUND_A, _ROUND_B = 0xD2511F53, 0xCD9E8D57


def _mul32(a: int, b: torch.Tensor):
    """(hi, lo) 32-bit words of a * b for a constant a and b in [0, 2**32), in int64 without overflow."""
    a_lo, a_hi = a & 0xFFFF, a >> 16
    b_lo, b_hi = b & 0xFFFF, b >> 16
    lo_lo = a_lo * b_lo
    mid = a_hi * b_lo + a_lo * b_hi + (lo_lo >> 16)
    hi = a_hi * b_hi + (mid >> 16)
    lo = ((mid & 0xFFFF) << 16) | (lo_lo & 0xFFFF)
    return hi & _M32, lo & _M32


def philox_words(seed, offset, counter, stream: int = 0):
    """The four words of Philox-4x32-10 as fsdist.ops.noise.philox_words computes them.

    Each an int64 tensor with values in [0, 2**32).
    """
    stream = int(getattr(stream, "value", stream))  # accepts fsdist.ops.noise's tl.constexpr ids
    seed, offset, counter = (torch.as_tensor(x, dtype=torch.int64) for x in (seed, offset, counter))
    seed, offset, counter = torch.broadcast_tensors(seed, offset, counter)
    k0, k1 = seed & _M32, (seed >> 32) & _M32
    c0, c1, c2 = counter & _M32, offset & _M32, (offset >> 32) & _M32
    c3 = torch.full_like(c0, stream)
    for _ in range(10):
        hi_b, lo_b = _mul32(_ROUND_B, c2)
        hi_a, lo_a = _mul32(_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0, k1 = (k0 + _KEY_A) & _M32, (k1 + _KEY_B) & _M32
    return c0, c1, c2, c3


def philox_uniform_bits(seed, offset, counter, stream: int = 0) -> torch.Tensor:
    """Word 0 of Philox (fsdist.ops.noise.philox_bits): the noise of non-vocabulary uses."""
    return philox_words(seed, offset, counter, stream)[0]


def vocab_uniform_bits(seed, offset, vocab_id) -> torch.Tensor:
    """The sampler's bits for a vocabulary id: word id & 3 of counter id >> 2 (fsdist.ops.noise.vocab_bits)."""
    vocab_id = torch.as_tensor(vocab_id, dtype=torch.int64)
    words = torch.stack(torch.broadcast_tensors(*philox_words(seed, offset, vocab_id >> 2, 0)))
    lane = torch.broadcast_to(vocab_id & 3, words.shape[1:])
    return words.gather(0, lane[None]).squeeze(0)


def gumbel_from_bits(bits: torch.Tensor) -> torch.Tensor:
    """-log(-log(u)) in float64 for u = (bits + 0.5) / 2**32, as fsdist.ops.noise.gumbel_from_bits."""
    bits = bits.double()
    u = (bits + 0.5) / 2.0**32
    one_minus_u = (float(_M32) - bits + 0.5) / 2.0**32
    e = torch.where(u < 0.5, -torch.log(u), -torch.log1p(-one_minus_u))
    return -torch.log(e)


def gumbel_noise(seed, offset, counter, stream: int = 0) -> torch.Tensor:
    """Gumbel noise from word 0 of Philox at (counter, offset, stream): fsdist.ops.noise.gumbel."""
    return gumbel_from_bits(philox_uniform_bits(seed, offset, counter, stream))


def vocab_gumbel(seed, offset, vocab_id) -> torch.Tensor:
    """The sampler's Gumbel noise for (seed, offset, vocabulary id), in float64."""
    return gumbel_from_bits(vocab_uniform_bits(seed, offset, vocab_id))
