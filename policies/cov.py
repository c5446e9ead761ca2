"""Coefficient of variation (CoV) of a group's label counts (Group-FEL Sec. 4.2, Eq. 31).

Two normalisations, differing by the constant √m (m = number of labels):

* ``"std"`` (default): σ/μ of the group's per-label counts with the population σ. This is what
  the authors' code computes (``np.std(counts) / np.mean(counts)``); the paper's MaxCoV values
  (0.1, 0.5, 1.0 in Table 1) refer to it.
* ``"eq31"``: Eq. 31 as printed, sqrt(Σ_j (n_g/m − B_j)²) / n_g = CoV_std / √m.

A group holding no samples has CoV = inf (it cannot be balanced).
"""
from __future__ import annotations

from typing import Literal

import numpy as np

Normalization = Literal["std", "eq31"]
NORMALIZATIONS = ("std", "eq31")


def cov_from_moments(total: np.ndarray, sumsq: np.ndarray, m: int,
                     normalization: Normalization = "std") -> np.ndarray:
    """CoV from a count vector's sum and sum of squares: σ/μ = sqrt(m·Σx²/(Σx)² − 1).

    Computing CoV from these two moments makes it a function of exact integers when the counts
    are integers, so the fast CoV-Grouping (which updates the moments of every candidate with a
    single matrix-vector product) and the straightforward one get bit-identical values.
    """
    total = np.asarray(total, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = m * np.asarray(sumsq, dtype=float) / np.where(total > 0, total, 1.0) ** 2 - 1.0
        out = np.where(total > 0, np.sqrt(np.maximum(ratio, 0.0)), np.inf)
    if normalization == "eq31":
        out = out / np.sqrt(m)
    elif normalization != "std":
        raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}")
    return out


def cov_of_counts(counts: np.ndarray, normalization: Normalization = "std") -> np.ndarray:
    """CoV of label-count vectors along the last axis: shape (..., m) -> (...)."""
    counts = np.asarray(counts, dtype=float)
    return cov_from_moments(counts.sum(axis=-1), (counts ** 2).sum(axis=-1), counts.shape[-1], normalization)


def group_cov(label_matrix: np.ndarray, members, normalization: Normalization = "std") -> float:
    """CoV of the group made of rows ``members`` of the clients × labels matrix (Eq. 31)."""
    return float(cov_of_counts(np.asarray(label_matrix)[np.asarray(members, dtype=int)].sum(axis=0),
                               normalization))
