"""Decisions that hold under repeated looks: group-sequential tests with alpha spending, TOST
equivalence, and Holm's step-down over the family.

A study compares every arm with the reference arm on each headline metric. Each comparison has two
null hypotheses, and at most one of them can be true:

- ``diff``: the mean paired difference is 0 (two-sided; rejected: **higher** or **lower**);
- ``eq``: the difference is at least the metric's margin away from 0, |μ| >= δ (rejected by two
  one-sided tests, TOST, Schuirmann 1987: **equivalent**).

A study that adds seeds looks at its data after every batch, on a schedule planned before its first
look: seeds ``first``, then every ``batch`` more, up to ``max_seeds``. Each hypothesis is tested with
the Lan-DeMets (1983) O'Brien-Fleming-type spending function α(t) = 2 − 2Φ(z_{1−α/2} / √t),
t = pairs / max_seeds; the boundaries come from the exact joint normal law of the look statistics
(recursive integration, Armitage, McPherson & Rowe 1969; Jennison & Turnbull 2000, ch. 19) and apply
to each look's paired t-test through its nominal significance level (Jennison & Turnbull 2000, §3.8).
The smallest level at which a look so far crosses its boundary, read through the simulated null law
of the *whole planned schedule* (every look up to max_seeds, whether or not the study gets there),
is the hypothesis's *repeated p-value* (Jennison & Turnbull 2000, §9.1): it never grows from one
look to the next, and the chance under the null that it ever falls to α or below, at any look of the
schedule, is at most α. Holm's step-down over the repeated p-values of a look (Maurer & Bretz 2013,
*Stat. Biopharm. Res.* 5:311: sequentially rejective graphical, here Holm, procedures for
group-sequential designs) controls the family-wise error over all looks; because at most one
hypothesis of a comparison is true, the divisor at each step is the number of comparisons with a
hypothesis still open (Shaffer 1986). A decision once made is kept. A run with a fixed seed list has
one look, at t = 1, where the repeated p-value is the t-test's p.

The procedure, one concern a module: :mod:`.design` (its error rate, the pairs from which a look is
tested, the spending function, the per-look test and the futility threshold: read at call time, so
alternatives are set there), :mod:`.spending` (the schedule and the alpha spent at each look),
:mod:`.looktests` (the test at one look), :mod:`.nulllaw` (the simulated null law of the schedule and
the repeated p-values), :mod:`.decisions` (Holm-Shaffer, decisions, futility), :mod:`.fixed` (a fixed
design's power and seeds) and :mod:`.simulation` (whole simulated studies).
"""
from __future__ import annotations

from . import design
from .decisions import (EQUIVALENT, HIGHER, LOWER, NAMES, UNDECIDED, decide, futile, keep, predictive_power,
                        step_down, step_down_fast)
from .design import ALPHA, BOOTSTRAP, MIN_PAIRS, untested
from .fixed import fixed_seeds_needed, power_difference, power_equivalence
from .looktests import (FLAT, RARE_Z, beyond_every_resample, bootstrap_t, bootstrap_weights, hall_statistic,
                        look_pvalues, no_spread, rare_seed, skewness, skewness_rows, t_fallback)
from .nulllaw import repeated_p, repeated_p_path
from .simulation import NOISE, SKEWED, noise_draw, simulate, simulated_values
from .spending import boundaries, looks, plan, spend

__all__ = ["ALPHA", "BOOTSTRAP", "EQUIVALENT", "FLAT", "HIGHER", "LOWER", "MIN_PAIRS", "NAMES", "NOISE", "RARE_Z",
           "SKEWED", "UNDECIDED", "beyond_every_resample", "bootstrap_t", "bootstrap_weights", "boundaries", "decide",
           "design", "fixed_seeds_needed", "futile", "hall_statistic", "keep", "look_pvalues", "looks", "no_spread",
           "noise_draw", "plan", "power_difference", "power_equivalence", "predictive_power", "rare_seed",
           "repeated_p", "repeated_p_path", "simulate", "simulated_values", "skewness", "skewness_rows", "spend", "step_down",
           "step_down_fast", "t_fallback", "untested"]
