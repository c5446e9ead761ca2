import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from groupfel.emulator.driver import plan_arm
from groupfel.emulator.membership import form_groups
from groupfel.emulator.world import build_world
from groupfel.policies import EdgeView, cov_of_counts, groupings


def literal_alg2(L, min_gs, max_cov, rng):
    """Alg. 2 exactly as printed, one CoV call per candidate (the greedy step under test)."""
    K = list(range(len(L)))
    G = []
    cov = lambda g: float(cov_of_counts(L[g].sum(axis=0)))  # noqa: E731
    while K:
        c = int(rng.choice(np.array(K)))
        g = [c]
        K.remove(c)
        while (cov(g) > max_cov or len(g) < min_gs) and K:
            best = min(K, key=lambda k: (cov(g + [k]), k))
            if cov(g + [best]) < cov(g) or len(g) < min_gs:
                g.append(best)
                K.remove(best)
            else:
                break
        G.append(sorted(g))
    return G


label_matrices = arrays(np.int64, st.tuples(st.integers(1, 30), st.integers(2, 6)),
                        elements=st.integers(0, 40))


@settings(max_examples=60, deadline=None)
@given(L=label_matrices, min_gs=st.integers(1, 6), max_cov=st.sampled_from([0.0, 0.1, 0.5, 1.0, 3.0]),
       seed=st.integers(0, 10_000))
def test_covg_partitions_and_picks_the_cov_minimising_client(L, min_gs, max_cov, seed):
    policy = groupings.make("covg", {"min_group_size": min_gs, "max_cov": max_cov, "leftover": "keep"})
    out = policy.group(EdgeView(L), np.random.default_rng(seed))
    flat = np.concatenate(out.groups)
    assert sorted(flat.tolist()) == list(range(len(L)))          # nobody lost or duplicated
    # With leftover="keep", the output is Alg. 2's exactly: same greedy choices.
    assert sorted(map(sorted, (g.tolist() for g in out.groups))) == sorted(
        literal_alg2(L, min_gs, max_cov, np.random.default_rng(seed)))


@settings(max_examples=60, deadline=None)
@given(L=label_matrices, min_gs=st.integers(1, 6), seed=st.integers(0, 10_000),
       policy_name=st.sampled_from(["covg", "rg"]))
def test_merge_rule_meets_min_group_size_without_losing_clients(L, min_gs, seed, policy_name):
    policy = groupings.make(policy_name, {"min_group_size": min_gs})
    out = policy.group(EdgeView(L), np.random.default_rng(seed))
    assert sorted(np.concatenate(out.groups).tolist()) == list(range(len(L)))
    if len(L) >= min_gs:
        assert min(len(g) for g in out.groups) >= min_gs
    assert len(out.dropped) == 0


def test_drop_rule_reports_what_it_dropped():
    L = np.eye(3, dtype=int).repeat(3, axis=0)[:7] * 10        # 7 clients, MinGS 3 -> one short group
    out = groupings.make("rg", {"min_group_size": 3, "leftover": "drop"}).group(EdgeView(L), np.random.default_rng(0))
    kept = np.concatenate(out.groups)
    assert len(out.dropped) == 1 and out.leftover_clients == 1
    assert sorted(kept.tolist() + out.dropped.tolist()) == list(range(7))


def test_merge_joins_the_group_it_hurts_least():
    # Two complete groups missing label 1 and label 0 respectively; the leftover holds label 1.
    L = np.array([[10, 0], [10, 0], [0, 10], [0, 10], [0, 5]])
    from groupfel.policies import resolve_leftover
    out = resolve_leftover([[0, 1], [2, 3]], [4], "merge", L)
    assert sorted(out.groups[0].tolist()) == [0, 1, 4]


def test_groups_never_cross_edges(tiny_config):
    world = build_world(tiny_config)
    for i in range(len(tiny_config.arms)):
        result = form_groups(world, plan_arm(world, i).grouping, epoch=0)
        covered = np.concatenate([g.clients for g in result.groups])
        assert sorted(covered.tolist()) == list(range(world.topology.n_clients))
        for g in result.groups:
            assert set(world.topology.client_edge[g.clients]) == {g.edge}
            assert g.size >= 3


def test_unknown_parameter_is_named():
    from groupfel.errors import InputError
    with pytest.raises(InputError, match=r"grouping\.max_covv"):
        groupings.make("covg", {"max_covv": 1}, "grouping")
