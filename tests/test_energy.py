"""Energy beside time: power per state × the simulated seconds in it, per client (cost.energy)."""
import json
import os

import numpy as np
import pandas as pd
import pytest
import simpy

from conftest import one_arm, one_error_line, write_toml
from groupfel.cost_models import CostModel, DeviceProfile, linear, quadratic
from groupfel.cost_models.energy_meter import advance, open_meter, rapl_zones
from groupfel.cost_models.power import STATES, DevicePower, PowerCurve, PowerModel, Polynomial, read_power
from groupfel.emulator.config import parse_config
from groupfel.emulator.federation import Federation, Group, RoundContext
from groupfel.emulator.ledger import CostLedger
from groupfel.errors import InputError
from groupfel.experiments.cli import main
from groupfel.topologies import Link, build_topology

POWER = os.path.join(os.path.dirname(__file__), "fixtures", "power-rpi4-rest.toml")


def _power(watts: dict[str, float], accounting: str = "group-rounds") -> PowerModel:
    watts = {"listen": watts["idle"], **watts}     # listening defaults to idle power
    return PowerModel({"dev": DevicePower("dev", {s: PowerCurve(Polynomial((w,))) for s, w in watts.items()})},
                      accounting)


def _play(n_samples, watts, group_rounds=1, latency=0.5, rounds=1):
    """One group of the given members on dedicated links (transfer = latency), E = 3,
    H(n) = 0.1 n + 1, one group operation O(s) = 0.5 s² + 1; returns the ledger."""
    n = len(n_samples)
    parts = [np.arange(1) for _ in range(n)]
    topo = build_topology([n], ["dev"] * n, parts, np.ones((n, 1), dtype=int),
                          client_link=Link(1e15, latency), edge_link=Link(1e15, 1.0))
    prof = DeviceProfile("dev", "t", training={"sgd": linear(0.1, 1.0)}, group_overhead={"secagg": quadratic(0.5, 0, 1)})
    ledger = CostLedger()
    ledger.power = _power(watts)
    env = simpy.Environment()
    fed = Federation(RoundContext(env, 1000, CostModel({"dev": prof}, "sgd", ("secagg",)), ledger, topo, seed=0,
                                  group_rounds=group_rounds, local_epochs=3))
    g = Group(0, np.arange(n), np.asarray(n_samples), 0.0)
    for t in range(rounds):
        fed.run_round(t, [(0, g)])
    return ledger, env.now


@pytest.mark.parametrize("train_w, idle_w, expected", [(2.0, 0.5, {0: 15.0, 1: 24.0}),
                                                     (5.0, 1.6, {0: 39.6, 1: 60.0})])   # docs/energy.md
def test_one_group_round_two_states_by_hand(train_w, idle_w, expected):
    """Two clients (10 and 30 samples), one group round, no transfer time; training and idle power
    given, the other states at 0 W. Training: 3·(0.1·10 + 1) = 6 s and 3·(0.1·30 + 1) = 12 s;
    secagg O(2) = 3 s each; the round lasts 15 s, so client 0 idles 15 − 9 = 6 s, client 1 none.
    At 2 W and 0.5 W: client 0 2·6 + 0.5·6 = 15 J, client 1 2·12 = 24 J; at the shipped Raspberry
    Pi 4's 5.0 W and 1.6 W: 30 + 9.6 = 39.6 J and 60 J."""
    ledger, now = _play([10, 30], {"training": train_w, "group_operation": 0.0, "transmit": 0.0, "receive": 0.0,
                                   "idle": idle_w}, latency=0.0)
    assert now == pytest.approx(1.0 + 15.0 + 1.0)   # edge link down and up, 1 s each
    e = ledger.energy_frame()
    assert e.groupby("client")["joules"].sum().to_dict() == pytest.approx(expected)
    sec = e.pivot_table(index="client", columns="state", values="seconds", observed=True)
    assert sec.loc[0].to_dict() == pytest.approx({"training": 6, "group_operation": 3, "idle": 6, "receive": 0,
                                                  "transmit": 0, "listen": 0})
    total = sum(expected.values())
    row = ledger.energy_row()
    assert row.pop("energy_accounting") == "group-rounds"      # every row of joules names its accounting
    assert row == pytest.approx({"energy_j": total, "energy_training_j": train_w * 18,
                                 "energy_idle_j": idle_w * 6, "energy_group_operation_j": 0.0,
                                 "energy_transmit_j": 0.0, "energy_receive_j": 0.0, "energy_listen_j": 0.0})


def test_the_shipped_pi_power_gives_every_state_and_marks_the_assumed():
    from groupfel.cost_models.power import shipped_power

    pi = shipped_power()["raspberry-pi-4"].states
    assert sorted(pi) == sorted(STATES)
    watts = {s: float(pc.curve(0)) for s, pc in pi.items()}
    assert watts == {"idle": 1.6, "training": 5.0, "group_operation": 5.0, "transmit": 2.3, "receive": 2.3,
                     "listen": 1.6}
    measured = {s for s, pc in pi.items() if not pc.assumed}
    assert measured == {"idle", "training"}
    assert all("https://github.com/geerlingguy/sbc-reviews/issues/4" in pi[s].source for s in measured)
    assert all(pc.source.startswith("assumed: ") for s, pc in pi.items() if s not in measured)
    assert all("chipwired" in pi[s].source for s in ("transmit", "receive"))


