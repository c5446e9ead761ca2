"""Shared edges in the SimPy federation: hand-computed clocks, availability, bad input."""
import copy
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import simpy

from groupfel.cost_models import CostModel, DeviceProfile, linear, quadratic
from groupfel.emulator.config import AvailabilityConfig, HeterogeneityConfig, parse_config
from groupfel.emulator.network import (OFFLINE, Availability, ClientNet, ContendedFederation, EdgeNetwork,
                                 client_bytes, client_net)
from groupfel.errors import InputError
from groupfel.emulator.federation import Group, RoundContext
from groupfel.emulator.ledger import CostLedger
from groupfel.topologies import Link, build_topology

sys.path.insert(0, str(Path(__file__).parent))
from conftest import TINY  # noqa: E402

MB = 10**6


def _fed(n_clients=4, *, access=None, cores=None, aggregation=None, avail=None, group_rounds=1, bw=8.0, bws=None):
    """One edge, clients on 8 Mbit/s links without latency, the edge link 8 Mbit/s; every
    client trains 1 s (E = 1, H = 1 s) and runs one 1 s group operation; the model is 1 MB."""
    parts = [np.arange(i * 10, i * 10 + 10) for i in range(n_clients)]
    topo = build_topology([n_clients], ["dev"] * n_clients, parts, np.ones((n_clients, 10), dtype=int),
                          client_link=Link(bw, 0.0), edge_link=Link(8.0, 0.0))
    prof = DeviceProfile("dev", "t", training={"sgd": linear(0.0, 1.0)},
                         group_overhead={"backdoor": quadratic(0.0, 0.0, 1.0)})
    cost = CostModel({"dev": prof}, "sgd", ("backdoor",))
    curves = {"aggregation": quadratic(0.0, 0.0, aggregation)} if aggregation else {}
    clients = client_net(None, n_clients, bw, 0.0, 0)
    if bws is not None:
        clients = ClientNet(np.array(bws, dtype=float), clients.latency_s, clients.slowdown)
    net = EdgeNetwork(None if access is None else access * 1e6, cores, False, clients, 1, False, curves, avail)
    env = simpy.Environment()
    ctx = RoundContext(env, MB, cost, CostLedger(), topo, seed=0, group_rounds=group_rounds, local_epochs=1)
    return ContendedFederation(ctx, net), env


def _groups(*members):
    return [(gid, Group(0, np.array(m), np.full(len(m), 10), 0.0)) for gid, m in enumerate(members)]


def test_two_groups_queue_for_one_core():
    # x_t to the edge 0..1 s; each client: download 1..2, train 2..3, operation 3..4, upload
    # 4..5. Both groups are ready at 5 s; one core: group 0 aggregates 5..7, group 1 waits and
    # aggregates 7..9; the edge sends 2 models up (2 MB at 8 Mbit/s) 9..11.
    fed, env = _fed(cores=1, aggregation=2.0)
    fed.run_round(0, _groups([0, 1], [2, 3]))
    assert env.now == pytest.approx(11.0)
    holds = sorted((r["start"], r["end"], r["queued"]) for r in fed.trace if r["kind"] == "core")
    assert [x for h in holds for x in h] == pytest.approx([5.0, 7.0, 5.0, 7.0, 9.0, 5.0])
    edge = fed.stats[0]["edges"][0]
    assert edge["core_wait_s"] == pytest.approx(2.0)
    assert edge["core_utilisation"] == pytest.approx(4.0 / 11.0)
    # waiting is time, not cost: Eq. 5 is 4 clients × (1 + 1)
    assert fed.ctx.ledger.total == pytest.approx(8.0)
    # two cores: both aggregate 5..7, the round ends at 9
    fed2, env2 = _fed(cores=2, aggregation=2.0)
    fed2.run_round(0, _groups([0, 1], [2, 3]))
    assert env2.now == pytest.approx(9.0)


def test_shared_access_stretches_transfers():
    # 4 clients on 8 Mbit/s of access capacity: each download of 8 Mbit gets 2 Mbit/s (1..5 s),
    # train 5..6, operation 6..7, uploads share likewise (7..11); one core aggregates the two
    # groups 11..13 and 13..15; the edge link sends 2 MB 15..17
    fed, env = _fed(access=8.0, cores=1, aggregation=2.0)
    fed.run_round(0, _groups([0, 1], [2, 3]))
    assert env.now == pytest.approx(17.0)
    r = fed.stats[0]
    assert r["makespan_s"] == pytest.approx(17.0)
    assert r["edges"][0]["access_down_utilisation"] == pytest.approx(32 / (8 * 17))
    assert r["bytes"] == {"cloud_to_edge": MB, "edge_to_cloud": 2 * MB, "edge_to_client": 4 * MB,
                          "client_to_edge": 4 * MB}
    downloads = [(x["start"], x["end"]) for x in fed.trace if x["kind"] == "download"]
    assert [x for d in downloads for x in d] == pytest.approx([1.0, 5.0] * 4)


def test_half_bandwidth_client_in_a_group_sharing_the_edge():
    # one group of 3 on 8 Mbit/s of access; own links 4, 4 and 2 Mbit/s (client 2: half).
    # x_t 0..1. Downloads from 1: client 2 gets its cap 2, the others (8 - 2) / 2 = 3: they end
    # at 1 + 8/3 = 3.667; client 2 has 5.333 Mbit by then, the rest at its cap: ends at 5.0.
    # Fast clients: train, operate to 5.667, upload alone together at 4 each. Client 2: train,
    # operate to 7.0, then uploads at its cap 2 (8 Mbit: 7.0..11.0) while the others, sharing
    # 8 - 2 = 6, have 8 - 4 × 1.333 = 2.667 Mbit left at 3 each: they end at 7 + 8/9 = 7.889.
    # The group round ends at 11.0, the edge sends one model up 11..12.
    fed, env = _fed(3, access=8.0, bws=[4.0, 4.0, 2.0])
    fed.run_round(0, _groups([0, 1, 2]))
    assert env.now == pytest.approx(12.0)
    ends = {(x["kind"], x["client"]): x["end"] for x in fed.trace}
    assert ends[("download", 0)] == pytest.approx(1 + 8 / 3) and ends[("download", 2)] == pytest.approx(5.0)
    assert ends[("upload", 0)] == pytest.approx(7 + 8 / 9) and ends[("upload", 1)] == pytest.approx(7 + 8 / 9)
    assert ends[("upload", 2)] == pytest.approx(11.0)


