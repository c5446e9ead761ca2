"""FedScale-format device and behaviour traces: the mapping by hand, the formats, bad input, a run.

The traces are written here in FedScale's on-disk format (a pickled dict keyed by client id) and
as the same data in JSON and CSV; never FedScale's own files."""
from __future__ import annotations

import copy
import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import TINY, one_arm, one_error_line, write_toml
from groupfel.emulator.config import AvailabilityConfig, HeterogeneityConfig, parse_config
from groupfel.emulator.network import Availability, client_net
from groupfel.errors import InputError, InputWarning
from groupfel.experiments.cli import main

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "docs/guide/fedscale"

# three devices, ids out of order (FedScale's keys are ints)
CAPACITY = {10: {"computation": 20.0, "communication": 1000.0},
            3: {"computation": 40.0, "communication": 250.0},
            7: {"computation": 60.0, "communication": 4000.0}}
BEHAVIOUR = {10: {"active": [0, 6], "inactive": [4, 8], "finish_time": 8, "duration": 6, "model": "a"},
             3: {"active": [2], "inactive": [12], "finish_time": 10, "duration": 8, "model": "b"},
             7: {"active": [0], "inactive": [5], "finish_time": 5, "duration": 5, "model": "c"}}


def _pickle(path: Path, data) -> str:
    path.write_bytes(pickle.dumps(data, protocol=4))
    return str(path)


def test_capacity_mapping_by_hand(tmp_path):
    """Sorted ids 3, 7, 10; four clients cycle: 3, 7, 10, 3. Median computation 40 ms: slowdowns
    40/40, 60/40, 20/40, 40/40. Bandwidth = kbit/s × 1024 bit: 250 → 0.256, 4000 → 4.096,
    1000 → 1.024 Mbit/s. Latency stays client_link's."""
    f = _pickle(tmp_path / "client_device_capacity", CAPACITY)
    net = client_net(HeterogeneityConfig(fedscale_file=f), 4, 20.0, 0.05, 0)
    assert net.trace_ids == ["3", "7", "10", "3"]
    assert net.slowdown.tolist() == [1.0, 1.5, 0.5, 1.0]
    assert net.bandwidth_mbps.tolist() == pytest.approx([0.256, 4.096, 1.024, 0.256], abs=1e-12)
    assert net.latency_s.tolist() == [0.05] * 4
    # a stated reference: the profile's device is the trace's 20 ms per sample
    ref = client_net(HeterogeneityConfig(fedscale_file=f, reference_ms_per_sample=20.0), 2, 20.0, 0.05, 0)
    assert ref.slowdown.tolist() == [2.0, 3.0]
    # the latency is still drawn around client_link's where asked
    drawn = client_net(HeterogeneityConfig(fedscale_file=f, latency_sigma=0.5), 4, 20.0, 0.05, 0)
    assert drawn.latency_s.std() > 0 and drawn.slowdown.tolist() == net.slowdown.tolist()


def test_behaviour_mapping_by_hand(tmp_path):
    """Client 0 ← id 3: online [2, 10) of a 10 s trace, so 2..10, 12..20, ... (the part of
    [2, 12) past finish_time is never reached). Client 1 ← id 7: [0, 5) of 5 s, always online.
    Client 2 ← id 10: [0, 4) and [6, 8) of 8 s. Client 3 ← id 3 again."""
    f = _pickle(tmp_path / "client_behave_trace", BEHAVIOUR)
    a = Availability(AvailabilityConfig(fedscale_file=f), 4, 0)
    assert a.trace_ids == ["3", "7", "10", "3"]
    at = {0: [(0, False), (1.99, False), (2, True), (9.99, True), (10, False), (12, True), (21, False)],
          1: [(0, True), (4.99, True), (5, True), (1e6 + 0.5, True)],
          2: [(0, True), (3.99, True), (4, False), (6, True), (7.99, True), (8, True), (12, False), (14.5, True)],
          3: [(2, True), (11, False)]}
    for c, points in at.items():
        assert [a.online(c, t) for t, _ in points] == [on for _, on in points], c