WATTS = {"training": 2.0, "group_operation": 3.0, "transmit": 4.0, "receive": 1.0, "listen": 2.5, "idle": 0.5}


def test_every_state_by_hand_over_two_group_rounds():
    """Three clients (10, 20, 30 samples), K = 2, links so fast that the airtime is nil and each
    transfer is its 0.5 s latency, which the radio spends listening: per group round client 0
    listens 2 × 0.5 s (2.5 J), trains 6 s (12 J), runs secagg O(3) = 5.5 s (16.5 J) and idles the
    slowest member's 0.5 + 12 + 5.5 + 0.5 = 18.5 s less its 12.5 s: 6 s (3 J): 34 J; client 1:
    2.5 + 18 + 16.5 + 1.5 = 38.5 J; client 2: 2.5 + 24 + 16.5 = 43 J."""
    ledger, _ = _play([10, 20, 30], WATTS, group_rounds=2)
    per_client = ledger.energy_frame().groupby("client")["joules"].sum()
    assert per_client.to_dict() == pytest.approx({0: 68.0, 1: 77.0, 2: 86.0})


def test_energy_is_power_times_the_ledgers_busy_time_for_every_client():
    """For every client: each state's joules are its power × seconds, the compute states' seconds
    are the Eq. 5 ledger's spans, and the five states fill each group round it completed."""
    ledger, _ = _play([12, 25, 7, 40], WATTS, group_rounds=3, rounds=2)
    e, led = ledger.energy_frame(), ledger.frame()
    for c in range(4):
        mine = e[e.client == c]
        by_state = mine.groupby("state", observed=True)
        assert mine["joules"].sum() == pytest.approx(sum(WATTS[s] * g["seconds"].sum() for s, g in by_state))
        spans = led[led.client == c].assign(s=lambda d: d.end - d.start).groupby("component", observed=True)["s"].sum()
        assert by_state["seconds"].sum()["training"] == pytest.approx(spans["training"])
        assert by_state["seconds"].sum()["group_operation"] == pytest.approx(spans["secagg"])
    rounds = led.groupby(["round", "group_round"])
    # each group round: the download (0.5 s), the slowest member's compute, its upload (0.5 s)
    span = (rounds["end"].max() - rounds["start"].min()).sum() + len(rounds) * (0.5 + 0.5)
    per_client = e.groupby("client")["seconds"].sum()
    assert per_client.to_numpy() == pytest.approx(np.full(4, span))


def test_no_power_no_energy():
    ledger = CostLedger()
    assert ledger.energy_frame() is None and ledger.energy_row() == {}


@pytest.mark.slow
def test_a_run_without_energy_has_no_energy_columns_and_one_with_it_has_them(tmp_path, tiny_dict, capsys):
    d = one_arm(tiny_dict, rounds=2, group_rounds=1)
    assert main(["run", str(write_toml(tmp_path, d)), "--output", str(tmp_path / "off"), "--quiet"]) == 0
    off = pd.read_csv(next((tmp_path / "off").rglob("results.csv")))
    assert not [c for c in off if "energy" in c] and not list((tmp_path / "off").rglob("energy.parquet"))
    d["cost"].update(energy=True, profiles_file=POWER)
    assert main(["run", str(write_toml(tmp_path, d)), "--output", str(tmp_path / "on"), "--quiet"]) == 0
    on = pd.read_csv(next((tmp_path / "on").rglob("results.csv")))
    # energy changes no other number
    pd.testing.assert_frame_equal(on[off.columns], off)
    e = pd.read_parquet(next((tmp_path / "on").rglob("energy.parquet")))
    assert on["energy_j"].iloc[-1] == pytest.approx(e["joules"].sum())
    assert on["energy_j"].iloc[-1] == pytest.approx(on[[f"energy_{s}_j" for s in STATES]].iloc[-1].sum())
    train = e[e.state == "training"]
    assert train["joules"].to_numpy() == pytest.approx(5.0 * train["seconds"].to_numpy())   # the shipped 5.0 W
    manifest = json.loads(next((tmp_path / "on").rglob("manifest.json")).read_text())
    assert "sbc-reviews/issues/4" in manifest["power_sources"]["raspberry-pi-4"]["idle"]
    assert manifest["total_energy_j"] == pytest.approx(on["energy_j"].iloc[-1])
    # every file of joules names its accounting
    assert (on["energy_accounting"] == "group-rounds").all()
    assert (pd.read_csv(next((tmp_path / "on").rglob("summary.csv")))["energy_accounting"] == "group-rounds").all()
    # timeline: energy per client, or one line saying the run measured none
    capsys.readouterr()
    for run, says in (("off", "energy: not measured"),
                      ("on", "energy per client in round 2 (J; power × simulated seconds in each state; "
                             "group-rounds accounting")):
        arm = next((tmp_path / run).rglob("ledger.parquet")).parent
        assert main(["timeline", str(arm), "--round", "2", "--out", str(tmp_path / f"{run}.png")]) == 0
        assert says in capsys.readouterr().out
    round2 = e[e["round"] == 2].groupby("client")["joules"].sum()
    from groupfel.experiments.timeline import energy_per_client

    per = energy_per_client(e[e["round"] == 2]).set_index("client")["total_j"]
    assert per.to_dict() == pytest.approx(round2.to_dict())
    # the report's energy section (the whole page is built and checked in Chromium in tests/test_report.py)
    from groupfel.experiments.report import _energy, load_study

    page = _energy(load_study(tmp_path / "on"), {"energy_j": "<img>"})
    assert "Accuracy against energy" in page and "group_operation (J)" in page and "<img>" in page


