import numpy as np
import pytest

from groupfel.policies import aggregations, sample_without_replacement, samplings
from groupfel.policies.sampling import groups_per_round, inclusion_log_probabilities


@pytest.mark.parametrize("name", ["random", "rcov", "srcov", "esrcov"])
def test_probabilities_sum_to_one_with_zero_and_tiny_cov(name):
    log_p = samplings.make(name).log_probabilities(np.array([0.0, 0.01, 0.05, 0.5, 2.0]))
    p = np.exp(log_p)
    assert not np.isnan(log_p).any() and p.sum() == pytest.approx(1.0)


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


@pytest.mark.parametrize("name", ["rcov", "srcov", "esrcov"])
def test_several_zero_cov_groups_share_the_mass_and_the_rest_keep_their_order(name):
    """CoV 0 twice, three times: equal shares (they summed to 2 with the old 1e-12 floor), and
    draws beyond them go to the others by weight."""
    policy = samplings.make(name)
    covs = np.array([0.0, 0.5, 0.0, 0.01, 0.3, 0.0])
    assert np.exp(policy.log_probabilities(covs)) == pytest.approx([1 / 3, 0, 1 / 3, 0, 0, 1 / 3])
    w = policy.log_masses(covs)
    pi = np.exp(inclusion_log_probabilities(w, 2))        # fewer draws than balanced groups
    assert pi == pytest.approx([2 / 3, 0, 2 / 3, 0, 0, 2 / 3]) and pi.sum() == pytest.approx(2)
    pi = np.exp(inclusion_log_probabilities(w, 4))        # one draw left for the others, by weight
    assert pi[[0, 2, 5]] == pytest.approx(1) and pi.sum() == pytest.approx(4)
    assert pi[3] >= pi[4] >= pi[1] and pi[3] > 0.9 * (name == "esrcov")
    x2 = {"rcov": 1 / np.array([0.01, 0.3, 0.5]), "srcov": 1 / np.array([0.01, 0.3, 0.5]) ** 2}.get(name)
    if x2 is not None:   # exact shares of the one draw left: w / Σ w over the finite-weight groups
        assert pi[[3, 4, 1]] == pytest.approx(x2 / x2.sum())
    for seed in range(20):
        chosen = sample_without_replacement(w, 4, np.random.default_rng(seed))
        assert len(set(chosen.tolist())) == 4 and {0, 2, 5} <= set(chosen.tolist())


def test_near_zero_cov_ties_are_exact():
    """1/CoV² = 1e20 for two groups: each half the mass (scipy's x - logsumexp(x) made both 1),
    and the other two keep their order once the tied pair is taken."""
    esr = samplings.make("esrcov")
    covs = np.array([1e-10, 0.01, 1e-10, 0.02])
    assert np.exp(esr.log_probabilities(covs)) == pytest.approx([0.5, 0, 0.5, 0])
    w = esr.log_masses(covs)
    assert np.exp(inclusion_log_probabilities(w, 1)) == pytest.approx([0.5, 0, 0.5, 0])
    pi = np.exp(inclusion_log_probabilities(w, 3))
    assert pi == pytest.approx([1, 1, 1, 0])     # e^{1e4} against e^{2500}: the 0.01 group
    srcov = samplings.make("srcov")
    pi = np.exp(inclusion_log_probabilities(srcov.log_masses(np.array([1e-10, 1e-10, 0.1, 0.2])), 3))
    assert pi == pytest.approx([1, 1, 0.8, 0.2])


def test_many_groups_two_balanced_reported_case():
    """The reported crash: 517 groups, two with CoV exactly 0, ESRCoV, S = 10 (IndexError in
    sample_without_replacement after every group was marked certain)."""
    rng = np.random.default_rng(0)
    covs = rng.uniform(0.2, 2.0, 517)
    covs[[17, 301]] = 0.0
    w = samplings.make("esrcov").log_masses(covs)
    pi = np.exp(inclusion_log_probabilities(w, 10))
    assert pi.sum() == pytest.approx(10) and pi[[17, 301]] == pytest.approx(1) and pi.max() <= 1
    order = np.argsort(covs[pi < 1])
    assert np.all(np.diff(pi[pi < 1][order]) <= 1e-15)   # smaller CoV, larger share
    chosen = sample_without_replacement(w, 10, np.random.default_rng(3))
    assert len(set(chosen.tolist())) == 10 and {17, 301} <= set(chosen.tolist())


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
    pi = 2 * p   # S = 2, no certainty groups: π_g = S·p_g
    assert aggregations.make("biased").weights(n_g, np.log(pi), n) == pytest.approx([0.25, 0.75])
    # Eq. 4: (1/(p_g S)) (n_g/n) with S = 2
    assert aggregations.make("unbiased").weights(n_g, np.log(pi), n) == pytest.approx([0.1, 0.6])
    # Eq. 39: the same, renormalised
    assert aggregations.make("stabilized").weights(n_g, np.log(pi), n) == pytest.approx([1 / 7, 6 / 7])


