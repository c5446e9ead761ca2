"""Power per client state: watts beside the seconds, so energy = power(state) × time in state.

A client of a sampled group is in one state at a time (:data:`STATES`): receiving the group model,
training, running the group operations, transmitting its update, listening (its radio on during a
shared transfer, waiting for its share of the medium), or idle while online (waiting in its group
round for the slowest member and the edge's aggregation). Each device's power in each
state is a constant or a curve of the state's own x, in watts:

* training: the client's sample count n_i (like H_i);
* group_operation: the group size |g| (like O_g);
* transmit, receive: the client's link rate in Mbit/s (a radio draws more at higher rates);
* idle, listen: constants only (listen defaults to the device's idle power).

A number that is not a measurement is marked ``assumed = true`` (its ``source`` says how it was
derived); a run names every assumed state it used.

Two hand-writable formats, the time curves' (:mod:`groupfel.cost_models.profiles`), in the same file:

* TOML: one ``[[power]]`` table per state::

      [[power]]
      device = "raspberry-pi-4"
      state = "training"
      units = "W"                       # "W" (default) or "mW"
      value = 5.0                       # a constant, or
      # coefficients = [0.001, 4.2]     # a polynomial in x, highest power first, or
      # points = [[20, 4.6], [200, 5.0]] # a measured table (interpolated)
      source = "https://..."            # where the number comes from (kept in the manifest)
      # assumed = true                  # not a measurement: reports name it

* CSV: rows with operation ``power``, method the state and a, b, c the polynomial a·x² + b·x + c
  in watts (task is ignored; power belongs to the device).
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, model_validator

from groupfel.errors import InputError
from groupfel.userfile import parse_toml, read_text

from .carbon import CarbonIntensity
from .curves import Curve, PiecewiseLinear, Polynomial, table_error
from .profiles import Number

STATES = ("training", "group_operation", "transmit", "receive", "listen", "idle")
# an edge server's or the cloud's states (cost.edge_power, cost.cloud_power): aggregating a group's
# models, its share of secure aggregation (and dropout recovery), idle while it serves the round
SERVER_STATES = ("aggregation", "secagg_server", "idle")
StateName = Literal["training", "group_operation", "transmit", "receive", "listen", "idle", "aggregation",
                    "secagg_server"]
CONSTANT_STATES = ("idle", "listen")
# what each state's curve is a function of (error messages and docs)
X_OF = {"training": "samples", "group_operation": "group size", "transmit": "Mbit/s", "receive": "Mbit/s",
        "listen": None, "idle": None, "aggregation": "group size", "secagg_server": "group size"}
POWER_UNITS = {"W": 1.0, "mW": 1e-3}
MAX_WATTS = 1e6     # a megawatt client is a typo (the limits harness)
SHIPPED_POWER = "raspberry-pi-4-power.toml"
SHIPPED_SERVER_POWER = "edge-server-power.toml"    # a Raspberry Pi 4 as an edge server


@dataclass(frozen=True)
class PowerCurve:
    curve: Curve
    source: str | None = None
    where: str = ""
    assumed: bool = False       # not a measurement (the profile says so): reports name it


@dataclass
class DevicePower:
    """One device's power per state (a state may be missing: the run that needs it says so)."""

    device: str
    states: dict[str, PowerCurve] = field(default_factory=dict)


class _PowerSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    device: str
    state: StateName
    units: str = "W"
    value: Number | None = None
    coefficients: list[Number] | None = Field(None, min_length=1)
    points: list[tuple[Number, Number]] | None = None
    source: str | None = None
    assumed: StrictBool = False

    @model_validator(mode="after")
    def _one(self):
        if self.units not in POWER_UNITS:
            raise ValueError(f"units: power is in W or mW, got {self.units!r}")
        if sum(v is not None for v in (self.value, self.coefficients, self.points)) != 1:
            raise ValueError("give exactly one of value, coefficients or points")
        if self.state in CONSTANT_STATES and self.value is None:
            raise ValueError(f"{self.state} power is a constant: give value")
        if self.points is not None and len(self.points) < 2:
            raise ValueError("points needs at least two [x, watts] pairs")
        return self

    def curve(self) -> Curve:
        s = POWER_UNITS[self.units]
        if self.value is not None:
            return Polynomial((s * self.value,))
        if self.coefficients is not None:
            return Polynomial(tuple(s * c for c in self.coefficients))
        x, y = np.array(self.points, dtype=float).T
        return PiecewiseLinear(x, s * y)