def test_offline_client_drops_and_is_charged_nothing_after(tmp_path):
    # client 1 is online [0, 5) and [100, 1000): online through group round 0 (1 s to 5 s: 1 +
    # download 1 + train 1 + op 1 + upload 1), offline at group round 1's start (5 s). It pays group
    # round 0 (1 + 1) and nothing after; client 0 alone runs group round 1 (5..9), the edge sends
    # one model up 9..10.
    csv = tmp_path / "avail.csv"
    csv.write_text("client,start_s,end_s\n0,0,1000\n1,0,5\n1,100,1000\n")
    avail = Availability(AvailabilityConfig(file=str(csv)), 2, 0)
    fed, env = _fed(2, avail=avail, group_rounds=2)
    sampled = _groups([0, 1])
    assert fed.offline(0, sampled) == {(1, 1)}            # known before the round runs (the compute's)
    assert fed.round_cost(0, [g for _, g in sampled]) == pytest.approx(6.0)
    fed.run_round(0, sampled)
    assert env.now == pytest.approx(10.0)
    led = fed.ctx.ledger.frame()
    c1 = led[led.client == 1]
    assert c1[c1.group_round == 0]["amount"].sum() == pytest.approx(2.0)
    assert (c1[c1.start >= 5.0]["amount"] == 0).all() and len(c1[c1.start >= 5.0]) > 0
    off = led[led.component == OFFLINE]
    assert off[["client", "group_round", "start"]].values.tolist() == [[1, 1, 5.0]]
    assert fed.ctx.ledger.total == pytest.approx(6.0)
    assert fed.manifest(fed.ctx.ledger)["network"]["offline"] == [
        {"round": 1, "group_round": 1, "client": 1, "edge": 0, "group": 0, "time_s": 5.0}]


def test_a_client_offline_before_it_finishes_drops_out_then(tmp_path):
    """Client 1 is online [0, 3) only: group round 0 starts at 1 s, its download ends at 2 s, it
    trains 2..3 s and goes offline at 3 s, before its group operation: it drops out at 3 s (an
    offline charge then), pays its training (Eq. 5, as a fault's dropout) and no group operation,
    sends nothing, and is out of group round 1; its update is left out (the compute's set)."""
    csv = tmp_path / "avail.csv"
    csv.write_text("client,start_s,end_s\n0,0,1000\n1,0,3\n")
    avail = Availability(AvailabilityConfig(file=str(csv)), 2, 0)
    fed, env = _fed(2, avail=avail, group_rounds=2)
    sampled = _groups([0, 1])
    assert fed.offline(0, sampled) == {(0, 1), (1, 1)}
    fed.run_round(0, sampled)
    led = fed.ctx.ledger.frame()
    c1 = led[(led.client == 1) & (led.group_round == 0)].set_index("component")
    assert c1.loc["training", "amount"] == pytest.approx(1.0) and c1.loc["backdoor", "amount"] == 0.0
    off = led[led.component == OFFLINE]
    assert off[["client", "group_round", "start"]].values.tolist() == [[1, 0, 3.0]]
    assert fed.ctx.ledger.total == pytest.approx(1.0 + 2.0 * 2)   # client 1's training, client 0's two rounds
    # client 0 alone in both group rounds: 1..5 and 5..9, the edge sends one model up 9..10
    assert env.now == pytest.approx(10.0)


WATTS = {"receive": 2.0, "training": 5.0, "group_operation": 3.0, "transmit": 7.0, "listen": 1.0, "idle": 0.5}


def _powered(fed):
    from groupfel.cost_models.power import DevicePower, Polynomial, PowerCurve, PowerModel

    fed.ctx.ledger.power = PowerModel({"dev": DevicePower("dev", {s: PowerCurve(Polynomial((w,)))
                                                                   for s, w in WATTS.items()})})
    return fed