def test_whatif_prices_energy_by_group_size_and_access_capacity(tmp_path, capsys):
    args = ["whatif", "--energy", "--group-sizes", "2,4", "--access-mbps", "8,50", "--edge-clients", "8",
            "--clients", "40", "--rounds", "1", "--out", str(tmp_path / "w")]
    assert main([*args, "--profiles-file", POWER]) == 0
    df = pd.read_csv(tmp_path / "w" / "whatif.csv")
    assert (df["energy_accounting"] == "group-rounds").all() and "group-rounds accounting" in capsys.readouterr().out
    parts = df[[f"energy_{s}_j" for s in STATES]].sum(axis=1)
    assert (df["edge_energy_j"] > 0).all() and df["edge_energy_j"].to_numpy() == pytest.approx(parts.to_numpy())
    # a slower access link: the same Eq. 5 cost, more time on the radio and waiting, more joules
    slow, fast = df[df.access_mbps == 8].set_index("group_size"), df[df.access_mbps == 50].set_index("group_size")
    assert (slow["edge_cost"] == fast["edge_cost"]).all() and (slow["edge_energy_j"] > fast["edge_energy_j"]).all()
    # the shipped profile alone gives every state, and the printout names those assumed
    capsys.readouterr()
    assert main([*args[:-1], str(tmp_path / "w2")]) == 0
    assert "power assumed, not measured: raspberry-pi-4 group_operation, transmit, receive, listen" in \
        capsys.readouterr().out
    shipped = pd.read_csv(tmp_path / "w2" / "whatif.csv")
    assert (shipped["edge_energy_j"] > 0).all() and shipped["energy_listen_j"].gt(0).all()
    from groupfel.experiments import api

    same = api.whatif([2, 4], clients=40, rounds=1, edge_clients=8, access_mbps=[8, 50], profiles_file=POWER,
                      energy=True)
    assert same["edge_energy_j"].to_numpy() == pytest.approx(df["edge_energy_j"].to_numpy())
    # the edge server too: without edge curves it idles (1.6 W) through the round
    server = api.whatif([2, 4], clients=40, rounds=1, edge_clients=8, access_mbps=[8, 50], profiles_file=POWER,
                        energy=True, edge_power="raspberry-pi-4-edge")
    assert server["edge_server_energy_j"].to_numpy() == pytest.approx(1.6 * server["makespan_s"].to_numpy())
    assert server["edge_total_energy_j"].to_numpy() == pytest.approx(
        (server["edge_energy_j"] + server["edge_server_energy_j"]).to_numpy())


@pytest.mark.slow
def test_energy_budget_stops_the_run_and_batteries_take_clients_offline(tmp_path, tiny_dict):
    d = one_arm(tiny_dict, rounds=4, group_rounds=2)
    d["cost"].update(energy=True, profiles_file=POWER)
    assert main(["run", str(write_toml(tmp_path, d)), "--output", str(tmp_path / "full"), "--quiet"]) == 0
    full = pd.read_csv(next((tmp_path / "full").rglob("results.csv")))
    budget = float(full["energy_j"].iloc[2]) + 1e-6     # room for exactly two rounds
    d["train"]["energy_budget"] = budget
    assert main(["run", str(write_toml(tmp_path, d)), "--output", str(tmp_path / "budget"), "--quiet"]) == 0
    arm = next((tmp_path / "budget").rglob("manifest.json"))
    assert json.loads(arm.read_text())["stop_reason"] == "energy_budget"
    assert pd.read_csv(arm.parent / "results.csv")["round"].max() == 2
    del d["train"]["energy_budget"]
    per_client = pd.read_parquet(next((tmp_path / "full").rglob("energy.parquet"))).groupby("client")["joules"].sum()
    d["train"]["client_energy_budget"] = float(per_client[per_client > 0].min()) / 3
    assert main(["run", str(write_toml(tmp_path, d)), "--output", str(tmp_path / "battery"), "--quiet"]) == 0
    arm = next((tmp_path / "battery").rglob("manifest.json")).parent
    led = pd.read_parquet(arm / "ledger.parquet")
    assert (led.component == "offline").any()      # a client whose battery ran out went offline
    spent = pd.read_parquet(arm / "energy.parquet").groupby("client")["joules"].sum()
    # a battery is checked at each group round's start: no client starts one with an empty battery,
    # so none spends more than its budget plus one group round
    assert (spent <= d["train"]["client_energy_budget"] + per_client.max()).all()
    # batteries so small that every one empties: the run stops saying so, never plays a round with nobody
    d["train"].update(client_energy_budget=1.0, rounds=30)
    assert main(["run", str(write_toml(tmp_path, d)), "--output", str(tmp_path / "flat"), "--quiet"]) == 0
    manifest = json.loads(next((tmp_path / "flat").rglob("manifest.json")).read_text())
    assert manifest["stop_reason"] == "batteries" and manifest["rounds_run"] < 30
    assert manifest["stop_message"].startswith("batteries: every client's battery (train.client_energy_budget = 1 J)")
    flat = pd.read_csv(next((tmp_path / "flat").rglob("results.csv")))
    assert (flat["clients_sampled"].iloc[1:] > 0).all()