def check_watts(curve: Curve, xs, where: str) -> None:
    """Refuse a power that is negative, not finite or over :data:`MAX_WATTS` at any x of ``xs``."""
    raw = getattr(curve, "raw", curve)
    with np.errstate(over="ignore", invalid="ignore"):
        w = np.atleast_1d(np.asarray(raw(np.asarray(xs, dtype=float)), dtype=float))
    bad = np.flatnonzero(~((w >= 0) & (w <= MAX_WATTS)))
    if len(bad):
        at = np.atleast_1d(np.asarray(xs, dtype=float))
        x = f" at {at[min(bad[0], len(at) - 1)]:g}" if len(at) > 1 or at[0] != 0 else ""
        got = repr(float(w[bad[0]])).removesuffix(".0")   # as written: 1000000.5, not 1e+06
        raise InputError(f"{where}: power {got} W{x}; give watts from 0 to {MAX_WATTS:,.0f}")


def _add(out: dict[str, DevicePower], device: str, state: str, pc: PowerCurve) -> None:
    dev = out.setdefault(device, DevicePower(device))
    if state in dev.states:
        raise InputError(f"{pc.where}: device {device!r} already has {state} power ({dev.states[state].where}); "
                         f"give each state once")
    dev.states[state] = pc


def parse_power_toml(data: dict, source: str) -> dict[str, DevicePower]:
    out: dict[str, DevicePower] = {}
    specs = data.get("power", [])
    if not isinstance(specs, list):
        raise InputError(f"{source}: power must be [[power]] tables")
    for i, raw in enumerate(specs):
        where = f"{source} power[{i}]"
        try:
            spec = _PowerSpec.model_validate(raw)
            curve = spec.curve()
        except ValidationError as exc:
            raise table_error(exc, where) from None
        except ValueError as exc:
            raise InputError(f"{where}: {exc}") from None
        pts = np.asarray(curve.x) if isinstance(curve, PiecewiseLinear) else np.zeros(1)
        given = "value" if spec.value is not None else "points" if spec.points else "coefficients"
        check_watts(curve, pts, f"{where}.{given}")
        _add(out, spec.device, spec.state, PowerCurve(curve, spec.source, where, spec.assumed))
    return out


def parse_power_table(table) -> dict[str, DevicePower]:
    """The ``operation = power`` rows of a coefficient CSV (:func:`groupfel.usercsv.read_user_csv`)."""
    out: dict[str, DevicePower] = {}
    for row in table.rows:
        if row.get("operation") != "power":
            continue
        where = table.where(row)
        state = row.get("method")
        if state not in STATES + SERVER_STATES[:2]:
            raise InputError(f"{where}: method {state!r} is not a power state; choose one of "
                             f"{list(STATES + SERVER_STATES[:2])}")
        if "units" in table.header and (row.get("units") or "W") not in POWER_UNITS:
            raise InputError(f"{where}: column 'units': power is in W or mW, got {row.get('units')!r}")
        s = POWER_UNITS[(row.get("units") or "W") if "units" in table.header else "W"]
        c = table.number(row, "c") if (row.get("c") or "").strip() else 0.0
        curve = Polynomial((s * table.number(row, "a"), s * table.number(row, "b"), s * c))
        check_watts(curve, np.zeros(1), f"{where}: column 'c'")
        _add(out, row.get("device"), state, PowerCurve(curve, None, where))
    return out


def read_power(path: str | Path) -> dict[str, DevicePower]:
    """The power tables of a profile file (TOML ``[[power]]`` or CSV ``operation = power`` rows)."""
    path = Path(path)
    if path.suffix.lower() == ".toml":
        text = read_text(path, f"cost profile file {path}", "a TOML or CSV profile file")
        try:
            return parse_power_toml(parse_toml(text, str(path)), str(path))
        except tomllib.TOMLDecodeError as exc:
            raise InputError(f"{path}: not valid TOML ({exc})") from None
    from groupfel.usercsv import read_user_csv

    return parse_power_table(read_user_csv(path, str(path)))


@cache
def shipped_power() -> dict[str, DevicePower]:
    out = {}
    for name in (SHIPPED_POWER, SHIPPED_SERVER_POWER):
        text = resources.files(__package__).joinpath("profiles", name).read_text()
        out.update(parse_power_toml(tomllib.loads(text), f"shipped {name}"))
    return out