def test_pickle_json_and_csv_read_alike(tmp_path):
    p = _pickle(tmp_path / "cap", CAPACITY)
    j = tmp_path / "cap.json"
    j.write_text(json.dumps(CAPACITY))
    c = tmp_path / "cap.csv"
    c.write_text("client_id,computation,communication\n" +
                 "".join(f"{k},{v['computation']},{v['communication']}\n" for k, v in CAPACITY.items()))
    nets = [client_net(HeterogeneityConfig(fedscale_file=str(f)), 5, 20.0, 0.05, 0).manifest() for f in (p, j, c)]
    assert nets[0] == nets[1] == nets[2]
    bp = _pickle(tmp_path / "beh", BEHAVIOUR)
    bj = tmp_path / "beh.json"
    bj.write_text(json.dumps(BEHAVIOUR))
    bc = tmp_path / "beh.csv"
    bc.write_text("client_id,active,inactive,finish_time\n" + "".join(
        f"{k},{a},{b},{v['finish_time']}\n" for k, v in BEHAVIOUR.items() for a, b in zip(v["active"], v["inactive"])))
    grid = np.arange(0, 40, 0.5)
    states = [[[Availability(AvailabilityConfig(fedscale_file=str(f)), 4, 0).online(c, t) for t in grid]
               for c in range(4)] for f in (bp, bj, bc)]
    assert states[0] == states[1] == states[2]


def test_the_docs_samples_are_what_the_script_writes(tmp_path):
    subprocess.run([sys.executable, str(SAMPLES / "make_samples.py"), str(tmp_path)], check=True)
    for f in tmp_path.iterdir():
        assert f.read_bytes() == (SAMPLES / f.name).read_bytes(), f.name
    assert {f.name for f in tmp_path.iterdir()} == {f.name for f in SAMPLES.iterdir()} - {"make_samples.py"}


def test_a_pickle_that_would_run_code_is_refused(tmp_path, code_running_payload):
    marker = tmp_path / "pwned"
    f = _pickle(tmp_path / "client_device_capacity", {1: {"computation": code_running_payload(marker),
                                                          "communication": 1.0}})
    with pytest.raises(InputError, match=r"^topology.heterogeneity.fedscale_file: .*client_device_capacity: the "
                                         r"pickle refers to io\.open, which groupfel does not load") as e:
        client_net(HeterogeneityConfig(fedscale_file=f), 2, 20.0, 0.05, 0)
    assert "\n" not in str(e.value) and not marker.exists()


@pytest.mark.parametrize("name, data, says", [
    ("cap", b"\x80\x04not a pickle", "not a readable pickle"),
    ("cap", [1, 2], "holds a list; give a dict of client id -> {'computation'"),
    ("cap", {}, "holds an empty dict"),
    ("cap", {1: {"computation": 5.0}}, "client id '1': the entry is {'computation': 5.0}; give {'computation'"),
    ("cap", {1: {"computation": 5.0, "communication": 0}, 2: CAPACITY[3]},
     "client id '1': communication = 0; give a number above 0 to 1e+12 kbit/s (fix or delete the entry)"),
    ("cap", {1: {"computation": float("nan"), "communication": 5.0}}, "client id '1': computation = nan"),
    ("cap", {1: CAPACITY[3], "1": CAPACITY[7]}, "client id '1' appears twice"),
    ("cap", {1.5: CAPACITY[3]}, "entry key 1.5 is not a client id"),
    ("cap.json", b"{\"1\": ", "not valid JSON"),
    ("cap.csv", b"client_id,computation\n1,5\n", "missing column 'communication'"),
    ("cap.csv", b"client_id,computation,communication\n1,5,100\n2,abc,100\n",
     "row 2: column 'computation' must be a number, got 'abc'"),
    ("cap.csv", b"client_id,computation,communication\n1,5,100\n1,6,100\n", "rows 1 (line 2) and 2 (line 3) both give"),
    ("cap.csv", b"client_id,computation,communication\n1,-5,100\n", "row 1 (client id '1'): computation = -5.0"),
])
def test_bad_capacity_traces_are_one_line_naming_file_and_entry(tmp_path, name, data, says):
    f = tmp_path / name
    f.write_bytes(data if isinstance(data, bytes) else pickle.dumps(data))
    with pytest.raises(InputError) as e:
        client_net(HeterogeneityConfig(fedscale_file=str(f)), 2, 20.0, 0.05, 0)
    msg = str(e.value)
    assert msg.startswith(f"topology.heterogeneity.fedscale_file: {f}") and "\n" not in msg and says in msg, msg