@pytest.mark.parametrize("access, gone, end, joules", [
    # dedicated 8 Mbit/s links: download 1..2, train 2..3, operation 3..4, upload 4..5; client 1
    # leaves at 4.5 having sent 4 of its 8 Mbit: receive 1 s × 2 W + training 5 J + operation 3 J +
    # transmit 0.5 s × 7 W = 13.5 J. Client 0 alone uploads to 5 s; the edge's model goes up 5..6.
    (None, 4.5, 6.0, {0: 2 + 5 + 3 + 7, 1: 13.5}),
    # 8 Mbit/s shared: both download 1..3 at 4 Mbit/s (1 s receive + 1 s listen each), train 3..4,
    # operate 4..5 and upload from 5 at 4 Mbit/s; client 1 leaves at 5.5 having sent 2 Mbit (0.25 s
    # of airtime at its own 8 Mbit/s, 0.25 s listening): 2 + 1 + 5 + 3 + 1.75 + 0.25 = 13 J. Client
    # 0's 6 Mbit left then go at 8 Mbit/s: 5.5..6.25 (transmit 1 s, listen 0.25 s more: 18.25 J);
    # the edge's model goes up 6.25..7.25.
    (8.0, 5.5, 7.25, {0: 2 + 5 + 3 + 7 + 1.25, 1: 13.0}),
])
def test_a_client_offline_before_its_upload_ends_drops_out_then(tmp_path, access, gone, end, joules):
    """FedScale drops a client that is not online at the end of its compute and communication:
    its update does not count (the compute's offline set), it is charged its Eq. 5 work (it did
    it) and its radio until it left, nothing after, and a shared medium's capacity is the
    others' from then on."""
    csv = tmp_path / "avail.csv"
    csv.write_text(f"client,start_s,end_s\n0,0,1000\n1,0,{gone}\n")
    avail = Availability(AvailabilityConfig(file=str(csv)), 2, 0)
    fed, env = _fed(2, avail=avail, access=access)
    _powered(fed)
    sampled = _groups([0, 1])
    assert fed.offline(0, sampled) == {(0, 1)}
    fed.run_round(0, sampled)
    assert env.now == pytest.approx(end)
    led = fed.ctx.ledger.frame()
    assert led[led.component == OFFLINE][["client", "start"]].values.tolist() == [[1, gone]]
    assert fed.ctx.ledger.total == pytest.approx(4.0)          # both trained and operated: 2 × (1 + 1) s
    e = fed.ctx.ledger.energy_frame()
    assert e.groupby("client")["joules"].sum().to_dict() == pytest.approx(joules, rel=1e-12)
    assert not (e[(e.client == 1) & (e.state == "idle")]["joules"] > 0).any()


def _leaver_at_5_5(tmp_path):
    """Two clients online from 0; client 1 leaves at 5.5 s."""
    (tmp_path / "avail.csv").write_text("client,start_s,end_s\n0,0,1000\n1,0,5.5\n")
    return Availability(AvailabilityConfig(file=str(tmp_path / "avail.csv")), 2, 0)


def _whole_system_power(carbon=None, accounting="group-rounds"):
    """Clients at WATTS, the shipped Pi 4 edge, a 50 W (20 W idle) cloud at PUE 1.5."""
    from groupfel.cost_models.power import DevicePower, Polynomial, PowerCurve, PowerModel, shipped_power

    def const(w):
        return PowerCurve(Polynomial((w,)))
    return PowerModel(
        {"dev": DevicePower("dev", {s: const(w) for s, w in WATTS.items()}),
         "raspberry-pi-4-edge": shipped_power()["raspberry-pi-4-edge"],
         "dc": DevicePower("dc", {"aggregation": const(50.0), "secagg_server": const(50.0), "idle": const(20.0)})},
        accounting, edge="raspberry-pi-4-edge", cloud="dc", cloud_pue=1.5, carbon=carbon)


@pytest.mark.parametrize("accounting, edge_j, cloud_j", [
    # the edge holds its core 5..7 s (aggregation 2 s at 5 W: 10 J) and idles the rest of the 8 s
    # round (6 s at 1.6 W: 9.6 J); the cloud averages 1 group model in 2 s at 50 W, × PUE 1.5: 150 J
    ("group-rounds", 10.0 + 9.6, 150.0),
    # above idle: (5 - 1.6) W × 2 s, no idle; the cloud (50 - 20) W × 2 s × 1.5
    ("marginal", 6.8, 90.0),
])
def test_the_edge_servers_and_the_cloud_are_charged_by_hand(accounting, edge_j, cloud_j):
    fed, env = _fed(2, cores=1, aggregation=2.0)
    fed.ctx.ledger.power = _whole_system_power(accounting=accounting)
    fed.run_round(0, _groups([0, 1]))
    assert env.now == pytest.approx(8.0)
    led = fed.ctx.ledger
    assert led.site_energy == pytest.approx({"edge": edge_j, "cloud": cloud_j}, rel=1e-12)
    rows = led.site_frame()
    assert rows[rows.site == "edge"].set_index("state")["seconds"].to_dict() == \
        pytest.approx({"aggregation": 2.0, **({"idle": 6.0} if accounting != "marginal" else {})})
    row = led.energy_row()
    assert row["edge_energy_j"] == pytest.approx(edge_j) and row["cloud_energy_j"] == pytest.approx(cloud_j)


EMAPS = ("Datetime (UTC),Country,Zone Name,Zone Id,Carbon Intensity gCO₂eq/kWh (direct),"
         "Carbon Intensity gCO₂eq/kWh (LCA),Low Carbon Percentage,Renewable Percentage,Data Source,Data Estimated\n"
         "2024-01-01 00:00:00,Germany,Germany,DE,80,100,50,40,x,false\n"
         "2024-01-01 01:00:00,Germany,Germany,DE,350,400,20,10,x,false\n"
         "2024-01-01 02:00:00,Germany,Germany,DE,90,110,50,40,x,false\n")


