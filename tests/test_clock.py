"""benchmarks/clock.py and the emulator's CPU-quota term (quota_seconds, ClientNet.cpu_share).

The slow test runs real clients that train under cgroup CPU quotas in network namespaces; it needs
root, iproute2 and a cgroup cpu controller, and skips, saying why, where they are refused."""
from __future__ import annotations

import importlib.util
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


def test_client_and_edge_move_the_emulators_bytes_and_aggregate():
    import multiprocessing as mp

    from groupfel.cost_models.secagg import quantize

    n, m = 3, 50
    keys = clock._group_keys(n)
    q = quantize(np.random.default_rng(0).normal(0, 0.01, m), 2.0**16)
    uploads = [clock.client_secagg(u, n, q, keys) for u in range(n)]
    assert {len(u) for u in uploads} == {client_bytes(4 * m, n, 1, True)[1]}
    a, b = mp.Pipe()
    a.send((n, m, uploads))
    a.send(None)
    clock.net.worker(b, clock._aggregate)       # an edge core's loop, here in this process
    start, end = a.recv()
    assert 0 <= end - start < 5


def test_refused_without_root(monkeypatch):
    monkeypatch.setattr(clock.os, "geteuid", lambda: 1000)
    assert clock.check_quota() == "needs root (cgroup CPU quotas)"
    with pytest.raises((clock.Refused, clock.net.Refused), match="needs root"):
        clock.validate(clock.scenarios(quick=True), out=lambda *_: None)


def test_training_sizes_bracket_the_shards():
    assert clock.training_sizes([150, 200]) == [75, 150, 200, 400]
    assert clock.training_sizes([40]) == [32, 40, 80]


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
    assert abs(r["error_pct"]) <= 10.0, table
    # the quotas were real: the 25 % clients were throttled, and ran at about their share
    m = r["measured_phases"]
    assert min(m["throttled"][1:]) > 0, table
    assert all(0.6 < s < 1.8 for s in m["share"]), table
    # every namespace and cgroup was removed
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    assert f"gfn{os.getpid()}x" not in left, left
    roots = clock._cgroup_roots()
    assert not list(roots[1].glob(f"gfq{os.getpid()}*")), table


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