@dataclass(frozen=True)
class PowerModel:
    """Each device's watts per state; :meth:`joules` is power × seconds, per client. Under the
    ``marginal`` accounting (``cost.energy_accounting``) a state's joules are those above idle:
    (power − idle power) × seconds, so idle costs nothing."""

    devices: dict[str, DevicePower]
    accounting: str = "group-rounds"
    # the edge servers' and the cloud's devices (cost.edge_power, cost.cloud_power; None: free) and
    # their facilities' power usage effectiveness (joules at the wall × PUE)
    edge: str | None = None
    cloud: str | None = None
    edge_pue: float = 1.0
    cloud_pue: float = 1.0
    n_edges: int = 0                             # the topology's edges (one results column each)
    carbon: CarbonIntensity | None = None      # grams CO2e beside the joules (cost.carbon_intensity*)

    def watts(self, devices, state: str, x=None) -> np.ndarray:
        x = np.zeros(len(devices)) if x is None else np.broadcast_to(np.asarray(x, dtype=float), (len(devices),))
        out = np.empty(len(devices))
        devices = np.asarray(devices, dtype=object)
        for d in set(devices.tolist()):
            idx = devices == d
            out[idx] = self.devices[d].states[state].curve(x[idx])
        return out

    def joules(self, devices, state: str, seconds, x=None) -> np.ndarray:
        w = self.watts(devices, state, x)
        if self.accounting == "marginal":
            w = w - self.watts(devices, "idle")
        return w * np.asarray(seconds, dtype=float)

    def site_joules(self, site: str, state: str, seconds: float, x: float = 0.0) -> float:
        """An edge server's (``site`` "edge") or the cloud's joules in ``state`` for ``seconds``,
        its facility's PUE included; under ``marginal`` the power above its idle."""
        device, pue = (self.edge, self.edge_pue) if site == "edge" else (self.cloud, self.cloud_pue)
        if device is None:
            return 0.0
        states = self.devices[device].states
        w = float(states[state].curve(np.array([float(x)]))[0])
        if self.accounting == "marginal":
            w -= float(states["idle"].curve(np.zeros(1))[0])
        return w * float(seconds) * pue

    def sources(self) -> dict:
        """The manifest's record: device → state → source (None: the user's own number)."""
        return {d: {s: pc.source for s, pc in p.states.items()} for d, p in self.devices.items()}

    def assumed(self) -> dict[str, list[str]]:
        """device → the states whose power is an assumption, not a measurement (none: left out)."""
        out = {d: [s for s in (*STATES, *SERVER_STATES[:2]) if s in p.states and p.states[s].assumed]
               for d, p in self.devices.items()}
        return {d: s for d, s in out.items() if s}


def assumed_line(assumed: dict[str, list[str]]) -> str | None:
    """One printable line naming the assumed powers of a run (None where every power is measured)."""
    if not assumed:
        return None
    return "power assumed, not measured: " + "; ".join(f"{d} {', '.join(s)}" for d, s in sorted(assumed.items())) \
        + " (docs/energy.md)"


def build_power(devices: list[str], extra: dict[str, DevicePower] | None, uses: dict[str, dict[str, np.ndarray]],
                where: str = "cost.energy") -> PowerModel:
    """The run's power model: each device's shipped power with the user's file's states over it;
    every state must be given, and every curve must be 0..MAX_WATTS where the run uses it
    (``uses``: device → state → the x values)."""
    shipped, extra = shipped_power(), extra or {}
    out = {}
    for d in devices:
        states = {**(shipped[d].states if d in shipped else {}), **(extra[d].states if d in extra else {})}
        if "idle" in states and (d in extra and "idle" in extra[d].states and "listen" not in extra[d].states
                                 or "listen" not in states):
            # listening defaults to the device's idle power (the user's, where the user gave idle)
            idle = states["idle"]
            states["listen"] = PowerCurve(idle.curve, f"idle power ({idle.source or idle.where})", idle.where,
                                          idle.assumed)
        missing = [s for s in STATES if s not in states]
        if missing:
            have = f"the shipped profile gives {sorted(shipped[d].states)}" if d in shipped else "no shipped power"
            raise InputError(f"{where}: device {d!r} has no power for {', '.join(missing)} ({have}); add a [[power]] "
                             f"table for each to cost.profiles_file")
        for s, pc in states.items():
            xs = uses.get(d, {}).get(s)
            if xs is not None and len(xs):
                check_watts(pc.curve, np.unique(xs), f"{pc.where or where} ({d} {s} power, {X_OF[s] or 'x'})")
        out[d] = DevicePower(d, states)
    return PowerModel(out)




def build_server_power(device: str, extra: dict[str, DevicePower] | None, sizes: np.ndarray, where: str) -> DevicePower:
    """An edge server's or the cloud's power (:data:`SERVER_STATES`): the shipped power of
    ``device`` with the user's file's states over it, every state given, checked at ``sizes``."""
    shipped, extra = shipped_power(), extra or {}
    states = {**(shipped[device].states if device in shipped else {}),
              **(extra[device].states if device in extra else {})}
    missing = [s for s in SERVER_STATES if s not in states]
    if missing:
        raise InputError(f"{where}: device {device!r} has no power for {', '.join(missing)} (the shipped server "
                         f"is raspberry-pi-4-edge); add a [[power]] table for each to cost.profiles_file")
    for s in SERVER_STATES:
        check_watts(states[s].curve, sizes if s != "idle" else np.zeros(1),
                    f"{states[s].where or where} ({device} {s} power)")
    return DevicePower(device, {s: states[s] for s in SERVER_STATES})
