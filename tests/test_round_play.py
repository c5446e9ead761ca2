"""The emulator's shortcuts change no number: a group round's members played as one SimPy process
give the clock and ledger of one process per member (ties between groups included), and the
ledger kept expanded between checkpoints, checkpointed as codes, reads back as charged (old
checkpoints with the text columns as strings too)."""
import numpy as np
import pandas as pd
import simpy
import torch

from groupfel.emulator.io import read_checkpoint
from groupfel.cost_models import CostModel, DeviceProfile, linear, quadratic
from groupfel.emulator.config import FaultsConfig, StragglerConfig
from groupfel.emulator.federation import Federation, Group, RoundContext
from groupfel.emulator.ledger import CostLedger
from groupfel.topologies import Link, build_topology


def _play(faults, one_process: bool, computed: bool = False, edge_mbps: float = 80.0) -> tuple[float, pd.DataFrame]:
    """Three rounds of 4 groups on 2 edges; groups 0 and 2 are alike (devices, samples) on alike edges,
    so their group rounds end at the same simulated times."""
    sizes = np.array([10, 20, 10, 20, 10, 20, 10, 20, 30, 30])
    labels = sizes[:, None]
    topo = build_topology([5, 5], ["a", "b"] * 5, [np.arange(s) for s in sizes], labels, Link(8.0, 0.5),
                          Link(edge_mbps, 0.2))
    profiles = {d: DeviceProfile(d, "t", {"sgd": linear(0.1 * (1 + i), 0.01)}, {"secagg": quadratic(1, 0.5, 0)})
                for i, d in enumerate("ab")}
    ledger = CostLedger()
    env = simpy.Environment()
    fed = Federation(RoundContext(env, 1_000_000, CostModel(profiles, "sgd", ("secagg",), 2.0), ledger, topo, 3, 3,
                                  2, faults))
    if not one_process:
        fed._spans = lambda t0, transfer, charges, slow, dropped: (None, None)   # every member its own process
    groups = [(0, Group(0, np.array([0, 1]), sizes[[0, 1]], 0.0)), (1, Group(0, np.array([2, 3, 4]), sizes[[2, 3, 4]], 0.0)),
              (2, Group(1, np.array([5, 6]), sizes[[5, 6]], 0.0)), (3, Group(1, np.array([7, 8, 9]), sizes[[7, 8, 9]], 0.0))]
    for t in range(3):
        if computed:
            fed.run_round(t, groups)
        else:
            env.run(until=env.process(fed.global_round(t, groups)))
    frame = ledger.frame()
    frame.attrs["totals"] = (ledger.total, ledger.by_component)
    return env.now, frame


def test_one_process_per_group_round_plays_as_one_per_member():
    for faults in (None, FaultsConfig(dropout=0.3, recovery_multiple=2.0),
                   FaultsConfig(dropout=0.2, straggler=StragglerConfig(distribution="lognormal", sigma=0.5))):
        now, fast = _play(faults, one_process=True)
        now_each, each = _play(faults, one_process=False)
        assert now == now_each
        pd.testing.assert_frame_equal(fast, each, check_exact=True)
    # the case the order matters: groups finishing their group rounds at the same time
    _, df = _play(None, one_process=True)
    ends = df.groupby(["round", "group_round", "group"])["end"].max().unstack()
    assert (ends[0] == ends[2]).all()


def test_a_round_computed_without_events_plays_as_simpy():
    """Federation.run_round computes a round without SimPy events where it can (no dropouts, no
    energy): the same clock, ledger rows in the same order (groups tying included) and totals."""
    from groupfel.emulator import federation

    calls = []
    real = federation.Federation._computed

    def spy(self, t, sampled):
        calls.append(real(self, t, sampled))
        return calls[-1]

    federation.Federation._computed = spy
    try:
        for edge_mbps in (80.0, 8.0, 1e9):   # edges arriving apart, groups ending with the other edge's
            for faults in (None, FaultsConfig(dropout=0.0, straggler=StragglerConfig(distribution="lognormal", sigma=0.5)),
                           FaultsConfig(dropout=0.3, recovery_multiple=2.0)):
                calls.clear()
                now, computed = _play(faults, one_process=True, computed=True, edge_mbps=edge_mbps)
                assert calls and all(calls) == (faults is None or faults.dropout == 0)   # dropouts: SimPy plays
                for one in (True, False):
                    now_sim, sim = _play(faults, one_process=one, edge_mbps=edge_mbps)
                    assert now == now_sim
                    pd.testing.assert_frame_equal(computed, sim, check_exact=True)
                    assert computed.attrs["totals"] == sim.attrs["totals"]
    finally:
        federation.Federation._computed = real
    _, df = _play(None, one_process=True, computed=True)
    ends = df.groupby(["round", "group_round", "group"])["end"].max().unstack()
    assert (ends[0] == ends[2]).all()   # ties, charged in SimPy's order


