"""Seeds added until decided: simulated error rates where studies stop early, power and expected
seeds against a fixed design, and AdaStop on the same simulated studies.

    nice python benchmarks/sequential.py [--studies 10000] [--power-studies N] [--adastop 1000]
        [--only 'SETTING/NOISE'] [--no-before] [--no-power] [--power-only LABEL] [--out results.jsonl]
        [--t-fallback] [--seed 1] [--power-seed 3] [--spending rho:R|hsd:G] [--boot-min N] [--test-min N]
        [--eq-min N] [--futility P] [--withhold-skew S] [--adastop-alphas 0.025] [--adastop-seed 11]
        [--adastop-only 'K sd, NOISE'] [--adastop-corr R] [--single-look SAMPLES] [--continuation STUDIES]
        [--skew-flags STUDIES]
        [--test bootstrap|hall|hall-max|hall-boot|hall+bootstrap] [--calibration own|t] [--hall-skew m3/s3|G1]
    nice python benchmarks/sequential.py --docs --out results.jsonl   # every figure of the statistics docs

Simulates whole studies run with :mod:`groupfel.experiments.sequential` (looks after 3 seeds and
every 2 more up to max_seeds, stopping when every comparison is decided; Holm-Shaffer over the
family) and prints, for each setting, the share of studies with a false decision and its Monte
Carlo standard error, twice: with the per-look test of before (a paired t-test at every look) and
with today's (bootstrap-t from 8 pairs, each tail at least the t-test's; no test before 8 pairs;
a study whose open comparisons all have under 10 % predictive power of a decision stops):

- false ``higher``/``lower`` (family-wise, on the comparisons whose true difference is 0) where the
  others are decided early and one comparison is left open (max 20 and 50), with two open
  accuracies, with the demo's family and spread;
- false ``equivalent`` with the true difference exactly at the margin;
- noise: normal and Student t3 in every part of every arm; the skewed kinds (chi2_4, gamma(0.5),
  lognormal, 10 % bad seeds) in the compared arms' own noise only, so the paired differences are
  skewed (the column ``skew`` is their skewness, measured on 200,000 simulated seeds);
- power (share of studies deciding ``higher``) and mean seeds for one comparison at 0.5, 1 and 2
  paired sd, and the demo's family with all 12 comparisons shifted by 1 sd, against the seeds a
  fixed design (one look, t-test, Bonferroni over the family) needs for the same power (exact,
  noncentral t);
- with ``adastop`` installed (``pip install groupfel[adastop]``): AdaStop (Mathieu et al. 2024,
  group-sequential permutation tests, unpaired) as documented, n = 5 seeds a look, K = 4 looks,
  B = 10,000 permutations, alpha 0.025 (it tests two-sided at twice the alpha it is given: see
  :data:`ADASTOP_ALPHA`), each study's permutations from its own seed, on the same simulated studies
  as ours, one comparison; in the null rows both arms draw from the same law (skewed or not);
- ``--continuation``: fixed tables continued on their seeds by a study that adds seeds (the cost of
  reading both, which the tool refuses); ``--skew-flags``: how often the sample skewness of the
  seeds shows their skew; ``--withhold-skew``: the rows with a run's ``withhold_skew``;
- ``--docs``: every figure of today's procedure in docs/statistics-and-safety.md (:data:`DOCS_RUNS`).

``--spending``, ``--boot-min``, ``--eq-min`` and ``--futility`` run the measured alternatives to
today's procedure (another spending function, tests from fewer pairs, equivalence from more pairs,
another futility threshold or none: 0); each JSON line records which ran. ``--test`` runs
another per-look test from 8 pairs on: ``hall``, Hall's (1992) skewness-corrected t, analytic
(``--hall-skew``: its skewness estimate; ``--calibration t`` reads its repeated p-values through
the t-test's normal null law instead of its own); ``hall-max``, each tail the larger of the
t-test's and Hall's; ``hall-boot``, a bootstrap of Hall's statistic; ``hall+bootstrap``, each tail
the larger of Hall's and the bootstrap-t's (today's ``bootstrap``: of the t-test's and the
bootstrap-t's). ``--resamples`` sets each
bootstrap's (default: the tool's own 9,999; fewer floor each tail's p-value at 1/(resamples + 1),
which early boundaries, at 10⁻⁵ to 10⁻³, cannot cross).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import time
from functools import partial

import numpy as np

from groupfel.experiments import sequential as seq

# The demo's spread (seeds 0, 1, 2): sd of one arm's metric pooled over its arms, the reference
# arm's mean; margins are the defaults.
SD = np.array([0.0195, 0.0193, 818.0, 82.4])
REF = np.array([0.913, 0.899, 5506.0, 749.0])
RELATIVE = np.array([False, False, True, True])
MARGIN = np.array([0.01, 0.01, 0.05, 0.05])
CORR = 0.2    # two arms' values within a seed (shared data placement and costs)
ARMS = 3


def _closing(arms: int, metrics: int, open_: list[tuple[int, int]], open_sd: float) -> dict:
    """A family of ``arms`` x ``metrics`` comparisons (margin 1) where every comparison but the
    ``open_`` ones has a true difference of half the margin and a small spread (both its hypotheses
    are soon rejected: it leaves the family), and the open ones a true difference of 0 and spread
    ``open_sd`` (each arm's sd; the reference arm's is small, and no noise is shared, so the open
    comparisons' paired differences are the open arm's own noise, skew included)."""
    sd = np.full((arms + 1, metrics), 0.02)
    true = np.full((arms, metrics), 0.5)
    for a, m in open_:
        sd[a + 1, m], true[a, m] = open_sd, 0.0
    return {"sd": sd, "margin": np.ones(metrics), "true_diff": true, "corr": 0.0}


DEMO = {"sd": SD, "margin": MARGIN, "ref_mean": REF, "relative": RELATIVE, "corr": CORR, "max_seeds": 20}
SKEWED = ("chi2_4", "gamma(0.5)", "lognormal", "bad seeds")
# name -> (simulate's keyword arguments, the false decision counted, (arm, metric) cells it counts in, noise kinds)
SETTINGS: dict[str, tuple[dict, int, list[tuple[int, int]] | None, tuple[str, ...]]] = {
    "one open comparison left, max 20": ({**_closing(3, 4, [(0, 0)], 2.0), "max_seeds": 20}, seq.HIGHER, [(0, 0)],
                                         ("normal", "t3", *SKEWED)),
    "one open comparison left, max 50": ({**_closing(3, 4, [(0, 0)], 2.0), "max_seeds": 50}, seq.HIGHER, [(0, 0)],
                                         ("normal", "gamma(0.5)", "lognormal")),
    "two open accuracies": ({**_closing(1, 4, [(0, 0), (0, 1)], 2.0), "max_seeds": 20}, seq.HIGHER,
                            [(0, 0), (0, 1)], ("normal", "gamma(0.5)", "lognormal")),
    "demo family and spread, identical arms": ({**DEMO, "true_diff": np.zeros((ARMS, 4))}, seq.HIGHER, None,
                                               ("normal", "lognormal")),
    "one comparison, AdaStop's setting": ({"sd": np.full((2, 1), np.sqrt(0.5)), "margin": np.array([0.05]),
                                           "corr": 0.0, "true_diff": np.zeros((1, 1)), "max_seeds": 20}, seq.HIGHER,
                                          None, ("normal", "gamma(0.5)", "lognormal")),
    "difference at the margin, one arm": ({"sd": np.array([[0.02], [1.5]]), "margin": np.ones(1), "corr": 0.0,
                                           "true_diff": np.ones((1, 1)), "max_seeds": 20}, seq.EQUIVALENT, None,
                                          ("normal", "chi2_4", "gamma(0.5)", "lognormal")),
    "difference at the margin, demo family": ({**DEMO, "sd": SD / 3,
                                               "true_diff": np.tile(np.where(RELATIVE, MARGIN * REF, MARGIN), (ARMS, 1))},
                                              seq.EQUIVALENT, None, ("normal", "lognormal")),
}


@contextlib.contextmanager
def t_tests_at_every_look():
    """The per-look test of before, for comparison: a paired t-test at every look, none left out."""
    design = seq.design
    saved = design.BOOT_MIN, design.untested, design.FUTILITY
    design.BOOT_MIN, design.FUTILITY = 10 ** 9, 0.0
    design.untested = lambda pairs, n_max, seeds=None, equivalence=False: np.zeros(np.shape(pairs), bool)
    seq.nulllaw._calibration.cache_clear()
    try:
        yield
    finally:
        design.BOOT_MIN, design.untested, design.FUTILITY = saved
        seq.nulllaw._calibration.cache_clear()


def false_rate(decisions: np.ndarray, wrong: int, cells) -> np.ndarray:
    """Per study: a false decision in the counted cells (``higher`` counts ``lower`` too)."""
    d = decisions if cells is None else np.stack([decisions[:, a, m] for a, m in cells], axis=1)
    bad = (d == seq.HIGHER) | (d == seq.LOWER) if wrong == seq.HIGHER else d == wrong
    return bad.reshape(len(d), -1).any(axis=1)


def _kwargs(setting: dict) -> dict:
    return {k: setting[k] for k in ("corr", "ref_mean", "relative", "max_seeds") if k in setting}


def rate(simulate, studies: int, name: str, noise: str, seed: int = 1) -> tuple[float, float, float]:
    """(false rate, its MC standard error, mean seeds) of setting ``name`` under ``simulate``."""
    kwargs, wrong, cells, _ = SETTINGS[name]
    decisions, used = simulate(studies, kwargs["sd"], kwargs["margin"], kwargs["true_diff"], first=3, batch=2,
                               noise=noise, seed=seed, **_kwargs(kwargs))
    bad = false_rate(decisions, wrong, cells)
    return float(bad.mean()), float(np.sqrt(bad.mean() * (1 - bad.mean()) / studies)), float(used.mean())


def paired_skewness(name: str, noise: str) -> float:
    """Skewness of the counted comparisons' paired differences in setting ``name`` (200,000 seeds)."""
    kwargs, _, cells, _ = SETTINGS[name]
    true = np.asarray(kwargs["true_diff"], float)
    sd = np.broadcast_to(np.asarray(kwargs["sd"], float), (true.shape[0] + 1, true.shape[1]))
    values = seq.simulated_values(np.random.default_rng(9), 10_000, sd, true, np.zeros(true.shape[1]),
                                  kwargs.get("corr", 0.5), noise, 20)
    a, m = (cells or [(0, 0)])[0]
    return seq.skewness((values[:, a + 1, :, m] - values[:, 0, :, m]).ravel())