@pytest.mark.parametrize("fmt", ["electricity-maps", "simgrid"])
def test_joules_and_grams_of_clients_edges_and_the_cloud_by_hand(tmp_path, fmt):
    """A shared 8 Mbit/s access, one core, aggregation 2 s, client 1 gone at 5.5 s mid-upload; an
    hourly intensity whose hour turns at 3 s simulated (100 g/kWh, then 400). Clients: client 0
    19.25 J (receive 2 + listen 1.25 + training 5 + operation 3 + transmit 7 + idle 2 s × 0.5 W
    waiting for the edge), client 1 13 J; priced at their group round's start (1 s: 100 g/kWh).
    The edge holds its core 6.25..8.25 s (10 J, priced at 6.25 s: 400 g/kWh) and idles the rest of
    the 9.25 s round (7.25 s × 1.6 W = 11.6 J at 0 s: 100). The cloud: 2 s × 50 W × PUE 1.5 =
    150 J at the round's start (100)."""
    from groupfel.cost_models.carbon import read_intensity

    if fmt == "electricity-maps":
        (tmp_path / "ci.csv").write_text(EMAPS)
        carbon = read_intensity(None, tmp_path / "ci.csv", "2024-01-01 00:59:57")
        assert "(LCA)" in carbon.source
    else:
        (tmp_path / "ci.txt").write_text("client\t0\t100\nedge\t0\t100\nedge\t3\t400\ncloud\t0\t100\n")
        carbon = read_intensity(None, tmp_path / "ci.txt")

    fed, env = _fed(2, access=8.0, cores=1, aggregation=2.0, avail=_leaver_at_5_5(tmp_path))
    fed.ctx.ledger.power = _whole_system_power(carbon)
    sampled = _groups([0, 1])
    fed.offline(0, sampled)
    fed.run_round(0, sampled)
    assert env.now == pytest.approx(9.25)
    led = fed.ctx.ledger
    e = led.energy_frame()
    kwh = 3.6e6
    assert e.groupby("client")["joules"].sum().to_dict() == pytest.approx({0: 19.25, 1: 13.0}, rel=1e-9)
    assert e.groupby("client")["grams"].sum().to_dict() == pytest.approx(
        {0: 19.25 / kwh * 100, 1: 13.0 / kwh * 100}, rel=1e-9)
    sites = led.site_frame().set_index(["site", "state"])
    assert sites["joules"].to_dict() == pytest.approx(
        {("edge", "aggregation"): 10.0, ("edge", "idle"): 11.6, ("cloud", "aggregation"): 150.0}, rel=1e-9)
    assert sites["grams"].to_dict() == pytest.approx(
        {("edge", "aggregation"): 10.0 / kwh * 400, ("edge", "idle"): 11.6 / kwh * 100,
         ("cloud", "aggregation"): 150.0 / kwh * 100}, rel=1e-9)
    row = led.energy_row()
    assert row["carbon_g"] == pytest.approx(32.25 / kwh * 100, rel=1e-9)
    assert row["edge_carbon_g"] == pytest.approx((10.0 * 400 + 11.6 * 100) / kwh, rel=1e-9)
    assert row["carbon_intensity"] == carbon.source
    back = CostLedger.from_state(led.state())        # a checkpoint keeps every gram
    pd.testing.assert_frame_equal(back.energy_frame(), e)
    pd.testing.assert_frame_equal(back.site_frame(), led.site_frame())
    assert back.carbon_g == led.carbon_g


def test_the_whole_systems_joules_and_grams_by_hand(tmp_path):
    """Clients, the edge and the cloud in one shared-link round with secure aggregation, a drop-out,
    batteries that charge and an hourly intensity, every number by hand.

    Secure aggregation in a group of 2: download 1e6 + 2 × 64 + 168 = 1,000,296 B (8,002,368 bit),
    upload 1e6 + 64 + 168 + 66 = 1,000,298 B (8,002,384 bit). x_t 0..1 s; both download at
    4 Mbit/s to 3.000592 s (receive 1.000296 s, listen 1.000296 s), train to 4.000592, operate to
    5.000592, upload at 4 Mbit/s. Client 1 goes offline at 5.5 s having sent 1,997,632 bit
    (transmit 0.249704 s, listen 0.249704 s); client 0's 6,004,752 bit left go at 8 Mbit/s to
    6.250594 s (transmit 1.000298 s, listen 0.249704 s more). The edge holds its core 3.5 s
    (aggregation 2 s; secure aggregation 1 s + 1 drop-out × 0.5 s) to 9.750594 s, then sends the
    model up (1 s): the round ends at 10.750594 s. Client 0 idles 8.750594 - 5.250594 = 3.5 s."""
    from groupfel.cost_models.carbon import read_intensity
    from groupfel.emulator.network.battery import Battery

    (tmp_path / "ci.csv").write_text(EMAPS)
    carbon = read_intensity(None, tmp_path / "ci.csv", "2024-01-01 00:59:57")     # 100 g/kWh, 400 from 3 s

    fed, env = _fed(2, access=8.0, cores=1, aggregation=2.0, avail=_leaver_at_5_5(tmp_path))
    fed.net.secagg = True
    fed.net.edge_curves.update({"secagg-server": quadratic(0.0, 0.0, 1.0),
                                "secagg-server-recovery": quadratic(0.0, 0.0, 0.5)})
    fed.net.battery_j, fed.net.battery = 15.0, Battery(15.0, 0.5)
    fed.ctx.ledger.power = _whole_system_power(carbon)
    sampled = _groups([0, 1])
    assert fed.offline(0, sampled) == {(0, 1)}
    fed.run_round(0, sampled)
    end = 10.750594
    assert env.now == pytest.approx(end, rel=1e-12)
    led, kwh = fed.ctx.ledger, 3.6e6
    rows = led.energy_frame().groupby(["client", "state"], observed=True)[["seconds", "joules", "grams"]].sum()
    hand = {(0, "receive"): (1.000296, 2), (0, "training"): (1, 5), (0, "group_operation"): (1, 3),
            (0, "transmit"): (1.000298, 7), (0, "listen"): (1.25, 1), (0, "idle"): (3.5, 0.5),
            (1, "receive"): (1.000296, 2), (1, "training"): (1, 5), (1, "group_operation"): (1, 3),
            (1, "transmit"): (0.249704, 7), (1, "listen"): (1.25, 1)}
    for key, (sec, w) in hand.items():
        assert rows.loc[key, "seconds"] == pytest.approx(sec, rel=1e-9), key
        assert rows.loc[key, "joules"] == pytest.approx(sec * w, rel=1e-9), key
        assert rows.loc[key, "grams"] == pytest.approx(sec * w / kwh * 100, rel=1e-9), key   # at 1 s: 100 g/kWh
    assert rows.loc[(1, "idle"), "joules"] == 0.0           # it left: no idle
    sites = led.site_frame().set_index(["site", "state"])
    edge_idle = (end - 3.5) * 1.6
    assert sites["joules"].to_dict() == pytest.approx(
        {("edge", "aggregation"): 10.0, ("edge", "secagg_server"): 7.5, ("edge", "idle"): edge_idle,
         ("cloud", "aggregation"): 150.0}, rel=1e-9)
    assert sites["grams"].to_dict() == pytest.approx(
        {("edge", "aggregation"): 10.0 / kwh * 400, ("edge", "secagg_server"): 7.5 / kwh * 400,
         ("edge", "idle"): edge_idle / kwh * 100, ("cloud", "aggregation"): 150.0 / kwh * 100}, rel=1e-9)
    # batteries: checked at 1 s (full), spent 20.002678 J and 12.99852 J, charged 0.5 W since:
    # client 0 at 15 - 20.002678 + 0.5 × 9.750594 = -0.127381 J is empty; client 1 (6.876777 J) is
    # offline for good, so the clock waits until client 0 holds 15 J: 30.254762 s later
    assert led.client_energy.tolist() == pytest.approx([20.002678, 12.99852], rel=1e-9)
    assert fed.await_online() is None
    assert env.now == pytest.approx(end + (15 + 0.127381) / 0.5, rel=1e-9)
    assert led.battery["level"][1] == pytest.approx(15 - 12.99852 + 0.5 * (end - 1), rel=1e-9)
    assert fed.online_now().tolist() == [True, False]       # client 0 is back, charged
    assert [(c, e) for _, c, e in led.battery["events"]] == [(0, "empty"), (0, "charged")]


