"""Named device profiles: the measured cost curves of one device running one task.

A profile is addressed as ``device/task`` (e.g. ``raspberry-pi-4/cifar10-resnet``); one of its
curves as ``device/task/method`` (e.g. ``raspberry-pi-4/cifar10-resnet/secagg``). The shipped
profiles are the authors' Raspberry Pi 4 and GPU-server fits (``profiles/reference.csv``).

Two hand-writable formats, chosen by the file's suffix:

* CSV (any suffix but ``.toml``): columns device, task, operation, method, a, b, c — polynomial
  coefficients, highest power first (``c`` empty for training). Lines starting with ``#`` are
  comments. This is what ``calibrate`` writes.
* TOML: one ``[[curves]]`` table per curve::

      [[curves]]
      device = "raspberry-pi-4"
      task = "cifar10-resnet"
      operation = "group_overhead"        # or "training"
      method = "secagg"
      units = "ms"                        # "s" (default) or "ms"
      coefficients = [16.3, -23.7, 554.4] # a polynomial, highest power first, or
      # points = [[2, 600], [10, 2100], [30, 15000]]   # a measured table (interpolated)
      # extrapolate = "quadratic"        # with points: fit this form for outside the table
"""
from __future__ import annotations

import csv
import tomllib
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from groupfel.errors import InputError
from groupfel.userfile import parse_toml, read_text

from .curves import Curve, MeasuredCurve, PiecewiseLinear, Polynomial, linear, quadratic, table_error

SHIPPED = "reference.csv"
OPERATIONS = ("training", "group_overhead")


@dataclass(frozen=True)
class DeviceProfile:
    """Training curves H (per method: sgd, fedprox, ...) and group-operation curves O_g."""

    device: str
    task: str
    training: dict[str, Curve] = field(default_factory=dict)
    group_overhead: dict[str, Curve] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.device}/{self.task}"

    def add(self, operation: str, method: str, curve: Curve, where: str) -> None:
        if operation not in OPERATIONS:
            raise InputError(f"{where}: operation must be 'training' or 'group_overhead', got {operation!r}")
        getattr(self, operation)[method] = curve


def _number(row: dict, key: str, where: str) -> float:
    try:
        return float(row[key])
    except (TypeError, ValueError):
        raise InputError(f"{where}: column '{key}' must be a number, got {row.get(key)!r}") from None


def uncommented(lines) -> list[str]:
    """CSV lines without ``#`` comment lines (measurement files record the machine there)."""
    return [ln for ln in lines if not ln.lstrip().startswith("#")]


def read_profiles(path: str | Path) -> dict[str, DeviceProfile]:
    """Read a profile file: TOML (``.toml``) or coefficient CSV (columns device, task, operation,
    method, a, b, c)."""
    path = Path(path)
    if path.suffix.lower() == ".toml":
        return _parse_toml(read_text(path, f"cost profile file {path}", "a TOML or CSV profile file"), str(path))
    from groupfel.usercsv import read_user_csv

    return _parse_table(read_user_csv(path, str(path)))


def _parse_table(table) -> dict[str, DeviceProfile]:
    """A user's coefficient CSV (:func:`groupfel.usercsv.read_user_csv`): one curve per device, task,
    operation and method; every coefficient finite."""
    table.require(("device", "task", "operation", "method", "a", "b"),
                  "'a', 'b', 'device', 'method', 'operation', 'task' (and 'c' for group operations)")
    table.unique(("device", "task", "operation", "method"), "curve device/task/operation/method")
    profiles: dict[str, DeviceProfile] = {}
    for row in table.rows:
        if row.get("operation") == "power":   # power per state (cost_models/power.py)
            continue
        where = table.where(row)
        prof = profiles.setdefault(f"{row.get('device')}/{row.get('task')}",
                                   DeviceProfile(row.get("device"), row.get("task")))
        a, b = table.number(row, "a"), table.number(row, "b")
        operation = row.get("operation")
        curve = linear(a, b) if operation == "training" else quadratic(a, b, table.number(row, "c"))
        prof.add(operation, row.get("method"), curve, where)
    return profiles


def _parse(lines, source: str) -> dict[str, DeviceProfile]:
    reader = csv.DictReader(uncommented(lines))
    need = {"device", "task", "operation", "method", "a", "b"}
    missing = need - set(reader.fieldnames or ())
    if missing:
        raise InputError(f"{source}: missing column(s) {sorted(missing)}; the header needs {sorted(need)}")
    profiles: dict[str, DeviceProfile] = {}
    for lineno, row in enumerate(reader, start=2):
        where = f"{source} row {lineno - 1}"
        prof = profiles.setdefault(f"{row['device']}/{row['task']}", DeviceProfile(row["device"], row["task"]))
        a, b = _number(row, "a", where), _number(row, "b", where)
        curve = linear(a, b) if row["operation"] == "training" else quadratic(a, b, _number(row, "c", where))
        prof.add(row["operation"], row["method"], curve, where)
    return profiles


UNITS = {"s": 1.0, "ms": 1e-3}


