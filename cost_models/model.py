"""The per-client charges of Eq. 5 for one run: which curve each client's device uses."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from groupfel.errors import InputError

from .curves import first_nonpositive, require_finite
from .profiles import DeviceProfile, missing_curve_fix, shipped_profiles

TRAINING = "training"


@dataclass(frozen=True)
class CostModel:
    """Eq. 5: a client i of group g pays, per group round, O_g(|g|) + E·H_i(n_i).

    ``profiles`` maps a device type (as carried by topology nodes) to its measured profile;
    ``operations`` are the group operations charged together (e.g. secagg + backdoor-distance),
    each its own ledger component.
    """

    profiles: dict[str, DeviceProfile]
    training_method: str = "sgd"
    operations: tuple[str, ...] = ("secagg",)
    recovery_multiple: float = 1.0

    def __post_init__(self):
        for device, prof in self.profiles.items():
            if self.training_method not in prof.training:
                raise InputError(
                    f"cost.training: profile {prof.name} (device {device}) has no training curve "
                    f"{self.training_method!r} (it has {sorted(prof.training) or 'none'}); choose one it has "
                    f"or {missing_curve_fix(prof)}")
            for op in self.operations:
                if op not in prof.group_overhead:
                    raise InputError(
                        f"cost.group_operations: profile {prof.name} (device {device}) has no curve "
                        f"{op!r} (it has {sorted(prof.group_overhead) or 'none'}); choose from those or "
                        f"{missing_curve_fix(prof)}")

    def check_range(self, max_group_size: int, samples: dict[str, np.ndarray], where: str = "cost") -> list[str]:
        """Refuse a curve at or below zero anywhere this run can use it: its group operations at
        group sizes 1..``max_group_size``, each device's training curve at its clients' sample
        counts (``samples``: device → counts). Such a curve would be charged as 0, silently. The
        shipped fits that dip below zero (backdoor-distance at small groups) stay clamped; the
        returned warnings say so (the manifest keeps them)."""
        sizes = np.arange(1, max(1, int(max_group_size)) + 1)
        notes = []
        for device, prof in self.profiles.items():
            shipped = shipped_profiles().get(prof.name)
            uses = [("training", self.training_method, prof.training[self.training_method],
                     np.unique(np.asarray(samples.get(device, []), dtype=float)), "samples")]
            uses += [("group_overhead", op, prof.group_overhead[op], sizes, "group size")
                     for op in self.operations]
            uses += [("group_overhead", f"{op}-recovery", prof.group_overhead[f"{op}-recovery"], sizes, "group size")
                     for op in self.operations if f"{op}-recovery" in prof.group_overhead]
            for kind, method, curve, xs, unit in uses:
                if len(xs):
                    require_finite(curve, xs, where, f"{prof.name}/{method}", unit, "this run")
                bad = first_nonpositive(curve, xs) if len(xs) else None
                if bad is None:
                    continue
                name = f"{prof.name}/{method}"
                point = f"{bad[1]:.4g} s at {unit} {bad[0]:g}"
                if shipped is not None and getattr(shipped, kind).get(method) is curve:
                    notes.append(f"{where}: the shipped curve {name} is {point} (its fit dips below zero there); "
                                 f"charged as 0 at those points")
                    continue
                span = f"group sizes 1..{sizes[-1]}" if unit == "group size" else \
                    f"sample counts {xs.min():g}..{xs.max():g}"
                raise InputError(f"{where}: curve {name} is {point}, and this run uses {span}; a cost must be "
                                 f"positive there: fix the curve's coefficients or points")
        return notes

    @property
    def components(self) -> tuple[str, ...]:
        return (TRAINING, *self.operations)

    def training_cost(self, devices: Sequence[str], n_samples: np.ndarray, epochs: int) -> np.ndarray:
        """E·H_i(n_i) for each client."""
        n_samples = np.asarray(n_samples, dtype=float)
        out = np.empty(len(devices))
        for d in set(devices):
            idx = [i for i, dev in enumerate(devices) if dev == d]
            out[idx] = epochs * self.profiles[d].training[self.training_method](n_samples[idx])
        return out

    def overhead(self, devices: Sequence[str], group_size: int) -> dict[str, np.ndarray]:
        """O_g(|g|) for each client and each group operation (each curve evaluated once per device
        type: the emulator prices every group of every round)."""
        per = {d: {op: float(self.profiles[d].group_overhead[op](group_size)) for op in self.operations}
               for d in set(devices)}
        return {op: np.array([per[d][op] for d in devices]) for op in self.operations}

    def recovery(self, devices: Sequence[str], group_size: int, n_dropped: int) -> dict[str, np.ndarray]:
        """Dropout recovery each survivor pays for the secure-aggregation operations (component
        ``<op>-recovery``), per dropped member: the profile's ``<op>-recovery`` curve where it has
        one (``measure secagg`` records it), else ``recovery_multiple`` × O_op(|g|) / |g| — the
        aggregator regenerates the dropped member's |g| − 1 pairwise masks, about one member's
        masking work, and the survivors share it."""
        out = {}
        for op in self.operations:
            if "secagg" not in op or not n_dropped:
                continue
            per = []
            for d in devices:
                curves = self.profiles[d].group_overhead
                rec = curves.get(f"{op}-recovery")
                per.append(float(rec(group_size)) if rec is not None else
                           self.recovery_multiple * float(curves[op](group_size)) / group_size)
            out[f"{op}-recovery"] = n_dropped * np.array(per)
        return out

    def group_round(self, devices: Sequence[str], n_samples: np.ndarray, epochs: int) -> dict[str, np.ndarray]:
        """Every component a group's members pay in one group round, per client."""
        return {TRAINING: self.training_cost(devices, n_samples, epochs),
                **self.overhead(devices, len(devices))}