def test_a_run_charges_its_edge_servers_and_the_cloud_beside_its_clients(tmp_path, tiny_dict):
    d = one_arm(tiny_dict, rounds=2, group_rounds=1)
    (tmp_path / "edge.csv").write_text("device,task,operation,method,a,b,c\n"
                                       "edge,t,group_overhead,aggregation,0,0.5,1\n")
    d["topology"].update(edge_access_mbps=50.0, edge_profile="edge/t")
    d["cost"].update(energy=True, profiles_file=str(tmp_path / "edge.csv"), edge_power="raspberry-pi-4-edge",
                     cloud_power="raspberry-pi-4-edge", cloud_pue=1.5, carbon_intensity=380.0)
    assert main(["run", str(write_toml(tmp_path, d)), "--output", str(tmp_path / "r"), "--quiet"]) == 0
    arm = next((tmp_path / "r").rglob("manifest.json")).parent
    res = pd.read_csv(arm / "results.csv")
    sites = pd.read_parquet(arm / "server_energy.parquet")
    by_site = sites.groupby("site")["joules"].sum()
    assert res["edge_energy_j"].iloc[-1] == pytest.approx(by_site["edge"])
    assert res["cloud_energy_j"].iloc[-1] == pytest.approx(by_site["cloud"])
    per_edge = sites[sites.site == "edge"].groupby("edge")["joules"].sum()     # a column per edge
    assert [res[f"edge{j}_energy_j"].iloc[-1] for j in (0, 1)] == pytest.approx([per_edge.get(0, 0.0), per_edge.get(1, 0.0)])
    # each edge row is the shipped server's watts × seconds; the cloud's its aggregation × PUE 1.5
    watts = {"idle": 1.6, "aggregation": 5.0, "secagg_server": 5.0}
    edge = sites[sites.site == "edge"]
    assert edge["joules"].to_numpy() == pytest.approx(edge["state"].map(watts).to_numpy() * edge["seconds"].to_numpy())
    cloud = sites[sites.site == "cloud"]
    assert (cloud["state"] == "aggregation").all() and len(cloud) == 2
    assert cloud["joules"].to_numpy() == pytest.approx(5.0 * 1.5 * cloud["seconds"].to_numpy())
    manifest = json.loads((arm / "manifest.json").read_text())
    assert manifest["total_edge_energy_j"] == pytest.approx(by_site["edge"])
    # grams CO2e at a constant 380 g/kWh, each site's and the clients', the source named
    last = res.iloc[-1]
    for col, joules in (("carbon_g", "energy_j"), ("edge_carbon_g", "edge_energy_j"), ("cloud_carbon_g", "cloud_energy_j")):
        assert last[col] == pytest.approx(last[joules] / 3.6e6 * 380.0, rel=1e-12)
    assert last["carbon_intensity"] == "constant 380 g/kWh" == manifest["carbon"]["source"]
    e = pd.read_parquet(arm / "energy.parquet")
    assert e["grams"].to_numpy() == pytest.approx(e["joules"].to_numpy() / 3.6e6 * 380.0, rel=1e-12)
    assert "aggregation" in manifest["power_assumed"]["raspberry-pi-4-edge"]
    # the timeline prints each edge's and the cloud's joules in the round
    from groupfel.experiments.timeline import site_energy

    table = site_energy(arm, 2)
    r2 = sites[sites["round"] == 2]
    assert table["total_j"].sum() == pytest.approx(r2["joules"].sum()) and set(table["site"]) == {"edge", "cloud"}
    # the clients' joules are the same as without the servers
    for key in ("edge_power", "cloud_power", "cloud_pue", "carbon_intensity"):
        del d["cost"][key]
    assert main(["run", str(write_toml(tmp_path, d)), "--output", str(tmp_path / "c"), "--quiet"]) == 0
    clients = pd.read_csv(next((tmp_path / "c").rglob("results.csv")))
    pd.testing.assert_frame_equal(res[clients.columns], clients)


@pytest.mark.parametrize("accounting, shared", [("full-fleet", False), ("marginal", False),
                                                 ("full-fleet", True)])
def test_an_energy_budget_is_never_overshot_in_any_accounting(tmp_path, tiny_dict, accounting, shared):
    """The budget is set just above round 3's joules inside its group rounds: under full-fleet,
    round 3's fleet idle would cross it, so the run stops after round 2 (it used to run round 3
    and end above the budget); under the others round 3 fits. Never above the budget."""
    d = one_arm(tiny_dict, rounds=3, group_rounds=1)
    d["cost"].update(energy=True, profiles_file=POWER, energy_accounting=accounting)
    if shared:      # the shared-edge model (its dry play prices the round)
        d["topology"]["edge_access_mbps"] = 50.0
    assert main(["run", str(write_toml(tmp_path, d)), "--output", str(tmp_path / "full"), "--quiet"]) == 0
    full = pd.read_csv(next((tmp_path / "full").rglob("results.csv"))).set_index("round")["energy_j"]
    e = pd.read_parquet(next((tmp_path / "full").rglob("energy.parquet")))
    inside = float(e[(e["round"] == 3) & (e["group"] >= 0)]["joules"].sum())
    budget = float(full[2]) + inside + 1e-6
    d["train"]["energy_budget"] = budget
    assert main(["run", str(write_toml(tmp_path, d)), "--output", str(tmp_path / "b"), "--quiet"]) == 0
    got = pd.read_csv(next((tmp_path / "b").rglob("results.csv")))
    assert got["energy_j"].iloc[-1] <= budget
    assert got["round"].max() == (2 if accounting == "full-fleet" else 3)