@pytest.mark.parametrize("name, data, says", [
    ("beh", {1: {"active": [0, 5], "inactive": [3], "finish_time": 10}},
     "client id '1': active has 2 times but inactive has 1"),
    ("beh", {1: {"active": [5], "inactive": [3], "finish_time": 10}}, "online from 5 s until 3 s is reversed"),
    ("beh", {1: {"active": [0, 2], "inactive": [5, 8], "finish_time": 10}}, "[0, 5) and [2, 8) overlap"),
    ("beh", {1: {"active": [0], "inactive": [5], "finish_time": 0}}, "finish_time = 0; give a number above 0"),
    ("beh", {1: {"active": [0], "inactive": [5]}}, "client id '1': the entry is"),
    ("beh", {1: {"active": 0, "inactive": 5, "finish_time": 9}}, "active and inactive must be lists"),
    ("beh", {1: {"active": ["0"], "inactive": [5], "finish_time": 9}}, "active time = '0'"),
    ("beh.csv", b"client_id,active,inactive,finish_time\n1,0,5,10\n1,6,8,12\n",
     "row 2 (client id '1'): finish_time 12 differs from an earlier row's 10"),
    ("beh.csv", b"client_id,active,inactive\n1,0,5\n", "missing column 'finish_time'"),
])
def test_bad_behaviour_traces_are_one_line_naming_file_and_entry(tmp_path, name, data, says):
    f = tmp_path / name
    f.write_bytes(data if isinstance(data, bytes) else pickle.dumps(data))
    with pytest.raises(InputError) as e:
        Availability(AvailabilityConfig(fedscale_file=str(f)), 2, 0)
    msg = str(e.value)
    assert msg.startswith(f"topology.availability.fedscale_file: {f}") and "\n" not in msg and says in msg, msg


def test_a_slowdown_beyond_its_limits_names_the_reference(tmp_path):
    f = _pickle(tmp_path / "cap", CAPACITY)
    with pytest.raises(InputError, match=r"client id '7' \(client 1\): computation 60 ms per sample is a slowdown "
                                         r"of 1200 against topology.heterogeneity.reference_ms_per_sample = 0.05; the slowdown must be "
                                         r"0.001 to 1000: set reference_ms_per_sample nearer, or fix the entry$"):
        client_net(HeterogeneityConfig(fedscale_file=f, reference_ms_per_sample=0.05), 2, 20.0, 0.05, 0)


@pytest.mark.parametrize("top, says", [
    ({"heterogeneity": {"file": "a.csv", "fedscale_file": "b"}}, "topology.heterogeneity: fedscale_file: give file"),
    ({"heterogeneity": {"fedscale_file": "b", "slowdown_sigma": 0.3}},
     "topology.heterogeneity: slowdown_sigma: fedscale_file gives every client's bandwidth and slowdown"),
    ({"heterogeneity": {"fedscale_file": "b", "bandwidth_sigma": 0.3}}, "topology.heterogeneity: bandwidth_sigma"),
    ({"heterogeneity": {"reference_ms_per_sample": 5.0}},
     "topology.heterogeneity: reference_ms_per_sample: only used with fedscale_file"),
    ({"heterogeneity": {"fedscale_file": "b", "reference_ms_per_sample": 0}},
     "topology.heterogeneity.reference_ms_per_sample: 0 is out of range"),
    ({"availability": {"file": "a.csv", "fedscale_file": "b"}}, "topology.availability: give file, fedscale_file"),
    ({"availability": {"fedscale_file": "b", "mean_on_s": 5}}, "topology.availability: give file, fedscale_file"),
])
def test_keys_that_contradict_a_trace_are_refused(top, says):
    d = copy.deepcopy(TINY)
    d["topology"].update(top)
    with pytest.raises(InputError) as e:
        parse_config(d)
    assert str(e.value).startswith(f"config: {says}"), str(e.value)


