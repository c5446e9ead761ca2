"""Named device profiles: the measured cost curves of one device running one task.

A profile is addressed as ``device/task`` (e.g. ``raspberry-pi-4/cifar10-resnet``); one of its
curves as ``device/task/method`` (e.g. ``raspberry-pi-4/cifar10-resnet/secagg``). The shipped
profiles are the authors' Raspberry Pi 4 and GPU-server fits (``profiles/reference.csv``).
"""
from __future__ import annotations

import csv
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path

from emulator.errors import InputError

from .curves import Polynomial, linear, quadratic

SHIPPED = "reference.csv"


@dataclass(frozen=True)
class DeviceProfile:
    """Training curves H (per method: sgd, fedprox, ...) and group-operation curves O_g."""

    device: str
    task: str
    training: dict[str, Polynomial] = field(default_factory=dict)
    group_overhead: dict[str, Polynomial] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.device}/{self.task}"


def _number(row: dict, key: str, where: str) -> float:
    try:
        return float(row[key])
    except (TypeError, ValueError):
        raise InputError(f"{where}: column '{key}' must be a number, got {row.get(key)!r}") from None


def read_profiles(path: str | Path) -> dict[str, DeviceProfile]:
    """Read a coefficient CSV (columns device, task, operation, method, a, b, c)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError(f"cost profile file {path}: cannot read ({exc.strerror}); check the path") from None
    return _parse(text.splitlines(), str(path))


def _parse(lines, source: str) -> dict[str, DeviceProfile]:
    reader = csv.DictReader(lines)
    need = {"device", "task", "operation", "method", "a", "b"}
    missing = need - set(reader.fieldnames or ())
    if missing:
        raise InputError(f"{source}: missing column(s) {sorted(missing)}; the header needs {sorted(need)}")
    profiles: dict[str, DeviceProfile] = {}
    for lineno, row in enumerate(reader, start=2):
        where = f"{source} line {lineno}"
        key = f"{row['device']}/{row['task']}"
        prof = profiles.setdefault(key, DeviceProfile(row["device"], row["task"]))
        a, b = _number(row, "a", where), _number(row, "b", where)
        if row["operation"] == "training":
            prof.training[row["method"]] = linear(a, b)
        elif row["operation"] == "group_overhead":
            prof.group_overhead[row["method"]] = quadratic(a, b, _number(row, "c", where))
        else:
            raise InputError(f"{where}: operation must be 'training' or 'group_overhead', got {row['operation']!r}")
    return profiles


@cache
def shipped_profiles() -> dict[str, DeviceProfile]:
    text = resources.files(__package__).joinpath("profiles", SHIPPED).read_text()
    return _parse(text.splitlines(), f"shipped {SHIPPED}")


def get_profile(name: str, extra: dict[str, DeviceProfile] | None = None) -> DeviceProfile:
    """Look up ``device/task`` among the shipped profiles (and ``extra``, e.g. a user's CSV)."""
    known = {**shipped_profiles(), **(extra or {})}
    if name not in known:
        raise InputError(f"cost profile {name!r} is unknown; choose one of {sorted(known)}")
    return known[name]
