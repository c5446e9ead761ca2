"""Energy meters for ``groupfel measure``: Linux powercap (Intel/AMD RAPL) counters, or a user's
power-meter log of timestamps and watts.

RAPL: each zone has a cumulative ``energy_uj`` counter that wraps at ``max_energy_range_uj``. The
zones overlap, so they are summed without counting anything twice: where a top-level zone named
``psys`` (the platform: the SoC and more, which contains the packages) is present, it alone is
read; else every package zone ``intel-rapl:N`` plus each of its ``dram`` sub-zones (DRAM is
outside the package; the core, uncore and other sub-zones are inside it and are not added again).
A counter wraps often: a 2^32 µJ range (4295 J) lasts about 21 s at 200 W, and the usual
262,143,328,850 µJ range (262 kJ) about 22 min. So, as Zeus does, a reading polls the counters in
the background every :data:`RAPL_POLL_S` and sums each poll's advance, across at most one wrap per
poll (a counter would need over 2.6 MW to wrap twice in 0.1 s of its usual range): a reading of
any length counts every wrap. The counters cover the whole machine's package (or platform), so
other work on it is included; the measurement file's header says so.

A power-meter log: a CSV with columns ``timestamp`` (Unix seconds) and ``watts``; the energy of a
call is the trapezoidal integral of the log over the call's start and end, on this machine's clock:
a log whose last timestamp lies ahead of that clock (beyond :data:`CLOCK_SLACK_S`) is refused.

A reading must span several of the meter's updates: RAPL's counters update about every millisecond
and a log every sampling interval, so a call shorter than the meter's ``min_span_s`` is repeated
until the reading spans it (the reading is then per call). A log whose sampling interval is not
known when ``measure`` starts (fewer than two rows yet) is checked once read: a reading that spans
fewer than :data:`MIN_SAMPLES` of its intervals is refused in one line. A log that is written while
``measure`` runs is read once it covers the last call (waiting a few of its intervals at most).

Where neither is readable, :func:`open_meter` says why in one line; nothing records a zero.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from groupfel.errors import InputError

POWERCAP = Path("/sys/class/powercap")
RAPL_MIN_SPAN_S = 0.05   # RAPL updates about every 1 ms: 50 updates per reading
RAPL_POLL_S = 0.1        # how often a reading polls the counters for wraps (Zeus: 0.1 s)
MIN_SAMPLES = 10         # a log's samples per reading (the trapezoid's error is about one sample's share)
CLOCK_SLACK_S = 1.0      # how far a log's last timestamp may lie ahead of this machine's clock
MAX_INTERVAL_S = 6.0     # a log's longest sampling interval: a reading then spans a minute (MIN_SAMPLES of them)
MAX_WAIT_S = 30.0        # how long the calls' end waits for a live log to cover them


@dataclass(frozen=True)
class RaplZone:
    path: Path
    name: str
    max_range_uj: int

    def read_uj(self) -> int:
        return int((self.path / "energy_uj").read_text().strip())


def _name(p: Path) -> str:
    try:
        return (p / "name").read_text().strip() if (p / "name").exists() else p.name
    except OSError:
        return p.name


def rapl_zones(root: Path = POWERCAP) -> tuple[list[RaplZone], str | None]:
    """The readable RAPL zones under ``root`` that together count each joule once (psys alone, or
    the packages and their DRAM), or ([], why none is)."""
    root = Path(root)
    if not root.is_dir():
        return [], f"{root} does not exist (no powercap driver, or not Linux)"
    tops = sorted(p for p in root.glob("intel-rapl:*") if p.name.count(":") == 1)
    if not tops:
        return [], f"{root} has no intel-rapl:N zone (no RAPL on this CPU, or the intel_rapl driver is not loaded)"
    psys = [p for p in tops if _name(p) == "psys"]
    if psys:
        chosen = psys      # the platform contains the packages: adding them would count them twice
    else:
        chosen = [q for p in tops for q in (p, *sorted(d for d in p.glob(f"{p.name}:*") if _name(d) == "dram"))]
    zones, why = [], []
    for p in chosen:
        try:
            zone = RaplZone(p, _name(p), int((p / "max_energy_range_uj").read_text().strip()))
            zone.read_uj()
        except PermissionError:
            why.append(f"{p / 'energy_uj'} is not readable by this user (root only since Linux 5.10; "
                       f"e.g. sudo chmod o+r it)")
            continue
        except (OSError, ValueError) as exc:
            why.append(f"{p}: {exc}")
            continue
        zones.append(zone)
    return zones, (None if zones else "; ".join(why))


def advance(before: int, after: int, max_range: int) -> int:
    """A counter's advance in µJ between two polls, across one wrap at ``max_range``."""
    return after - before if after >= before else after + max_range - before


