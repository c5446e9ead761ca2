import numpy as np
import pytest

from policies import aggregations, sample_without_replacement, samplings
from policies.sampling import groups_per_round


@pytest.mark.parametrize("name", ["random", "rcov", "srcov", "esrcov"])
def test_probabilities_finite_with_zero_and_tiny_cov(name):
    log_p = samplings.make(name).log_probabilities(np.array([0.0, 0.01, 0.05, 0.5, 2.0]))
    p = np.exp(log_p)
    assert np.all(np.isfinite(log_p)) and p.sum() == pytest.approx(1.0)


def test_esrcov_matches_eq38_where_it_does_not_overflow():
    covs = np.array([0.8, 1.0, 2.0])
    w = np.exp(1 / covs**2)
    assert np.exp(samplings.make("esrcov").log_probabilities(covs)) == pytest.approx(w / w.sum())
    x = 1 / covs
    assert np.exp(samplings.make("rcov").log_probabilities(covs)) == pytest.approx(x / x.sum())
    assert np.exp(samplings.make("srcov").log_probabilities(covs)) == pytest.approx(x**2 / (x**2).sum())


def test_zero_cov_group_takes_the_mass():
    p = np.exp(samplings.make("esrcov").log_probabilities(np.array([0.0, 0.3])))
    assert p[0] == pytest.approx(1.0)


def test_sampling_without_replacement_draws_underflowed_groups_when_needed():
    log_p = samplings.make("esrcov").log_probabilities(np.array([0.01, 0.02, 0.5, 0.9]))
    chosen = sample_without_replacement(log_p, 4, np.random.default_rng(0))
    assert sorted(chosen.tolist()) == [0, 1, 2, 3]
    assert sample_without_replacement(log_p, 1, np.random.default_rng(1)).tolist() == [0]


def test_sampling_frequencies_follow_p():
    log_p = np.log(np.array([0.6, 0.3, 0.1]))
    rng = np.random.default_rng(0)
    hits = np.bincount([sample_without_replacement(log_p, 1, rng)[0] for _ in range(4000)], minlength=3)
    assert hits / hits.sum() == pytest.approx([0.6, 0.3, 0.1], abs=0.03)


def test_aggregation_weights_hand_case():
    n_g = np.array([100.0, 300.0])
    p = np.array([0.5, 0.25])
    n = 1000.0
    assert aggregations.make("biased").weights(n_g, np.log(p), n) == pytest.approx([0.25, 0.75])
    # Eq. 4: (1/(p_g S)) (n_g/n) with S = 2
    assert aggregations.make("unbiased").weights(n_g, np.log(p), n) == pytest.approx([0.1, 0.6])
    # Eq. 39: the same, renormalised
    assert aggregations.make("stabilized").weights(n_g, np.log(p), n) == pytest.approx([1 / 7, 6 / 7])


def test_unbiased_weights_overflow_to_inf_not_nan():
    w = aggregations.make("unbiased").weights(np.array([10.0]), np.array([-800.0]), 100.0)
    assert np.isinf(w).all()


def test_groups_per_round_fixed_or_from_data_fraction():
    sizes = np.array([100, 100, 100, 100, 100, 100, 100, 100, 100, 100])
    assert groups_per_round(10, sizes, groups=3, data_fraction=None) == 3
    assert groups_per_round(10, sizes, groups=None, data_fraction=0.2) == 2
    assert groups_per_round(10, sizes, groups=None, data_fraction=0.01) == 1