def test_unbiased_weights_overflow_to_inf_not_nan():
    w = aggregations.make("unbiased").weights(np.array([10.0]), np.array([-800.0]), 100.0)
    assert np.isinf(w).all()


def test_groups_per_round_fixed_or_from_data_fraction():
    sizes = np.array([100, 100, 100, 100, 100, 100, 100, 100, 100, 100])
    assert groups_per_round(10, sizes, groups=3, data_fraction=None) == 3
    assert groups_per_round(10, sizes, groups=None, data_fraction=0.2) == 2
    assert groups_per_round(10, sizes, groups=None, data_fraction=0.01) == 1
    # the authors' count: a share of every client's data, those left out of the groups included
    # (1,000 grouped + 400 left out: 0.2 · 1,400 / 100 = 2.8 -> 3)
    assert groups_per_round(10, sizes, groups=None, data_fraction=0.2, total_samples=1400.0) == 3


class _Fixed:
    """A generator stand-in that returns a given permutation and uniform, to enumerate a sampler's
    outcomes exactly."""

    def __init__(self, perm, u):
        self.perm, self.u = np.asarray(perm), u

    def permutation(self, n):
        assert n == len(self.perm)
        return self.perm

    def uniform(self):
        return self.u


def _exact_outcomes(log_p, size):
    """Every (probability, sample) of the sampler: all orders of the non-certain groups, and u in
    each piece of [0, 1) between the breakpoints where the sample changes."""
    from itertools import permutations
    pi = np.exp(inclusion_log_probabilities(log_p, size))
    rest = np.flatnonzero(pi < 1)
    orders = list(permutations(range(len(rest))))
    for perm in orders:
        cuts = np.unique(np.concatenate([[0.0, 1.0], np.cumsum(pi[rest[list(perm)]]) % 1.0]))
        for a, b in zip(cuts[:-1], cuts[1:]):
            yield (b - a) / len(orders), sample_without_replacement(log_p, size, _Fixed(perm, (a + b) / 2))


@pytest.mark.parametrize("name, covs, size", [
    ("rcov", [0.8, 0.5, 0.3, 0.6, 0.4], 2),          # 5 groups, S = 2 (successive sampling: E[Σw] ≠ 1)
    ("srcov", [0.05, 0.5, 0.3, 0.6, 0.4], 3),         # a certainty group
    ("esrcov", [0.3, 0.35, 0.5, 0.9, 2.0, 1.0], 3),   # skewed: certainty groups (S·p_g ≥ 1)
    ("random", [0.3, 0.5, 0.9, 1.0], 4)])
def test_unbiased_aggregation_is_unbiased_exactly(name, covs, size):
    """E[Σ_sampled w_g x_g] = Σ_g (n_g/n) x_g (Eq. 4), enumerating every sample with its probability:
    with x_g the unit vectors, the expected weight of each group is n_g / n."""
    log_p = samplings.make(name).log_probabilities(np.array(covs))
    n_g = np.arange(10.0, 10.0 + 7 * len(covs), 7)
    n = n_g.sum()
    log_pi = inclusion_log_probabilities(log_p, size)
    expected, total_prob, inclusion = np.zeros(len(covs)), 0.0, np.zeros(len(covs))
    for prob, chosen in _exact_outcomes(log_p, size):
        assert len(chosen) == size == len(set(chosen.tolist()))
        expected[chosen] += prob * aggregations.make("unbiased").weights(n_g[chosen], log_pi[chosen], n)
        inclusion[chosen] += prob
        total_prob += prob
    assert total_prob == pytest.approx(1.0, abs=1e-12)
    assert inclusion == pytest.approx(np.exp(log_pi), abs=1e-12)
    assert expected == pytest.approx(n_g / n, abs=1e-12)


def test_inclusion_probabilities_cap_at_one_and_sum_to_s():
    p = np.array([0.5, 0.3, 0.1, 0.06, 0.04])
    pi = np.exp(inclusion_log_probabilities(np.log(p), 3))
    # 3·0.5 ≥ 1: group 0 certain; the other 2 draws in proportion: 2·0.3/0.5 = 1.2 ≥ 1: group 1 too;
    # the last draw shares 0.1 : 0.06 : 0.04.
    assert pi == pytest.approx([1, 1, 0.5, 0.3, 0.2])
    assert np.exp(inclusion_log_probabilities(np.log(p), 5)) == pytest.approx(np.ones(5))


