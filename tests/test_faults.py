"""Makespan on a hand-made topology, and faults: dropout, stragglers, recovery, ledger balance."""
import numpy as np
import pytest
import simpy
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from groupfel.cost_models import CostModel, DeviceProfile, linear, quadratic
from groupfel.emulator.compute import LocalSpec, run_group_rounds
from groupfel.emulator.config import FaultsConfig, StragglerConfig
from groupfel.emulator.federation import Federation, Group, RoundContext, client_seeds, draw_faults
from groupfel.emulator.ledger import CostLedger
from groupfel.topologies import Link, build_topology

MODEL_BYTES = 1_000_000   # 1 s over the 8 Mbps client link, 0.1 s over the 80 Mbps edge link


class FakeEngine:
    """Client c's local model is start + c, so aggregation weights are visible in the result."""

    n_params, model_bytes = 1, MODEL_BYTES

    def __init__(self):
        self.trained = []

    def train(self, start, clients, epochs, seeds, *, lr=None, correction=None, momentum=None, rows=None):
        self.trained.append(list(clients))
        return start[rows] + torch.tensor(clients, dtype=start.dtype)[:, None]


def _world(faults=None, ops=("secagg",)):
    """Edge 0: clients 0 (10 samples), 1 (20); edge 1: client 2 (30). H(n) = 0.1·n, O(s) = s²."""
    labels = np.array([[10], [20], [30]])
    topo = build_topology([2, 1], ["dev"] * 3, [np.arange(10)] * 3, labels, Link(8.0, 0.5), Link(80.0, 0.2))
    prof = DeviceProfile("dev", "t", {"sgd": linear(0.1, 0.0)}, {"secagg": quadratic(1, 0, 0)})
    env, ledger, engine = simpy.Environment(), CostLedger(), FakeEngine()
    cost = CostModel({"dev": prof}, "sgd", ops, faults.recovery_multiple if faults else 1.0)
    ctx = RoundContext(env, MODEL_BYTES, cost, ledger, topo, 0, 2, 1, faults)
    groups = [(0, Group(0, np.array([0, 1]), np.array([10, 20]), 0.0)), (1, Group(1, np.array([2]), np.array([30]), 0.0))]
    return env, ledger, engine, Federation(ctx), groups


def _run(env, fed, groups, engine=None, t=0):
    """The round's models (computed apart from time), then its time and charges."""
    ctx = fed.ctx
    spec = LocalSpec(ctx.seed, ctx.group_rounds, ctx.local_epochs, 0.1, faults=ctx.faults)
    models = run_group_rounds(engine or FakeEngine(), {gid: torch.zeros(1) for gid, _ in groups}, dict(groups), t, spec)
    env.run(until=env.process(fed.global_round(t, groups)))
    return models


def test_makespan_and_cost_match_hand_computation():
    env, ledger, _, fed, groups = _world()
    _run(env, fed, groups)
    # group round = download 1.5 + E·H + O(|g|) + upload 1.5; the group waits for its slowest member
    # edge 0: 0.3 + K·max(1.5+1+4+1.5, 1.5+2+4+1.5) + 0.3 = 0.3 + 2·9 + 0.3
    # edge 1: 0.3 + 2·(1.5+3+1+1.5) + 0.3 = 14.6; the cloud waits for the slowest edge
    assert env.now == pytest.approx(18.6)
    # Eq. 5: K Σ (O + E·H) = 2·((4+1) + (4+2)) + 2·(1+3)
    assert ledger.total == pytest.approx(30.0)
    df = ledger.frame()
    assert df["amount"].sum() == pytest.approx(30.0)
    assert (df["end"] - df["start"]).to_numpy() == pytest.approx(df["amount"].to_numpy())


def test_draws_are_deterministic_per_event():
    f = FaultsConfig(dropout=0.5, straggler=StragglerConfig(distribution="pareto", shape=2.0))
    a = draw_faults(f, 7, 3, 1, np.arange(50))
    b = draw_faults(f, 7, 3, 1, np.arange(50)[::-1])
    np.testing.assert_array_equal(a[0], b[0][::-1])
    np.testing.assert_array_equal(a[1], b[1][::-1])
    assert 10 < a[0].sum() < 40 and np.all(a[1] >= 1) and a[1].max() > 1
    c = draw_faults(f, 7, 3, 2, np.arange(50))
    assert not np.array_equal(a[0], c[0])


WORD = st.integers(0, 2**32 - 1)


@settings(max_examples=200, deadline=None)
@given(seed=st.one_of(WORD, st.integers(2**32, 2**70)), t=WORD, k=WORD,
       clients=st.lists(st.one_of(WORD, st.integers(2**32, 2**40)), max_size=20))
def test_client_seeds_are_numpys_seed_sequence(seed, t, k, clients):
    """The vectorised per-event training seeds are SeedSequence's, bit for bit (the runs'
    numbers, committed results included, depend on them), multi-word integers included."""
    want = [np.random.SeedSequence((seed, 2, t, k, c)).generate_state(1)[0] for c in clients]
    got = client_seeds(seed, t, k, np.array(clients, dtype=object).astype(np.uint64) if clients else np.array([], int))
    assert got.dtype == np.uint32 and got.tolist() == [int(w) for w in want]


def test_dropouts_charge_what_was_spent_and_ledger_balances():
    faults = FaultsConfig(dropout=0.4, recovery_multiple=2.0)
    env, ledger, engine, fed, groups = _world(faults)
    models = _run(env, fed, groups, engine)
    df = ledger.frame()
    assert ledger.total == pytest.approx(df["amount"].sum())
    assert sum(ledger.by_component.values()) == pytest.approx(ledger.total)
    expected = 0.0
    for gid, g in groups:
        x = torch.zeros(1)
        for k in range(2):
            dropped, _ = draw_faults(faults, 0, 0, k, g.clients)
            alive = ~dropped
            h = 0.1 * g.n_samples
            o = float(g.size**2)
            expected += h.sum() + o * alive.sum() + alive.sum() * dropped.sum() * 2.0 * o / g.size
            rows = df[(df.group == gid) & (df.group_round == k)]
            sec = rows[rows.component == "secagg"].sort_values("client")["amount"].to_numpy()
            np.testing.assert_allclose(sec, np.where(alive, o, 0.0))
            if alive.any():
                w = g.n_samples[alive] / g.n_samples[alive].sum()
                x = x + float((w * g.clients[alive]).sum())   # survivors' average, renormalised
        assert float(models[gid]) == pytest.approx(float(x))
    assert ledger.total == pytest.approx(expected)
    assert "secagg-recovery" in ledger.by_component   # some group round had a dropout (seeded)


def test_all_dropped_group_keeps_its_model_and_pays_training_only():
    env, ledger, engine, fed, groups = _world(FaultsConfig(dropout=1.0))
    models = _run(env, fed, groups, engine)
    assert all(float(m) == 0.0 for m in models.values()) and engine.trained == []
    assert ledger.by_component["secagg"] == 0.0 and "secagg-recovery" not in ledger.by_component
    assert ledger.total == pytest.approx(ledger.by_component["training"]) == pytest.approx(2 * 0.1 * 60)


def test_stragglers_stretch_time_not_cost():
    base_env, base_ledger, _, base_fed, base_groups = _world()
    _run(base_env, base_fed, base_groups)
    f = FaultsConfig(straggler=StragglerConfig(distribution="lognormal", sigma=1.0))
    env, ledger, _, fed, groups = _world(f)
    _run(env, fed, groups)
    assert ledger.total == pytest.approx(base_ledger.total)
    assert env.now > base_env.now