def _one_round(d: dict) -> dict:
    d = copy.deepcopy(d)
    d["arms"] = d["arms"][1:]
    d["train"].update(rounds=2, group_rounds=2)
    return d


def test_a_bad_trace_stops_the_run_before_any_work(tmp_path, capsys):
    f = tmp_path / "client_device_capacity"
    f.write_bytes(pickle.dumps({1: {"computation": 5.0, "communication": -1.0}}))
    d = _one_round(TINY)
    d["topology"]["heterogeneity"] = {"fedscale_file": str(f)}
    out = tmp_path / "run"
    assert main(["run", str(write_toml(tmp_path, d)), "--output", str(out), "--quiet"]) == 2
    assert f"topology.heterogeneity.fedscale_file: {f}: client id '1': communication = -1.0" in one_error_line(capsys)
    assert not out.exists()


@pytest.mark.parametrize("kind", ["heterogeneity", "availability"])
def test_an_empty_trace_path_is_one_line(tmp_path, capsys, kind):
    """Before: '' read as the current directory ("is a directory")."""
    d = _one_round(TINY)
    d["topology"][kind] = {"fedscale_file": ""}
    out = tmp_path / "run"
    assert main(["run", str(write_toml(tmp_path, d)), "--output", str(out), "--quiet"]) == 2
    assert f"topology.{kind}.fedscale_file: empty; give the trace file's path" in one_error_line(capsys)
    assert not out.exists()


@pytest.mark.slow
def test_a_run_on_a_trace_is_the_run_on_the_same_numbers_in_groupfels_csvs(tmp_path, capsys):
    """A run on FedScale-format traces charges exactly what the run on groupfel's own CSVs with
    the hand-mapped numbers charges: links and slowdowns (4 trace devices cycled over 12
    clients) and online intervals (a 7 s behaviour trace unrolled for 20 periods)."""
    cap = {1: {"computation": 30.0, "communication": 2000.0}, 2: {"computation": 90.0, "communication": 500.0},
           3: {"computation": 60.0, "communication": 8000.0}, 4: {"computation": 45.0, "communication": 1000.0}}
    beh = {1: {"active": [0], "inactive": [7], "finish_time": 7}, 2: {"active": [0, 4], "inactive": [3, 7], "finish_time": 7},
           3: {"active": [0], "inactive": [5], "finish_time": 7}, 4: {"active": [1], "inactive": [7], "finish_time": 7}}
    d = _one_round(TINY)
    d["topology"].update(heterogeneity={"fedscale_file": _pickle(tmp_path / "client_device_capacity", cap)},
                         availability={"fedscale_file": _pickle(tmp_path / "client_behave_trace", beh)})
    # by hand: median computation 52.5 ms; bandwidth kbit/s × 1024 / 1e6; the trace repeats every 7 s;
    # capacity ids sorted from client 0, behaviour ids as FedScale pairs them (client c: (c + 1) mod 4)
    ids, beh_ids = [1, 2, 3, 4] * 3, [2, 3, 4, 1] * 3
    links = tmp_path / "links.csv"
    links.write_text("client,bandwidth_mbps,latency_s,slowdown\n" + "".join(
        f"{c},{cap[i]['communication'] * 1024 / 1e6!r},0.02,{cap[i]['computation'] / 52.5!r}\n" for c, i in enumerate(ids)))
    online = tmp_path / "online.csv"
    online.write_text("client,start_s,end_s\n" + "".join(
        f"{c},{a + 7 * k},{b + 7 * k}\n" for c, i in enumerate(beh_ids) for k in range(20)
        for a, b in zip(beh[i]["active"], beh[i]["inactive"])))
    mine = copy.deepcopy(d)
    mine["topology"].update(heterogeneity={"file": str(links)}, availability={"file": str(online)})
    for name, cfg in (("trace", d), ("csv", mine)):
        assert main(["run", str(write_toml(tmp_path, cfg, f"{name}.toml")), "--output", str(tmp_path / name),
                     "--quiet"]) == 0, capsys.readouterr().err
    arm = d["arms"][0]["name"]
    a, b = (pd.read_parquet(tmp_path / n / arm / "ledger.parquet") for n in ("trace", "csv"))
    pd.testing.assert_frame_equal(a, b)
    assert a["end"].max() > 7          # the run outlasts one period of the trace
    net = json.loads((tmp_path / "trace" / arm / "manifest.json").read_text())["network"]
    assert net["clients"]["fedscale_ids"] == [str(i) for i in ids]
    assert net["availability_fedscale_ids"] == [str(i) for i in beh_ids]
    assert net["clients"]["slowdown"][:4] == pytest.approx([30 / 52.5, 90 / 52.5, 60 / 52.5, 45 / 52.5])
    assert net["offline"], "some sampled client is offline at a group round's start"


