"""TokenHistory against a plain list: the same answers for what it keeps, bounded storage."""

import numpy as np
import pytest

from llama_extrapolate.history import TokenHistory


def test_matches_a_list_and_stays_bounded():
    rng = np.random.default_rng(0)
    h, ref = TokenHistory(capacity=64), []
    for _ in range(200):
        if ref and rng.random() < 0.2:  # roll back a little, as prompt-prefix reuse does
            n = int(rng.integers(0, min(len(ref), 10)))
            del ref[len(ref) - n:]
        chunk = rng.integers(0, 1000, size=int(rng.integers(1, 40))).tolist()
        h[len(ref):len(ref) + len(chunk)] = chunk
        ref += chunk
        assert h.end == len(ref) and len(h) <= 64 and len(h._buf) <= 64
        kept = h[: len(ref)]
        assert list(kept) == ref[len(ref) - len(kept):]
        assert h[len(ref) - 1] == ref[-1]
    with pytest.raises(IndexError, match="not kept"):
        h[0]


def test_aligned_while_nothing_was_dropped():
    h = TokenHistory(capacity=1000)
    h[0:5] = [1, 2, 3, 4, 5]
    h[5:7] = [6, 7]
    assert list(h[:7]) == [1, 2, 3, 4, 5, 6, 7]
    h[3:4] = [9]  # a rollback to 3 then one new token
    assert list(h[:10]) == [1, 2, 3, 9] and h.end == 4


@pytest.mark.parametrize("bad", [0, 1, -5])
def test_capacity_is_checked(bad):
    with pytest.raises(ValueError, match=f"capacity={bad}"):
        TokenHistory(capacity=bad)