# AdaStop as its documentation runs it (Mathieu et al. 2024; adastop 0.1.3's defaults): n = 5 seeds
# an arm a look, K = 4 looks (max 20 seeds, as ours), B = 10,000 permutations.
ADASTOP_N, ADASTOP_K, ADASTOP_B = 5, 4, 10_000
# adastop 0.1.3 compares |T| with the upper tail of the *signed* permutation law
# (``compute_mean_diffs`` keeps signed differences, ``partial_compare`` takes ``np.abs`` of the
# observed one only), so it tests two-sided at about twice the alpha it is given: a 5 % test is
# alpha 0.025.
ADASTOP_ALPHA = 0.025


def adastop_study(ref: np.ndarray, arm: np.ndarray, comparator, alpha: float, seed: int) -> tuple[str, int]:
    """AdaStop on one simulated study: looks after 5, 10, 15, 20 seeds of both arms, each look given
    every seed so far (its ``partial_compare`` reads "evaluations till interim k"), its permutations
    drawn from this study's own ``seed``. Returns its decision and the seeds it used."""
    c = comparator(n=ADASTOP_N, K=ADASTOP_K, B=ADASTOP_B, alpha=alpha, seed=seed)
    for k in range(ADASTOP_K):
        c.partial_compare({"ref": ref[:ADASTOP_N * (k + 1)], "arm": arm[:ADASTOP_N * (k + 1)]}, False)
        if c.is_finished:
            break
    return next(iter(c.decisions.values())), max(c.n_iters.values())