class RaplReading:
    """The counters' advance since it began, polled every ``poll_s`` on a thread of its own so that
    every wrap is counted (:meth:`poll` adds one poll's advances)."""

    def __init__(self, zones: list[RaplZone], poll_s: float | None = RAPL_POLL_S):
        self.zones = zones
        self.last = [z.read_uj() for z in zones]
        self.uj = 0
        self.polls = 0
        self.t0 = time.perf_counter()
        self._lock, self._done = threading.Lock(), threading.Event()
        self._thread = None
        if poll_s is not None:
            self._thread = threading.Thread(target=self._run, args=(poll_s,), name="rapl-poll", daemon=True)
            self._thread.start()

    def _run(self, poll_s: float) -> None:
        while not self._done.wait(poll_s):
            self.poll()

    def poll(self) -> None:
        with self._lock:
            now = [z.read_uj() for z in self.zones]
            self.uj += sum(advance(b, a, z.max_range_uj) for b, a, z in zip(self.last, now, self.zones))
            self.last, self.polls = now, self.polls + 1

    def end(self) -> tuple[int, float]:
        """Stop polling; (µJ since the start, seconds)."""
        self._done.set()
        if self._thread is not None:
            self._thread.join()
        self.poll()
        return self.uj, time.perf_counter() - self.t0


class RaplMeter:
    """Joules over a span: every package's counter polled from its start to its end."""

    kind = "rapl"
    min_span_s = RAPL_MIN_SPAN_S

    def __init__(self, zones: list[RaplZone], poll_s: float | None = RAPL_POLL_S):
        self.zones, self.poll_s = zones, poll_s

    def start(self) -> RaplReading:
        return RaplReading(self.zones, self.poll_s)

    def stop(self, mark: RaplReading, calls: int = 1) -> tuple[float, float]:
        """(joules, the seconds they cover), per call of the ``calls`` the reading spans."""
        uj, seconds = mark.end()
        return uj * 1e-6 / calls, seconds / calls

    def describe(self) -> str:
        what = "the whole platform" if any(z.name == "psys" for z in self.zones) else "the whole package"
        return (f"RAPL {', '.join(f'{z.path.name} ({z.name})' for z in self.zones)}: {what}, other "
                f"work on the machine included")