def test_a_battery_that_charges_takes_its_client_off_and_brings_it_back():
    """Two clients, batteries of 20 J charging at 2 W (always plugged in), back when full. Each
    group round spends 17 J a client (receive 1 s × 2 W, training 5 J, operation 3 J, transmit
    1 s × 7 W) in 4 s. Round 1: group rounds at 1 s (20 J) and 5 s (20 - 17 + 2 × 4 = 11 J). Round
    2: at 11 s 11 - 17 + 2 × 6 = 6 J; at 15 s 6 - 17 + 8 = -3 J: both empty, nobody trains, the
    round ends at 16 s. Nobody is charged until 15 + 23 J / 2 W = 26.5 s: the clock waits for
    them, and both come back then."""
    from groupfel.emulator.network.battery import Battery

    fed, env = _fed(2, group_rounds=2)
    _powered(fed)
    fed.net.battery_j = 20.0
    fed.net.battery = Battery(20.0, 2.0)
    sampled = _groups([0, 1])
    for t in range(2):
        fed.offline(t, sampled)
        fed.run_round(t, sampled)
    assert env.now == pytest.approx(16.0)
    led = fed.ctx.ledger
    assert led.client_energy.tolist() == pytest.approx([51.0, 51.0])
    assert [(a, e) for a, _, e in led.battery["events"]] == [(15.0, "empty"), (15.0, "empty")]
    off = led.frame()
    assert sorted(off[off.component == OFFLINE][["round", "group_round"]].values.tolist()) == [[2, 1], [2, 1]]
    assert fed.await_online() is None and env.now == pytest.approx(26.5)
    assert fed.online_now().all()
    assert [(a, c, e) for a, c, e in led.battery["events"][2:]] == [(26.5, 0, "charged"), (26.5, 1, "charged")]
    assert fed.manifest(led)["network"]["battery_events"][-1] == {"time_s": 26.5, "client": 1, "event": "charged"}


def test_a_battery_charges_only_in_its_charging_intervals(tmp_path):
    """Charging in [0, 10) and [20, 30) at 1 W: 15 J from 5 s take 5 s to 10 s and 10 s more from
    20 s: charged at 30 s; 30 J never (the intervals hold 20 s in all)."""
    from groupfel.emulator.network.battery import Battery

    (tmp_path / "charge.csv").write_text("client,start_s,end_s\n0,0,10\n0,20,30\n")
    plugged = Availability(AvailabilityConfig(file=str(tmp_path / "charge.csv")), 1, 0, "train.client_charging_file")
    b = Battery(100.0, 1.0, plugged)
    assert b.charged_by(0, 5.0, 15.0) == 30.0 and b.charged_by(0, 5.0, 30.0) is None
    assert b.charging_seconds(0, 5.0, 25.0) == 10.0


def test_drain_only_batteries_never_come_back():
    fed, env = _fed(2, group_rounds=2)
    _powered(fed)
    fed.net.battery_j = 20.0
    sampled = _groups([0, 1])
    fed.offline(0, sampled)
    fed.run_round(0, sampled)
    assert fed.await_online().startswith("batteries: every client's battery (train.client_energy_budget = 20 J)")


def test_generated_availability_is_seeded_and_alternates():
    cfg = AvailabilityConfig(mean_on_s=100.0, mean_off_s=100.0)
    a, b = Availability(cfg, 50, 7), Availability(cfg, 50, 7)
    grid = np.arange(0, 2000, 10.0)
    sa = np.array([[a.online(c, t) for t in grid] for c in range(50)])
    sb = np.array([[b.online(c, t) for t in grid] for c in range(50)])
    assert (sa == sb).all()
    assert 0.35 < sa.mean() < 0.65          # on half the time on average


