"""Eq. 5 and the simulated clock on a hand-computed scenario (2 edges, 5 clients, fixed groups)."""
import numpy as np
import pytest
import simpy

from groupfel.cost_models import CostModel, DeviceProfile, linear, quadratic
from groupfel.emulator.federation import Federation, Group, RoundContext
from groupfel.emulator.ledger import CostLedger
from groupfel.emulator.training import TorchEngine
from groupfel.topologies import Link, build_topology, label_matrix, load_dataset

N = [10, 20, 30, 5, 15]


@pytest.fixture(scope="module")
def scenario():
    data = load_dataset("digits")
    parts, start = [], 0
    for n in N:
        parts.append(np.arange(start, start + n))
        start += n
    labels = label_matrix(data.y_train, parts, 10)
    topo = build_topology([3, 2], ["dev"] * 5, parts, labels,
                          client_link=Link(1e15, 0.5), edge_link=Link(1e15, 1.0))
    profile = DeviceProfile("dev", "t", training={"sgd": linear(0.1, 1.0)},
                            group_overhead={"secagg": quadratic(0.5, 0.0, 1.0), "backdoor": quadratic(0, 1, 0)})
    cost = CostModel({"dev": profile}, "sgd", ("secagg", "backdoor"))
    engine = TorchEngine(data, parts, "mlp", lr=0.05, batch_size=8)
    env = simpy.Environment()
    ledger = CostLedger()
    fed = Federation(RoundContext(env, engine.model_bytes, cost, ledger, topo, seed=0, group_rounds=2, local_epochs=3))
    g0 = Group(0, np.array([0, 1, 2]), np.array(N[:3]), 0.0)
    g1 = Group(1, np.array([3, 4]), np.array(N[3:]), 0.0)
    times = []
    for t, sampled in enumerate([[(0, g0), (1, g1)], [(1, g1)]]):
        env.run(until=env.process(fed.global_round(t, sampled)))
        times.append(env.now)
    return ledger, times


def test_ledger_total_equals_hand_eq5(scenario):
    ledger, _ = scenario
    # g0 per group round: clients pay E·H = 3(0.1n+1) = 6, 9, 12 plus O_secagg(3) = 5.5 and
    # O_backdoor(3) = 3 each -> 52.5; K = 2 -> 105. g1: 4.5, 7.5 + 3 + 2 each -> 22; K = 2 -> 44.
    # Round 1 (t = 0) samples both (149), round 2 only g1 (44).
    assert ledger.total == pytest.approx(193.0, rel=1e-12)
    assert ledger.frame()["amount"].sum() == pytest.approx(193.0, rel=1e-12)


def test_ledger_per_client_and_component(scenario):
    ledger, _ = scenario
    df = ledger.frame()
    per_client = df.groupby("client")["amount"].sum()
    assert per_client.to_dict() == pytest.approx({0: 29.0, 1: 35.0, 2: 41.0, 3: 38.0, 4: 50.0})
    per_comp = df.groupby("component", observed=True)["amount"].sum()
    assert per_comp.to_dict() == pytest.approx({"training": 102.0, "secagg": 57.0, "backdoor": 34.0})
    per_round = df.groupby("round")["amount"].sum()
    assert per_round.to_dict() == pytest.approx({1: 149.0, 2: 44.0})   # round index t = 0 is round 1
    assert ledger.by_component == pytest.approx(per_comp.to_dict())


def test_simulated_clock_is_the_slowest_path(scenario):
    _, times = scenario
    # Round 0: edge 0 = 1 (down) + 2 × (0.5 + 12 + 5.5 + 3 + 0.5) + 1 (up) = 45 (client 2 is slowest);
    # edge 1 = 1 + 2 × (0.5 + 7.5 + 3 + 2 + 0.5) + 1 = 29, the cloud waits for edge 0.
    # Round 1 only edge 1: 29 more.
    assert times == pytest.approx([45.0, 74.0])


def test_charge_spans_are_sequential_within_a_client(scenario):
    ledger, _ = scenario
    df = ledger.frame()
    c2 = df[(df.client == 2) & (df.group_round == 0)].set_index("component")
    assert c2.loc["training", "end"] - c2.loc["training", "start"] == pytest.approx(12.0)
    assert c2.loc["secagg", "start"] == pytest.approx(c2.loc["training", "end"])
    assert c2.loc["backdoor", "start"] == pytest.approx(c2.loc["secagg", "end"])