# a number written as a number: pydantic would read "5" as 5 and true as 1
Number = Annotated[float, Field(strict=True)]


class _CurveSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    device: str
    task: str
    operation: Literal["training", "group_overhead"]
    method: str
    units: Literal["s", "ms"] = "s"
    coefficients: list[Number] | None = Field(None, min_length=1)
    points: list[tuple[Number, Number]] | None = None
    extrapolate: Literal["linear", "quadratic"] | None = None

    @model_validator(mode="after")
    def _one(self):
        if (self.coefficients is None) == (self.points is None):
            raise ValueError("give exactly one of coefficients or points")
        if self.extrapolate and self.points is None:
            raise ValueError("extrapolate needs points (it fits a curve to them)")
        if self.points is not None and len(self.points) < 2:
            raise ValueError("points needs at least two [x, seconds] pairs")
        return self

    def curve(self) -> Curve:
        scale = UNITS[self.units]
        if self.coefficients is not None:
            return Polynomial(tuple(scale * c for c in self.coefficients))
        x, y = np.array(self.points).T
        y = scale * y
        if self.extrapolate is None:
            return PiecewiseLinear(x, y)
        degree = {"linear": 1, "quadratic": 2}[self.extrapolate]
        if len(np.unique(x)) <= degree:
            raise ValueError(f"extrapolate = {self.extrapolate!r} needs more than {degree} distinct points")
        return MeasuredCurve(x, y, Polynomial(tuple(np.polyfit(x, y, degree))))


def _parse_toml(text: str, source: str) -> dict[str, DeviceProfile]:
    try:
        data = parse_toml(text, source)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{source}: not valid TOML ({exc})") from None
    specs = data.get("curves", [] if "power" in data else None)
    if not isinstance(specs, list) or not (specs or data.get("power")) or set(data) - {"curves", "power"}:
        raise InputError(f"{source}: expected only [[curves]] tables (device, task, operation, method, "
                         f"coefficients or points, units) and [[power]] tables (device, state, value, units)")
    profiles: dict[str, DeviceProfile] = {}
    for i, raw in enumerate(specs):
        where = f"{source} curves[{i}]"
        try:
            spec = _CurveSpec.model_validate(raw)
            curve = spec.curve()
        except ValidationError as exc:
            raise table_error(exc, where) from None
        except ValueError as exc:
            raise InputError(f"{where}: {exc}") from None
        prof = profiles.setdefault(f"{spec.device}/{spec.task}", DeviceProfile(spec.device, spec.task))
        prof.add(spec.operation, spec.method, curve, where)
    return profiles


@cache
def shipped_profiles() -> dict[str, DeviceProfile]:
    text = resources.files(__package__).joinpath("profiles", SHIPPED).read_text()
    return _parse(text.splitlines(), f"shipped {SHIPPED}")


def layer(base: DeviceProfile, top: DeviceProfile) -> DeviceProfile:
    """``top``'s curves replace ``base``'s of the same name; ``base``'s other curves stay."""
    return DeviceProfile(base.device, base.task, {**base.training, **top.training},
                         {**base.group_overhead, **top.group_overhead})


def get_profile(name: str, extra: dict[str, DeviceProfile] | None = None) -> DeviceProfile:
    """Look up ``device/task`` among the shipped profiles and ``extra`` (e.g. a user's CSV). A user's
    profile with a shipped profile's name is layered over it: a user who measured only secure
    aggregation on their device keeps the shipped training curves."""
    shipped, extra = shipped_profiles(), extra or {}
    if name in shipped and name in extra:
        return layer(shipped[name], extra[name])
    known = {**shipped, **extra}
    if name not in known:
        raise InputError(f"cost profile {name!r} is unknown; choose one of {sorted(known)}")
    return known[name]


def missing_curve_fix(prof: DeviceProfile) -> str:
    """How to supply a curve a profile lacks (the end of an error message)."""
    shipped = sorted(shipped_profiles())
    if prof.name in shipped:
        return "add it to cost.profiles_file"
    return (f"add it to cost.profiles_file, or name your profile after a shipped one ({', '.join(shipped)}), "
            f"e.g. measure --device raspberry-pi-4 and calibrate --task cifar10-resnet, so that the shipped "
            f"profile supplies the curves yours lacks")


def get_curve(name: str, extra: dict[str, DeviceProfile] | None = None) -> tuple[DeviceProfile, str, Curve]:
    """Look up ``device/task/method``: a group-operation curve, or a training curve by its method."""
    prof_name, _, method = name.rpartition("/")
    if not prof_name:
        raise InputError(f"--profile {name!r}: expected device/task/method, e.g. raspberry-pi-4/cifar10-resnet/secagg")
    prof = get_profile(prof_name, extra)
    for kind in ("group_overhead", "training"):
        if method in getattr(prof, kind):
            return prof, kind, getattr(prof, kind)[method]
    raise InputError(f"--profile {name!r}: {prof_name} has no curve {method!r}; choose one of "
                     f"{sorted(prof.group_overhead) + sorted(prof.training)}")
