"""Every grouping policy partitions its edge, respects MinGS where it claims to, and is
deterministic by seed; the fast CoVG equals the literal Alg. 2."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from groupfel.errors import InputError
from groupfel.experiments.grouping_studies import surrogate_gradients, synthetic_label_matrix
from groupfel.policies import EdgeView, groupings
from groupfel.policies.cov import cov_of_counts
from groupfel.policies.reference import covg_reference

L40 = synthetic_label_matrix(40, np.random.default_rng(7))
L100 = synthetic_label_matrix(100, np.random.default_rng(0))
POLICIES = ["rg", "covg", "cdg", "kldg", "qcid", "fedcollab", "hcct", "hcct-e"]


def _view(name: str, L: np.ndarray) -> EdgeView:
    if groupings[name].needs_gradients:
        g = surrogate_gradients(L, dim=32)
        return EdgeView(L, g, (slice(0, 16), slice(16, 32)))
    return EdgeView(L)


def _canon(result) -> list[tuple[int, ...]]:
    return sorted(tuple(sorted(map(int, g))) for g in result.groups)


@pytest.mark.parametrize("name", POLICIES)
@pytest.mark.parametrize("mings", [1, 3, 7])
def test_partition_and_min_group_size(name, mings):
    res = groupings.make(name, {"min_group_size": mings}).group(_view(name, L40), np.random.default_rng(0))
    everyone = np.concatenate([*res.groups, res.dropped])
    assert np.array_equal(np.sort(everyone), np.arange(len(L40)))  # disjoint and complete
    assert all(len(g) >= mings for g in res.groups)


@pytest.mark.parametrize("name", POLICIES)
def test_deterministic_by_seed(name):
    pol = groupings.make(name, {"min_group_size": 4})
    a = pol.group(_view(name, L40), np.random.default_rng(3))
    b = pol.group(_view(name, L40), np.random.default_rng(3))
    assert _canon(a) == _canon(b)


@pytest.mark.parametrize("name", ["rg", "covg", "cdg", "kldg", "qcid"])
def test_randomised_policies_depend_on_the_seed(name):
    pol = groupings.make(name, {"min_group_size": 4})
    outcomes = {tuple(_canon(pol.group(EdgeView(L40), np.random.default_rng(s)))) for s in range(4)}
    assert len(outcomes) > 1  # regrouping (Sec. 5.2) must be able to produce new groups


def test_fixed_size_policies_make_groups_of_min_group_size():
    for name in ("kldg", "qcid"):
        res = groupings.make(name, {"min_group_size": 5, "leftover": "drop"}).group(EdgeView(L40[:38]),
                                                                                    np.random.default_rng(0))
        assert [len(g) for g in res.groups] == [5] * 7 and len(res.dropped) == 3
    res = groupings.make("cdg", {"min_group_size": 5}).group(EdgeView(L40[:38]), np.random.default_rng(0))
    assert len(res.groups) == 7 and sorted(len(g) for g in res.groups) == [5, 5, 5, 5, 6, 6, 6]


def test_balance_aware_policies_beat_random_on_cov():
    L = synthetic_label_matrix(200, np.random.default_rng(1))

    def avg_cov(name):
        res = groupings.make(name, {"min_group_size": 5}).group(EdgeView(L), np.random.default_rng(0))
        return cov_of_counts(np.stack([L[g].sum(axis=0) for g in res.groups])).mean()

    rg = avg_cov("rg")
    for name in ("covg", "kldg"):  # greedy: clearly better
        assert avg_cov(name) < 0.8 * rg, name
    assert avg_cov("qcid") < 0.95 * rg  # QCID samples members, so it is only biased towards balance


def test_kldg_picks_the_client_that_completes_the_edge_distribution():
    # Edge distribution is uniform over 2 labels; from client 0 (label a) the best partner is a
    # label-b client, never another label-a client.
    L = np.array([[10, 0], [10, 0], [0, 10], [10, 0], [0, 10], [0, 10]])
    res = groupings.make("kldg", {"min_group_size": 2}).group(EdgeView(L), np.random.default_rng(0))
    for g in res.groups:
        assert L[g].sum(axis=0).tolist() == [10, 10]


def test_config_validation_names_the_field():
    with pytest.raises(InputError, match="n_clusters"):
        groupings.make("cdg", {"n_clusters": 0})
    with pytest.raises(InputError, match="beta"):
        groupings.make("qcid", {"beta": -1.0})
    with pytest.raises(InputError, match="alpha"):
        groupings.make("hcct", {"alpha": 0})
    with pytest.raises(InputError, match="capacity"):
        groupings.make("fedcollab", {"capacity": -1})
    with pytest.raises(InputError, match="restarts"):
        groupings.make("fedcollab", {"restarts": 0})


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 18), m=st.integers(2, 6), hi=st.integers(0, 30), mings=st.integers(1, 5),
       max_cov=st.sampled_from([0.0, 0.3, 0.8, 2.0]), norm=st.sampled_from(["std", "eq31"]),
       leftover=st.sampled_from(["merge", "drop", "keep"]), grow=st.sampled_from(["alg2", "authors"]),
       seed=st.integers(0, 2**16))
def test_fast_covg_equals_literal_alg2(n, m, hi, mings, max_cov, norm, leftover, grow, seed):
    L = np.random.default_rng(seed).integers(0, hi + 1, size=(n, m))
    pol = groupings.make("covg", {"min_group_size": mings, "max_cov": max_cov, "normalization": norm,
                                  "leftover": leftover, "grow": grow})
    fast = pol.group(EdgeView(L), np.random.default_rng(seed))
    slow = covg_reference(pol, EdgeView(L), np.random.default_rng(seed))
    assert [g.tolist() for g in fast.groups] == [g.tolist() for g in slow.groups]
    assert fast.dropped.tolist() == slow.dropped.tolist()


def _authors_cv_greedy(L: np.ndarray, max_cv: float, min_group_size: int, rng) -> list[list[int]]:
    """Jiyao17/fl-grouping utils/fed.py, GFL.group's __CV_greedy_grouping, transcribed line by line
    (its np.random.randint for the first client becomes a draw from ``rng`` that consumes it as
    our CoVG does). It returns the groups kept; the clients of the others are left out. Its
    np.std / np.mean is computed exactly here, as CoV² in fractions (a monotone change): the
    float quotient rounds CoVs that are equal, e.g. of [1, 0, 1] and [0, 1, 1], differently,
    and the tie then goes by rounding instead of by row."""
    def calc_group_cv(subset):
        distribution = [int(x) for x in L[subset].sum(axis=0)]
        total, m = sum(distribution), len(distribution)
        return Fraction(m * sum(x * x for x in distribution) - total * total, total * total)

    max_cv = Fraction(max_cv) ** 2

    server_clients, groups = list(range(len(L))), []
    while len(server_clients) > 0:
        rand_client = int(rng.choice(np.arange(len(server_clients))))
        cur_min_cv = calc_group_cv([server_clients[rand_client]])
        new_group = [server_clients[rand_client]]
        server_clients.remove(new_group[0])
        while len(server_clients) > 0 and not (cur_min_cv < max_cv and len(new_group) >= min_group_size):
            new_client = -1
            for client in server_clients:
                new_group.append(client)
                new_cv = calc_group_cv(new_group)
                if new_cv < cur_min_cv:
                    cur_min_cv = new_cv
                    new_client = client
                new_group.pop()
            if new_client == -1:
                break
            server_clients.remove(new_client)
            new_group.append(new_client)
        if len(new_group) >= min_group_size:
            groups.append(new_group)
    return groups


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 40), m=st.integers(2, 10), hi=st.integers(1, 30), mings=st.integers(2, 6),
       max_cov=st.sampled_from([0.0, 0.55, 1.0, 1.7, 2.0]), seed=st.integers(0, 2**16))
def test_covg_grow_authors_with_drop_is_the_authors_code(n, m, hi, mings, max_cov, seed):
    """``grow = "authors"`` with ``leftover = "drop"`` forms the groups the authors' code keeps and
    leaves out the rest, wherever a short group formed, also where a CoV equals MaxCoV exactly
    (0, 1 and 2 are reached by 0/1 counts: theirs goes on growing there). Every client holds a
    sample (the authors' CoV of an empty group is NaN)."""
    L = np.random.default_rng(seed).integers(0, hi + 1, size=(n, m))
    L[L.sum(axis=1) == 0, 0] = 1
    authors = _authors_cv_greedy(L, max_cov, mings, np.random.default_rng(seed))
    pol = groupings.make("covg", {"min_group_size": mings, "max_cov": max_cov, "grow": "authors", "leftover": "drop"})
    ours = pol.group(EdgeView(L), np.random.default_rng(seed))
    if authors:
        assert [g.tolist() for g in ours.groups] == authors
        assert sorted(ours.dropped.tolist()) == sorted(set(range(n)) - {c for g in authors for c in g})
    else:   # nothing complete: like `drop` everywhere, the edge keeps its short clients as one group
        assert sorted(c for g in ours.groups for c in g.tolist()) == list(range(n))


def test_covg_grow_authors_closes_a_group_no_client_improves():
    """Two clients of label 0 and three of label 1, MinGS 3: from client 0, Alg. 2 fills the group
    with client 1 and a label-1 client; the authors' rule takes label-1 clients while the CoV falls
    (2-1 is better than 2-0) and then stops, so their groups differ and one is short."""
    L = np.array([[5, 0], [5, 0], [0, 5], [0, 5], [0, 5]])

    class First:   # the first client drawn is always the lowest row left
        def choice(self, a):
            return a[0]
    alg2 = groupings.make("covg", {"min_group_size": 3, "max_cov": 0.0, "leftover": "keep"}).group(EdgeView(L), First())
    authors = groupings.make("covg", {"min_group_size": 3, "max_cov": 0.0, "leftover": "keep",
                                      "grow": "authors"}).group(EdgeView(L), First())
    assert _canon(alg2) != _canon(authors)
    assert min(map(len, authors.groups)) < 3 and authors.leftover_clients > 0


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 1000), min_size=2, max_size=12))
def test_cov_is_population_sigma_over_mu(counts):
    c = np.array(counts, dtype=float)
    got = float(cov_of_counts(c))
    if c.sum() == 0:
        assert got == np.inf
    else:
        assert got == pytest.approx(np.std(c) / np.mean(c), rel=1e-9, abs=1e-9)
        assert float(cov_of_counts(c, "eq31")) == pytest.approx(got / np.sqrt(len(c)), rel=1e-12, abs=1e-12)


