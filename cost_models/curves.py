"""Cost curves: group size → per-client O_g, or sample count → one-epoch H (Eq. 5).

Every curve is a callable ``curve(x) -> float | array`` so :class:`~groupfel.cost_models.model.CostModel`
does not care which form a profile uses:

- :class:`Polynomial` — the paper's fitted forms (quadratic O_g, linear H).
- :class:`PiecewiseLinear` — linear interpolation of a measured table.
- :class:`MeasuredCurve` — a measured table inside its range, a fitted polynomial outside it,
  with a warning when asked far outside what was measured.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from groupfel.errors import InputError
from groupfel.userfile import short

Curve = Callable[[float | np.ndarray], float | np.ndarray]


class ExtrapolationWarning(UserWarning):
    """A cost curve was evaluated far outside its measured range."""


@dataclass(frozen=True)
class Polynomial:
    """p(x) = c[0]·x^d + … + c[d] (highest power first, numpy.polyval order).

    Fitted curves can dip below zero outside the measured range (the authors' backdoor-distance
    fit is negative at s = 1), and a negative time is meaningless, so values clamp at 0; a run
    refuses a curve that is at or below zero where it can use it (:func:`first_nonpositive`),
    except the shipped fits, which it records as clamped.
    """

    coefficients: tuple[float, ...]

    def raw(self, x):
        return np.polyval(np.asarray(self.coefficients, dtype=float), x)

    def __call__(self, x):
        return np.maximum(self.raw(x), 0.0)

    @property
    def degree(self) -> int:
        return len(self.coefficients) - 1


def quadratic(a: float, b: float, c: float) -> Polynomial:
    """Group-operation overhead per client, O_g(s) = a·s² + b·s + c (Eq. 5)."""
    return Polynomial((float(a), float(b), float(c)))


def linear(a: float, b: float) -> Polynomial:
    """One local epoch over n samples, H(n) = a·n + b (Eq. 5)."""
    return Polynomial((float(a), float(b)))


def _table(x, y) -> tuple[np.ndarray, np.ndarray]:
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.ndim != 1 or x.shape != y.shape or len(x) < 2:
        raise ValueError("a measured table needs at least two (x, y) points of equal length")
    if np.any(np.diff(np.sort(x)) == 0):
        raise ValueError("a measured table needs distinct x values (average repeats first)")
    order = np.argsort(x)
    return x[order], y[order]


@dataclass(frozen=True, init=False)
class PiecewiseLinear:
    """Linear interpolation of measured points; beyond the ends it continues the end segments
    (a flat clamp would make a group of 100 cost what a group of 30 did)."""

    x: tuple[float, ...]
    y: tuple[float, ...]

    def __init__(self, x, y):
        xs, ys = _table(x, y)
        object.__setattr__(self, "x", tuple(xs))
        object.__setattr__(self, "y", tuple(ys))

    def raw(self, q):
        x, y = np.asarray(self.x), np.asarray(self.y)
        q = np.asarray(q, dtype=float)
        inside = np.interp(q, x, y)
        lo = y[0] + (q - x[0]) * (y[1] - y[0]) / (x[1] - x[0])
        hi = y[-1] + (q - x[-1]) * (y[-1] - y[-2]) / (x[-1] - x[-2])
        return np.where(q < x[0], lo, np.where(q > x[-1], hi, inside))

    def __call__(self, q):
        return np.maximum(self.raw(q), 0.0)


@dataclass(frozen=True, init=False)
class MeasuredCurve:
    """A measured table, interpolated inside its range and extrapolated by ``fit`` outside it.

    ``far`` sets what "far outside" means: beyond ``far`` × the measured span past either end,
    the call warns (:class:`ExtrapolationWarning`) because a fitted quadratic is only an
    assumption there (Sec. 2.3 assumes O_g quadratic, H linear).
    """

    table: PiecewiseLinear
    fit: Polynomial
    far: float = 0.5

    def __init__(self, x, y, fit: Polynomial, far: float = 0.5):
        object.__setattr__(self, "table", PiecewiseLinear(x, y))
        object.__setattr__(self, "fit", fit)
        object.__setattr__(self, "far", float(far))

    @property
    def range(self) -> tuple[float, float]:
        return self.table.x[0], self.table.x[-1]

    def __call__(self, q):
        lo, hi = self.range
        q = np.asarray(q, dtype=float)
        slack = self.far * (hi - lo)
        if np.any(q < lo - slack) or np.any(q > hi + slack):
            warnings.warn(f"cost curve evaluated at {np.min(q):g}..{np.max(q):g}, far outside its measured "
                          f"range [{lo:g}, {hi:g}]; the fitted curve is extrapolating", ExtrapolationWarning,
                          stacklevel=2)
        return np.where((q >= lo) & (q <= hi), self.table(q), self.fit(q))

    def raw(self, q):
        lo, hi = self.range
        q = np.asarray(q, dtype=float)
        return np.where((q >= lo) & (q <= hi), self.table.raw(q), self.fit.raw(q))


def first_nonpositive(curve: Curve, xs) -> tuple[float, float] | None:
    """(x, value) of the first x in ``xs`` where ``curve`` is at or below zero before clamping
    (or not a number), else None. A cost of zero or less there would be charged as nothing."""
    xs = np.asarray(xs, dtype=float)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExtrapolationWarning)
        values = np.asarray(getattr(curve, "raw", curve)(xs), dtype=float)
    bad = np.flatnonzero(~(values > 0))
    return (float(xs[bad[0]]), float(values[bad[0]])) if len(bad) else None


def require_finite(curve: Curve, xs, where: str, name: str, unit: str, used_by: str) -> None:
    """Refuse ``curve`` where its cost overflows a float at an x in ``xs`` (sizes or sample counts
    that ``used_by`` prices), in one line naming the curve and the x."""
    with np.errstate(over="ignore", invalid="ignore"):
        values = np.asarray(curve(xs), dtype=float)
    if not np.isfinite(values).all():
        i = int(np.flatnonzero(~np.isfinite(values))[0])
        raise InputError(f"{where}: curve {name} overflows a float ({values[i]:g} s) at {unit} {xs[i]:g}, which "
                         f"{used_by} uses; a cost must be finite: fix the curve's coefficients or lower the {unit}s")


def table_error(exc, where: str) -> InputError:
    """A pydantic error of one [[curves]] or [[power]] table as one line naming its key."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    msg = "unknown key; remove it or check its spelling" if err["type"] == "extra_forbidden" else \
        err["msg"].removeprefix("Value error, ")
    if msg.startswith("units: "):   # a model-level check of the units field
        loc, msg = "units", msg.removeprefix("units: ")
    if err["type"] in ("float_type", "int_type", "float_parsing", "int_parsing") and isinstance(err["input"], (str, bool)):
        # a number in quotes or a boolean is refused, not read as one ("5" as 5 W, true as 1 W)
        v = err["input"]
        shown, what = (short(v), "text") if isinstance(v, str) else ("true" if v else "false", "a boolean")
        msg = f"{shown} is {what}, not a number; write the number without quotes"
    elif err["type"] == "too_short":
        msg = "an empty list; give at least one number"
    return InputError(f"{where}{'.' + loc if loc else ''}: {msg}")