# AdaStop's rows: true difference in paired sd, noise. Each arm's own noise, sd √½ (paired sd 1, no
# noise shared: AdaStop's test is unpaired); in a null row both arms draw from the same law, skewed
# or not, so they are exchangeable, as a permutation test assumes (and the paired differences are
# symmetric).
ADASTOP_ROWS = ((0.0, "normal"), (0.0, "gamma(0.5)"), (0.0, "lognormal"), (1.0, "normal"), (2.0, "normal"))


def adastop_values(studies: int, k: float, noise: str, seed: int, corr: float = 0.0) -> np.ndarray:
    """Both arms' values of ``studies`` simulated studies, (studies, 2, 20, 1), the reference first:
    the same law in both, ``k`` paired sd apart. ``corr``: the correlation of the two arms' values
    within a seed (a normal part both share, as a seed's data placement is shared), each arm's sd
    chosen so that the paired sd stays 1: 2 sd² (1 - corr) = 1."""
    rng = np.random.default_rng(seed)
    own = seq.noise_draw(rng, noise, (studies, 2, 20, 1))
    if corr:
        own = np.sqrt(corr) * rng.standard_normal((studies, 1, 20, 1)) + np.sqrt(1 - corr) * own
    values = np.sqrt(0.5 / (1 - corr)) * own
    values[:, 1] += k
    return values