def _authors_kld_grouping(L: np.ndarray, group_num: int, min_group_size: int) -> list[list[int]]:
    """Jiyao17/fl-grouping utils/fed.py, GFL.group's __KLD_grouping, transcribed (the label counts
    are floats here, so their ``p.dtype = np.float64`` changes nothing)."""
    import copy

    def kld_normal(p):
        if np.sum(p) == 0:
            return 0
        p = copy.deepcopy(p).astype(np.float64)
        p /= np.sum(p)
        normal = 1 / len(p)
        ds = np.zeros(len(p))
        for i, prob in enumerate(p):
            ds[i] = 1 if prob == 0 else prob * np.log(prob / normal)
        return np.sum(ds)

    clients = list(range(len(L)))
    groups = [[clients[i]] for i in range(group_num)]
    clients = clients[group_num:]
    while len(clients) > 0:
        assign_mat = np.zeros((len(clients), group_num))
        for i, client in enumerate(clients):
            for j, group in enumerate(groups):
                group_distri = np.sum([L[c] for c in group], axis=0)
                assign_mat[i, j] = kld_normal(group_distri + L[client]) - kld_normal(group_distri)
        c, g = np.unravel_index(np.argmin(assign_mat), assign_mat.shape)
        groups[g].append(clients.pop(c))
    return [group for group in groups if len(group) >= min_group_size]