def test_secagg_bytes():
    # n = 3: download = model + 3 × 64 B keys + 2 share ciphertexts (2 × 66 + 12 + 16 + 8 = 168 B);
    # upload = 2 vectors (SCAFFOLD) + 64 B keys + 2 × (168 + 66) B
    assert client_bytes(1000, 3, vectors=2, secagg=True) == (1000 + 192 + 336, 2000 + 64 + 468)
    assert client_bytes(1000, 3) == (1000, 1000)


def test_heterogeneity_csv(tmp_path):
    f = tmp_path / "c.csv"
    f.write_text("client,bandwidth_mbps,latency_s,slowdown\n0,10,0.1,1.5\n1,5,0.2,1\n")
    net = client_net(HeterogeneityConfig(file=str(f)), 2, 20.0, 0.02, 0)
    assert net.bandwidth_mbps.tolist() == [10.0, 5.0] and net.slowdown.tolist() == [1.5, 1.0]
    drawn = client_net(HeterogeneityConfig(bandwidth_sigma=0.5), 100, 20.0, 0.02, 0)
    assert drawn.bandwidth_mbps.std() > 0 and (drawn.latency_s == 0.02).all()


@pytest.mark.parametrize("rows, match", [
    ("client,bandwidth_mbps,latency_s\n0,10,0.1\n1,5,0.2\n7,5,0.2\n", "unknown client '7'"),
    ("client,bandwidth_mbps,latency_s\n0,10,0.1\n", r"no row for client\(s\) 1"),
    ("client,bandwidth_mbps,latency_s\n0,0,0.1\n1,5,0.2\n", "bandwidth_mbps = '0'; give a number from 1e-06 to 1e"),
    ("client,bandwidth_mbps,latency_s\n0,1e-300,0.1\n1,5,0.2\n", "bandwidth_mbps = '1e-300'; give a number from"),
    ("client,bandwidth_mbps,latency_s\n0,5,1e308\n1,5,0.2\n", "latency_s = '1e308'; give a number from 0 to 86400 s"),
    ("client,bandwidth_mbps,latency_s,slowdown\n0,5,0.1,1e308\n1,5,0.2,1\n", "slowdown = '1e308'; give a number from"),
    ("client,bandwidth_mbps,latency_s,speed\n0,5,0.1,2\n1,5,0.2,1\n", "column speed is now slowdown"),
    ("client,bandwidth_mbps,latency_s\n0,nan,0.1\n1,5,0.2\n", "bandwidth_mbps = 'nan'"),
    ("client,bandwidth\n0,10\n", "missing columns 'bandwidth_mbps', 'latency_s'"),
])
def test_heterogeneity_csv_errors(tmp_path, rows, match):
    """Read through the one reader of users' files; one line naming the key."""
    f = tmp_path / "c.csv"
    f.write_text(rows)
    with pytest.raises(InputError, match=match) as e:
        client_net(HeterogeneityConfig(file=str(f)), 2, 20.0, 0.02, 0)
    assert str(e.value).startswith("topology.heterogeneity.file:") and "\n" not in str(e.value)


def test_a_spreadsheets_link_table_reads_like_a_plain_file(tmp_path):
    plain, saved = tmp_path / "plain.csv", tmp_path / "saved.csv"
    plain.write_text("client,bandwidth_mbps,latency_s,slowdown\n0,10,0.1,1.5\n1,5,0.2,0.5\n")
    saved.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes().replace(b"\n", b"\r\n"))
    a, b = (client_net(HeterogeneityConfig(file=str(f)), 2, 20.0, 0.02, 0) for f in (plain, saved))
    assert a.manifest() == b.manifest() == {"bandwidth_mbps": [10.0, 5.0], "latency_s": [0.1, 0.2], "slowdown": [1.5, 0.5]}


@pytest.mark.parametrize("rows, match", [
    ("client,start_s,end_s\n0,0,10\n0,5,20\n1,0,5\n", "overlap"),
    ("client,start_s,end_s\n0,10,5\n1,0,5\n", "reversed"),
    ("client,start_s,end_s\n3,0,5\n", "unknown client '3'"),
    ("client,start_s,end_s\n0,0,5\n", r"no row for client\(s\) 1 \(1 of 2\); give every client a row"),
    ("client,start_s,end_s\n0,0,1e308\n1,0,5\n", r"end_s = '1e308'; give a number from 0 to 1e\+12 s"),
])
def test_availability_csv_errors(tmp_path, rows, match):
    f = tmp_path / "a.csv"
    f.write_text(rows)
    with pytest.raises(InputError, match=match) as e:
        Availability(AvailabilityConfig(file=str(f)), 2, 0)
    assert str(e.value).startswith("topology.availability.file:")


@pytest.mark.parametrize("top, key", [
    ({"edge_access_mbps": 0}, "topology.edge_access_mbps"),
    ({"edge_access_mbps": -5.0}, "topology.edge_access_mbps"),
    ({"edge_access_mbps": math.nan}, "topology.edge_access_mbps"),
    ({"edge_cores": 2.5}, "topology.edge_cores"),
    ({"edge_cores": 0}, "topology.edge_cores"),
    ({"availability": {"mean_on_s": 0, "mean_off_s": 5}}, "topology.availability.mean_on_s"),
    ({"availability": {"mean_on_s": 5}}, "topology.availability"),
])
def test_bad_keys_are_one_line_errors(top, key):
    d = copy.deepcopy(TINY)
    d["topology"].update(top)
    with pytest.raises(InputError) as e:
        parse_config(d)
    assert str(e.value).startswith(f"config: {key}") and "\n" not in str(e.value)


