"""HCCT / HCCT-E: Alg. 2 with the Gram-matrix speed-up equals the literal merging, and the
partition degenerates as HCCT Sec. 5.1 says."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from sklearn.datasets import load_digits

from groupfel.policies import EdgeView, groupings
from groupfel.policies.hcct import group_utility, hcct_partition, relative_variance_layer


def literal_hcct(grads: np.ndarray, sizes: np.ndarray, alpha: float, start=None) -> list[list[int]]:
    """HCCT Alg. 2 straight from Eqs. 13-17: recompute every pair's benefit from the gradients,
    merging from ``start`` (default singletons)."""
    groups = [list(g) for g in start] if start is not None else [[i] for i in range(len(grads))]
    while len(groups) > 1:
        best, pair = -np.inf, None
        for a, b in itertools.combinations(range(len(groups)), 2):
            gain = (group_utility(grads, sizes, groups[a] + groups[b], alpha)
                    - group_utility(grads, sizes, groups[a], alpha) - group_utility(grads, sizes, groups[b], alpha))
            if gain > best:
                best, pair = gain, (a, b)
        if best <= 0:
            break
        a, b = pair
        groups[a] += groups.pop(b)
    return groups


def _canon(groups) -> list[tuple[int, ...]]:
    return sorted(tuple(sorted(map(int, g))) for g in groups)


@pytest.mark.parametrize("seed", range(6))
def test_fast_hcct_equals_literal_alg2(seed):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(3, 20))
    grads = centers[rng.integers(3, size=9)] + 0.6 * rng.normal(size=(9, 20))
    sizes = rng.integers(5, 200, size=9)
    alpha = float(rng.choice([1.0, 20.0, 200.0]))
    assert _canon(hcct_partition(grads, sizes, alpha)) == _canon(literal_hcct(grads, sizes, alpha))


@pytest.mark.parametrize("seed", range(6))
def test_alg2_from_the_current_groups_equals_literal_merging_and_only_merges(seed):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(3, 20))
    grads = centers[rng.integers(3, size=10)] + 0.6 * rng.normal(size=(10, 20))
    sizes = rng.integers(5, 200, size=10)
    alpha = float(rng.choice([1.0, 20.0, 200.0]))
    start = [list(g) for g in np.array_split(rng.permutation(10), 5)]
    fast = hcct_partition(grads, sizes, alpha, start)
    assert _canon(fast) == _canon(literal_hcct(grads, sizes, alpha, start))
    for g in start:                                   # every current group lies inside one new group
        assert sum(set(g) <= set(f) for f in fast) == 1


def test_alg2_hand_case_orthogonal_pair_merges_iff_alpha_over_d_beats_2_minus_sqrt2():
    # g1 ⟂ g2, D = 10 each: alone 2(1 − α/10); together g_G = (g1 + g2)/2, cos = 1/√2 each,
    # 2(1/√2 − α/20): benefit α/10 − (2 − √2) = α/10 − 0.586
    grads, sizes = np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([10, 10])
    assert _canon(hcct_partition(grads, sizes, 5.0)) == [(0,), (1,)]
    assert _canon(hcct_partition(grads, sizes, 10.0)) == [(0, 1)]
    # 0 ∥ 1 and 2 ∥ 3 (α = 1): from singletons the parallel pairs merge. From the current groups
    # {0, 2}, {1}, {3}, {0, 2} cannot split: U{0,2} = 2(1/√2 − 0.05) = 1.314, U{1} = U{3} = 0.9;
    # {0,1,2}: g_G ∝ (2, 1), cos 0.894, 0.894, 0.447, U = 2.236 − 0.1 = 2.136, benefit −0.078;
    # {1,3}: 0.1 − 0.586 < 0. So nothing merges.
    grads, sizes = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]]), np.full(4, 10)
    assert _canon(hcct_partition(grads, sizes, 1.0)) == [(0, 1), (2, 3)]
    assert _canon(hcct_partition(grads, sizes, 1.0, [[0, 2], [1], [3]])) == [(0, 2), (1,), (3,)]
    # with α = 3 a 3-client merge pays (1.936 − 1.114 − 0.7 = 0.122 > 0; {1} or {3}, a tie), the
    # 4-client one then does not (2.528 − 1.936 − 0.7 < 0)
    assert _canon(hcct_partition(grads, sizes, 3.0, [[0, 2], [1], [3]])) in ([(0, 1, 2), (3,)], [(0, 2, 3), (1,)])


def test_fixed_number_of_groups_merges_the_best_pairs_down_to_k_and_no_further():
    """HCCT Figs. 5-6: K fixed. The orthogonal pair (benefit α/10 − 0.586 < 0 at α = 5) merges
    when K = 1; at α = 10 (benefit > 0) it stays apart when K = 2."""
    grads, sizes = np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([10, 10])
    assert _canon(hcct_partition(grads, sizes, 5.0, n_groups=1)) == [(0, 1)]
    assert _canon(hcct_partition(grads, sizes, 10.0, n_groups=2)) == [(0,), (1,)]
    # two parallel pairs (α = 1): K = 3 merges one pair (the best benefit; a tie), K = 1 merges all
    grads, sizes = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]]), np.full(4, 10)
    assert _canon(hcct_partition(grads, sizes, 1.0, n_groups=3)) in ([(0, 1), (2,), (3,)], [(0,), (1,), (2, 3)])
    assert _canon(hcct_partition(grads, sizes, 1.0, n_groups=1)) == [(0, 1, 2, 3)]
    # from the current groups: already at K, nothing merges
    assert _canon(hcct_partition(grads, sizes, 1.0, [[0], [1], [2, 3]], n_groups=3)) == [(0,), (1,), (2, 3)]
    assert groupings.make("hcct", {"n_groups": 4}).n_groups == 4
    with pytest.raises(ValueError, match="n_groups must be an integer >= 1"):
        groupings.make("hcct-e", {"n_groups": 0})


def test_hcct_schedule_is_checked():
    assert groupings.make("hcct", {"schedule": "once", "min_group_size": 3}).schedule == "once"
    with pytest.raises(ValueError, match="schedule must be one of alg1, once"):
        groupings.make("hcct", {"schedule": "every"})
    with pytest.raises(ValueError, match="min_group_size must be 1"):
        groupings.make("hcct", {"schedule": "alg1", "min_group_size": 3})


def test_repartition_restarts_from_singletons_unless_restart_is_merge():
    """HCCT Alg. 2 line 2 ("Initialize K = N groups C_k = {k}"): the current groups are ignored,
    so {0, 2} splits into the parallel pairs; ``restart = "merge"`` keeps {0, 2} (the hand case
    above: no merge pays)."""
    grads, sizes = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]]), np.full(4, 10)
    view = EdgeView(np.ones((4, 10), dtype=int), grads)
    current = [np.array([0, 2]), np.array([1]), np.array([3])]
    assert _canon(groupings.make("hcct", {"alpha": 1.0}).repartition(view, current)) == [(0, 1), (2, 3)]
    merged = groupings.make("hcct", {"alpha": 1.0, "restart": "merge"}).repartition(view, current)
    assert _canon(merged) == [(0, 2), (1,), (3,)]
    # a client in no current group (not yet arrived) stays out of the partition
    present = groupings.make("hcct", {"alpha": 1.0}).repartition(view, [np.array([0, 2]), np.array([1])])
    assert _canon(present) == [(0, 1), (2,)]
    with pytest.raises(ValueError, match="restart must be one of singletons, merge"):
        groupings.make("hcct-e", {"restart": "keep"})


def softmax_regression_gradients(x: np.ndarray, y: np.ndarray, parts: list[np.ndarray]) -> np.ndarray:
    """Each client's cross-entropy gradient of a zero-initialised softmax regression (real data)."""
    out = []
    for idx in parts:
        p = np.full((len(idx), 10), 0.1)           # softmax of zero logits
        onehot = np.eye(10)[y[idx]]
        out.append(((p - onehot).T @ x[idx] / len(idx)).ravel())
    return np.stack(out)


