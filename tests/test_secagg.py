"""Secure aggregation: masks cancel exactly, dropouts are recovered, cost grows superlinearly."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from groupfel.cost_models.secagg import (PRIME, dequantize, quantize, secure_sum, shamir_reconstruct, shamir_share,
                                time_secagg)


@settings(max_examples=25, deadline=None)
@given(secret=st.integers(0, PRIME - 1), n=st.integers(1, 12), data=st.data())
def test_shamir_any_t_shares_reconstruct(secret, n, data):
    t = data.draw(st.integers(1, n))
    shares = shamir_share(secret, n, t)
    pick = data.draw(st.permutations(shares))[:t]
    assert shamir_reconstruct(pick) == secret


def test_shamir_fewer_than_t_shares_do_not_reconstruct():
    shares = shamir_share(123456789, 5, 3)
    assert shamir_reconstruct(shares[:2]) != 123456789


def test_masks_cancel_sum_exact():
    rng = np.random.default_rng(1)
    q = rng.integers(0, 2**32, size=(6, 257), dtype=np.uint32)
    total, tm = secure_sum(q)
    np.testing.assert_array_equal(total, q.sum(axis=0, dtype=np.uint32))
    assert tm.recovery == 0.0 and np.all(tm.client > 0)


def test_float_updates_round_trip_through_quantisation():
    rng = np.random.default_rng(2)
    x = rng.normal(0, 0.05, (5, 100))
    total, _ = secure_sum(quantize(x, 2.0**16))
    np.testing.assert_allclose(dequantize(total, 2.0**16), x.sum(axis=0), atol=5 * 0.5 / 2**16)


@pytest.mark.parametrize("dropped", [[0], [2, 5], [6]])
def test_dropout_recovery_sums_survivors(dropped):
    rng = np.random.default_rng(3)
    q = rng.integers(0, 2**32, size=(7, 64), dtype=np.uint32)
    total, tm = secure_sum(q, dropped=dropped)
    alive = [u for u in range(7) if u not in dropped]
    np.testing.assert_array_equal(total, q[alive].sum(axis=0, dtype=np.uint32))
    assert tm.recovery > 0


def test_too_many_dropouts_refused():
    q = np.zeros((5, 4), dtype=np.uint32)
    with pytest.raises(ValueError, match="threshold"):
        secure_sum(q, dropped=[0, 1, 2])


@pytest.mark.slow
def test_measured_cost_superlinear_in_group_size():
    """Per-client work is O(n² + n·m) (Shamir sharing and reconstruction are the n² part) but the
    n·X25519 term dominates small groups, so the sizes reach 160. The fit is T(n) = a·n² + b·n
    (no work without members), i.e. a line through T(n)/n, which a noisy middle point cannot
    bend the way it bends a free 3-parameter quadratic; min over interleaved repeats of CPU time
    keeps other load out."""
    sizes = np.array([16, 64, 112, 160])
    runs = [[time_secagg(int(n), 8)[0] for n in sizes] for _ in range(2)]
    a, b = np.polyfit(sizes, np.min(runs, axis=0) / sizes, 1)
    assert a > 0


def test_wall_clock_times_each_party_on_the_monotonic_clock(monkeypatch):
    # a clock that moves 1 s a reading: each timed block is 1 s. A client times 4 steps (advertise,
    # share, mask, unmask), the aggregator 1 (the sum and unmasking)
    import itertools

    from groupfel.cost_models import secagg

    ticks = itertools.count()
    monkeypatch.setitem(secagg.CLOCKS, "wall", lambda: float(next(ticks)))
    assert secagg.time_secagg_parts(3, 16, clock="wall") == (4.0, 1.0, 0.0)
    client, server, _ = secagg.time_secagg_parts(3, 16)      # the CPU clock: microseconds, not 1 s steps
    assert client < 1.0 and server < 1.0


def test_measure_clock_wall_is_secagg_only(tmp_path):
    from groupfel.experiments.cli import main

    out = tmp_path / "m.csv"
    assert main(["measure", "secagg", "--sizes", "2,3", "--params", "16", "--repeats", "1", "--clock", "wall",
                 "--out", str(out)]) == 0
    assert "# groupfel measure: secagg --clock wall" in out.read_text()
    assert main(["measure", "training", "--sizes", "8", "--repeats", "1", "--clock", "wall",
                 "--out", str(tmp_path / "t.csv")]) == 2
