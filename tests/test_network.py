"""benchmarks/network.py: the emulator's clock against a real Linux network (issue 27, item 6).

The slow test builds network namespaces shaped by tc and runs real socket processes; it needs root
and iproute2 and skips, saying why, where namespaces are refused."""
from __future__ import annotations

import importlib.util
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("network_benchmark", ROOT / "benchmarks" / "network.py")
net = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = net          # dataclasses look their module up there
_spec.loader.exec_module(net)


def test_emulated_round_by_hand():
    # caps 1, 4, 4 Mbit/s on a 6 Mbit/s edge, 10 Mbit each way, no compute, one core, 1 s aggregation.
    # Down: max-min gives 1, 2.5, 2.5 -> clients 1, 2 done at 4 s; client 0 has 4 Mbit, then 6 more at 1 -> 10 s.
    # Up: clients 1, 2 share 6 (3 each) from 4 s -> 7.33 s; their group aggregates 7.33-8.33.
    # Client 0 uploads alone at its cap 1 from 10 s -> 20 s; its group aggregates 20-21.
    sc = net.Scenario("hand", [1.0, 4.0, 4.0], [[0], [1, 2]], 1_250_000, edge_mbps=6.0,
                      compute_s=0.0, aggregation_s=1.0, edge_cores=1)
    e = net.emulate(sc, efficiency=1.0)
    assert e["download_end"] == pytest.approx([10.0, 4.0, 4.0])
    assert e["upload_end"] == pytest.approx([20.0, 4 + 10 / 3, 4 + 10 / 3])
    assert e["aggregation_end"] == pytest.approx([21.0, 4 + 10 / 3 + 1])
    assert e["makespan"] == pytest.approx(21.0)
    # the benchmark's own calibration: TCP's 1448 payload bytes per 1514-byte frame stretch every transfer
    assert net.emulate(sc)["download_end"][0] == pytest.approx(10.0 * 1514 / 1448)


def test_core_queue_by_hand():
    # two groups ready at once on one core: the second's aggregation starts when the first's ends
    sc = net.Scenario("cores", [8.0, 8.0], [[0], [1]], 1_000_000, compute_s=0.5,
                      aggregation_s=2.0, edge_cores=1)
    e = net.emulate(sc, efficiency=1.0)
    assert sorted(e["aggregation_end"]) == pytest.approx([1 + 0.5 + 1 + 2, 1 + 0.5 + 1 + 4])
    assert net.emulate(net.Scenario(**{**sc.__dict__, "edge_cores": None}), 1.0)["makespan"] == pytest.approx(4.5)


def test_refused_without_root(monkeypatch):
    monkeypatch.setattr(net.os, "geteuid", lambda: 1000)
    assert net.check_available() == "needs root (network namespaces and tc)"
    with pytest.raises(net.Refused, match="needs root"):
        net.validate(net.scenarios(quick=True), goodput=False, out=lambda *_: None)


def test_model_bytes_are_the_cnns_parameters():
    from groupfel.emulator.models import build_model

    cnn = build_model("cnn", (1, 28, 28), 10)
    assert net.CNN_BYTES == 4 * sum(p.numel() for p in cnn.parameters())


@pytest.mark.slow
def test_emulated_makespan_within_10_percent_of_a_real_network():
    why = net.check_available()
    if why:
        pytest.skip(f"real network unavailable: {why}")
    lines: list[str] = []
    rows = net.validate(net.scenarios(quick=True), goodput=False, out=lines.append)
    table = "\n".join(lines)
    assert len(rows) == 3, table
    for r in rows:
        assert abs(r["error_pct"]) <= 10.0, table
    # the shaping is real: client 3 (an 8 Mbit/s link) shares the 8 Mbit/s edge with three others,
    # so its download takes about 4x what its own link alone would give (2x is far outside noise)
    alone = 8 * 200_000 / (8e6 * net.EFFICIENCY)
    assert rows[1]["measured_phases"]["download_end"][3] > 2 * alone, table
    # and the edge's one core queued the four groups' aggregations (0.3 s each) one after another
    starts = sorted(rows[2]["measured_phases"]["aggregation_start"])
    assert all(b - a >= 0.29 for a, b in itertools.pairwise(starts)), table
    # every namespace was deleted
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    assert f"gfn{os.getpid()}x" not in left, left