@settings(max_examples=40, deadline=None)
@given(n=st.integers(4, 30), m=st.integers(2, 8), hi=st.integers(1, 20), mings=st.integers(2, 4),
       seed=st.integers(0, 2**16))
def test_kldg_assign_authors_is_the_authors_code(n, m, hi, mings, seed):
    L = np.random.default_rng(seed).integers(0, hi + 1, size=(n, m)).astype(float)
    authors = _authors_kld_grouping(L, n // mings, mings)
    ours = groupings.make("kldg", {"min_group_size": mings, "assign": "authors", "leftover": "drop"}).group(
        EdgeView(L), np.random.default_rng(seed))
    if authors:
        assert [g.tolist() for g in ours.groups] == authors
        assert sorted(ours.dropped.tolist()) == sorted(set(range(n)) - {c for g in authors for c in g})


def _authors_cd_grouping(L: np.ndarray, cluster_num: int, group_num: int, min_group_size: int):
    """Jiyao17/fl-grouping utils/fed.py, GFL.group's __CD_grouping, transcribed; a cluster is a
    sorted list popped from the front where theirs pops a Python set (whose order is the hash
    table's)."""
    clients = list(range(len(L)))
    centers = [L[clients[i]] for i in range(cluster_num)]
    i = 0
    while i < 1000:
        clusters = [[] for _ in range(cluster_num)]
        for client in clients:
            distances = [np.linalg.norm(L[client] - center) for center in centers]
            clusters[np.argmin(distances)].append(client)
        new_centers = [np.mean([L[c] for c in cluster], axis=0) for cluster in clusters]
        if all(np.linalg.norm(c - nc) == 0 for c, nc in zip(centers, new_centers)):
            break
        centers = new_centers
        i += 1
    groups = [[] for _ in range(group_num)]
    for cluster in clusters:
        i = 0
        while len(cluster) > 0:
            groups[i % group_num].append(cluster.pop(0))
            i += 1
    for group in groups:
        if len(group) < min_group_size:
            groups.remove(group)
    return groups


@settings(max_examples=40, deadline=None)
@given(n=st.integers(6, 40), m=st.integers(2, 8), hi=st.integers(1, 20), mings=st.integers(2, 5),
       seed=st.integers(0, 2**16))
def test_cdg_deal_authors_is_the_authors_code(n, m, hi, mings, seed):
    import warnings
    L = np.random.default_rng(seed).integers(0, hi + 1, size=(n, m)).astype(float)
    group_num = n // mings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # an empty cluster's mean, in theirs
        authors = _authors_cd_grouping(L, n // group_num, group_num, mings)
    pol = groupings.make("cdg", {"min_group_size": mings, "deal": "authors"})
    ours = pol.group(EdgeView(L), np.random.default_rng(seed))
    assert [g.tolist() for g in ours.groups] == [g for g in authors if g]
    assert sorted(ours.dropped.tolist()) == sorted(set(range(n)) - {c for g in authors for c in g})
    n_clusters = groupings.make("cdg", {"min_group_size": mings, "deal": "authors", "n_clusters": n}).group(
        EdgeView(L), np.random.default_rng(seed))   # more clusters than groups can fill: no empty group
    assert all(len(g) for g in n_clusters.groups)


def test_the_authors_kldg_and_cdg_form_uneven_groups():
    """What the Group-FEL paper says of SHARE and OUEA (Sec. 6.3: they "do not control the group
    size") holds for the authors' versions and not for ours: on 100 clients, MinGS 5."""
    for name, option in (("kldg", {"assign": "authors", "leftover": "drop"}), ("cdg", {"deal": "authors"})):
        ours = groupings.make(name, {"min_group_size": 5}).group(EdgeView(L100), np.random.default_rng(0))
        authors = groupings.make(name, {"min_group_size": 5, **option}).group(EdgeView(L100), np.random.default_rng(0))
        assert {len(g) for g in ours.groups} == {5} and len(ours.dropped) == 0
        assert len({len(g) for g in authors.groups}) > 2 and len(authors.dropped) > 0