def adastop_rows(studies: int, seed: int, alphas: list[float], only: str, record, corr: float = 0.0) -> None:
    """AdaStop and this tool on the same simulated studies (generator ``seed`` and the row's index;
    AdaStop's permutations each study's own seed): false-decision rate or power, MC standard
    error, mean seeds."""
    import logging

    from adastop import MultipleAgentsComparator

    logging.getLogger().setLevel(logging.WARNING)
    print(f"\nAdaStop (n = {ADASTOP_N}, K = {ADASTOP_K}, B = {ADASTOP_B:,}) and this tool on the same {studies} "
          f"simulated studies a row, one comparison, max 20 seeds, paired sd 1, within-seed correlation {corr:g}; "
          f"generator seed {seed}")
    print(f"{'true difference, noise':26s} " + " ".join(f"{f'AdaStop a={a:g}':>15s} {'(se)':>6s} {'seeds':>6s}"
                                                       for a in alphas) + f" {'ours':>7s} {'(se)':>6s} {'seeds':>6s}")
    se = lambda r: float(np.sqrt(r * (1 - r) / studies))   # noqa: E731
    for row, (k, noise) in enumerate(ADASTOP_ROWS):
        if only not in f"{k:g} sd, {noise}":
            continue
        values = adastop_values(studies, k, noise, seed=[seed, row], corr=corr)
        perm_seeds = np.random.default_rng([seed, row, 1]).integers(2 ** 31, size=studies)
        got = {}
        for alpha in alphas:
            ada = [adastop_study(values[i, 0, :, 0], values[i, 1, :, 0], MultipleAgentsComparator, alpha,
                                 int(perm_seeds[i])) for i in range(studies)]
            r = float(np.mean([dec in ("larger", "smaller") for dec, _ in ada]))
            got[alpha] = (r, se(r), float(np.mean([u for _, u in ada])))
        d, used = seq.simulate(studies, np.full((2, 1), np.sqrt(0.5 / (1 - corr))), np.array([0.05]), np.array([[k]]),
                               corr=corr, values=values)
        ours = float(np.isin(d, (seq.HIGHER, seq.LOWER)).mean())
        print(f"{f'{k:g} sd, {noise}':26s} " + " ".join(f"{r:15.2%} {s:6.2%} {u:6.1f}" for r, s, u in got.values())
              + f" {ours:7.2%} {se(ours):6.2%} {used.mean():6.1f}", flush=True)
        record(kind="adastop", setting=f"{k:g} sd", noise=noise, adastop={str(a): list(v) for a, v in got.items()},
               adastop_n=ADASTOP_N, adastop_k=ADASTOP_K, adastop_b=ADASTOP_B, ours=ours, ours_se=se(ours),
               ours_seeds=float(used.mean()), studies=studies, seed=seed, **({"corr": corr} if corr else {}))