def _charge(led: CostLedger, r: int) -> None:
    for comp, devices in (("training", ["a", "b", "a"]), ("secagg", ["b", "b", "a"])):
        led.charge(round=r, edge=r % 2, group=r, group_round=0, clients=np.array([0, 1, 2]) + r, devices=devices,
                   component=comp, amounts=np.arange(3.0) + r, start=np.zeros(3), end=np.ones(3))


def test_a_ledger_read_between_charges_checkpoints_and_resumes_as_charged(tmp_path):
    from groupfel.emulator.arm import ArmState
    from groupfel.emulator.driver import load_checkpoint, save_checkpoint

    whole, read = CostLedger(), CostLedger()
    for r in range(4):
        _charge(whole, r)
        _charge(read, r)
        read.state()                     # a checkpoint after every round keeps the rows expanded
    pd.testing.assert_frame_equal(whole.frame(), read.frame(), check_exact=True)
    save_checkpoint(tmp_path / "c.pt", ArmState(ledger=read))
    blob = read_checkpoint(tmp_path / "c.pt")
    assert all(isinstance(v, torch.Tensor) for v in blob["ledger"]["columns"].values())   # no string per row
    back = load_checkpoint(tmp_path / "c.pt").ledger
    _charge(back, 4)
    _charge(whole, 4)
    pd.testing.assert_frame_equal(whole.frame(), back.frame(), check_exact=True)
    assert back.total == whole.total and back.by_component == whole.by_component


def test_a_checkpoint_with_the_text_columns_as_strings_still_resumes(tmp_path):
    """Checkpoints written before the codes kept the device and component of every row as a string."""
    from groupfel.emulator.arm import ArmState
    from groupfel.emulator.driver import load_checkpoint, save_checkpoint

    led = CostLedger()
    for r in range(3):
        _charge(led, r)
    save_checkpoint(tmp_path / "c.pt", ArmState(ledger=led))
    blob = read_checkpoint(tmp_path / "c.pt")
    names = blob["ledger"].pop("names")
    for c, v in names.items():           # the old layout
        blob["ledger"]["columns"][c] = [v[i] for i in blob["ledger"]["columns"][c].tolist()]
    torch.save(blob, tmp_path / "old.pt")
    back = load_checkpoint(tmp_path / "old.pt").ledger
    _charge(back, 3)
    _charge(led, 3)
    pd.testing.assert_frame_equal(led.frame(), back.frame(), check_exact=True)


def test_checkpoint_tables_survive_a_kill_while_the_next_is_written(tmp_path):
    """A checkpoint's large tables live in one of two side files, written in place in turn: a kill
    while the next checkpoint writes its tables (into the other one) leaves the last one whole; a
    side file that is not the checkpoint's own is refused as damaged."""
    import pytest

    from groupfel.emulator.arm import ArmState
    from groupfel.emulator.driver import load_checkpoint, save_checkpoint
    from groupfel.emulator.io import checkpoint_files, remove_checkpoint
    from groupfel.errors import InputError

    path = tmp_path / "checkpoint.pt"
    states = [ArmState(t=t, momentum=torch.full((300, 100), float(t))) for t in (1, 2)]
    for s in states:
        save_checkpoint(path, s)
    main, side0, side1 = checkpoint_files(path)
    assert side0.exists() and side1.exists() and main.stat().st_size < 100_000   # the momentum is beside it
    side0.write_bytes(side0.read_bytes()[:1000])      # killed while writing the third checkpoint's tables
    back = load_checkpoint(path)
    assert back.t == 2 and torch.equal(back.momentum, states[1].momentum)
    save_checkpoint(path, ArmState(t=3, momentum=torch.full((300, 100), 3.0)))   # the third, into side 0
    assert load_checkpoint(path).t == 3
    side0.write_bytes(side1.read_bytes())             # another checkpoint's tables: refused, not misread
    with pytest.raises(InputError, match="not a readable checkpoint"):
        load_checkpoint(path)
    remove_checkpoint(path)
    assert not any(p.exists() for p in checkpoint_files(path))