@pytest.fixture(scope="module")
def digits():
    d = load_digits()
    return d.data / 16.0, d.target


def test_identical_data_and_tiny_datasets_merge_into_one_group(digits):
    x, y = digits
    rng = np.random.default_rng(0)
    base = rng.choice(len(y), size=4, replace=False)
    parts = [base] * 8                                 # every client holds the same 4 samples
    grads = softmax_regression_gradients(x, y, parts)
    L = np.stack([np.bincount(y[p], minlength=10) for p in parts])
    res = groupings.make("hcct", {"alpha": 10.0}).group(EdgeView(L, grads), None)
    assert len(res.groups) == 1 and len(res.groups[0]) == 8   # global training


def test_disjoint_labels_and_large_datasets_stay_alone(digits):
    x, y = digits
    parts = [np.flatnonzero(y == c) for c in range(8)]  # ~180 samples each, one label per client
    grads = softmax_regression_gradients(x, y, parts)
    L = np.stack([np.bincount(y[p], minlength=10) for p in parts])
    res = groupings.make("hcct", {"alpha": 10.0}).group(EdgeView(L, grads), None)
    assert len(res.groups) == 8                         # independent training


def test_similar_clients_group_together(digits):
    x, y = digits
    rng = np.random.default_rng(1)
    pools = [np.flatnonzero(np.isin(y, labs)) for labs in ([0, 1], [5, 6])]
    parts = [rng.choice(pools[i % 2], size=30, replace=False) for i in range(8)]
    grads = softmax_regression_gradients(x, y, parts)
    L = np.stack([np.bincount(y[p], minlength=10) for p in parts])
    res = groupings.make("hcct", {"alpha": 10.0}).group(EdgeView(L, grads), None)
    assert _canon(res.groups) == [(0, 2, 4, 6), (1, 3, 5, 7)]