@pytest.mark.slow
def test_esrcov_extreme_skew_stays_exact_by_monte_carlo():
    """ESRCoV's log p spans thousands: the sampler works in log space, takes the dominant groups
    with certainty and draws the rest with frequencies π_g. 20000 draws: a binomial frequency
    has sd ≤ 0.0036, so the tolerance 0.02 is > 5 sd."""
    log_p = samplings.make("esrcov").log_probabilities(np.array([0.02, 0.03, 0.3, 0.31, 0.32, 0.6, 0.05]))
    pi = np.exp(inclusion_log_probabilities(log_p, 4))
    assert pi[[0, 1, 6]] == pytest.approx(1.0) and pi.sum() == pytest.approx(4.0)
    rng = np.random.default_rng(0)
    hits = np.zeros(7)
    for _ in range(20000):
        chosen = sample_without_replacement(log_p, 4, rng)
        assert len(set(chosen.tolist())) == 4
        hits[chosen] += 1
    assert hits / 20000 == pytest.approx(pi, abs=0.02)
    w = aggregations.make("unbiased").weights(np.full(4, 10.0), np.log(pi[:4]), 70.0)
    assert np.isfinite(w).all()


def test_sampling_is_deterministic_by_seed():
    log_p = samplings.make("rcov").log_probabilities(np.linspace(0.1, 1.0, 12))
    draws = [sample_without_replacement(log_p, 4, np.random.default_rng((0, 1, t))).tolist() for t in range(5)]
    assert draws == [sample_without_replacement(log_p, 4, np.random.default_rng((0, 1, t))).tolist() for t in range(5)]
    assert len({tuple(d) for d in draws}) > 1


def _successive_inclusion(p: np.ndarray, size: int) -> np.ndarray:
    """P(g among the first ``size`` of draw-remove-renormalise), by enumerating every ordered draw."""
    from itertools import permutations
    pi = np.zeros(len(p))
    for seq in permutations(range(len(p)), size):
        prob, left = 1.0, 1.0
        for g in seq:
            prob *= p[g] / left
            left -= p[g]
        pi[list(seq)] += prob
    return pi


def test_successive_draws_have_the_successive_inclusion_probabilities_not_pi():
    """The authors' numpy choice(replace=False): each draw renormalised over the groups left. Its
    inclusion probabilities (exact, by enumeration) differ from π_g under SRCoV's skew, and the
    sampler hits them: 20000 draws, a binomial frequency has sd ≤ 0.0036, tolerance 0.015 > 4 sd."""
    from groupfel.policies import sample_successive
    log_p = samplings.make("srcov").log_probabilities(np.array([0.15, 0.2, 0.3, 0.5, 0.8, 1.2]))
    p = np.exp(log_p)
    exact, pi = _successive_inclusion(p, 3), np.exp(inclusion_log_probabilities(log_p, 3))
    assert exact.sum() == pytest.approx(3.0) and np.abs(exact - pi).max() > 0.05   # the two differ
    rng = np.random.default_rng(0)
    hits = np.zeros(6)
    for _ in range(20000):
        chosen = sample_successive(log_p, 3, rng)
        assert len(set(chosen.tolist())) == 3 and chosen.tolist() == sorted(chosen.tolist())
        hits[chosen] += 1
    assert hits / 20000 == pytest.approx(exact, abs=0.015)
    # numpy's own call, as the authors make it, agrees with the enumeration too
    np_rng = np.random.default_rng(1)
    np_hits = np.zeros(6)
    for _ in range(20000):
        np_hits[np_rng.choice(6, 3, p=p / p.sum(), replace=False)] += 1
    assert np_hits / 20000 == pytest.approx(exact, abs=0.015)


def test_successive_draws_take_zero_cov_groups_first_and_weightless_ones_last():
    from groupfel.policies import sample_successive
    log_p = samplings.make("esrcov").log_masses(np.array([0.0, 0.4, 0.0, 0.9, 0.0]))
    rng = np.random.default_rng(0)
    pairs = {tuple(sample_successive(log_p, 2, rng).tolist()) for _ in range(200)}
    assert pairs == {(0, 2), (0, 4), (2, 4)}          # two of the three CoV-0 groups, any two
    assert {0, 2, 4} <= set(sample_successive(log_p, 4, rng).tolist())
    weightless = np.array([0.0, -np.inf, -np.inf])
    assert sorted(sample_successive(weightless, 3, rng).tolist()) == [0, 1, 2]
    assert {tuple(sample_successive(weightless, 2, rng).tolist()) for _ in range(200)} == {(0, 1), (0, 2)}
    with pytest.raises(ValueError, match="cannot sample 4 of 3"):
        sample_successive(weightless, 4, rng)
