"""Clients that join mid-run (topology.arrivals, HCCT Sec. 7.3 / Fig. 3): when each joins, that
nothing is charged for it before, that HCCT places it by Alg. 2 in the round it joins, and the
one-line refusals."""
import numpy as np
import pandas as pd
import pytest

from groupfel.emulator.io import read_checkpoint
from groupfel.emulator.config import ArrivalsConfig, arrival_rounds, parse_config
from groupfel.emulator.driver import CHECKPOINT, plan_arm, run_arm
from groupfel.errors import InputError
from groupfel.emulator.rounds.common import LocalData
from groupfel.emulator.world import build_world


def test_arrival_rounds_by_hand():
    a = ArrivalsConfig(initial=3, every=2, per_arrival=2)
    assert arrival_rounds(a, 7).tolist() == [0, 0, 0, 2, 2, 4, 4]
    assert arrival_rounds(None, 3).tolist() == [0, 0, 0]
    assert arrival_rounds(ArrivalsConfig(initial=2, every=5, per_arrival=1), 4).tolist() == [0, 0, 5, 10]


def _config(tiny_dict, arrivals, rounds=6, policy=None):
    """Two concepts (clients 0-2 and 3-5 disagree on every label); clients 4 and 5 join later."""
    tiny_dict["mode"] = "per-group"
    tiny_dict["topology"] = {"edges": 1, "clients_per_edge": 6, "arrivals": arrivals}
    tiny_dict["data"].update(partition="concept-shift", min_samples=60, max_samples=60,
                             types=[{"clients": 3, "permutation": list(range(10))},
                                    {"clients": 3, "permutation": list(range(9, -1, -1))}])
    tiny_dict["train"].update(rounds=rounds, eval_every=1, group_rounds=1)
    tiny_dict["arms"] = [{"name": "hcct", "grouping": policy or {"policy": "hcct", "alpha": 10.0}}]
    return parse_config(tiny_dict)


def test_newcomers_are_free_until_they_join_then_hcct_places_them_with_their_concept(tiny_dict, tmp_path):
    cfg = _config(tiny_dict, {"initial": 4, "every": 2, "per_arrival": 1}, rounds=8)
    world = build_world(cfg)
    seen = {}

    def record(t, cost, acc):
        seen[t] = read_checkpoint(tmp_path / "a" / CHECKPOINT)["assign"].numpy().copy()
    full = run_arm(world, plan_arm(world, 0), tmp_path / "a", record)
    ledger = pd.read_parquet(tmp_path / "a" / "ledger.parquet")
    first = ledger.groupby("client")["round"].min()                       # the ledger counts rounds from 1
    assert first[4] == 3 and first[5] == 5 and (first[[0, 1, 2, 3]] == 1).all()
    # in the first round it trains, a newcomer probes one epoch from the initial model (charged, group -1)
    probes = ledger[ledger["group"] == -1]
    assert set(probes.loc[probes["round"] == 3, "client"]) == {4}
    assert set(probes.loc[probes["round"] == 5, "client"]) == {5}
    assert (seen[1][4:] == -1).all() and seen[3][5] == -1                   # in no group before they join
    assert seen[3][4] == seen[3][3]          # Alg. 2 puts client 4 with its concept in the round it joins
    assert seen[8][5] == seen[8][4] == seen[8][3]                            # client 5 a round later
    assert not set(seen[8][:3]) & set(seen[8][3:])                          # the concepts never share a group
    assert list(full["round"]) == list(range(9))

    def kill(t, cost, acc):
        if t == 3:
            raise KeyboardInterrupt
    world = build_world(cfg)
    with pytest.raises(KeyboardInterrupt):
        run_arm(world, plan_arm(world, 0), tmp_path / "b", kill)
    world = build_world(cfg)
    pd.testing.assert_frame_equal(full, run_arm(world, plan_arm(world, 0), tmp_path / "b"), check_exact=True)


def test_the_local_error_is_over_the_clients_present(tiny_dict, tmp_path):
    """Round 0, where every client holds the initial model: the mean error over the 4 clients
    present, where the run without arrivals averages all 6."""
    import copy

    rows = {}
    for name, arrivals in (("late", {"initial": 4, "every": 2, "per_arrival": 1}), ("all", None)):
        world = build_world(_config(copy.deepcopy(tiny_dict), arrivals))
        rows[name] = run_arm(world, plan_arm(world, 0), tmp_path / name)
    x0 = world.engine.initial_weights(world.config.seed)
    acc = LocalData(world, world.local_test).score(x0, np.arange(6))[0]
    assert rows["late"]["local_error_mean"].iloc[0] == pytest.approx(1 - acc[:4].mean())
    assert rows["all"]["local_error_mean"].iloc[0] == pytest.approx(1 - acc.mean())
    assert rows["late"]["local_error_mean"].iloc[0] != pytest.approx(rows["all"]["local_error_mean"].iloc[0])


@pytest.mark.parametrize("change,message", [
    (lambda d: d.update(mode="global"), r"^config: topology.arrivals: clients join mid-run in per-group mode only"),
    (lambda d: d["topology"]["arrivals"].update(per_arrival=0),
     r"^config: topology.arrivals.per_arrival: 0 means no client joins, but the topology has 2 clients beyond"),
    (lambda d: d["train"].update(rounds=4),
     r"^config: topology.arrivals: the last of 6 clients would join at round 4, after the 4 rounds"),
    (lambda d: d["topology"]["arrivals"].update(initial=7), r"^config: topology.arrivals.initial: 7 is more than"),
])
def test_bad_arrivals_fail_in_one_line_naming_the_field(tiny_dict, change, message):
    d = _config(tiny_dict, {"initial": 4, "every": 2, "per_arrival": 1}).model_dump()
    change(d)
    with pytest.raises(InputError, match=message):
        parse_config(d)


def test_a_grouping_formed_once_cannot_take_newcomers(tiny_dict):
    cfg = _config(tiny_dict, {"initial": 4, "every": 2, "per_arrival": 1}, policy={"policy": "global"})
    with pytest.raises(InputError, match=r"^arms\[0\].grouping: 'global' regroups by '\w+', so it cannot place "
                                         r"clients that join mid-run \(topology.arrivals\)"):
        plan_arm(build_world(cfg), 0)


def test_ifca_newcomers_pick_a_model_from_the_round_they_join(tiny_dict, tmp_path):
    cfg = _config(tiny_dict, {"initial": 4, "every": 2, "per_arrival": 1},
                  policy={"policy": "ifca", "n_clusters": 2})
    world = build_world(cfg)
    run_arm(world, plan_arm(world, 0), tmp_path / "a")
    ledger = pd.read_parquet(tmp_path / "a" / "ledger.parquet")
    first = ledger.groupby("client")["round"].min()      # IFCA's loss evaluations included (group -1)
    assert first.tolist() == [1, 1, 1, 1, 3, 5]
    assert (ledger.loc[ledger["client"] == 4, "group"] >= 0).any()     # it trains with a cluster