def test_batteries_that_charge_bring_their_clients_back(tmp_path, tiny_dict, capsys):
    d = one_arm(tiny_dict, rounds=6, group_rounds=1)
    d["cost"].update(energy=True, profiles_file=POWER)
    d["train"].update(client_energy_budget=4.0, client_charge_w=0.05)
    assert main(["run", str(write_toml(tmp_path, d)), "--output", str(tmp_path / "r"), "--quiet"]) == 0
    arm = next((tmp_path / "r").rglob("manifest.json")).parent
    manifest = json.loads((arm / "manifest.json").read_text())
    assert manifest["stop_reason"] == "rounds" and manifest["rounds_run"] == 6
    net = manifest["network"]
    assert net["battery"] == {"capacity_j": 4.0, "charge_w": 0.05, "resume_share": 1.0, "charging": "always"}
    kinds = {e["event"] for e in net["battery_events"]}
    assert kinds == {"empty", "charged"}, net["battery_events"]
    back = next(e for e in net["battery_events"] if e["event"] == "charged")
    r = next(x for x in net["rounds"] if x["start_s"] <= back["time_s"] <= x["start_s"] + x["makespan_s"])
    capsys.readouterr()
    assert main(["timeline", str(arm), "--round", str(r["round"]), "--out", str(tmp_path / "t.png")]) == 0
    assert f"client {back['client']} charged at" in capsys.readouterr().out
    # the simple case: the same batteries without charging empty for good and the run stops
    del d["train"]["client_charge_w"]
    d["train"]["rounds"] = 30
    assert main(["run", str(write_toml(tmp_path, d)), "--output", str(tmp_path / "drain"), "--quiet"]) == 0
    drained = json.loads(next((tmp_path / "drain").rglob("manifest.json")).read_text())
    assert drained["stop_reason"] == "batteries"


@pytest.mark.parametrize("text, says", [
    ('[[power]]\ndevice = "d"\nstate = "idle"\nunits = "kJ"\nvalue = 1', "power[0].units: power is in W or mW"),
    ('[[power]]\ndevice = "d"\nstate = "idle"\nvalue = -1', "power[0].value: power -1 W; give watts from 0"),
    ('[[power]]\ndevice = "d"\nstate = "sleep"\nvalue = 1', "power[0].state"),
    ('[[power]]\ndevice = "d"\nstate = "idle"\ncoefficients = [1, 2]', "idle power is a constant"),
    ('[[power]]\ndevice = "d"\nstate = "training"\nvalue = 1e7', "power 10000000 W; give watts from 0 to 1,000,000"),
    ('[[power]]\ndevice = "d"\nstate = "training"\nvalue = 1\nwatts = 2', "power[0].watts: unknown key"),
])
def test_bad_power_tables_are_one_line_naming_the_field(tmp_path, text, says):
    path = tmp_path / "p.toml"
    path.write_text(text)
    with pytest.raises(InputError) as exc:
        read_power(path)
    assert says in str(exc.value) and "\n" not in str(exc.value)


