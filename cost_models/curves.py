"""Cost curves: polynomials in group size (O_g) or sample count (H), as the paper fits them."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Polynomial:
    """p(x) = c[0]·x^d + … + c[d] (highest power first, numpy.polyval order).

    Fitted curves can dip below zero outside the measured range (the authors' backdoor-distance
    fit is negative at s = 1), and a negative time is meaningless, so values clamp at 0.
    """

    coefficients: tuple[float, ...]

    def __call__(self, x):
        return np.maximum(np.polyval(np.asarray(self.coefficients, dtype=float), x), 0.0)

    @property
    def degree(self) -> int:
        return len(self.coefficients) - 1


def quadratic(a: float, b: float, c: float) -> Polynomial:
    """Group-operation overhead per client, O_g(s) = a·s² + b·s + c (Eq. 5)."""
    return Polynomial((float(a), float(b), float(c)))


def linear(a: float, b: float) -> Polynomial:
    """One local epoch over n samples, H(n) = a·n + b (Eq. 5)."""
    return Polynomial((float(a), float(b)))
