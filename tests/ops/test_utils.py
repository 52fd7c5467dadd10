"""Host helpers of fsdist/ops/utils.py."""
import triton

from fsdist.ops.utils import cdiv, next_pow2


def test_host_integer_helpers_equal_tritons():
    """cdiv / next_pow2 (host code calls them instead of triton.cdiv / triton.next_power_of_2, constexpr functions
    that cost ~2-3 µs a host call in Triton 3.6) give Triton's results, zero and negative arguments included."""
    values = list(range(-70, 300)) + [2**k + d for k in range(4, 40) for d in (-1, 0, 1)]
    for n in values:
        assert next_pow2(n) == triton.next_power_of_2(n), n
        for b in (1, 2, 3, 16, 100, 128, 512):
            assert cdiv(n, b) == triton.cdiv(n, b), (n, b)
