"""The procedure's design: its error rate, the pairs from which a look is tested, the spending
function, the per-look test and the futility threshold. The procedure reads them at call time
(``design.X``), so the benchmark's alternatives set them here and nowhere else."""
from __future__ import annotations

import numpy as np

ALPHA = 0.05
MIN_PAIRS = 3


def special():
    """scipy.special, imported when first needed (the command line's parser must not pay for it)."""
    from scipy import special

    return special


# Spending function: the Lan-DeMets O'Brien-Fleming type generalised by Liu et al. (2012) with
# exponent ρ (1: Lan-DeMets 1983; smaller spends more at early looks), or, where GAMMA is a number,
# the Hwang-Shih-DeCani family (γ = −4 is close to O'Brien-Fleming; larger spends more early).
RHO = 1.0
GAMMA: float | None = None

# The per-look test from BOOT_MIN pairs on: "bootstrap", each tail the larger of the t-test's and the
# bootstrap-t's. The others were measured against it (docs/statistics-and-safety.md) and run only in
# benchmarks/sequential.py: "hall", Hall's skewness-corrected t (:func:`~.looktests.hall_statistic`, analytic);
# "hall-max", each tail the larger of the t-test's and Hall's; "hall-boot", a bootstrap of Hall's
# statistic; "hall+bootstrap", each tail the larger of Hall's and the bootstrap-t's.
TEST = "bootstrap"
# The null law a repeated p-value is read through: "own", the per-look test's own on normal seeds
# where it is analytic (Hall's, "hall" and "hall-max"; the t-test's for the bootstrap, which cannot be
# simulated on so many paths), or "t", the t-test's.
CALIBRATION = "own"
# The skewness estimate in Hall's statistic: "m3/s3" (third central moment over s³, s with n − 1)
# or "G1" (the adjusted Fisher-Pearson, as reported).
HALL_SKEW = "m3/s3"

# Resamples of a look's bootstrap-t: the smallest two-sided p-value it gives is 2 / 10,000, so
# Holm's step-down over up to 250 comparisons can still reach 5 %.
BOOTSTRAP = 9_999
# Pairs from which a look's test is the bootstrap-t: with fewer, the resamples are too few and too
# often constant to tell the statistic's tails (3 pairs have 10 distinct resamples).
BOOT_MIN = 8
# Pairs from which a look of a plan of several looks is tested (below, the look has only a t-test,
# whose far tail skewed differences make wrong by orders of magnitude: it is no evidence yet).
TEST_MIN = 8
# Pairs from which equivalence (TOST) is tested.
EQ_MIN = 8

# A study stops early, undecided, when every open comparison's predictive power is below this
# (0: never): it is heading nowhere by max_seeds. Non-binding: the boundaries ignore it, and a
# study that stops makes no more decisions, so no error rate can grow. 10 %: chosen on simulated
# studies (benchmarks/sequential.py, generator seed 5) as the largest threshold that costs at most
# 1 point of power at 0.5 paired sd; reported on others.
FUTILITY = 0.1


def untested(pairs, n_max: int, seeds=None, equivalence: bool = False):
    """Which looks of a plan of several looks (with ``pairs``, after ``seeds`` seeds, default as
    many, up to ``n_max``) have no test: those with fewer than :data:`TEST_MIN` pairs, where only a
    t-test is possible and a skewed law of the differences makes its far tail, the one early
    boundaries read, wrong by orders of magnitude. The last look keeps its t-test, so a plan of
    fewer seeds still decides. ``equivalence``: TOST's looks, tested from :data:`EQ_MIN` pairs."""
    pairs = np.asarray(pairs)
    return (pairs < (EQ_MIN if equivalence else TEST_MIN)) & (np.asarray(pairs if seeds is None else seeds) < n_max)
