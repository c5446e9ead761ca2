"""A shared link: concurrent transfers share its capacity by processor sharing.

Stable API (``benchmarks/network.py`` builds on it; keep it):

- ``SharedLink(env, capacity_bps=None, name="")``: a link on a SimPy clock. ``capacity_bps`` is
  the capacity its concurrent flows share, in bits per second; ``None`` means every flow has a
  dedicated link of its own (no sharing: the rate is the flow's own cap).
- ``SharedLink.transfer(nbytes, cap_bps, latency_s=0.0, burst_bytes=0.0)``: a generator for
  ``yield env.process(link.transfer(...))``. The flow moves ``nbytes`` bytes; while it is active
  it gets its max-min fair share of the capacity, never more than its own link's ``cap_bps``
  (``None``: only the capacity limits it). Rates are recomputed whenever a flow starts or ends.
  The flow's ``latency_s`` is added after its last byte (one-way delay of a bulk transfer: a
  fixed term that holds no capacity). ``burst_bytes``: its own link's token bucket (a shaper's,
  full when the flow starts): that many of its first bytes leave at once, outside the sharing,
  as a token-bucket shaper (tc's HTB) lets a class within its assured rate send its bucket.
  Returns the finish time.
- ``SharedLink.send(nbytes, cap_bps, burst_bytes=0.0)``: the same flow without latency and without
  a process of its own: an event that fires when its last byte is through (cheaper inside another
  process).
- ``SharedLink.cancel(done)``: end the flow whose event ``send`` returned before its last byte (its
  sender went away); the other flows share the capacity from then on. Returns the bits it had left.
- ``SharedLink.carried_bits``, ``SharedLink.busy_s``: bits moved and time with at least one flow
  active, for utilisation (``carried_bits / (capacity_bps · window)``).
- ``finish_times(flows, capacity_bps)``: the finish time of each ``(start_s, nbytes, cap_bps,
  latency_s)`` flow on one link, on a private clock (for what-if sweeps and for the network
  benchmark's expected makespans).

Max-min fairness with caps (water-filling): serve flows in increasing order of their caps; each
gets min(its cap, what is left / flows left). With equal caps above the fair share, n flows of
b bits on capacity C all finish at n·b/C.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import simpy

# a flow whose remaining time is below this many seconds is done (float rounding of rate × time)
_EPS_S = 1e-9


@dataclass(eq=False)
class _Flow:
    bits: float                   # still to send
    cap: float                    # its own link's rate, bits/s (inf: none)
    done: simpy.Event
    rate: float = 0.0
    order: int = field(default=0)


class SharedLink:
    """Processor-sharing link on a SimPy clock (see the module docstring)."""

    def __init__(self, env: simpy.Environment, capacity_bps: float | None = None, name: str = ""):
        if capacity_bps is not None and not (capacity_bps > 0 and math.isfinite(capacity_bps)):
            raise ValueError(f"link capacity must be a positive finite number of bits/s, not {capacity_bps!r}")
        self.env = env
        self.capacity_bps = capacity_bps
        self.name = name
        self.carried_bits = 0.0
        self.busy_s = 0.0
        self._flows: list[_Flow] = []
        self._last = env.now
        self._gen = 0               # invalidates timers scheduled before the last change
        self._count = 0

    @property
    def shared(self) -> bool:
        return self.capacity_bps is not None

    @property
    def active(self) -> int:
        """Flows now on the link."""
        return len(self._flows)

    def transfer(self, nbytes: int, cap_bps: float | None, latency_s: float = 0.0, burst_bytes: float = 0.0):
        """Move ``nbytes`` bytes (a SimPy process body); returns the finish time."""
        env = self.env
        cap = math.inf if cap_bps is None else float(cap_bps)
        if not cap > 0:
            raise ValueError(f"a flow's cap must be positive, not {cap_bps!r}")
        if self.capacity_bps is None and cap == math.inf:
            raise ValueError("a dedicated link (capacity None) needs each flow's cap_bps")
        if nbytes > 0:
            yield self.send(nbytes, cap, burst_bytes)
        if latency_s:
            yield env.timeout(latency_s)
        return env.now

    def send(self, nbytes: int, cap_bps: float | None, burst_bytes: float = 0.0) -> simpy.Event:
        """Start a flow of ``nbytes`` bytes, the first ``burst_bytes`` of them at once; the event
        fires when its last byte is through."""
        env = self.env
        cap = math.inf if cap_bps is None else float(cap_bps)
        if not cap > 0:
            raise ValueError(f"a flow's cap must be positive, not {cap_bps!r}")
        bits = 8.0 * nbytes
        if burst_bytes:
            free = min(bits, 8.0 * burst_bytes)
            self.carried_bits += free
            bits -= free
        if self.capacity_bps is None:
            if cap == math.inf:
                raise ValueError("a dedicated link (capacity None) needs each flow's cap_bps")
            self.carried_bits += bits
            return env.timeout(bits / cap)
        if bits <= 0:
            return env.timeout(0.0)
        self._advance()
        flow = _Flow(bits, cap, env.event(), order=self._count)
        self._count += 1
        self._flows.append(flow)
        self._reschedule()
        return flow.done

    def cancel(self, done: simpy.Event) -> float:
        """End the unfinished flow of ``done`` (from :meth:`send`) now; the bits it had left."""
        flow = next((f for f in self._flows if f.done is done), None)
        if flow is None:
            return 0.0
        self._advance()
        self._flows.remove(flow)
        self._reschedule()
        return max(flow.bits, 0.0)

    # -- processor sharing -------------------------------------------------------------------

    def _advance(self) -> None:
        """Charge the time since the last change at the rates then in force."""
        dt = self.env.now - self._last
        if dt > 0 and self._flows:
            for f in self._flows:
                sent = f.rate * dt
                f.bits -= sent
                self.carried_bits += sent
            self.busy_s += dt
        self._last = self.env.now

    def _rates(self) -> None:
        left, n = float(self.capacity_bps), len(self._flows)
        for f in sorted(self._flows, key=lambda f: (f.cap, f.order)):
            share = left / n
            f.rate = min(f.cap, share)
            left -= f.rate
            n -= 1

    def _reschedule(self) -> None:
        self._gen += 1
        if not self._flows:
            return
        self._rates()
        nxt = min(self._flows, key=lambda f: (f.bits / f.rate, f.order))
        timer = self.env.timeout(max(0.0, nxt.bits / nxt.rate))
        timer.callbacks.append(lambda _ev, gen=self._gen, flow=nxt: self._fire(gen, flow))

    def _fire(self, gen: int, flow: _Flow) -> None:
        if gen != self._gen:
            return                  # a flow started or ended since: a newer timer stands
        self._advance()
        flow.bits = 0.0             # the flow the timer was set for ends now, whatever rounding says
        finished = [f for f in self._flows if f.bits <= f.rate * _EPS_S]
        for f in finished:
            self.carried_bits += max(0.0, f.bits)
            self._flows.remove(f)
            f.done.succeed()
        self._reschedule()


def finish_times(flows: Iterable[tuple[float, int, float | None, float]],
                 capacity_bps: float | None) -> list[float]:
    """Finish time of each ``(start_s, nbytes, cap_bps, latency_s)`` flow on one link."""
    env = simpy.Environment()
    link = SharedLink(env, capacity_bps)
    flows = list(flows)
    out = [math.nan] * len(flows)

    def one(i, start, nbytes, cap, lat):
        if start > 0:
            yield env.timeout(start)
        out[i] = yield env.process(link.transfer(nbytes, cap, lat))

    for i, f in enumerate(flows):
        env.process(one(i, *f))
    env.run()
    return out
