"""The shared link's processor sharing, against finish times worked out by hand."""
import math

import pytest
import simpy

from groupfel.emulator.network.links import SharedLink, finish_times

MB = 10**6                       # 1 MB = 8 Mbit
MBIT = 1e6


def test_twenty_clients_share_8_mbit():
    # 20 flows of 8 Mbit on 8 Mbit/s: each gets 0.4 Mbit/s, all end at 20 s (+ 0.05 s latency)
    shared = finish_times([(0.0, MB, 8 * MBIT, 0.05)] * 20, 8 * MBIT)
    assert shared == pytest.approx([20.05] * 20, abs=1e-9)
    # dedicated 8 Mbit/s links: 1 s each
    dedicated = finish_times([(0.0, MB, 8 * MBIT, 0.05)] * 20, None)
    assert dedicated == pytest.approx([1.05] * 20, abs=1e-12)


def test_half_bandwidth_client_in_a_shared_group():
    # capacity 8 Mbit/s; own links 4, 4 and 2 (half) Mbit/s; 1 MB each.
    # Fair share 8/3 = 2.667 > 2: the slow client gets its cap 2, the others (8-2)/2 = 3 each.
    # The fast two end at 8/3 = 2.667 s (dedicated: 2 s); the slow one has sent 2·8/3 = 5.333
    # Mbit by then, sends the last 2.667 Mbit at its cap 2 -> 1.333 s more: 4.0 s, as alone.
    t = finish_times([(0.0, MB, 4 * MBIT, 0.0), (0.0, MB, 4 * MBIT, 0.0), (0.0, MB, 2 * MBIT, 0.0)], 8 * MBIT)
    assert t == pytest.approx([8 / 3, 8 / 3, 4.0], rel=1e-12)
    # five clients (four at 4, one at 2 Mbit/s) on 8 Mbit/s: the share 1.6 is below every cap,
    # so the slow client's own link does not matter: all end at 5·8/8 = 5 s
    t = finish_times([(0.0, MB, 4 * MBIT, 0.0)] * 4 + [(0.0, MB, 2 * MBIT, 0.0)], 8 * MBIT)
    assert t == pytest.approx([5.0] * 5, rel=1e-12)


def test_staggered_start_recomputes_rates():
    # A alone from 0 to 0.5 s sends 4 Mbit at 8; then A and B share 4 each: A's last 4 Mbit take
    # 1 s (ends 1.5 s); B has 4 Mbit left at 1.5 s, alone at 8 -> 0.5 s: ends 2.0 s
    t = finish_times([(0.0, MB, 8 * MBIT, 0.0), (0.5, MB, 8 * MBIT, 0.0)], 8 * MBIT)
    assert t == pytest.approx([1.5, 2.0], rel=1e-12)


def test_uncapped_flows_and_utilisation():
    env = simpy.Environment()
    link = SharedLink(env, 10 * MBIT)
    for _ in range(2):
        env.process(link.transfer(MB, None, 0.1))
    env.run()
    # two uncapped flows of 8 Mbit on 10 Mbit/s: 1.6 s of transfer, then the latency
    assert env.now == pytest.approx(1.7)
    assert link.busy_s == pytest.approx(1.6)
    assert link.carried_bits == pytest.approx(16 * MBIT)
    assert link.active == 0


def test_zero_bytes_take_only_latency():
    assert finish_times([(0.0, 0, 8 * MBIT, 0.25)], 8 * MBIT) == [0.25]


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf])
def test_bad_capacity(bad):
    with pytest.raises(ValueError, match="capacity"):
        SharedLink(simpy.Environment(), bad)


def test_dedicated_link_needs_a_cap():
    env = simpy.Environment()
    env.process(SharedLink(env, None).transfer(MB, None))
    with pytest.raises(ValueError, match="cap_bps"):
        env.run()


def test_a_token_bucket_sends_its_burst_at_once():
    # tc's HTB leaf: burst 1600 B. 57,000 B over 2 Mbit/s: (57,000 - 1,600) × 8 / 2e6 = 0.2296 s,
    # against 0.228 s for the ideal link's 57,000 × 8 / 2e6 = 0.228 -> shorter by 6.4 ms
    from groupfel.topologies import Link

    assert Link(2.0, 0.0, 1600.0).transfer_time(57_000) == pytest.approx((57_000 - 1_600) * 8 / 2e6, rel=1e-15)
    assert Link(2.0, 0.01, 1600.0).transfer_time(1_000) == pytest.approx(0.01, rel=1e-15)   # all of it in the burst
    assert Link(2.0, 0.0).transfer_time(57_000) == 57_000 * 8 / 2e6                        # no bucket: bitwise as before
    env = simpy.Environment()
    # dedicated 8 Mbit/s links: 1 MB with a 100 kB burst ends at 0.9 s
    dedicated = SharedLink(env, None)
    ends = []

    def one(link, cap, burst):
        ends.append((yield env.process(link.transfer(MB, cap, 0.0, burst))))

    env.process(one(dedicated, 8 * MBIT, 100_000))
    env.run()
    assert ends == pytest.approx([0.9], rel=1e-12)
    # four flows of 1 MB on a shared 8 Mbit/s, each with its own 100 kB bucket (a leaf within its
    # assured rate sends its bucket at once): 4 × 0.9 MB through 8 Mbit/s, all end at 3.6 s
    env, ends = simpy.Environment(), []
    shared = SharedLink(env, 8 * MBIT)
    for _ in range(4):
        env.process(one(shared, 8 * MBIT, 100_000))
    env.run()
    assert ends == pytest.approx([3.6] * 4, rel=1e-12)
    assert shared.carried_bits == pytest.approx(4 * 8 * MB, rel=1e-12)