def continuation(studies: int, seed: int, record) -> None:
    """Studies that continue after a fixed table: a fixed table of ``n0`` seeds (one look, t-tests at
    5 %), and a study that adds seeds up to 20 on the same seeds (its first look reads them), run
    where the table left a comparison undecided. False decisions (identical arms) of the table, of
    the continuation alone, and of the two read together: what continuing a finished fixed-seed
    study would cost, and why the tool refuses it."""
    print(f"\nfixed tables continued, {studies} simulated studies a row (generator seed {seed}): false decisions "
          f"(MC se) of the table, the continuation alone, both together")
    settings = {"one comparison, AdaStop's setting": SETTINGS["one comparison, AdaStop's setting"][0]}
    se = lambda r: float(np.sqrt(r * (1 - r) / studies))   # noqa: E731
    for name, kw in settings.items():
        true = np.asarray(kw["true_diff"], float)
        sd = np.broadcast_to(np.asarray(kw["sd"], float), (true.shape[0] + 1, true.shape[1]))
        ref = np.asarray(kw.get("ref_mean", np.zeros(true.shape[1])), float)
        values = seq.simulated_values(np.random.default_rng(seed), studies, sd, true, ref, kw["corr"], "normal", 20)
        extra = {k: kw[k] for k in ("ref_mean", "relative") if k in kw}
        later, used = seq.simulate(studies, kw["sd"], kw["margin"], true, corr=kw["corr"], values=values, **extra)
        false_later = false_rate(later, seq.HIGHER, None)
        for n0 in (3, 5, 10):
            table, _ = seq.simulate(studies, kw["sd"], kw["margin"], true, corr=kw["corr"], first=n0, max_seeds=n0,
                                    values=values[:, :, :n0], **extra)
            false_table = false_rate(table, seq.HIGHER, None)
            goes_on = (table == seq.UNDECIDED).reshape(studies, -1).any(axis=1)
            both = false_table | (goes_on & false_later)
            print(f"{name:36s} {n0:2d} fixed seeds: table {false_table.mean():6.2%} ({se(false_table.mean()):.2%}), "
                  f"continuation {false_later.mean():6.2%} ({se(false_later.mean()):.2%}), together "
                  f"{both.mean():6.2%} ({se(both.mean()):.2%}); continued in {goes_on.mean():.1%}", flush=True)
            record(kind="continuation", setting=name, fixed_seeds=n0, table=float(false_table.mean()),
                   continuation=float(false_later.mean()), together=float(both.mean()), continued=float(goes_on.mean()),
                   seeds=float(used.mean()), seed=seed)


def skew_flags(studies: int, seed: int, threshold: float = 1.5) -> None:
    """How often the sample skewness of a study's paired differences reaches ``threshold`` (in
    absolute value) at some tested look (9, 11, ..., 19, 20 pairs) and at 20 pairs, for the one open
    comparison's differences (the open arm's own noise, sd 2; the reference's sd 0.02): whether the
    skew of the seeds shows in them."""
    rng = np.random.default_rng(seed)
    ns = [n for n in seq.looks(3, 2, 20) if n >= seq.design.TEST_MIN]
    print(f"|sample skewness| >= {threshold:g}, {studies} simulated studies a row (generator seed {seed})")
    for kind in ("normal", "chi2_4", "gamma(0.5)"):
        d = 2.0 * seq.noise_draw(rng, kind, (studies, 20)) - 0.02 * rng.standard_normal((studies, 20))
        g = np.abs(np.stack([seq.skewness_rows(d[:, :n]) for n in ns], axis=1)) >= threshold
        some, last = g.any(axis=1).mean(), g[:, -1].mean()
        print(f"{kind:10s} at some look {some:6.1%} (se {np.sqrt(some * (1 - some) / studies):.2%}), "
              f"at 20 pairs {last:6.1%} (se {np.sqrt(last * (1 - last) / studies):.2%})", flush=True)


def single_look(samples: int, seed: int) -> None:
    """How often each tail of one look's test (today's rule, or ``--test``'s) rejects, as a multiple of its one-sided
    level, for skewed differences and no true difference: the heavy tail of a right-skewed law is
    the lower tail of the studentised mean."""
    rng = np.random.default_rng(seed)
    levels = (0.002, 0.005, 0.02)
    print(f"single looks, {samples} samples a row: rejections / level, lower (heavy) and upper tail")
    for kind in ("chi2_4", "gamma(0.5)"):
        for n in (9, 11, 15):
            d = seq.noise_draw(rng, kind, (samples, n))
            _, p_lo, p_hi = seq.look_pvalues(d, 0.0)       # margin 0: TOST's tails are the two tails at 0
            print(f"{kind:10s} {n:3d} pairs " + "  ".join(
                f"{a:g}: {(p_hi <= a).mean() / a:4.2f} {(p_lo <= a).mean() / a:4.2f}" for a in levels), flush=True)