# -- availability that acts like FedScale's: only online clients, never a round with nobody --------

def _stretch(tmp_path: Path, d: dict, intervals: list[tuple[float, float]], period: float | None = 3600.0) -> dict:
    """``d`` with every client online during ``intervals`` only (a FedScale CSV trace repeating
    every ``period`` s, or groupfel's own availability file where ``period`` is None)."""
    n = d["topology"]["edges"] * d["topology"]["clients_per_edge"]
    if period is None:
        rows = ["client,start_s,end_s"] + [f"{c},{a:g},{b:g}" for c in range(n) for a, b in intervals]
        (tmp_path / "avail.csv").write_text("\n".join(rows) + "\n")
        d["topology"]["availability"] = {"file": str(tmp_path / "avail.csv")}
    else:
        rows = ["client_id,active,inactive,finish_time"] + [f"{c},{a:g},{b:g},{period:g}" for c in range(n)
                                                            for a, b in intervals]
        (tmp_path / "behaviour.csv").write_text("\n".join(rows) + "\n")
        d["topology"]["availability"] = {"fedscale_file": str(tmp_path / "behaviour.csv")}
    return d


def test_online_until_and_next_online_follow_a_repeating_trace(tmp_path):
    trace = _stretch(tmp_path, {"topology": {"edges": 1, "clients_per_edge": 1}}, [(0, 25), (1000, 3600)])
    a = Availability(AvailabilityConfig(**trace["topology"]["availability"]), 1, 0)
    assert a.next_online(0, 10.0) == 10.0 and a.next_online(0, 25.0) == 1000.0
    assert a.next_online(0, 3600 + 30.0) == 3600 + 1000.0
    assert a.online_until(0, 10.0) == 25.0 and a.online_until(0, 30.0) == 30.0
    # online from 1000 s to the period's end runs on into the next period's [0, 25)
    assert a.online_until(0, 1500.0) == 3600 + 25.0
    always = _stretch(tmp_path, {"topology": {"edges": 1, "clients_per_edge": 1}}, [(0, 3600)])
    assert Availability(AvailabilityConfig(**always["topology"]["availability"]), 1, 0).online_until(0, 5.0) == np.inf


def test_the_offline_stretch_is_waited_out_never_played(tmp_path, tiny_dict):
    """Every client online 0-25 s and 1000-3600 s (FedScale trace): rounds run while they are
    online; the round that reaches 25 s loses its members then (they drop out, their work after
    25 s never charged); the next round starts at 1000 s, when they are back. No round starts in
    the offline stretch, and each samples online clients."""
    d = _stretch(tmp_path, one_arm(tiny_dict, rounds=10), [(0, 25), (1000, 3600)])
    assert main(["run", str(write_toml(tmp_path, d)), "--output", str(tmp_path / "r"), "--quiet"]) == 0
    res = pd.read_csv(next((tmp_path / "r").rglob("results.csv")))
    manifest = json.loads(next((tmp_path / "r").rglob("manifest.json")).read_text())
    starts = [r["start_s"] for r in manifest["network"]["rounds"]]
    assert len(starts) == 10 and not any(25 <= s < 1000 for s in starts)
    assert any(s >= 1000 for s in starts) and manifest["stop_reason"] == "rounds"
    assert (res["clients_sampled"].iloc[1:] > 0).all()
    # the members that were mid-work at 25 s left then (a zero "offline" charge at 25 s)
    left = [o for o in manifest["network"]["offline"] if o["time_s"] == pytest.approx(25.0)]
    assert left and all(o["round"] == 1 + starts.index(max(s for s in starts if s < 25)) for o in left)
    # every round made progress in simulated time that someone worked in
    led = pd.read_parquet(next((tmp_path / "r").rglob("ledger.parquet")))
    assert set(led.loc[led.component == "training", "round"]) == set(range(1, 11))