def test_hcct_e_uses_the_layer_of_largest_relative_variance():
    rng = np.random.default_rng(2)
    n = 8
    # Layer 0: the same large gradient for everyone plus noise (low relative variance).
    # Layer 1: two clearly different client types (high relative variance).
    layer0 = 5.0 + 0.01 * rng.normal(size=(n, 6))
    types = np.array([0, 1] * 4)
    layer1 = np.where(types[:, None] == 0, 1.0, -1.0) * np.array([1, 0, 1, 0]) + 0.05 * rng.normal(size=(n, 4))
    grads = np.hstack([layer0, layer1])
    slices = (slice(0, 6), slice(6, 10))
    assert relative_variance_layer(grads, slices) == 1
    view = EdgeView(np.full((n, 10), 100), grads, slices)
    e = groupings.make("hcct-e", {"alpha": 100.0}).group(view, None)
    assert _canon(e.groups) == [(0, 2, 4, 6), (1, 3, 5, 7)]
    full = groupings.make("hcct", {"alpha": 100.0}).group(view, None)
    assert len(full.groups) == 1                        # the shared layer 0 dominates the full gradient


def test_min_group_size_merges_short_groups_where_utility_drops_least(digits):
    x, y = digits
    parts = [np.flatnonzero(y == c) for c in range(8)]
    grads = softmax_regression_gradients(x, y, parts)
    L = np.stack([np.bincount(y[p], minlength=10) for p in parts])
    res = groupings.make("hcct", {"alpha": 10.0, "min_group_size": 3}).group(EdgeView(L, grads), None)
    assert all(len(g) >= 3 for g in res.groups) and sum(map(len, res.groups)) == 8
    assert res.leftover_clients > 0


def test_needs_gradients():
    with pytest.raises(ValueError, match="gradients"):
        groupings.make("hcct", {}).group(EdgeView(np.ones((3, 2))), None)


def test_objective_is_the_summed_utility_by_hand():
    """Two clients with the same gradient direction in one group (D = 30): U = 2(−α/30 + 1); a
    third alone with 10 samples: −α/10 + 1 (its own gradient, cosine 1)."""
    counts = np.array([[10, 0], [0, 20], [5, 5]])
    grads = np.array([[1.0, 0.0], [2.0, 0.0], [0.0, 3.0]])
    policy = groupings.make("hcct", {"alpha": 3.0})
    value = policy.objective(EdgeView(counts, grads), [np.array([0, 1]), np.array([2])])
    assert value == pytest.approx(2 * (-3.0 / 30 + 1) + (-3.0 / 10 + 1))
    assert groupings.make("rg", {}).objective(EdgeView(counts), [np.arange(3)]) is None