def test_edge_makespan_by_hand():
    # the shared-access case above through the what-if's entry point: edge link 8 Mbit/s sends
    # x_t 0..1, downloads 1..5, train 5..6, operation 6..7, uploads 7..11, 2 models up 11..13
    from groupfel.emulator.network import edge_makespan

    r = edge_makespan([2, 2], np.full(4, 10), linear(0.0, 1.0), quadratic(0.0, 0.0, 1.0), group_rounds=1,
                      local_epochs=1, model_bytes=MB, client_mbps=8.0, latency_s=0.0, access_mbps=8.0, cores=None,
                      secagg=False, edge_mbps=8.0, edge_latency_s=0.0, operation="backdoor")
    assert r["makespan_s"] == pytest.approx(13.0)
    assert r["edge_cost"] == pytest.approx(8.0)


def test_whatif_makespan_columns(tmp_path, capsys):
    from groupfel.experiments.cli import main

    out = tmp_path / "wi"
    assert main(["whatif", "--clients", "200", "--rounds", "5", "--group-sizes", "2..6:2", "--access-mbps", "8,50",
                 "--edge-cores", "1", "--edge-clients", "12", "--out", str(out)]) == 0
    import pandas as pd

    df = pd.read_csv(out / "whatif.csv")
    assert len(df) == 6 and {"makespan_s", "edge_cost", "core_wait_s", "total_per_round"} <= set(df)
    slow, fast = df[df.access_mbps == 8], df[df.access_mbps == 50]
    assert (slow["makespan_s"].to_numpy() > fast["makespan_s"].to_numpy()).all()
    assert slow[["edge_groups", "edge_group_sizes"]].astype(str).values.tolist() == [["6", "2"], ["3", "4"], ["2", "6"]]
    assert main(["whatif", "--clients", "200", "--access-mbps", "0", "--out", str(out)]) == 2
    assert "--access-mbps: '0': give a number from 1e-06 to" in capsys.readouterr().err
    from groupfel.experiments import api

    py = api.whatif([2, 4], clients=200, rounds=5, access_mbps=[8, 50], edge_cores=1, edge_clients=12)
    assert py["makespan_s"].tolist() == pytest.approx(df["makespan_s"].iloc[[0, 1, 3, 4]].tolist())


def test_whatif_rows_are_the_groups_formed_and_each_capacity_is_its_own_line(tmp_path, capsys):
    """Before: 60 clients at sizes 16 and 20 were two rows of the same 3 groups of 20, and the
    capacities were drawn as one line jumping from size 40 back to 2."""
    import matplotlib.pyplot as plt
    import pandas as pd

    from groupfel.experiments.cli import main

    seen = []
    real = plt.Figure.savefig
    plt.Figure.savefig = lambda fig, *a, **k: (seen.append(fig), real(fig, *a, **k))[1]
    try:
        assert main(["whatif", "--clients", "200", "--rounds", "2", "--group-sizes", "16,20,30", "--access-mbps",
                     "8,50,200", "--edge-clients", "60", "--out", str(tmp_path)]) == 0
    finally:
        plt.Figure.savefig = real
    df = pd.read_csv(tmp_path / "whatif.csv")
    assert df.groupby("access_mbps")["edge_group_sizes"].apply(list).map(lambda v: [str(x) for x in v]).tolist() \
        == [["20", "30"]] * 3 and df["edge_groups"].tolist() == [3, 2] * 3
    makespan, cost = seen[0].axes
    assert [ln.get_label() for ln in makespan.get_lines()] == ["access 8 Mbit/s", "access 50 Mbit/s",
                                                             "access 200 Mbit/s"]
    assert all(list(ln.get_xdata()) == [20.0, 30.0] for ln in makespan.get_lines())   # no jump back
    assert "makespan" in makespan.get_ylabel() and "Eq. 5" in cost.get_ylabel()


