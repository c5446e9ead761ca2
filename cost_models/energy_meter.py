"""Energy meters for ``groupfel measure``: Linux powercap (Intel/AMD RAPL) counters, or a user's
power-meter log of timestamps and watts.

RAPL: every top-level zone ``/sys/class/powercap/intel-rapl:N`` (one per CPU package; its
sub-zones ``intel-rapl:N:M`` are parts of it and are not added again) has a cumulative
``energy_uj`` counter that wraps at ``max_energy_range_uj``. A reading is the sum over packages of
the counter's advance, with one wrap allowed per reading (a package at 200 W wraps a 2^32 µJ
counter in about 6 h, far longer than one measured call). The counter covers the whole package,
so other work on the machine is in it; the measurement file's header says so.

A power-meter log: a CSV with columns ``timestamp`` (Unix seconds) and ``watts``; the energy of a
call is the trapezoidal integral of the log over the call's start and end.

Where neither is readable, :func:`open_meter` says why in one line; nothing records a zero.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from groupfel.errors import InputError

POWERCAP = Path("/sys/class/powercap")


@dataclass(frozen=True)
class RaplZone:
    path: Path
    name: str
    max_range_uj: int

    def read_uj(self) -> int:
        return int((self.path / "energy_uj").read_text().strip())


def rapl_zones(root: Path = POWERCAP) -> tuple[list[RaplZone], str | None]:
    """The readable top-level RAPL zones under ``root``, or ([], why none is)."""
    root = Path(root)
    if not root.is_dir():
        return [], f"{root} does not exist (no powercap driver, or not Linux)"
    tops = sorted(p for p in root.glob("intel-rapl:*") if p.name.count(":") == 1)
    if not tops:
        return [], f"{root} has no intel-rapl:N zone (no RAPL on this CPU, or the intel_rapl driver is not loaded)"
    zones, why = [], []
    for p in tops:
        try:
            name = (p / "name").read_text().strip() if (p / "name").exists() else p.name
            zone = RaplZone(p, name, int((p / "max_energy_range_uj").read_text().strip()))
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
    """A counter's advance in µJ between two readings, across one wrap at ``max_range``."""
    return after - before if after >= before else after + max_range - before


class RaplMeter:
    """Joules over a span: read every package's counter at its start and end."""

    kind = "rapl"

    def __init__(self, zones: list[RaplZone]):
        self.zones = zones

    def start(self):
        return [z.read_uj() for z in self.zones], time.perf_counter()

    def stop(self, mark) -> tuple[float, float]:
        """(joules, the seconds they cover)."""
        before, t0 = mark
        joules = sum(advance(b, z.read_uj(), z.max_range_uj) for b, z in zip(before, self.zones)) * 1e-6
        return joules, time.perf_counter() - t0

    def describe(self) -> str:
        return (f"RAPL {', '.join(f'{z.path.name} ({z.name})' for z in self.zones)}: the whole package, other "
                f"work on the machine included")


class PowerLog:
    """A power meter's log (``timestamp``, ``watts``), read after the calls ran: :meth:`stop`
    records the span, :meth:`joules` integrates the log over it."""

    kind = "power-log"

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def start(self):
        return time.time()

    def stop(self, mark) -> tuple[tuple[float, float], float]:
        """((start, end) in Unix seconds, to integrate once the log is complete; the seconds)."""
        end = time.time()
        return (mark, end), end - mark

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

    def joules(self, spans: list[tuple[float, float]]) -> list[float]:
        """The energy of each (start, end) span; a span outside the log is refused."""
        t, w = self.read()
        out = []
        for a, b in spans:
            if a < t[0] or b > t[-1]:
                raise InputError(f"--power-log {self.path}: covers {t[0]:.3f}..{t[-1]:.3f} but a measured call ran "
                                 f"{a:.3f}..{b:.3f}; log the meter for the whole measure run")
            grid = np.concatenate([[a], t[(t > a) & (t < b)], [b]])
            out.append(float(np.trapezoid(np.interp(grid, t, w), grid)))
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