def test_power_units_and_csv_rows(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text('[[power]]\ndevice = "d"\nstate = "transmit"\nunits = "mW"\npoints = [[10, 500], [30, 900]]')
    curve = read_power(path)["d"].states["transmit"].curve
    assert float(curve(20.0)) == pytest.approx(0.7)
    csv = tmp_path / "p.csv"
    csv.write_text("device,task,operation,method,a,b,c\nd,x,power,training,0,0.01,3\nd,x,training,sgd,0.1,1,\n")
    assert float(read_power(csv)["d"].states["training"].curve(100)) == pytest.approx(4.0)


def test_energy_alone_runs_on_the_shipped_power_and_names_the_assumed_states(tmp_path, tiny_dict, capsys):
    d = one_arm(tiny_dict, rounds=1)
    d["cost"]["energy"] = True
    assert main(["run", str(write_toml(tmp_path, d)), "--output", str(tmp_path / "r"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "energy_j" in out and "accuracy_vs_energy.png (energy_j: joules, group-rounds accounting)" in out
    assert "power assumed, not measured: raspberry-pi-4 group_operation, transmit, receive, listen" in out
    manifest = json.loads(next((tmp_path / "r").rglob("manifest.json")).read_text())
    assert manifest["power_assumed"] == {"raspberry-pi-4": ["group_operation", "transmit", "receive", "listen"]}
    assert manifest["total_energy_j"] > 0


def test_a_missing_state_is_asked_for():
    from groupfel.cost_models.power import build_power

    mine = {"mine": DevicePower("mine", {s: PowerCurve(Polynomial((1.0,))) for s in ("idle", "training")})}
    with pytest.raises(InputError, match="cost.energy: device 'mine' has no power for group_operation, transmit, "
                                         "receive \\(no shipped power\\)"):
        build_power(["mine"], mine, {})
    # listening defaults to the device's own idle power
    mine["mine"].states.update({s: PowerCurve(Polynomial((2.0,))) for s in ("group_operation", "transmit", "receive")})
    assert float(build_power(["mine"], mine, {}).devices["mine"].states["listen"].curve(0)) == 1.0


def test_energy_budget_needs_energy(tiny_dict):
    tiny_dict["train"]["energy_budget"] = 10.0
    with pytest.raises(InputError, match="train.energy_budget is in joules and needs cost.energy = true"):
        parse_config(tiny_dict)


# -- measuring energy ---------------------------------------------------------------------------------

def _fake_rapl(root, packages):
    """A powercap tree in the kernel's layout: intel-rapl:N with name, energy_uj, max_energy_range_uj,
    and a sub-zone intel-rapl:N:0 (part of the package, not added again)."""
    for i, (uj, top) in enumerate(packages):
        z = root / f"intel-rapl:{i}"
        (z / f"intel-rapl:{i}:0").mkdir(parents=True)
        (z / "name").write_text(f"package-{i}\n")
        (z / "energy_uj").write_text(f"{uj}\n")
        (z / "max_energy_range_uj").write_text(f"{top}\n")
        (z / f"intel-rapl:{i}:0" / "energy_uj").write_text("5\n")
        (root / f"intel-rapl:{i}:0").symlink_to(z / f"intel-rapl:{i}:0")


def test_rapl_reader_on_a_fake_sysfs_tree_with_wraparound(tmp_path):
    _fake_rapl(tmp_path, [(262_143_000_000, 262_143_328_850), (1_000_000, 65_712_999_613)])
    zones, why = rapl_zones(tmp_path)
    assert why is None and [z.name for z in zones] == ["package-0", "package-1"]
    meter, said = open_meter(None, tmp_path)
    assert "intel-rapl:0 (package-0)" in said
    mark = meter.start()
    (tmp_path / "intel-rapl:0" / "energy_uj").write_text("1000000\n")    # wrapped: 328 850 + 1 000 000 µJ
    (tmp_path / "intel-rapl:1" / "energy_uj").write_text("3500000\n")    # 2 500 000 µJ
    assert meter.stop(mark)[0] == pytest.approx(1.32885 + 2.5)
    assert advance(10, 4, 10) == 4 and advance(4, 10, 10) == 6


def test_a_long_rapl_reading_counts_every_wrap_by_polling(tmp_path):
    """A counter with a 1000 µJ range that wraps three times during one reading: 0 -> 600 -> 200
    (wrapped) -> 800 -> 400 (wrapped) -> 900 -> 300 (wrapped) is 600 + 600 + 600 + 600 + 500 + 400
    = 3300 µJ. Reading only its start and end (0 and 300) would give 300 µJ. Once by hand-driven
    polls, once by the meter's own background thread."""
    import os
    import time

    from groupfel.cost_models.energy_meter import RaplMeter

    _zone(tmp_path / "intel-rapl:0", "package-0", 0, top=1000)
    energy = tmp_path / "intel-rapl:0" / "energy_uj"

    def write(uj):     # atomically, as sysfs reads are
        (tmp_path / "next").write_text(f"{uj}\n")
        os.replace(tmp_path / "next", energy)

    steps = (600, 200, 800, 400, 900, 300)
    zones, _ = rapl_zones(tmp_path)
    meter = RaplMeter(zones, poll_s=None)
    mark = meter.start()
    for uj in steps:
        write(uj)
        mark.poll()
    assert meter.stop(mark)[0] == pytest.approx(3300e-6)
    write(0)
    meter = RaplMeter(zones, poll_s=0.005)
    mark = meter.start()
    for uj in steps:
        write(uj)
        seen = mark.polls
        deadline = time.monotonic() + 30
        while mark.polls < seen + 2 and time.monotonic() < deadline:    # the poller has read it
            time.sleep(0.002)
    joules, seconds = meter.stop(mark)
    assert joules == pytest.approx(3300e-6) and seconds > 0


def _zone(path, name, uj, top=2**32):
    path.mkdir(parents=True, exist_ok=True)
    (path / "name").write_text(f"{name}\n")
    (path / "energy_uj").write_text(f"{uj}\n")
    (path / "max_energy_range_uj").write_text(f"{top}\n")


def test_rapl_counts_each_joule_once_psys_alone_or_package_and_dram(tmp_path):
    """A laptop's tree: package-0 (with core and dram sub-zones) and psys, the platform, which
    contains the package. The platform used 3 J while the package used 2 J (1.5 J of it in the
    cores) and DRAM 0.5 J: psys alone reads 3 J (adding the package gave 5 J). Without psys: the
    package and its DRAM, 2.5 J (never the cores again)."""
    pkg = tmp_path / "intel-rapl:0"
    _zone(pkg, "package-0", 1_000_000)
    _zone(pkg / "intel-rapl:0:0", "core", 0)
    _zone(pkg / "intel-rapl:0:1", "dram", 0)
    _zone(tmp_path / "intel-rapl:1", "psys", 10_000_000)

    def spend(meter):
        mark = meter.start()
        for z, uj in (("intel-rapl:0", 3_000_000), ("intel-rapl:0/intel-rapl:0:0", 1_500_000),
                      ("intel-rapl:0/intel-rapl:0:1", 500_000), ("intel-rapl:1", 13_000_000)):
            if (tmp_path / z).exists():
                (tmp_path / z / "energy_uj").write_text(f"{uj}\n")
        return meter.stop(mark)[0]

    meter, said = open_meter(None, tmp_path)
    assert [z.name for z in meter.zones] == ["psys"] and "the whole platform" in said
    assert spend(meter) == pytest.approx(3.0)
    import shutil

    shutil.rmtree(tmp_path / "intel-rapl:1")
    for z, uj in (("intel-rapl:0", 1_000_000), ("intel-rapl:0/intel-rapl:0:0", 0), ("intel-rapl:0/intel-rapl:0:1", 0)):
        (tmp_path / z / "energy_uj").write_text(f"{uj}\n")
    meter, said = open_meter(None, tmp_path)
    assert [z.name for z in meter.zones] == ["package-0", "dram"]
    assert spend(meter) == pytest.approx(2.5)


def test_no_counter_says_so_in_one_line(tmp_path):
    meter, said = open_meter(None, tmp_path / "none")
    assert meter is None and said.startswith("energy: not recorded: no energy counter is readable here")
    (tmp_path / "empty").mkdir()
    assert "no intel-rapl:N zone" in open_meter(None, tmp_path / "empty")[1]


def test_measure_with_a_power_log_and_calibrate_fits_power(tmp_path, capsys, monkeypatch):
    import time

    from groupfel.cost_models import energy_meter

    monkeypatch.setattr(energy_meter, "CLOCK_SLACK_S", 60.0)   # the log is written ahead, as no live meter's is

    t0 = time.time()
    log = tmp_path / "log.csv"
    log.write_text("timestamp,watts\n" + "".join(f"{t0 - 5 + i * 0.01:.3f},4.0\n" for i in range(3000)))
    out = tmp_path / "m.csv"
    assert main(["measure", "backdoor", "--sizes", "2,4,8", "--params", "64", "--repeats", "2",
                 "--power-log", str(log), "--out", str(out)]) == 0
    df = pd.read_csv(out, comment="#")
    assert (df["joules"] / df["energy_span_s"]).to_numpy() == pytest.approx(4.0)
    assert main(["calibrate", str(out), "--out", str(tmp_path / "cal")]) == 0
    said = capsys.readouterr().out
    assert "local/group_operation: power = b·x + c (W)" in said and "c =  4" in said
    assert "R² = n/a (every y equal)" in said      # a perfect constant fit: no R² to give
    assert float(read_power(tmp_path / "cal" / "profile.csv")["local"].states["group_operation"].curve(4)) == \
        pytest.approx(4.0)


def test_a_log_too_coarse_for_a_reading_is_refused_and_short_calls_are_batched(tmp_path):
    """A 1 Hz log cannot integrate a 0.3 ms call: refused in one line. Where the log's interval
    is known when measuring starts, a short call is repeated until its reading spans 10 samples
    and the reading is per call: here 4 W × each call's share of the span."""
    from groupfel.cost_models.energy_meter import MIN_SAMPLES, PowerLog
    from groupfel.cost_models.measure import _sweep

    log = tmp_path / "log.csv"
    log.write_text("timestamp,watts\n" + "".join(f"{1000 + i}.0,4.0\n" for i in range(100)))
    meter = PowerLog(log)
    assert meter.min_span_s == MIN_SAMPLES * 1.0
    with pytest.raises(InputError, match=r"samples every 1 s, but a measured reading spans 0.0003 s, under 10 "):
        meter.joules([(1010.0, 1010.0003, 1)])
    assert meter.joules([(1010.0, 1030.0, 4)]) == pytest.approx([4.0 * 20 / 4])
    # the meter's clock checked: a log whose timestamps lie an hour ahead of ours is refused
    import time

    ahead = tmp_path / "ahead.csv"
    ahead.write_text("timestamp,watts\n" + "".join(f"{time.time() + 3600 + i},4.0\n" for i in range(20)))
    with pytest.raises(InputError, match=r"ahead of this machine's clock; give timestamps in Unix seconds"):
        PowerLog(ahead).joules([(time.time() + 3600, time.time() + 3615, 1)])
    meter.min_span_s = 0.05     # a fast log: batch until 50 ms
    got = list(_sweep([3], 1, lambda n: 1e-4, meter))
    (a, b, calls), per_call = got[0][2]
    assert calls > 1 and b - a >= 0.045 and per_call == pytest.approx((b - a) / calls)   # two clocks: a little slack


def test_measure_without_a_meter_writes_no_energy_columns(tmp_path, capsys, monkeypatch):
    from groupfel.cost_models import energy_meter

    monkeypatch.setattr(energy_meter, "POWERCAP", tmp_path / "none")
    monkeypatch.setattr(energy_meter.open_meter, "__defaults__", (None, tmp_path / "none"))
    out = tmp_path / "m.csv"
    assert main(["measure", "backdoor", "--sizes", "2,3", "--params", "16", "--repeats", "1", "--out", str(out)]) == 0
    assert "energy: not recorded" in capsys.readouterr().out
    assert "joules" not in pd.read_csv(out, comment="#")


def test_a_checkpoint_keeps_the_energy(tmp_path):
    """A resumed run continues the energy table and every battery's level from its checkpoint."""
    from groupfel.emulator.arm import ArmState
    from groupfel.emulator.driver import load_checkpoint, save_checkpoint

    ledger, _ = _play([10, 30], WATTS, group_rounds=2)
    save_checkpoint(tmp_path / "c.pt", ArmState(ledger=ledger))
    back = load_checkpoint(tmp_path / "c.pt").ledger
    pd.testing.assert_frame_equal(back.energy_frame(), ledger.energy_frame())
    assert back.energy_total == ledger.energy_total and back.energy_by_state == ledger.energy_by_state
    assert back.client_energy.tolist() == ledger.client_energy.tolist()
    plain = CostLedger()
    save_checkpoint(tmp_path / "p.pt", ArmState(ledger=plain))
    assert load_checkpoint(tmp_path / "p.pt").ledger.energy_frame() is None


def test_the_radio_is_charged_its_airtime_and_listens_for_the_rest_of_a_shared_transfer():
    """Two clients with 8 Mbit/s radios share an edge whose access is 8 Mbit/s each way; the model
    is 10^6 bytes (8 Mbit), no latency, no secure aggregation, training 1 s, no group operation.
    Both downloads share the medium at 4 Mbit/s each: they end at 2 s, of which each radio was on
    the air 8 Mbit / 8 Mbit/s = 1 s (receive) and listened 1 s; training ends at 3 s; the uploads
    likewise end at 5 s: 1 s transmitting, 1 s listening. Per client at receive 2 W, transmit 4 W,
    listen 0.5 W, training 3 W: 2 + 4 + 2 × 0.5 + 3 = 10 J, no idle (the group round is 5 s, all
    of it accounted). Charging the radio its power for the whole stretched transfer would give
    2 × 2 + 2 × 4 + 3 = 15 J."""
    from groupfel.emulator.network import edge_makespan

    watts = {"receive": 2.0, "transmit": 4.0, "listen": 0.5, "training": 3.0, "group_operation": 1.0, "idle": 0.1}
    power = DevicePower("d", {s: PowerCurve(Polynomial((w,))) for s, w in watts.items()})
    r = edge_makespan([2], np.array([5, 5]), linear(0.0, 1.0), quadratic(0, 0, 0), group_rounds=1, local_epochs=1,
                      model_bytes=10**6, client_mbps=8.0, latency_s=0.0, access_mbps=8.0, cores=None, secagg=False,
                      edge_mbps=1e9, edge_latency_s=0.0, power=power)
    assert r["makespan_s"] == pytest.approx(5.0, abs=1e-6)
    assert r["energy_receive_j"] == pytest.approx(2 * 2.0 * 1.0)
    assert r["energy_transmit_j"] == pytest.approx(2 * 4.0 * 1.0)
    assert r["energy_listen_j"] == pytest.approx(2 * 0.5 * 2.0)
    assert r["energy_training_j"] == pytest.approx(2 * 3.0)
    assert r["energy_idle_j"] == pytest.approx(0.0, abs=1e-6)
    assert r["edge_energy_j"] == pytest.approx(20.0)


@pytest.mark.parametrize("accounting, expected", [("group-rounds", {0: 48.6, 1: 69.0}),
                                                  ("full-fleet", {0: 51.8, 1: 72.2, 2: 27.2}),
                                                  ("marginal", {0: 20.4 + 4.2, 1: 40.8 + 4.2})])
def test_the_three_accountings_by_hand(accounting, expected):
    """Three clients; clients 0 and 1 (10 and 30 samples) form the sampled group, client 2 is not
    sampled; the worked example's round (training 6 s and 12 s, O(2) = 3 s each, the group round
    15 s) inside a 17 s round (the edge link 1 s each way). Training 5 W, group operation 3 W,
    idle 1.6 W. group-rounds: client 0 30 + 9 + 6 × 1.6 = 48.6 J, client 1 60 + 9 = 69 J;
    full-fleet adds the round's other 2 s of each sampled client (3.2 J) and client 2's 17 s
    (27.2 J); marginal charges the power above idle: training 3.4 W (20.4 J, 40.8 J), group
    operation 1.4 W (4.2 J each), idle nothing."""
    topo = build_topology([3], ["dev"] * 3, [np.arange(1) for _ in range(3)], np.ones((3, 1), dtype=int),
                          client_link=Link(1e15, 0.0), edge_link=Link(1e15, 1.0))
    prof = DeviceProfile("dev", "t", training={"sgd": linear(0.1, 1.0)}, group_overhead={"secagg": quadratic(0.5, 0, 1)})
    ledger = CostLedger()
    ledger.power = _power({"training": 5.0, "group_operation": 3.0, "transmit": 0.0, "receive": 0.0, "idle": 1.6},
                          accounting)
    env = simpy.Environment()
    fed = Federation(RoundContext(env, 1000, CostModel({"dev": prof}, "sgd", ("secagg",)), ledger, topo, seed=0,
                                  group_rounds=1, local_epochs=3))
    charged = ledger.seconds_of(3)
    fed.run_round(0, [(0, Group(0, np.arange(2), np.array([10, 30]), 0.0))])
    assert env.now == pytest.approx(17.0)
    if accounting == "full-fleet":
        fed.charge_fleet_idle(0, 0.0, charged)
    per_client = ledger.energy_frame().groupby("client")["joules"].sum()
    assert per_client[per_client != 0].to_dict() == pytest.approx(expected)
    from groupfel.experiments.timeline import energy_per_client

    table = energy_per_client(ledger.energy_frame()).set_index("client")
    if accounting == "full-fleet":      # the timeline's idle outside group rounds is a column of its own
        assert table["idle_between_j"].to_dict() == pytest.approx({0: 3.2, 1: 3.2, 2: 27.2})
        assert table["idle_j"].to_dict() == pytest.approx({0: 9.6, 1: 0.0, 2: 0.0})
    else:
        assert "idle_between_j" not in table
    assert ledger.energy_total == pytest.approx(sum(expected.values()))
