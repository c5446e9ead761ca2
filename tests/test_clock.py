"""benchmarks/clock.py and the emulator's CPU-quota term (quota_seconds, ClientNet.cpu_share).

The slow test runs real clients that train under cgroup CPU quotas in network namespaces; it needs
root, iproute2 and a cgroup cpu controller, and skips, saying why, where they are refused."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from groupfel.cost_models import read_profiles
from groupfel.emulator.network import client_bytes, quota_seconds

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("clock_benchmark", ROOT / "benchmarks" / "clock.py")
clock = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = clock          # dataclasses look their module up there
_spec.loader.exec_module(clock)


def test_quota_seconds_by_hand():
    # half a core, 100 ms periods, 1 s at the steady pace = 0.5 s of CPU. Starting at phase p < 50 ms
    # it runs 50 ms, then 8 whole periods, then its last 50 ms: 0.95 - p; from p >= 50 ms it runs to
    # the period's end, then 9 periods and the rest: 0.95. Mean 0.5 * 0.925 + 0.5 * 0.95.
    assert quota_seconds(1.0, 0.5, 0.1) == pytest.approx(0.9375)
    # within the quota left in the period: the core's full speed, its CPU time
    assert quota_seconds(0.04, 0.5, 0.1) == pytest.approx(0.02)
    # no quota, nothing to do: unchanged
    assert quota_seconds(3.0, 1.0) == 3.0 and quota_seconds(0.0, 0.25) == 0.0
    # long steps finish at most one and a half periods early, never later than the steady pace
    for share in (0.1, 0.25, 0.5, 0.9):
        for steady in (0.5, 2.0, 10.0):
            assert steady - 0.15 <= quota_seconds(steady, share, 0.1) <= steady
    # a shorter period, a smaller saving
    assert 1.0 - quota_seconds(1.0, 0.25, 0.01) < 1.0 - quota_seconds(1.0, 0.25, 0.1)


def _profiles(tmp_path, rows: str) -> dict:
    path = tmp_path / "profile.csv"
    path.write_text("device,task,operation,method,a,b,c,note\n" + rows)
    return read_profiles(path)


def test_emulated_round_charges_the_quota_term(tmp_path):
    # training 0.01 s a sample per epoch, secagg 0.1 s a client: 2 epochs of 100 samples = 2 s steady
    profiles = _profiles(tmp_path, "q25,clock,training,sgd,0.01,0,,\nq25,clock,group_overhead,secagg,0,0,0.1,\n"
                                   "edgeq100,clock,group_overhead,secagg-server,0,0,0.3,\n")
    rd = clock.Round("t", [0.25, 0.25], [[0, 1]], [100, 100], [8.0, 8.0], epochs=2)
    model_bytes = 40_000
    steady = clock.emulate(rd, profiles, model_bytes, efficiency=1.0, quota_term=False)
    assert steady["train"] == pytest.approx([2.0, 2.0]) and steady["secagg"] == pytest.approx([0.1, 0.1])
    e = clock.emulate(rd, profiles, model_bytes, efficiency=1.0)
    period = clock.PERIOD_US / 1e6
    assert e["train"] == pytest.approx([quota_seconds(2.0, 0.25, period)] * 2)
    # the group operation follows at the throttled pace: the two steps together take the term's time
    assert np.add(e["train"], e["secagg"]) == pytest.approx([quota_seconds(2.1, 0.25, period)] * 2)
    down, up = client_bytes(model_bytes, 2, 1, True)
    assert e["download"] == pytest.approx([8 * down / 8e6] * 2)
    assert e["upload"] == pytest.approx([8 * up / 8e6] * 2)
    assert e["aggregation"] == pytest.approx([0.3]) and e["queue"] == [0.0]
    assert e["makespan"] < steady["makespan"]
    assert e["compute"] == [pytest.approx([quota_seconds(2.1, 0.25, period)])] * 2
    # the replay with the run's compute: each client's steps stretched by its slowdown
    slow = clock.emulate(rd, profiles, model_bytes, efficiency=1.0, quota_term=False, slowdown=[1.5, 1.0])
    assert slow["train"] == pytest.approx([3.0, 2.0]) and slow["compute"] == [[pytest.approx(3.15)], [pytest.approx(2.1)]]


def test_client_and_edge_move_the_emulators_bytes_and_aggregate():
    import multiprocessing as mp

    from groupfel.cost_models.secagg import quantize

    n, m = 3, 50
    keys = clock._group_keys(n)
    q = quantize(np.random.default_rng(0).normal(0, 0.01, m), 2.0**16)
    uploads = [clock.client_secagg(u, n, q, keys) for u in range(n)]
    assert {len(u) for u in uploads} == {client_bytes(4 * m, n, 1, True)[1]}
    a, b = mp.Pipe()
    a.send((n, m, uploads, 0))
    a.send((n, m, uploads[:2], 1))        # one member dropped out: its key rebuilt, its masks removed
    a.send(None)
    clock.net.worker(b, clock._aggregate)       # an edge core's loop, here in this process
    for _ in range(2):
        start, end = a.recv()
        assert 0 <= end - start < 5


def test_refused_without_root(monkeypatch):
    monkeypatch.setattr(clock.os, "geteuid", lambda: 1000)
    assert clock.check_quota() == "needs root (cgroup CPU quotas)"
    with pytest.raises((clock.Refused, clock.net.Refused), match="needs root"):
        clock.validate(clock.scenarios(quick=True), out=lambda *_: None)


def test_bad_scenario_or_json_refused_in_one_line(capsys, tmp_path):
    assert clock.main(["--scenario", "no such"]) == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("--scenario: no scenario's name holds 'no such'; the names: ")
    assert "2 edges, one WAN to the cloud" in out[0]
    kept = tmp_path / "rows.json"
    kept.write_text("[]")
    assert clock.main(["--quick", "--json", str(kept)]) == 2
    assert capsys.readouterr().out.strip() == f"--json: {kept} exists; give a new one (a run never overwrites another's)"
    assert kept.read_text() == "[]"
    assert clock.main(["--quick", "--keep", str(tmp_path)]) == 2
    assert capsys.readouterr().out.strip() == f"--keep: {tmp_path} exists; give a new one (a run never overwrites another's)"


def test_training_sizes_bracket_the_shards_up_to_a_rounds_epochs():
    assert clock.training_sizes([150, 200]) == [75, 150, 200, 400]
    assert clock.training_sizes([40]) == [32, 40, 80]
    assert clock.training_sizes([150, 200], epochs=8) == [75, 150, 200, 400, 1600]


_CURVES = ("q25,clock,training,sgd,0.001,0,,\nq25,clock,group_overhead,secagg,0,0,0.01,\n"
           "q12,clock,training,sgd,0.002,0,,\nq12,clock,group_overhead,secagg,0,0,0.02,\n"
           "edgeq100,clock,group_overhead,secagg-server,0,0,0.3,\n"
           "edgeq100,clock,group_overhead,secagg-server-recovery,0,0,0.05,\n")


def test_phase_check_holds_every_phase_of_20_ms_or_more():
    rd = clock.Round("t", [0.25, 0.25], [[0, 1]], [100, 100], [8.0, 8.0])
    m = {p: [] for p in clock.PHASES} | {"download": [0.5, 0.5], "train": [1.0, 1.2], "secagg": [0.005, 0.006],
                                         "upload": [0.4, 0.4], "queue": [0.001], "aggregation": [0.3]}
    e = {p: [] for p in clock.PHASES} | {"download": [0.51, 0.51], "train": [1.3, 1.3], "secagg": [0.01, 0.01],
                                         "upload": [0.4, 0.4], "queue": [0.0], "aggregation": [0.29]}
    phases = clock.compare(rd, m, e)
    assert "cloud up" not in phases                       # a phase neither side has: not in the row
    assert phases["train"]["error_pct"] == pytest.approx(100 * (1.3 - 1.1) / 1.1)
    assert not phases["train"]["within"] and phases["download"]["within"] and phases["aggregation"]["within"]
    # secagg is twice as long emulated, but 5.5 ms: reported in brackets, not held
    assert not phases["secagg"]["held"] and phases["secagg"]["within"]
    assert clock.phase_cell(phases["secagg"]) == "(6 ms)" and clock.phase_cell(phases["train"]) == "**+18.2**"
    assert clock.phase_cell(phases.get("cloud down")) == "-"
    row = {"scenario": "t", "error_pct": 1.0, "phases": phases}
    assert clock.check([row], quick=True) == ["t: train +18.2 %"]
    # a phase whose counts differ (a client round finished on one side only) is out, and the
    # makespan goals and the number of scenarios are checked too
    phases["upload"] = {**phases["upload"], "count": [2, 1], "within": False}
    assert clock.check([row, {"scenario": "u", "refused": "why"}], quick=False) == [
        "u: refused", f"1 scenarios reported, the goals need {clock.MIN_SCENARIOS}",
        "t: train +18.2 %", "t: upload 2 measured, 1 emulated"]
    assert clock.check([{**row, "error_pct": 6.0, "phases": {}}], quick=True) == [
        "makespan median 6.00 % > 2 %", "makespan worst 6.00 % > 5 %"]


def test_delivery_summary_and_the_check_says_a_phase_is_under_two_cycles():
    # bursts of 1 and 3 ms, gaps of 18 ms: a cycle of 2 + 18 = 20 ms on average, 10 % of a core
    d = clock.delivery_summary([0.001, 0.003] * 10, [0.018] * 20)
    assert d["cycle_s"] == pytest.approx(0.020) and d["share"] == pytest.approx(0.1)
    assert d["burst_median_s"] == pytest.approx(0.002) and d["burst_range_s"] == pytest.approx([0.001, 0.003])
    assert clock.delivery_text(0.1, d) == "10 %: bursts 2.0 ms (1.0-3.0), gaps 18.0 ms, a cycle 20.0 ms, 10 % got"
    assert clock.delivery_summary([], [])["cycle_s"] is None
    # a 25 ms secure aggregation off by 30 %: still a failure, said with the cycle and what the
    # same step took in the calibration loop; a training phase of many cycles gets no such note
    secagg = {"measured": 0.025, "emulated": 0.0175, "error_pct": -30.0, "held": True, "count": [2, 2],
              "within": False}
    train = {"measured": 1.0, "emulated": 1.2, "error_pct": 20.0, "held": True, "count": [2, 2], "within": False}
    row = {"scenario": "t", "error_pct": 1.0, "phases": {"secagg": secagg, "train": train},
           "delivery": {"0.1": d, "1.0": None}, "secagg_wall_ms": {"run": 25.0, "calibration": 17.4}}
    assert clock.check([row], quick=True) == [
        "t: secagg -30.0 % (25 ms: under two 10 % delivery cycles, 20 ms; 17.4 ms a step in the calibration loop)",
        "t: train +20.0 %"]


def test_starved_scenario_refused_in_one_line(monkeypatch, tmp_path):
    rd = clock.Round("starved", [0.5, 0.25], [[0, 1]], [100, 100], [8.0, 8.0])
    assert clock.starved(rd, [1.02, 0.95], "in the run") is None
    assert clock.starved(rd, [0.5, None], "after") == (
        "client 0 got 50 % of its 50 % quota after, under 90 %: other work on the machine starved it")
    why = clock.starved(rd, [0.97, 0.71], "in the run")
    assert why == "client 1 got 71 % of its 25 % quota in the run, under 90 %: other work on the machine starved it"
    # validate prints the scenario's one line and reports nothing else of it: here the real
    # calibration and run are replaced by what a machine busy with other work gave them
    load = {"others_cores": 1.93, "ours_cores": 0.7, "cpu_pressure": 0.97, "load_average": 9.5, "wall_s": 3.0}
    monkeypatch.setattr(clock.net, "check_available", lambda: None)
    monkeypatch.setattr(clock, "check_quota", lambda: None)
    cal = {"csv": "", "share": 1.0, "start": 0.0, "end": 1.0}
    monkeypatch.setattr(clock, "calibrate_edge", lambda rd, mb, wd, tag: wd / f"{tag}.csv")
    monkeypatch.setattr(clock, "measure_round", lambda *a: {"share": [0.99, 0.62], "loads": [load] * 3,
                                                            "calibrations": [[cal, cal], [cal, None]]})
    monkeypatch.setattr(clock, "fit_profiles", lambda *a: pytest.fail("a starved scenario is not fitted"))
    lines = []
    rows = clock.validate([rd], out=lines.append, workdir=tmp_path)
    assert lines[-1] == ("| starved | 2 | refused: client 1 got 62 % of its 25 % quota in the run, under 90 %: other "
                         "work on the machine starved it (other work 1.93 (97 %); 1.93 (97 %); 1.93 (97 %) cores; load average 9.5) |")
    assert rows[0]["refused"].startswith("client 1 got 62 %")
    assert clock.check(rows, quick=True) == ["starved: refused"]


def test_other_works_cores_leave_ours_out():
    why = clock.check_quota()
    if why:
        pytest.skip(f"no CPU quota here: {why}")
    q = clock.CpuQuota(f"gfq{os.getpid()}w", 0.5)
    try:
        w = clock.Window([q])
        p = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 0.6: pass"])
        q.add(p.pid)
        p.wait()
        load = w.close()
    finally:
        q.close()
    # the spinner ran at its half core; what the machine did besides is not counted as ours
    assert 0.3 < load["ours_cores"] <= 0.6 and load["others_cores"] >= 0.0 and load["wall_s"] >= 0.5
    assert load["cpu_pressure"] is None or 0.0 <= load["cpu_pressure"] <= 1.05


def test_rounds_members_and_numbering():
    rd = clock.Round("d", [0.25] * 4, [[0, 1], [2, 3]], [100] * 4, [2.0] * 4, rounds=3, group_rounds=2,
                     group_edge=[0, 1], drops={"3": [1, 1, 0.5]})
    assert rd.drops == {3: (1, 1, 0.5)} and rd.edges == 2 and rd.edge_clients(1) == [2, 3]
    assert rd.alive(1, 1, 1) == [2, 3] and rd.alive(2, 0, 1) == [2] and rd.alive(2, 0, 0) == [0, 1]
    assert clock.Round.from_json(json.loads(json.dumps(clock.asdict(rd)))) == rd
    assert [(s.client_mbps, s.groups) for s in (rd.network(0, 1000), rd.network(1, 1000))] == [([2.0, 2.0], [[0, 1]])] * 2
    with pytest.raises(ValueError, match="numbered edge by edge"):
        clock.Round("x", [0.25] * 4, [[0, 2], [1, 3]], [100] * 4, [2.0] * 4, group_edge=[0, 1])


def test_drop_out_mid_round_emulated(tmp_path):
    # 4 clients, 3 global rounds, client 3 offline half-way through its training in round 2
    profiles = _profiles(tmp_path, _CURVES)
    rd = clock.Round("drop", [0.25] * 4, [[0, 1, 2, 3]], [100] * 4, [8.0] * 4, epochs=2, rounds=3,
                     drops={3: (1, 0, 0.5)})
    at = clock.drop_times(rd, profiles, 40_000)
    spans = clock.emulate(rd, profiles, 40_000)["training_spans"]
    a, b = spans[(2, 0, 3)]
    assert at == {3: pytest.approx(a + 0.5 * (b - a))}
    e = clock.emulate(rd, profiles, 40_000, drop_at=at)
    assert e["offline"] == [3]
    # its round-2 training is cut short and never uploaded; the other 3 finish every round
    assert len(e["upload"]) == len(e["train"]) == len(e["secagg"]) == 4 + 3 + 3
    # the group rounds with a member missing pay secagg-server-recovery on the edge's core
    assert e["aggregation"] == pytest.approx([0.3, 0.35, 0.35])
    assert e["makespan"] > clock.emulate(rd, profiles, 40_000)["makespan"] - 0.1


def test_two_edges_share_the_wan_in_group_and_global_rounds(tmp_path):
    profiles = _profiles(tmp_path, _CURVES)
    mb = 125_000          # 1 Mbit: 1 s alone on the 1 Mbit/s WAN, 2 s when both edges move it at once
    rd = clock.Round("wan", [0.125] * 8, [[0, 1], [2, 3], [4, 5], [6, 7]], [100] * 8, [80.0] * 8, epochs=1,
                     rounds=2, group_rounds=2, group_edge=[0, 0, 1, 1], wan_mbps=1.0)
    e = clock.emulate(rd, profiles, mb, efficiency=1.0, quota_term=False)
    assert e["cloud down"] == pytest.approx([2.0] * 4)             # 2 edges x 2 global rounds, together
    # each edge sends its 2 groups' models (2 Mbit) at the same time: 4 Mbit through 1 Mbit/s
    assert e["cloud up"] == pytest.approx([4.0] * 4)
    assert len(e["aggregation"]) == 2 * 2 * 4 and len(e["train"]) == 2 * 2 * 8
    alone = clock.emulate(clock.Round(**{**clock.asdict(rd), "wan_mbps": 2.0}), profiles, mb, efficiency=1.0,
                          quota_term=False)
    assert alone["makespan"] == pytest.approx(e["makespan"] - 2 * (1.0 + 2.0))
    # a drop-out behind the WAN: the availability's dry run plays the shared WAN too
    drop = clock.Round(**{**clock.asdict(rd), "drops": {7: (0, 1, 0.5)}})
    d = clock.emulate(drop, profiles, mb, efficiency=1.0, quota_term=False, drop_at=clock.drop_times(drop, profiles, mb))
    assert d["offline"] == [7] and len(d["train"]) == 2 * 2 * 8 - 3 and d["cloud down"] == pytest.approx([2.0] * 4)

    # the WAN's leaves hold 12,500 B each (0.1 Mbit): each edge's 1 Mbit down and 2 Mbit up start
    # with 0.1 Mbit at once, the rest shared: 2 x 0.9 Mbit (1.8 s) down, 2 x 1.9 Mbit (3.8 s) up
    b = clock.emulate(rd, profiles, mb, efficiency=1.0, quota_term=False, buckets={"client": [0.0] * 8,
                                                                                 "wan": [12_500.0] * 2})
    assert b["cloud down"] == pytest.approx([1.8] * 4) and b["cloud up"] == pytest.approx([3.8] * 4)


def test_an_htb_leafs_burst_is_read_from_the_kernel():
    why = clock.net.check_available()
    if why:
        pytest.skip(why)
    ns = f"gfbt{os.getpid()}"
    try:
        clock.net._run("ip", "netns", "add", ns)
        clock.net._run("ip", "-n", ns, "link", "add", "b0", "type", "veth", "peer", "name", "b1")
        clock.net._run("tc", "-n", ns, "-batch", "-", stdin="qdisc add dev b0 root handle 1: htb\n"
                       "class add dev b0 parent 1: classid 1:10 htb rate 2mbit\n"
                       "class add dev b0 parent 1: classid 1:11 htb rate 2mbit burst 15k\n")
        assert clock.net.class_burst_bytes(ns, "b0", "1:10") == 1600        # the default at this rate
        assert clock.net.class_burst_bytes(ns, "b0", "1:11") == 15 * 1024   # shown as 15Kb
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


@pytest.mark.slow
def test_emulated_round_within_10_percent_of_real_clients_under_quotas():
    why = clock.net.check_available() or clock.check_quota()
    if why:
        pytest.skip(f"real network or CPU quota unavailable: {why}")
    lines: list[str] = []
    rows = clock.validate(clock.scenarios(quick=True), out=lines.append)
    table = "\n".join(lines)
    assert len(rows) == 1, table
    r = rows[0]
    if "refused" in r:
        pytest.skip(f"the machine's other work starved the clients: {r['refused']}")
    assert abs(r["error_pct"]) <= 10.0, table
    assert {"download", "train", "upload"} <= set(r["phases"]), table
    # the quotas were real: the 25 % clients were throttled, and ran at about their share
    m = r["measured_phases"]
    assert min(m["throttled"][1:]) > 0, table
    assert all(0.6 < s < 1.8 for s in m["share"]), table
    # the quota's delivery was probed alone first: the 25 % quota's bursts got about 25 %
    assert table.startswith("digits CNN") and "quota delivery" in lines[1], table
    assert 0.15 < r["delivery"]["0.25"]["share"] < 0.35, table
    # every namespace and cgroup was removed
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    assert f"gfn{os.getpid()}x" not in left, left
    roots = clock._cgroup_roots()
    assert not list(roots[1].glob(f"gfq{os.getpid()}*")), table


@pytest.mark.slow
def test_rounds_through_the_cloud_with_a_drop_out_real_and_emulated():
    why = clock.net.check_available() or clock.check_quota()
    if why:
        pytest.skip(f"real network or CPU quota unavailable: {why}")
    # two edges of two clients behind one WAN, two global rounds; client 3 leaves half-way through
    # its training in the first: the edge recovers it, and the second round plays without it
    rd = clock.Round("tiny", [0.25] * 4, [[0, 1], [2, 3]], [64] * 4, [2.0] * 4, epochs=2, edge_mbps=4.0, rounds=2,
                     group_edge=[0, 1], wan_mbps=2.0, drops={3: (0, 0, 0.5)})
    lines: list[str] = []
    rows = clock.validate([rd], out=lines.append)
    table = "\n".join(lines)
    r = rows[0]
    if "refused" in r:
        pytest.skip(f"the machine's other work starved the clients: {r['refused']}")
    assert r["dropped"] == [[3], [3]], table
    # both sides finished the same client rounds, group rounds and cloud hops
    assert all(ph["count"][0] == ph["count"][1] for ph in r["phases"].values()), r["phases"]
    assert r["phases"]["train"]["count"] == [6, 6] and r["phases"]["cloud up"]["count"] == [4, 4], r["phases"]
    assert abs(r["error_pct"]) <= 10.0, table
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    assert f"gfn{os.getpid()}x" not in left, left


def test_heterogeneity_file_gives_each_client_a_cpu_quota(tmp_path):
    from groupfel.emulator.config import HeterogeneityConfig
    from groupfel.emulator.network import client_net
    from groupfel.errors import InputError

    f = tmp_path / "c.csv"
    f.write_text("client,bandwidth_mbps,latency_s,cpu_share,cpu_period_s\n0,10,0.1,0.25,0.01\n1,5,0.2,1,0.1\n")
    net = client_net(HeterogeneityConfig(file=str(f)), 2, 20.0, 0.02, 0)
    assert net.cpu_share.tolist() == [0.25, 1.0] and net.slowdown.tolist() == [1.0, 1.0]
    assert net.manifest()["cpu_period_s"] == [0.01, 0.1]
    assert net.compute_seconds(0, 1.0) == pytest.approx(quota_seconds(1.0, 0.25, 0.01))
    assert net.compute_seconds(1, 1.0) == 1.0
    f.write_text("client,bandwidth_mbps,latency_s,cpu_share\n0,10,0.1,0.25\n1,5,0.2,1\n")
    assert client_net(HeterogeneityConfig(file=str(f)), 2, 20.0, 0.02, 0).compute_seconds(0, 1.0) == \
        pytest.approx(quota_seconds(1.0, 0.25, 0.1))       # the kernel's default period
    for rows, match in (("client,bandwidth_mbps,latency_s,cpu_share\n0,10,0.1,1.5\n1,5,0.2,1\n",
                         r"cpu_share = '1.5'; give a number from 0.001 to 1 of a core"),
                        ("client,bandwidth_mbps,latency_s,cpu_period_s\n0,10,0.1,0.1\n1,5,0.2,0.1\n",
                         "has cpu_period_s but no cpu_share column")):
        f.write_text(rows)
        with pytest.raises(InputError, match=match):
            client_net(HeterogeneityConfig(file=str(f)), 2, 20.0, 0.02, 0)