def test_processes_send_the_emulators_bytes():
    # SCAFFOLD under secure aggregation, a group of 3: down = model + 3 key pairs (64 B) + 2 share
    # ciphertexts (168 B); up = 2 models + its keys + 2 × (ciphertext + unmasking share 66 B)
    sc = net.Scenario("bytes", [8.0] * 4, [[0, 1, 2], [3]], 1000, vectors=2, secagg=True)
    spec = sc.spec()
    assert spec["down"] == [1000 + 3 * 64 + 2 * 168] * 3 + [1000 + 64]
    assert spec["up"] == [2000 + 64 + 2 * (168 + 66)] * 3 + [2000 + 64]
    moved = net.emulate(sc)["bytes"]
    assert (moved["edge_to_client"], moved["client_to_edge"]) == (sum(spec["down"]), sum(spec["up"]))


_clock_spec = importlib.util.spec_from_file_location("clock_benchmark_net", ROOT / "benchmarks" / "clock.py")
clock = importlib.util.module_from_spec(_clock_spec)
sys.modules[_clock_spec.name] = clock
_clock_spec.loader.exec_module(clock)

_WAN_PEERS = r'''
import socket, sys, threading, time, json
role, nbytes = sys.argv[1], int(sys.argv[2])
def recv(c, n):
    while n:
        got = c.recv(min(n, 1 << 16))
        if not got:
            raise ConnectionError("closed")
        n -= len(got)
if role == "cloud":
    s = socket.create_server(("10.99.0.1", 5078), backlog=4)
    print("ready", flush=True)
    conns = [s.accept()[0] for _ in range(2)]
    for c in conns:
        recv(c, 1)
    t0 = time.monotonic()
    def down(c):
        c.sendall(b"x" * nbytes)
        recv(c, 1)
    th = [threading.Thread(target=down, args=(c,)) for c in conns]
    [t.start() for t in th]; [t.join() for t in th]
    t1 = time.monotonic()
    ends = []
    def up(c):
        recv(c, nbytes)
        ends.append(time.monotonic())
    for c in conns:
        c.sendall(b"g")
    th = [threading.Thread(target=up, args=(c,)) for c in conns]
    [t.start() for t in th]; [t.join() for t in th]
    print(json.dumps({"down": t1 - t0, "up": max(ends) - t1}), flush=True)
else:
    for _ in range(100):
        try:
            c = socket.create_connection(("10.99.0.1", 5078)); break
        except OSError:
            time.sleep(0.05)
    c.sendall(b"r")
    recv(c, nbytes)
    c.sendall(b"d")
    recv(c, 1)
    c.sendall(b"y" * nbytes)
    time.sleep(0.5)
'''


@pytest.mark.slow
def test_two_edges_share_one_wan_to_the_cloud():
    why = net.check_available()
    if why:
        pytest.skip(f"real network unavailable: {why}")
    # two edges, each with one client namespace behind it, and a cloud behind one 2 Mbit/s WAN:
    # 100 kB to both edges at once, then 100 kB from both, each direction shared max-min fair
    rd = clock.Round("wan", [0.25, 0.25], [[0], [1]], [100, 100], [8.0, 8.0], group_edge=[0, 1], wan_mbps=2.0)
    nbytes, stamp = 100_000, "7"
    import contextlib

    with contextlib.ExitStack() as stack:
        nws = [stack.enter_context(clock._edge_network(rd, j, 1000, stamp)) for j in range(2)]
        wan = stack.enter_context(clock.Wan([nw.edge for nw in nws], 2.0, 0.0, stamp, netem=False))
        cloud = subprocess.Popen(["ip", "netns", "exec", wan.cloud, sys.executable, "-c", _WAN_PEERS, "cloud",
                                  str(nbytes)], stdout=subprocess.PIPE, text=True)
        assert cloud.stdout.readline().strip() == "ready"
        edges = [subprocess.Popen(["ip", "netns", "exec", nw.edge, sys.executable, "-c", _WAN_PEERS, "edge",
                                   str(nbytes)]) for nw in nws]
        out, _ = cloud.communicate(timeout=60)
        for p in edges:
            p.wait(timeout=30)
        left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
        assert wan.cloud in left
    times = json.loads(out.splitlines()[-1])
    both = 2 * 8 * nbytes / (2e6 * net.EFFICIENCY)     # the two flows through one link: 0.84 s
    assert 0.9 * both < times["down"] < 1.25 * both, times
    assert 0.9 * both < times["up"] < 1.25 * both, times
    # and every namespace went with the stack
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    assert wan.cloud not in left and nws[0].edge not in left, left