class PowerLog:
    """A power meter's log (``timestamp``, ``watts``), read after the calls ran: :meth:`stop`
    records the span, :meth:`joules` integrates the log over it."""

    kind = "power-log"

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.min_span_s = 0.0
        try:    # the log so far: its sampling interval sets how long a reading must be
            t, _ = self.read()
        except InputError:
            return   # not two rows yet: checked once the calls have run
        # before any call repeats for the log's sake: timestamps in another unit (milliseconds
        # read as seconds lie far ahead and sample every 1,000 "s") would repeat each for hours
        step = float(np.median(np.diff(t)))
        self._check_clock(t, step)
        if step > MAX_INTERVAL_S:
            raise InputError(f"--power-log {self.path}: samples every {step:g} s, so each measured call would repeat "
                             f"for {MIN_SAMPLES * step:g} s ({MIN_SAMPLES} samples a reading); log at least every "
                             f"{MAX_INTERVAL_S:g} s, with timestamps in Unix seconds")
        self.min_span_s = MIN_SAMPLES * step

    def _check_clock(self, t: np.ndarray, step: float) -> None:
        ahead = t[-1] - time.time()
        if ahead > max(CLOCK_SLACK_S, step):   # a log from the future: the meter's clock is ahead of ours
            raise InputError(f"--power-log {self.path}: its last timestamp is {ahead:.3g} s ahead of this machine's "
                             f"clock; give timestamps in Unix seconds (not milliseconds), on a clock that agrees "
                             f"with this one (sync both, e.g. with NTP, or shift the timestamps)")

    def start(self):
        return time.time()

    def stop(self, mark, calls: int = 1) -> tuple[tuple[float, float, int], float]:
        """((start, end) in Unix seconds and the calls, to integrate once the log is complete; the
        seconds per call)."""
        end = time.time()
        return (mark, end, calls), (end - mark) / calls

    def describe(self) -> str:
        return f"power-meter log {self.path}"

    def read(self) -> tuple[np.ndarray, np.ndarray]:
        from groupfel.usercsv import read_user_csv

        table = read_user_csv(self.path, f"--power-log {self.path}")
        table.require(("timestamp", "watts"), "timestamp (Unix seconds), watts")
        t, w = [], []
        for row in table.rows:
            ts, watts = table.number(row, "timestamp"), table.number(row, "watts")
            if not (np.isfinite(ts) and np.isfinite(watts) and 0 <= watts <= 1e6):
                raise InputError(f"{table.where(row)}: watts must be a number from 0 to 1e6, got {row.get('watts')!r}")
            t.append(ts)
            w.append(watts)
        t, w = np.array(t), np.array(w)
        if len(t) < 2 or np.any(np.diff(t) <= 0):
            raise InputError(f"--power-log {self.path}: needs at least two rows with increasing timestamps")
        return t, w

    def joules(self, spans: list[tuple[float, float, int]]) -> list[float]:
        """The energy per call of each (start, end, calls) span; a span outside the log, or one
        too short for its sampling interval, is refused."""
        t, w = self.read()
        step = float(np.median(np.diff(t)))
        # a live meter writes its sample for the calls' last instant a moment after it: wait for
        # it (a few of its intervals, at most MAX_WAIT_S) rather than find the log one sample short
        end = max((b for _, b, _ in spans), default=t[-1])
        deadline = time.monotonic() + min(MAX_WAIT_S, 3 * step + CLOCK_SLACK_S)
        while t[-1] < end and time.monotonic() < deadline:
            time.sleep(min(max(step / 4, 0.01), 0.5))
            t, w = self.read()
            step = float(np.median(np.diff(t)))
        self._check_clock(t, step)
        out = []
        for a, b, calls in spans:
            if a < t[0] or b > t[-1]:
                raise InputError(f"--power-log {self.path}: covers {t[0]:.3f}..{t[-1]:.3f} but a measured call ran "
                                 f"{a:.3f}..{b:.3f}; log the meter for the whole measure run")
            if b - a < MIN_SAMPLES * step:
                raise InputError(f"--power-log {self.path}: samples every {step:g} s, but a measured reading spans "
                                 f"{b - a:.3g} s, under {MIN_SAMPLES} samples; start the log before measure so its "
                                 f"interval is known and short calls are batched, or log faster")
            grid = np.concatenate([[a], t[(t > a) & (t < b)], [b]])
            out.append(float(np.trapezoid(np.interp(grid, t, w), grid)) / calls)
        return out


def open_meter(power_log: str | None = None, root: Path = POWERCAP) -> tuple[RaplMeter | PowerLog | None, str]:
    """The meter to use (``power_log`` if given, else RAPL where readable) and one line about it:
    what it measures, or why energy is not recorded."""
    if power_log is not None:
        if not Path(power_log).is_file():
            raise InputError(f"--power-log: {power_log} is not a file; give the power meter's CSV (timestamp, watts)")
        meter = PowerLog(power_log)
        return meter, f"energy: {meter.describe()}"
    zones, why = rapl_zones(root)
    if not zones:
        return None, (f"energy: not recorded: no energy counter is readable here ({why}); give --power-log for a "
                      f"meter's CSV")
    meter = RaplMeter(zones)
    return meter, f"energy: {meter.describe()}"
