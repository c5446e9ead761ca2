"""Carbon: grams CO2e from joules and the grid's carbon intensity (g/kWh) where and when they
were spent: grams = joules / 3.6e6 × intensity.

The intensity is a constant (``cost.carbon_intensity``) or a file (``cost.carbon_intensity_file``)
in one of two formats:

* an **Electricity Maps export** (its data portal's CSV): a ``Datetime (UTC)`` column and a
  carbon-intensity column in gCO₂eq/kWh, hourly. The life-cycle column (``... (LCA)``, or
  ``(Life cycle)``) is read where present, else the direct one; the manifest names it. Simulated
  second 0 is the file's first hour (or ``cost.carbon_start``); the file repeats after its last
  hour, as a FedScale trace does, so a run longer than the file reads it again.
* a **SimGrid carbon-footprint trace** (the plugin's ``--carbon-footprint-dynamic`` file): one
  change a line, ``host timestamp carbon_intensity`` separated by tabs or spaces (an optional
  header line), timestamps in simulated seconds. ``host`` is ``client``, ``edge``, ``cloud`` or
  ``*`` (every site): each site's intensity is its latest change at or before the time (before its
  first change: ``cost.carbon_intensity``, or the first change).

Every charge is priced at one time: a client's group-round energy at its group round's start, a
round's idle outside group rounds and an edge's idle at the round's start, an edge's core hold at
its start, the cloud's aggregation at the round's start (an hourly file changes at most once in a
group round shorter than an hour).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from groupfel.errors import InputError
from groupfel.userfile import read_text, short

J_PER_KWH = 3.6e6
SITES = ("client", "edge", "cloud")
MAX_G_PER_KWH = 1e4       # the dirtiest grids are about 1000 g/kWh: ten times that is a typo


@dataclass(frozen=True)
class CarbonIntensity:
    """g/kWh at a simulated time, per site (:data:`SITES`)."""

    source: str                                   # the manifest's words: the constant, or the file and column
    constant: float | None = None
    steps: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)   # site -> (times, g/kWh)
    period_s: float | None = None                 # the file repeats every this many seconds

    def g_per_kwh(self, site: str, time: float) -> float:
        steps = self.steps.get(site)
        if steps is None:
            return float(self.constant)
        times, values = steps
        if self.period_s is not None:
            time = time % self.period_s
        i = int(np.searchsorted(times, time, side="right")) - 1
        if i < 0:    # before the first change: a repeating file's last entry wraps round to it
            if self.period_s is not None:
                return float(values[-1])
            return float(self.constant) if self.constant is not None else float(values[0])
        return float(values[i])

    def grams(self, site: str, joules, time: float):
        return np.asarray(joules, dtype=float) / J_PER_KWH * self.g_per_kwh(site, time)

    def manifest(self) -> dict:
        return {"source": self.source, **({"g_per_kwh": self.constant} if self.constant is not None else {}),
                **({"repeats_every_s": self.period_s} if self.period_s is not None else {})}


def _g(value: str, where: str) -> float:
    try:
        v = float(value)
    except ValueError:
        v = math.nan
    if not 0.0 <= v <= MAX_G_PER_KWH:
        raise InputError(f"{where}: carbon intensity {short(value)}; give g/kWh from 0 to {MAX_G_PER_KWH:g}")
    return v


def _utc(text: str, where: str) -> datetime:
    try:
        t = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise InputError(f"{where}: {short(text)} is not a date and time; give ISO 8601, e.g. 2024-01-01 00:00:00"
                         ) from None
    return t if t.tzinfo is not None else t.replace(tzinfo=timezone.utc)


def _electricity_maps(path: Path, constant: float | None, start: str | None) -> CarbonIntensity:
    from groupfel.usercsv import read_user_csv

    table = read_user_csv(path, f"cost.carbon_intensity_file: {path}")
    table.require(("Datetime (UTC)",), "Datetime (UTC) and a carbon intensity column (an Electricity Maps export)")
    cols = [c for c in table.header if "carbon intensity" in c.lower()]
    life = [c for c in cols if re.search(r"lca|life ?cycle", c, re.I)]
    column = (life or [c for c in cols if "direct" in c.lower()] or cols or [None])[0]
    if column is None:
        raise InputError(f"cost.carbon_intensity_file: {path} has no carbon intensity column (an Electricity Maps "
                         f"export has 'Carbon Intensity gCO₂eq/kWh (LCA)'); give one")
    when = [_utc(r.get("Datetime (UTC)"), table.where(r)) for r in table.rows]
    if len(when) < 2 or any(b <= a for a, b in zip(when, when[1:])):
        raise InputError(f"cost.carbon_intensity_file: {path} needs two or more rows in increasing Datetime (UTC)")
    zero = _utc(start, "cost.carbon_start") if start is not None else when[0]
    if not when[0] <= zero <= when[-1]:
        raise InputError(f"cost.carbon_start: {start} is outside {path} ({when[0]:%Y-%m-%d %H:%M} to "
                         f"{when[-1]:%Y-%m-%d %H:%M} UTC); give a time the file covers")
    step = (when[-1] - when[0]).total_seconds() / (len(when) - 1)
    times = np.array([(t - when[0]).total_seconds() for t in when])
    values = np.array([_g(r.get(column), f"{table.where(r)}: column '{column}'") for r in table.rows])
    shift = (zero - when[0]).total_seconds()
    period = times[-1] + step          # the last hour lasts its step, then the file repeats
    times = (times - shift) % period
    order = np.argsort(times, kind="stable")
    steps = (times[order], values[order])
    return CarbonIntensity(f"{path} (Electricity Maps export, column '{column}', second 0 = "
                           f"{zero:%Y-%m-%d %H:%M} UTC)", constant, {s: steps for s in SITES}, float(period))


def _simgrid(path: Path, text: str, constant: float | None) -> CarbonIntensity:
    changes: dict[str, list[tuple[float, float]]] = {}
    for n, line in enumerate(text.splitlines(), 1):
        parts = line.split()
        if not parts or line.lstrip().startswith("#"):
            continue
        where = f"cost.carbon_intensity_file: {path} line {n}"
        if len(parts) != 3:
            raise InputError(f"{where}: give 'host timestamp carbon_intensity' (SimGrid's carbon trace), got "
                             f"{short(line)}")
        host, stamp, value = parts
        if n == 1 and not re.match(r"^[0-9.eE+-]+$", stamp):
            continue      # a header line
        if host not in (*SITES, "*"):
            raise InputError(f"{where}: host {short(host)}; give client, edge, cloud or * (every site)")
        try:
            at = float(stamp)
        except ValueError:
            at = math.nan
        if not 0.0 <= at <= 1e12:
            raise InputError(f"{where}: timestamp {short(stamp)}; give simulated seconds from 0")
        for site in SITES if host == "*" else (host,):
            changes.setdefault(site, []).append((at, _g(value, where)))
    if not changes:
        raise InputError(f"cost.carbon_intensity_file: {path} has no change line ('host timestamp carbon_intensity')")
    steps = {}
    for site, rows in changes.items():
        rows.sort(key=lambda r: r[0])
        steps[site] = (np.array([r[0] for r in rows]), np.array([r[1] for r in rows]))
    if constant is None and set(steps) != set(SITES):
        missing = sorted(set(SITES) - set(steps))
        raise InputError(f"cost.carbon_intensity_file: {path} has no line for {', '.join(missing)}; add one (or "
                         f"host *), or set cost.carbon_intensity for the sites it leaves out")
    return CarbonIntensity(f"{path} (SimGrid carbon trace)", constant, steps)


def read_intensity(constant: float | None = None, path: str | Path | None = None,
                   start: str | None = None) -> CarbonIntensity:
    """The run's carbon intensity: a constant, a file, or a file over a constant (the constant
    fills what the file leaves out)."""
    if path is None:
        return CarbonIntensity(f"constant {constant:g} g/kWh", constant)
    path = Path(path)
    text = read_text(path, f"cost.carbon_intensity_file: {path}", "an Electricity Maps CSV or a SimGrid carbon trace")
    first = next((line for line in text.lstrip("\ufeff").splitlines() if line.strip()), "")
    if "Datetime (UTC)" in first:
        return _electricity_maps(path, constant, start)
    if start is not None:
        raise InputError("cost.carbon_start: sets second 0 of an Electricity Maps export; a SimGrid trace's "
                         "timestamps are simulated seconds already: remove it")
    return _simgrid(path, text, constant)
