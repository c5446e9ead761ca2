"""When each client is online (``topology.availability``): a CSV of intervals, a FedScale
behaviour trace or an on/off process."""
from __future__ import annotations

import math
import warnings

import numpy as np

from groupfel.errors import InputError, InputWarning

from ..config import AvailabilityConfig
from ..rng import rng as stream
from .clientcsv import client_id, number, read_csv, require_every_client
from .fedscale import read_behaviour


class Availability:
    """Each client's online intervals [start, end) in simulated seconds, read from a CSV, from a
    FedScale behaviour trace (repeating every finish_time s, as FedScale reads it) or drawn as an
    alternating on/off process (exponential durations), extended lazily as time goes on."""

    def __init__(self, cfg: AvailabilityConfig, n: int, seed: int, where: str = "topology.availability.file"):
        self.cfg, self.n, self.seed, self.where = cfg, n, seed, where
        self._iv: list[list[tuple[float, float]]] = [[] for _ in range(n)]
        self._gen: list[tuple[np.random.Generator, float, bool]] = []
        self._period: np.ndarray | None = None      # a FedScale trace repeats every finish_time s
        self.trace_ids: list[str] | None = None
        if cfg.fedscale_file is not None:
            trace = read_behaviour(cfg.fedscale_file, "topology.availability.fedscale_file")
            idx = trace.pair(n, cfg.fedscale_pairing)
            used = [int(i) for i in idx if int(i) in trace.bad]
            if used:
                raise InputError(trace.bad[used[0]])
            for i in sorted(trace.bad):    # an id no client takes: reported, never read
                warnings.warn(f"{trace.bad[i]} (client id {trace.ids[i]!r} is paired with none of the {n} "
                              f"clients, so it is ignored)", InputWarning, stacklevel=2)
            self._iv = [list(trace.intervals[i]) for i in idx]
            self._period = trace.period_s[idx]
            self.trace_ids = [trace.ids[i] for i in idx]
        elif cfg.file is not None:
            self._read(cfg.file)
        else:
            on, off = cfg.mean_on_s, cfg.mean_off_s
            for c in range(n):
                r = stream(seed, "availability", c)
                self._gen.append((r, 0.0, bool(r.random() < on / (on + off))))

    def _read(self, path: str) -> None:
        where = self.where
        _, rows = read_csv(path, where, ("client", "start_s", "end_s"))
        for line, row in rows:
            c = client_id(row, where, line, self.n)
            a, b = number(row, "start_s", where, line), number(row, "end_s", where, line)
            if b <= a:
                raise InputError(f"{where}: line {line}: client {c}'s interval [{a:g}, {b:g}) is reversed or empty; "
                                 f"end_s must be after start_s")
            self._iv[c].append((a, b))
        for c, iv in enumerate(self._iv):
            iv.sort()
            for (a0, b0), (a1, b1) in zip(iv, iv[1:]):
                if a1 < b0:
                    raise InputError(f"{where}: client {c}'s intervals [{a0:g}, {b0:g}) and [{a1:g}, {b1:g}) overlap; "
                                     f"merge them")
        require_every_client({c for c, iv in enumerate(self._iv) if iv}, self.n, where, path)

    def _extend(self, c: int, until: float) -> None:
        r, t, on = self._gen[c]
        iv = self._iv[c]
        while t <= until:
            d = r.exponential(self.cfg.mean_on_s if on else self.cfg.mean_off_s)
            if on:
                iv.append((t, t + d))
            t, on = t + d, not on
        self._gen[c] = (r, t, on)

    def online(self, c: int, time: float) -> bool:
        if self._gen:
            self._extend(c, time)
        if self._period is not None:
            time = time % self._period[c]
        return any(a <= time < b for a, b in self._iv[c])

    def online_until(self, c: int, time: float) -> float:
        """When client c's online stretch that holds ``time`` ends (``time`` itself if it is
        offline then; inf if it never ends: a trace online over its whole period)."""
        end = time
        for _ in range(len(self._iv[c]) + 2):   # adjacent intervals, and across a period's end
            if not self.online(c, end):
                return end
            if self._period is not None:
                p = float(self._period[c])
                base, local = end - end % p, end % p
                b = next(b for a, b in self._iv[c] if a <= local < b)
                end = base + b if b < p else base + p
            else:
                end = next(b for a, b in self._iv[c] if a <= end < b)
        return math.inf

    def next_online(self, c: int, time: float) -> float | None:
        """The first time ≥ ``time`` at which client c is online, None if never again."""
        if self.online(c, time):
            return time
        if self._gen:
            while not any(a > time for a, _ in self._iv[c]):
                self._extend(c, self._gen[c][1])
            return next(a for a, _ in self._iv[c] if a > time)
        iv = self._iv[c]
        if self._period is None:
            return next((a for a, _ in iv if a > time), None)
        if not iv:
            return None
        p = float(self._period[c])
        base, local = time - time % p, time % p
        return next((base + a for a, _ in iv if a > local), base + p + iv[0][0])

    def seconds_between(self, c: int, start: float, end: float) -> float:
        """Client c's online seconds in [start, end)."""
        total, x = 0.0, start
        while x < end:
            if self.online(c, x):
                y = min(self.online_until(c, x), end)
                total, x = total + (y - x), y
            else:
                nxt = self.next_online(c, x)
                if nxt is None or nxt >= end:
                    break
                x = nxt
        return total