def test_measure_secagg_server_part(tmp_path):
    from groupfel.experiments.cli import main

    out = tmp_path / "srv.csv"
    assert main(["measure", "secagg", "--server", "--sizes", "2,4", "--params", "16", "--repeats", "1",
                 "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("# groupfel measure: secagg --server\n")
    ops = [ln.split(",")[0] for ln in text.splitlines() if not ln.startswith("#")][1:]
    assert ops == ["secagg-server", "secagg-server", "secagg-server-recovery"]
    assert main(["measure", "backdoor", "--server", "--sizes", "2", "--out", str(tmp_path / "b.csv")]) == 2


def test_edge_makespan_mixed_bandwidths():
    # 2 clients, one group, dedicated links of 8 and 4 Mbit/s, no group operation time:
    # x_t 0..1; downloads 1..2 and 1..3; train 1 s; op 1 s; uploads: the slow client 5..7;
    # one model up 7..8
    from groupfel.emulator.network import edge_makespan

    r = edge_makespan([2], np.full(2, 10), linear(0.0, 1.0), quadratic(0.0, 0.0, 1.0), group_rounds=1,
                      local_epochs=1, model_bytes=MB, client_mbps=[8.0, 4.0], latency_s=0.0, access_mbps=None,
                      cores=None, secagg=False, edge_mbps=8.0, edge_latency_s=0.0, operation="backdoor")
    assert r["makespan_s"] == pytest.approx(8.0)


class _Killed(Exception):
    pass


def test_a_killed_shared_edge_run_resumes_to_the_same_tables(tmp_path):
    """A whole run on shared edges: resumed equals uninterrupted (tables, ledger, transfers,
    per-round statistics); the manifest; offline clients uncharged; the timeline draws it."""
    import json

    import pandas as pd

    from groupfel.emulator.driver import plan_arm, run_arm
    from groupfel.emulator.world import build_world

    d = copy.deepcopy(TINY)
    d["train"].update(rounds=4, eval_every=2)
    d["arms"] = d["arms"][:1]
    d["topology"].update({"edge_access_mbps": 0.5, "edge_cores": 1, "edge_link": {"bandwidth_mbps": 10.0,
                          "latency_s": 0.01, "shared": True}, "availability": {"mean_on_s": 20.0, "mean_off_s": 20.0},
                          "edge_profile": "edge/cifar10-resnet"})
    (tmp_path / "edge.csv").write_text("device,task,operation,method,a,b,c\n"
                                       "edge,cifar10-resnet,group_overhead,aggregation,0,0.5,1\n")
    d["cost"]["profiles_file"] = str(tmp_path / "edge.csv")
    config = parse_config(d)
    world = build_world(config)
    full = run_arm(world, plan_arm(world, 0), tmp_path / "full")

    def kill(t, cost, acc):
        if t == 3:
            raise _Killed
    with pytest.raises(_Killed):
        run_arm(world, plan_arm(world, 0), tmp_path / "killed", kill)
    fresh = build_world(config)
    resumed = run_arm(fresh, plan_arm(fresh, 0), tmp_path / "killed")
    pd.testing.assert_frame_equal(full, resumed, check_exact=True)
    for name in ("ledger.parquet", "network.parquet"):
        pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "full" / name),
                                      pd.read_parquet(tmp_path / "killed" / name), check_exact=True)
    net = [json.loads((tmp_path / p / "manifest.json").read_text())["network"] for p in ("full", "killed")]
    assert net[0]["rounds"] == net[1]["rounds"] and len(net[0]["rounds"]) == 4
    assert net[0]["offline"] == net[1]["offline"]
    # what the manifest records, and that an offline client is charged nothing from when it left
    m = net[0]
    assert m["edge_access_mbps"] == 0.5 and m["edge_cores"] == 1 and m["edge_link_shared"]
    assert m["edge_curves"] == ["aggregation"] and all(e["core_busy_s"] > 0 for r in m["rounds"] for e in r["edges"])
    assert len(m["clients"]["bandwidth_mbps"]) == 12 and m["bytes_total"]["client_to_edge"] > 0
    assert m["offline"], "with 50 % availability some sampled client is offline"
    led = pd.read_parquet(tmp_path / "full" / "ledger.parquet")
    for ev in m["offline"]:
        later = led[(led.client == ev["client"]) & (led["round"] == ev["round"]) & (led.group_round >= ev["group_round"])]
        # one that left mid-work keeps the training it did in that group round; one that left
        # while uploading also its group operations, done before it left; nothing else
        assert (later.loc[later.group_round > ev["group_round"], "amount"] == 0).all()
        ops = later[(later.group_round == ev["group_round"]) & (later.component != "training")]
        assert ((ops["amount"] == 0) | (ops["end"] <= ev["time_s"] + 1e-9)).all()
    from groupfel.experiments.cli import main

    assert main(["timeline", str(tmp_path / "full"), "--round", "1", "--out", str(tmp_path / "t.png")]) == 0
    assert (tmp_path / "t.png").stat().st_size > 0
    # without any of the keys the plain federation runs
    from groupfel.emulator.network import build_network

    assert build_network(parse_config(TINY), 12, None, ("secagg",)) is None


def test_cores_without_an_edge_profile_warn():
    from groupfel.emulator.config import config_warnings

    d = copy.deepcopy(TINY)
    d["topology"]["edge_cores"] = 2
    assert any("topology.edge_cores = 2 without topology.edge_profile" in w for w in config_warnings(parse_config(d)))
    assert config_warnings(parse_config(TINY)) == []


def test_a_links_burst_shortens_each_transfer_by_its_bucket():
    # the round of test_shared_access_stretches_transfers with topology.client_link.burst_bytes =
    # 100 kB: each download and upload of 1 MB sends 0.1 MB at once, the four flows share 8 Mbit/s
    # for 4 × 0.9 MB: 1..4.6; train 4.6..5.6, operation ..6.6, uploads 6.6..10.2; one core
    # aggregates 10.2..12.2 and 12.2..14.2; the edge link (no bucket) sends 2 MB 14.2..16.2
    from dataclasses import replace

    fed, env = _fed(access=8.0, cores=1, aggregation=2.0)
    fed.net.clients = replace(fed.net.clients, burst_bytes=np.full(4, 100_000.0))
    fed.run_round(0, _groups([0, 1], [2, 3]))
    assert env.now == pytest.approx(16.2)
    ends = sorted((x["kind"], x["end"]) for x in fed.trace if x["kind"] in ("download", "upload"))
    assert [e for _, e in ends] == pytest.approx([4.6] * 4 + [10.2] * 4)


def test_burst_bytes_in_a_config_reach_every_link(tiny_dict):
    # plain and shared-edge runs: the same key shortens the clock, a negative one is one line
    from groupfel.emulator.network import build_network
    from groupfel.emulator.world import place_data
    from groupfel.topologies import load_dataset

    d = copy.deepcopy(tiny_dict)
    d["topology"]["client_link"] = {"bandwidth_mbps": 2.0, "latency_s": 0.0, "burst_bytes": 1600}
    d["topology"]["edge_link"] = {"bandwidth_mbps": 1.0, "latency_s": 0.0, "burst_bytes": 3200}
    cfg = parse_config(d)
    topo = place_data(cfg, load_dataset("digits")).topology
    assert topo.client_link(0).burst_bytes == 1600 and topo.edge_link(0).burst_bytes == 3200
    assert topo.client_link(0).transfer_time(57_000) == pytest.approx((57_000 - 1_600) * 8 / 2e6)
    d["topology"]["edge_access_mbps"] = 4.0
    net = build_network(parse_config(d), 12, None, ("secagg",))
    assert net.clients.burst(3) == 1600 and net.clients.manifest()["burst_bytes"] == [1600.0] * 12
    d["topology"]["client_link"]["burst_bytes"] = -1
    with pytest.raises(InputError, match="burst_bytes"):
        parse_config(d)