# Every figure of today's procedure in docs/statistics-and-safety.md: the runs ``--docs`` makes, each
# with its studies and generator seed (the tables of measured alternatives name their own commands).
TODAY_ROWS = ("one open comparison left, max 20/normal", "one open comparison left, max 20/chi2_4",
              "one open comparison left, max 20/gamma(0.5)", "two open accuracies/gamma(0.5)",
              "difference at the margin, one arm/normal", "difference at the margin, one arm/chi2_4",
              "difference at the margin, one arm/gamma(0.5)", "one comparison, AdaStop's setting/normal",
              "one comparison, AdaStop's setting/gamma(0.5)", "one comparison, AdaStop's setting/lognormal")
WITHHOLD_ROWS = ("one open comparison left, max 20/normal", "one open comparison left, max 20/chi2_4",
                 "one open comparison left, max 20/gamma(0.5)", "difference at the margin, one arm/chi2_4")
DOCS_RUNS = (
    *[["--studies", "10000", "--no-before", "--no-power", "--adastop", "0", "--only", row] for row in TODAY_ROWS],
    ["--studies", "2000", "--power-studies", "2000", "--only", "NONE", "--adastop", "0"],
    *[["--studies", "1000", "--no-before", "--no-power", "--adastop", "0", "--withhold-skew", "1.5", "--only", row]
      for row in WITHHOLD_ROWS],
    ["--studies", "1000", "--power-studies", "1000", "--only", "NONE", "--no-before", "--adastop", "0",
     "--withhold-skew", "1.5", "--power-only", "one comparison, 1 paired"],
    ["--only", "NONE", "--no-power", "--no-before", "--adastop", "600"],
    ["--continuation", "2000", "--seed", "2"],
    ["--skew-flags", "20000", "--seed", "7"],
)


