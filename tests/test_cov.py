import math

import numpy as np
import pytest

from groupfel.policies import cov_of_counts, group_cov


@pytest.mark.parametrize("counts, std, eq31", [
    ([10, 0], 1.0, math.sqrt(50) / 10),                    # σ=5, μ=5
    ([1, 2, 3], math.sqrt(2 / 3) / 2, math.sqrt(2) / 6),   # σ=√(2/3), μ=2
    ([3, 3, 3], 0.0, 0.0),                                 # perfectly balanced
    ([4, 0, 0, 0], math.sqrt(3), math.sqrt(9 + 1 + 1 + 1) / 4),
])
def test_cov_hand_cases(counts, std, eq31):
    assert cov_of_counts(np.array(counts)) == pytest.approx(std)
    assert cov_of_counts(np.array(counts), "eq31") == pytest.approx(eq31)


def test_eq31_is_std_over_sqrt_m():
    rng = np.random.default_rng(0)
    counts = rng.integers(0, 50, size=(20, 7))
    assert np.allclose(cov_of_counts(counts, "eq31") * math.sqrt(7), cov_of_counts(counts))


def test_group_cov_sums_member_rows():
    L = np.array([[5, 0], [0, 5], [2, 0]])
    assert group_cov(L, [0, 1]) == pytest.approx(0.0)
    assert group_cov(L, [0, 2]) == pytest.approx(1.0)
    assert group_cov(L, [0, 1, 2]) == pytest.approx(np.std([7, 5]) / 6)


def test_empty_group_is_infinitely_skewed():
    assert math.isinf(cov_of_counts(np.array([0, 0, 0])))