def test_nobody_online_again_stops_the_run_naming_availability(tmp_path, tiny_dict, capsys):
    d = _stretch(tmp_path, one_arm(tiny_dict, rounds=20), [(0, 12)], period=None)
    assert main(["run", str(write_toml(tmp_path, d)), "--output", str(tmp_path / "r"), "--quiet"]) == 0
    manifest = json.loads(next((tmp_path / "r").rglob("manifest.json")).read_text())
    assert manifest["stop_reason"] == "availability" and manifest["rounds_run"] < 20
    assert manifest["stop_message"].startswith("availability: no client is online at or after")
    assert "stopped early: rg-random: availability: no client is online" in capsys.readouterr().out


def test_behaviour_ids_pair_as_fedscales_client_manager_or_sorted(tmp_path):
    """FedScale's client j (from 1) takes the (j mod M)-th id in the file's order: with ids in
    the order 7, 3, 10, our clients 0..3 (FedScale's 1..4) take 3, 10, 7, 3; sorted pairing takes
    3, 7, 10, 3."""
    trace = {k: BEHAVIOUR[k] for k in (7, 3, 10)}
    f = _pickle(tmp_path / "beh", trace)
    assert Availability(AvailabilityConfig(fedscale_file=f), 4, 0).trace_ids == ["3", "10", "7", "3"]
    assert Availability(AvailabilityConfig(fedscale_file=f, fedscale_pairing="sorted"), 4, 0).trace_ids == \
        ["3", "7", "10", "3"]


def test_a_bad_interval_on_an_id_no_client_takes_is_reported_not_fatal(tmp_path):
    trace = {1: {"active": [0], "inactive": [50], "finish_time": 100},
             2: {"active": [0], "inactive": [50], "finish_time": 100},
             3: {"active": [60], "inactive": [10], "finish_time": 100}}
    f = _pickle(tmp_path / "beh", trace)
    # FedScale pairing: clients 0, 1 take ids 2, 3 (positions 1, 2): id 3 is used, refused
    with pytest.raises(InputError, match="client id '3'.*online from 60 s until 10 s is reversed"):
        Availability(AvailabilityConfig(fedscale_file=f), 2, 0)
    # one client takes id 2 only: id 3's bad interval is reported and ignored
    with pytest.warns(InputWarning, match="client id '3' is paired with none of the 1 clients, so it is ignored"):
        a = Availability(AvailabilityConfig(fedscale_file=f), 1, 0)
    assert a.trace_ids == ["2"] and a.online(0, 10.0) and not a.online(0, 60.0)


def test_capacity_pairs_by_key_as_fedscales_aggregator_where_asked(tmp_path):
    """Keys 3, 7, 10 (M = 3): FedScale's client j takes key j mod 3, so our clients 0..3 (its
    1..4) look up keys 1, 2, 0, 1, none of which exists: each takes FedScale's default entry
    (1 ms per sample, 1 kbit/s). With keys 1..3: clients 0, 1 take keys 1, 2; client 2 (FedScale's
    3, key 0) the default; client 3 key 1 again."""
    f = _pickle(tmp_path / "cap", CAPACITY)
    net = client_net(HeterogeneityConfig(fedscale_file=f, fedscale_pairing="fedscale"), 4, 20.0, 0.05, 0)
    assert net.trace_ids == ["default"] * 4
    g = _pickle(tmp_path / "cap2", {1: CAPACITY[10], 2: CAPACITY[3], 3: CAPACITY[7]})
    net = client_net(HeterogeneityConfig(fedscale_file=g, fedscale_pairing="fedscale", reference_ms_per_sample=20.0),
                     4, 20.0, 0.05, 0)
    assert net.trace_ids == ["1", "2", "default", "1"]
    assert net.bandwidth_mbps.tolist() == pytest.approx([1.024, 0.256, 1024 / 1e6, 1.024])
    assert net.slowdown.tolist() == pytest.approx([1.0, 2.0, 1.0 / 20.0, 1.0])