def docs(out: str | None) -> None:
    """Every run of :data:`DOCS_RUNS`, one after another, each appending its rows to ``out``."""
    import subprocess
    import sys

    for argv in DOCS_RUNS:
        print("$ python benchmarks/sequential.py " + " ".join(argv), flush=True)
        subprocess.run([sys.executable, __file__, *argv, *(["--out", out] if out else [])], check=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--studies", type=int, default=10_000)
    ap.add_argument("--resamples", type=int, default=seq.BOOTSTRAP)
    ap.add_argument("--adastop", type=int, default=1000, help="studies per AdaStop row (0: none)")
    ap.add_argument("--power-studies", type=int, default=None, help="studies per power row (default: --studies / 2)")
    ap.add_argument("--only", default="", help="rate rows: a setting (or part of it), a noise, or SETTING/NOISE (default: all)")
    ap.add_argument("--no-before", action="store_true", help="skip the t-test-at-every-look rows")
    ap.add_argument("--no-power", action="store_true", help="skip the power rows")
    ap.add_argument("--power-only", default="", help="power rows: a part of their label (default: all)")
    ap.add_argument("--out", default=None, help="append each row as a JSON line to this file")
    ap.add_argument("--seed", type=int, default=1, help="generator seed of the rate rows")
    ap.add_argument("--power-seed", type=int, default=3, help="generator seed of the power rows")
    ap.add_argument("--adastop-alphas", default=str(ADASTOP_ALPHA),
                    help="AdaStop's alpha in each column (0.025: a 5 %% two-sided test, see ADASTOP_ALPHA)")
    ap.add_argument("--adastop-seed", type=int, default=11, help="generator seed of the AdaStop rows")
    ap.add_argument("--adastop-only", default="", help="AdaStop rows: a part of 'K sd, NOISE' (default: all)")
    ap.add_argument("--adastop-corr", type=float, default=0.0,
                    help="AdaStop rows: the correlation of two arms' values within a seed (default 0: AdaStop's "
                         "unpaired setting; groupfel's arms share a seed's data placement)")
    ap.add_argument("--t-fallback", action="store_true",
                    help="the refused variant: the t-test's tail where the statistic lies beyond every resample")
    ap.add_argument("--spending", default=None,
                    help="alternatives to today's: 'rho:R' (O'Brien-Fleming type, exponent R) or 'hsd:G' (Hwang-Shih-DeCani)")
    ap.add_argument("--boot-min", type=int, default=None, help="pairs from which a look is tested (today: 8)")
    ap.add_argument("--test-min", type=int, default=None,
                    help="pairs from which a look is tested, with a t-test below --boot-min (today: 8)")
    ap.add_argument("--eq-min", type=int, default=None, help="pairs from which equivalence is tested (today: 8)")
    ap.add_argument("--futility", type=float, default=None, help="predictive power below which a study stops (today: 0.1)")
    ap.add_argument("--test", default=None, choices=("hall", "hall-max", "hall-boot", "hall+bootstrap", "bootstrap"),
                    help="the per-look test from 8 pairs on (today: %s)" % seq.design.TEST)
    ap.add_argument("--calibration", default=None, choices=("own", "t"),
                    help="the null law of the repeated p-values: the test's own where analytic (today), or the t-test's")
    ap.add_argument("--hall-skew", default=None, choices=("m3/s3", "G1"), help="the skewness estimate in Hall's statistic")
    ap.add_argument("--withhold-skew", type=float, default=None,
                    help="no decision where the differences' |sample skewness| is at least this (the run's withhold_skew)")
    ap.add_argument("--docs", action="store_true",
                    help="every figure of today's procedure in the statistics docs (DOCS_RUNS; hours on 2 cores)")
    ap.add_argument("--skew-flags", type=int, default=0,
                    help="only how often the sample skewness reaches 1.5, on this many studies a row")
    ap.add_argument("--continuation", type=int, default=0,
                    help="only fixed tables continued by a study that adds seeds, on this many studies a row")
    ap.add_argument("--single-look", type=int, default=0, help="only the single-look tails, on this many samples a row")
    args = ap.parse_args()
    if args.docs:
        docs(args.out)
        return
    if args.t_fallback:
        seq.looktests.beyond_every_resample = seq.t_fallback
    if args.spending:
        kind, value = args.spending.split(":")
        seq.design.RHO, seq.design.GAMMA = (float(value), None) if kind == "rho" else (1.0, float(value))
    seq.design.TEST = args.test or seq.design.TEST
    seq.design.HALL_SKEW = args.hall_skew or seq.design.HALL_SKEW
    seq.design.CALIBRATION = args.calibration or seq.design.CALIBRATION
    if args.single_look:
        single_look(args.single_look, args.seed)
        return
    if args.skew_flags:
        skew_flags(args.skew_flags, args.seed)
        return
    seq.design.BOOT_MIN = args.boot_min or seq.design.BOOT_MIN
    seq.design.TEST_MIN = args.test_min or args.boot_min or seq.design.TEST_MIN
    seq.design.EQ_MIN = args.eq_min or seq.design.EQ_MIN
    seq.design.FUTILITY = seq.design.FUTILITY if args.futility is None else args.futility
    variant = {"spending": args.spending or "obf", "boot_min": seq.design.BOOT_MIN, "test_min": seq.design.TEST_MIN,
               "eq_min": seq.design.EQ_MIN,
               "futility": seq.design.FUTILITY, "test": seq.design.TEST, "hall_skew": seq.design.HALL_SKEW,
               "calibration": seq.design.CALIBRATION if seq.design.TEST in ("hall", "hall-max") else "t",
               "withhold_skew": args.withhold_skew}

    def record(**row) -> None:
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps({"studies": n, "resamples": args.resamples, "fallback": args.t_fallback,
                                    **variant, **row}) + "\n")
    n = args.studies
    if args.continuation:
        n = args.continuation
        continuation(n, args.seed, record)
        return
    simulate = partial(seq.simulate, resamples=args.resamples, withhold_skew=args.withhold_skew)
    t0 = time.perf_counter()
    print(f"false decisions, share of {n} simulated studies (MC standard error); looks after 3, 5, 7, ... seeds",
          flush=True)
    print(f"{'setting':40s} {'noise':10s} {'skew':>5s} {'before':>7s} {'(se)':>6s} {'now':>7s} {'(se)':>6s} "
          f"{'seeds':>6s}")
    cases = [(name, noise) for name, (_, _, _, kinds) in SETTINGS.items() for noise in kinds
             if args.only in name or args.only == noise or args.only == f"{name}/{noise}"]
    nan = (float("nan"),) * 3
    with t_tests_at_every_look():     # every row of before first: each mode simulates its calibrations once
        before = [nan if args.no_before else rate(simulate, n, name, noise, args.seed) for name, noise in cases]
    for (name, noise), (old, se_b, _) in zip(cases, before):
        now, se, used = rate(simulate, n, name, noise, args.seed)
        skew = paired_skewness(name, noise)
        print(f"{name:40s} {noise:10s} {skew:5.2f} {old:7.2%} {se_b:6.2%} {now:7.2%} "
              f"{se:6.2%} {used:6.1f}", flush=True)
        record(kind="rate", setting=name, noise=noise, skew=skew, before=old, before_se=se_b, now=now, now_se=se,
               seeds=used, seed=args.seed)
    rows_power = not args.no_power

    print("\npower (decided higher) and mean seeds, normal noise, max 20; fixed design: seeds for the same power;\n"
          "* mean seeds an arm runs, the reference's included, where an arm whose comparisons are all decided stops")
    print(f"{'setting':44s} {'power before':>12s} {'now':>6s} {'mean seeds before':>17s} {'now':>5s} {'fixed':>5s} "
          f"{'runs an arm*':>13s}")
    rows = [(f"one comparison, {k:g} paired sd", {"sd": np.array([[0.0], [1.0]]), "margin": np.array([0.05]),
                                                 "true_diff": np.array([[k]]), "corr": 0.0}, 1, k) for k in (0.5, 1, 2)]
    paired_sd = SD * np.sqrt(2 * (1 - CORR))
    rows.append(("demo family, all 12 shifted by 1 paired sd", {**DEMO, "true_diff": np.tile(paired_sd, (ARMS, 1))},
                 ARMS * 4, 1.0))
    def power_of(kw):
        """Power, mean seeds and mean runs an arm (the reference's included) where an arm whose
        comparisons are all decided runs no more seeds."""
        d, used, at = simulate(args.power_studies or n // 2, kw["sd"], kw["margin"], kw["true_diff"],
                               seed=args.power_seed, decided_at=True, **_kwargs(kw))
        arm_seeds = np.where((at > 0).all(axis=2), at.max(axis=2), used[:, None])
        return (d == seq.HIGHER).mean(), used.mean(), (used + arm_seeds.sum(axis=1)).mean() / (at.shape[1] + 1)

    rows = [r for r in rows if rows_power and args.power_only in r[0]]
    with t_tests_at_every_look():
        before = [(np.nan, np.nan, np.nan) if args.no_before else power_of(kw) for _, kw, _, _ in rows]
    for (label, kw, family, k), old in zip(rows, before):
        out = [old, power_of(kw)]
        power = out[1][0]
        # near 100 % the power curve is flat and a fixed design's count meaningless: 99.9 % at most
        fixed = seq.fixed_seeds_needed(1.0, k, 0.0, family, power=min(power, 0.999)) if power > 0 else np.nan
        print(f"{label:44s} {out[0][0]:12.1%} {power:6.1%} {out[0][1]:17.1f} {out[1][1]:5.1f} {fixed:5.0f} "
              f"{out[1][2]:13.2f}", flush=True)
        record(kind="power", setting=label, before=float(out[0][0]), now=float(power), seeds_before=float(out[0][1]),
               seeds=float(out[1][1]), arm_runs=float(out[1][2]), fixed=fixed,
               studies_power=args.power_studies or n // 2, seed=args.power_seed)

    try:
        import adastop  # noqa: F401
    except ImportError:
        print("\nAdaStop: not installed (pip install groupfel[adastop])")
    else:
        if args.adastop:
            adastop_rows(args.adastop, args.adastop_seed, [float(a) for a in args.adastop_alphas.split(",")],
                         args.adastop_only, record, corr=args.adastop_corr)
    print(f"\n({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
