"""Decisions that hold: group-sequential looks, TOST equivalence and Holm-Shaffer over the family.

The error rates are checked by simulating whole studies (every look, the stopping rule, the family
of the demo's 3 arms × 4 metrics) with noise shaped like the demo's seed-to-seed spread.
"""
from __future__ import annotations

import json
from functools import partial

import numpy as np
import pandas as pd
import pytest
from scipy.special import ndtri

from groupfel.experiments import sequential as seq

# The demo's spread (groupfel run, seeds 0, 1, 2, portable numerics): the seed-to-seed sd of one
# arm's metric, pooled over its 4 arms, and the reference arm's mean; metrics final_acc,
# acc_at_common_cost, cost_to_target, sim_time_s. Margins are the defaults (1 point; 5 %).
DEMO_SD = np.array([0.0195, 0.0193, 818.0, 82.4])
DEMO_REF = np.array([0.913, 0.899, 5506.0, 749.0])
RELATIVE = np.array([False, False, True, True])
MARGIN = np.array([0.01, 0.01, 0.05, 0.05])
# Studies per simulation: 3,000 put a rate's Monte Carlo standard error at 0.4 points, so a rate
# within 2 of them of 5 % passes and the old procedure's 6 to 22 % fails (benchmarks/sequential.py
# runs 20,000 per setting).
STUDIES = {None: 3000, 3.0: 3000}
# Resamples of each look's bootstrap in the simulations: the tool's 9,999 resolve p-values a large
# family needs; the decisions simulated here need only those of one small family.
_sim = partial(seq.simulate, resamples=999)


def test_boundaries_are_the_published_obrien_fleming_type_ones():
    """Lan-DeMets O'Brien-Fleming-type spending, 5 equally spaced looks, two-sided 5 %: the
    z-boundaries 4.877, 3.357, 2.680, 2.290, 2.031 (Jennison & Turnbull 2000, Table 7.6 ff.)."""
    nominal = seq.boundaries((1, 2, 3, 4, 5), 5, 0.05, True)
    assert -ndtri(nominal / 2) == pytest.approx([4.877, 3.357, 2.680, 2.290, 2.031], abs=2e-3)
    assert seq.spend(0.05, np.array([1.0]), True)[0] == pytest.approx(0.05)


def test_one_look_at_every_seed_is_the_plain_t_test():
    p = np.array([[0.031], [0.2]])
    assert seq.repeated_p(p, (3,), 3, True) == pytest.approx([0.031, 0.2])


def test_an_early_look_needs_more_evidence_than_the_last():
    ns = tuple(seq.looks(3, 2, 20))
    assert ns[0] == 3 and ns[-1] == 20
    early = seq.repeated_p(np.array([[np.nan] * 3 + [0.001] + [np.nan] * (len(ns) - 4)]), ns, 20, True)[0]
    late = seq.repeated_p(np.array([[np.nan] * (len(ns) - 1) + [0.001]]), ns, 20, True)[0]
    assert late < 0.01 < early
    # looks with fewer than 8 pairs have no test in a plan of several looks (skewed seeds make a
    # t-test's far tail wrong): even p = 1e-9 after 3 seeds is no evidence there
    assert seq.repeated_p(np.array([[1e-9] + [np.nan] * (len(ns) - 1)]), ns, 20, True)[0] == 1.0


def test_step_down_is_holm_and_counts_comparisons_not_hypotheses():
    # one hypothesis per comparison: Holm (sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1, monotone)
    assert seq.step_down(np.array([0.01, 0.04, 0.03, 0.005]), np.arange(4)) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # two per comparison (at most one true): the divisor is the number of comparisons still open
    q = np.array([0.01, 0.04, 0.03, 0.005])
    assert seq.step_down(q, np.array([0, 0, 1, 1])) == pytest.approx([0.02, 0.06, 0.06, 0.01])
    assert seq.step_down_fast(q[None, :], np.array([0, 0, 1, 1]))[0] == pytest.approx([0.02, 0.06, 0.06, 0.01])


def _demo_like(true_diff, *, tails=None, seed=0, corr=0.2, studies=None):
    return _sim(studies or STUDIES[tails], DEMO_SD, MARGIN, true_diff, ref_mean=DEMO_REF, relative=RELATIVE,
                        first=3, batch=2, max_seeds=20, corr=corr, tails=tails, seed=seed)


def test_a_repeated_p_value_spends_alpha_over_the_whole_planned_schedule():
    """p = 0.01 after 9 seeds is strong evidence for a study of 9 seeds, and weak for one planned
    to 20 (O'Brien-Fleming spends little early): against the planned schedule (3, 5, ..., 19, 20)
    its repeated p-value is about 0.13. (Read against the looks so far, it was about 0.01.)"""
    p = np.array([[np.nan] * 3 + [0.01]])
    assert seq.repeated_p(p, (3, 5, 7, 9), 20, True)[0] == pytest.approx(0.135, abs=0.01)
    assert seq.repeated_p(np.array([[0.01]]), (9,), 9, True)[0] == pytest.approx(0.01)
    assert seq.plan((3,), 20, 2) == (3, 5, 7, 9, 11, 13, 15, 17, 19, 20)
    assert seq.plan((3, 5), 9, 4) == (3, 5, 9)


def test_a_repeated_p_value_never_grows_so_a_decision_is_kept():
    """An uninformative second look leaves the first look's evidence standing (before: 0.0043
    after look 1, 0.037 after look 2), and along random paths the value never grows."""
    ns = tuple(seq.looks(3, 2, 20))
    path = seq.repeated_p_path(np.array([0.5, 0.5, 0.5, 0.5, 1e-4, 0.6, 0.9] + [np.nan] * 3), ns, 20, True)
    assert (path[:4] == 1.0).all() and path[4] == path[5] == path[6] < 0.05
    rng = np.random.default_rng(8)
    p = rng.uniform(size=(500, len(ns))) ** 3
    p[rng.uniform(size=p.shape) < 0.25] = np.nan          # looks without a test (pairs missing)
    q = seq.repeated_p_path(p, ns, 20, True)
    assert (np.nan_to_num(np.diff(q, axis=-1), nan=0.0) <= 0).all()
    assert (seq.keep(np.array([seq.HIGHER, seq.UNDECIDED]), np.array([seq.UNDECIDED, seq.EQUIVALENT]))
            == [seq.HIGHER, seq.EQUIVALENT]).all()


def _false(decisions, cells=None, wrong=(seq.HIGHER, seq.LOWER)):
    d = decisions if cells is None else np.stack([decisions[:, a, m] for a, m in cells], axis=1)
    return np.isin(d, wrong).reshape(len(d), -1).any(axis=1)


def _closing(open_, open_sd=2.0, arms=3, metrics=4):
    """Every comparison but ``open_`` is soon decided both ways (a difference of half the margin,
    small spread) and leaves the family; the open ones have identical arms and a wide spread."""
    sd = np.full((arms + 1, metrics), 0.02)
    true = np.full((arms, metrics), 0.5)
    for a, m in open_:
        sd[a + 1, m], true[a, m] = open_sd, 0.0
    return sd, np.ones(metrics), true


def _within(rate, studies, sd_units=2.0):
    """A simulated family-wise rate is at most 5 % within ``sd_units`` Monte Carlo standard errors."""
    return rate <= 0.05 + sd_units * np.sqrt(0.05 * 0.95 / studies)


@pytest.mark.parametrize("noise", ["normal", pytest.param("chi2_4", marks=pytest.mark.slow),
                                   pytest.param("gamma(0.5)", marks=pytest.mark.slow)])
def test_one_comparison_left_open_after_the_others_are_decided_keeps_5_percent(noise):
    """Where studies stop early: 11 comparisons decided soon, one with identical arms left alone in
    the family (divisor 1) look after look. Testing it at 5 % at each look (the old calibration on
    the looks so far) gave false higher/lower in 17 % of 2,000 studies. The open arm's own noise is
    skewed (paired differences of skewness 1.41 and 2.83): per-look t-tests gave 8.2 % and 16 %."""
    sd, margin, true = _closing([(0, 0)])
    decisions, used = _sim(3000, sd, margin, true, noise=noise, corr=0.0, seed=21)
    assert used.mean() > 15     # the open comparison kept most studies going
    assert _within(_false(decisions, [(0, 0)]).mean(), 3000)


def test_two_open_accuracies_and_one_arm_with_a_small_spread_keep_5_percent():
    sd, margin, true = _closing([(0, 0), (0, 1)], arms=1)
    decisions, _ = _sim(3000, sd, margin, true, seed=22)
    assert _within(_false(decisions, [(0, 0), (0, 1)]).mean(), 3000)
    decisions, used = _sim(3000, np.array([0.6]), np.ones(1), np.zeros((1, 1)), seed=23)
    assert _within(_false(decisions).mean(), 3000) and used.mean() < 20


def test_a_true_difference_exactly_at_the_margin_is_rarely_called_equivalent():
    decisions, _ = _sim(3000, np.array([1.5]), np.ones(1), np.ones((1, 1)), seed=24)
    assert _within(_false(decisions, wrong=(seq.EQUIVALENT,)).mean(), 3000)


@pytest.mark.parametrize("tails", [None, 3.0], ids=["normal", "heavy-tailed t3"])
def test_identical_arms_give_a_false_higher_or_lower_in_at_most_5_percent_of_studies(tails):
    decisions, used = _demo_like(np.zeros((3, 4)), tails=tails, seed=1, studies=3000)
    assert _within(_false(decisions).mean(), 3000)
    assert (used >= 3).all() and (used <= 20).all()


def test_clear_differences_stop_early_and_small_spread_shows_equivalence():
    """A large difference is decided before max_seeds; arms equal within a spread small against
    the margin end equivalent; both with the demo's family size."""
    sd = DEMO_SD / 4
    big = np.tile(np.where(RELATIVE, 0.3 * DEMO_REF, 0.1), (3, 1))
    decisions, used = _sim(2000, sd, MARGIN, big, ref_mean=DEMO_REF, relative=RELATIVE, seed=3)
    assert (decisions == seq.HIGHER).mean() > 0.95 and used.mean() < 20
    decisions, _ = _sim(2000, sd / 4, MARGIN, np.zeros((3, 4)), ref_mean=DEMO_REF, relative=RELATIVE, seed=4)
    assert (decisions == seq.EQUIVALENT).mean() > 0.9


def test_each_comparison_says_after_how_many_seeds_it_was_first_decided():
    """simulate(decided_at=True): the same decisions, and each decided comparison's first look
    (an arm whose comparisons are all decided need not run again), no later than the study's end."""
    sd = DEMO_SD / 2
    true = np.tile(np.where(RELATIVE, 0.1 * DEMO_REF, 0.03), (3, 1))
    kwargs = dict(ref_mean=DEMO_REF, relative=RELATIVE, seed=5)
    decisions, used = _sim(300, sd, MARGIN, true, **kwargs)
    again, used_again, at = _sim(300, sd, MARGIN, true, decided_at=True, **kwargs)
    assert (again == decisions).all() and (used_again == used).all()
    decided = decisions != seq.UNDECIDED
    assert ((at > 0) == decided).all()
    assert np.isin(at[decided], seq.looks(3, 2, 20)).all()
    assert (at <= used[:, None, None]).all()
    # some comparisons are decided at a look before their study's last
    assert (at[decided] < np.broadcast_to(used[:, None, None], at.shape)[decided]).any()


def test_fixed_design_seeds_are_exact_from_the_noncentral_t():
    """A one-sample t-test at 5 % with effect size 1 needs 10 pairs for 80 % power (exact: 0.803
    with 10, 0.748 with 9; the normal approximation plus t quantiles said 9 or 10 depending on the
    df used), and TOST's exact power matches a simulation."""
    from scipy import stats

    assert seq.fixed_seeds_needed(sd=1.0, diff=1.0, margin=0.0, m=1) == 10
    assert seq.power_difference(np.array([9, 10]), 1.0, 1.0, 0.05) == pytest.approx([0.748, 0.803], abs=1e-3)
    rng = np.random.default_rng(3)
    d = rng.normal(0.2, 1.0, (40_000, 12))
    se = d.std(axis=1, ddof=1) / np.sqrt(12)
    c = stats.t.ppf(0.95, 11)
    hit = ((d.mean(axis=1) - c * se > -1.0) & (d.mean(axis=1) + c * se < 1.0)).mean()
    assert seq.power_equivalence(12, 1.0, 0.2, 1.0, 0.05) == pytest.approx(hit, abs=0.01)
    n = seq.fixed_seeds_needed(sd=1.0, diff=1.5, margin=0.1, m=1)
    assert n == 6       # below 8 pairs the procedure's test is the t-test
    decisions, _ = _sim(4000, np.array([1.0 / np.sqrt(2)]), np.array([0.1]), np.array([[1.5]]),
                        first=int(n), max_seeds=int(n), corr=0.0, seed=5)
    assert 0.8 <= (decisions == seq.HIGHER).mean() < 0.9



@pytest.mark.parametrize("sd, diff, m", [(1.0, 1.0, 1), (0.02, 0.001, 2), (3.0, 0.5, 1), (1.0, 0.2, 2), (1.0, 0.01, 1)])
def test_fixed_seeds_needed_is_the_first_n_of_the_whole_range(sd, diff, m):
    """The seeds a fixed design needs, found block by block, are the first n of one pass over
    [2, 10000] whose exact power reaches 80 % (answers 10 to 3,805 seeds, and none within the cap)."""
    n = np.arange(seq.design.MIN_PAIRS, 10_001)
    reach = seq.power_difference(n, sd, diff, 0.05 / m) >= 0.8
    expected = float(n[reach][0]) if reach.any() else float("nan")
    assert seq.fixed_seeds_needed(sd=sd, diff=diff, margin=0.0, m=m) == pytest.approx(expected, nan_ok=True)

# -- the study: summary columns, runs that add seeds, resume ------------------------------------------

def _per_seed(values: dict[str, list[float]]) -> pd.DataFrame:
    return pd.DataFrame([{"seed": s, "arm": arm, "final_acc": v, "acc_at_common_cost": v, "sim_time_s": 100.0,
                          "cost_to_target": np.nan, "cost": 1.0, "common_cost": 1.0}
                         for arm, vals in values.items() for s, v in enumerate(vals)])


def test_summary_has_a_decision_per_metric_equivalent_included():
    from groupfel.experiments.stats import summarize_seeds

    rng = np.random.default_rng(0)
    base = 0.9 + rng.normal(0, 0.01, 12)
    s = summarize_seeds(_per_seed({"a": list(base), "same": list(base + rng.normal(0, 0.001, 12)),
                                   "up": list(base + 0.05 + rng.normal(0, 0.002, 12))}), ["a", "same", "up"])
    same, up = s.iloc[1], s.iloc[2]
    assert same["final_acc_decision"] == "equivalent" and same["final_acc_verdict"].startswith("equivalent (within ±0.01")
    assert up["final_acc_decision"] == "higher"
    assert same["sim_time_s_decision"] == "no spread" and same["sim_time_s_verdict"].startswith("identical in every seed")
    assert same["cost_to_target_decision"] == "not measured"
    assert s.iloc[0]["final_acc_decision"] == ""       # the reference arm


def test_a_sequential_summary_says_after_how_many_seeds():
    from groupfel.experiments.stats import summarize_seeds

    rng = np.random.default_rng(1)
    base = 0.9 + rng.normal(0, 0.01, 9)
    base = 0.9 + rng.normal(0, 0.01, 13)
    s = summarize_seeds(_per_seed({"a": list(base), "up": list(base + 0.2 + rng.normal(0, 0.002, 13))}), ["a", "up"],
                        looks=[3, 5, 7, 9, 11, 13], max_seeds=20)
    assert s.iloc[1]["final_acc_decision"] == "higher" and s.iloc[1]["final_acc_seeds"] < 13
    assert "after" in s.iloc[1]["final_acc_verdict"]


@pytest.mark.parametrize("argv, says", [
    (["--max-seeds", "0"], "argument --max-seeds: '0': give an integer from 3 to 10,000 seeds"),
    (["--seeds", "some"], "argument --seeds: 'some': give auto or an integer from 1 to 10,000 seeds"),
    (["--max-seeds", "5"], "--max-seeds 5: needs --seeds auto"),
])
def test_bad_seed_flags_are_one_line_and_exit_2(argv, says, tmp_path, capsys):
    from groupfel.experiments.cli import main

    assert main(["run", "--output", str(tmp_path / "r"), "--quiet", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0]
    assert not (tmp_path / "r").exists()


def test_max_seeds_in_a_config_needs_auto(tiny_dict):
    from groupfel.emulator.config import parse_config
    from groupfel.errors import InputError

    with pytest.raises(InputError, match="max_seeds = 5 needs seeds = \"auto\""):
        parse_config({**tiny_dict, "seeds": [0, 1, 2], "max_seeds": 5})
    assert parse_config({**tiny_dict, "seeds": "auto"}).seed_cap == 20       # the stated default


def test_auto_study_adds_seeds_until_decided_and_resumes_keeping_finished_seeds(tiny_dict, tmp_path):
    """Two arms that differ a lot (groups of 3 against groups of 6: the sim time): the study stops
    at a look before max_seeds; a killed study (one seed's arm lost, tables gone) resumes to the same
    tables without rerunning the seeds it kept."""
    from groupfel.emulator.config import parse_config
    from groupfel.experiments.runner import run_experiment

    cfg = {**tiny_dict, "seeds": "auto", "max_seeds": 9, "seed_batch": 2, "name": "auto"}
    cfg.pop("seed")
    cfg["train"] = {**cfg["train"], "rounds": 2, "eval_every": 1}
    cfg["arms"] = [{"name": "g3", "grouping": {"policy": "rg", "min_group_size": 3},
                    "sampling": {"policy": "random", "groups_per_round": 2}},
                   {"name": "g6", "grouping": {"policy": "rg", "min_group_size": 6},
                    "sampling": {"policy": "random", "groups_per_round": 2}}]
    config = parse_config(cfg)
    out = tmp_path / "auto"
    summary = run_experiment(config, out, progress=False, jobs=1)
    looks = json.loads((out / "looks.json").read_text())["looks"]
    n = looks[-1]
    assert summary["seeds"].max() == n and looks[0] == 3
    assert sorted(p.name for p in out.glob("seed-*")) == sorted(f"seed-{s}" for s in range(n))
    decisions = summary.iloc[1][[f"{m}_decision" for m in ("final_acc", "acc_at_common_cost", "sim_time_s")]]
    assert (decisions != "undecided").all() or n == 9
    assert summary.iloc[1]["sim_time_s_decision"] == "higher"
    kept = (out / "seed-0" / "g3" / "results.csv").stat().st_mtime_ns
    import shutil

    shutil.rmtree(out / f"seed-{n - 1}" / "g6")
    for f in ("summary.csv", "per_seed.csv", "runs.csv"):
        (out / f).unlink()
    again = run_experiment(config, out, progress=False, jobs=1)
    cols = [c for c in summary.columns if c.endswith(("_decision", "_diff_p_holm", "_mean"))]
    pd.testing.assert_frame_equal(again[cols], summary[cols])
    assert (out / "seed-0" / "g3" / "results.csv").stat().st_mtime_ns == kept
    from groupfel.experiments import api

    assert api.load(out).seeds == list(range(n))


def test_seed_words_in_configs_and_sweeps_get_one_line_naming_the_fix(tiny_dict):
    from groupfel.emulator.config import parse_config
    from groupfel.errors import InputError
    from groupfel.experiments.sweep import SweepConfig

    cfg = {k: v for k, v in tiny_dict.items() if k != "seed"}
    with pytest.raises(InputError, match="'some' is neither a list of seeds nor \"auto\""):
        parse_config({**cfg, "seeds": "some"})
    with pytest.raises(ValueError, match="a sweep runs a list of seeds at every point"):
        SweepConfig.model_validate({"name": "s", "base": "b.toml", "seeds": "auto", "axes": {"data.alpha": [0.1]}})


def test_a_finished_fixed_run_is_not_continued_on_its_seeds(tiny_dict, tmp_path, capsys):
    """seeds = [0, 1, 2] run, then more seeds on the same directory, fixed or added until decided:
    the table spent its 5 % at its one look, so either would be a second test; each is refused in one
    line saying so (--seeds auto: with the simulated cost), before any work, and the conclusion
    names no continuation. (Before: --seeds auto continued it and its decisions replaced the
    table's.)"""
    from groupfel.experiments.cli import main
    from groupfel.experiments.runner import CONTINUED_RATE

    cfg = {k: v for k, v in tiny_dict.items() if k != "seed"}
    cfg.update(seeds=[0, 1, 2], name="cont")
    cfg["train"] = {**cfg["train"], "rounds": 2}
    import tomli_w

    path = tmp_path / "cont.toml"
    path.write_text(tomli_w.dumps(cfg))
    out = tmp_path / "cont"
    assert main(["run", str(path), "--output", str(out), "--quiet", "--jobs", "1"]) == 0
    printed = capsys.readouterr().out
    assert "--seeds auto" not in printed
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.name != ".groupfel.lock")
    for argv in (["--seeds", "6"], ["--seeds", "auto", "--max-seeds", "20"]):
        assert main(["run", str(path), "--output", str(out), "--quiet", "--jobs", "1", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "finished study of 3 fixed seeds" in err[0] and "second test" in err[0], err
        assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.name != ".groupfel.lock") == files
    assert f"({CONTINUED_RATE} false decisions with the table's, simulated, not 5 %)" in err[0]
    assert json.loads((out / "config.json").read_text())["seeds"] == [0, 1, 2]


def test_an_undecided_fixed_table_continued_on_its_seeds_is_a_second_test():
    """Why a finished fixed table is not continued: simulated studies (identical arms, one
    comparison, normal seeds) with a fixed table of 3 seeds at 5 %, and where it left the comparison
    undecided, a study adding seeds up to 20 on the same seeds (its first look reads them). Each alone
    holds 5 %; read together, their false decisions add up."""
    sd, margin, true = np.full((2, 1), np.sqrt(0.5)), np.array([0.05]), np.zeros((1, 1))
    values = seq.simulated_values(np.random.default_rng(12), 2000, sd, true, np.zeros(1), 0.0, "normal", 20)
    table, _ = _sim(2000, sd, margin, true, corr=0.0, first=3, max_seeds=3, values=values[:, :, :3])
    later, _ = _sim(2000, sd, margin, true, corr=0.0, values=values)
    false_table = np.isin(table, (seq.HIGHER, seq.LOWER)).ravel()
    false_later = np.isin(later, (seq.HIGHER, seq.LOWER)).ravel()
    together = false_table | ((table == seq.UNDECIDED).ravel() & false_later)
    assert false_table.mean() < 0.05 + 2 * 0.005 and false_later.mean() < 0.05 + 2 * 0.005
    assert together.mean() > 0.065      # MC se 0.6 points: a second test, not 5 %


@pytest.mark.parametrize("argv, says", [
    (["--max-seeds", "30"], "max_seeds = 30, seed_batch = 2: "),
    (["--seeds", "5"], "--seeds 5: "),
])
def test_a_study_that_adds_seeds_resumes_only_on_its_planned_schedule(tiny_dict, tmp_path, capsys, argv, says):
    """Its decisions spend their 5 % over the looks planned before the first one: another max_seeds
    (say, one chosen after seeing the first looks) or a fixed read of its seeds is refused in one
    line, before any work."""
    from groupfel.emulator.config import parse_config
    from groupfel.experiments.cli import main

    cfg = {k: v for k, v in tiny_dict.items() if k != "seed"}
    config = parse_config({**cfg, "seeds": "auto", "max_seeds": 20})
    out = tmp_path / "study"
    out.mkdir()
    (out / "config.json").write_text(config.model_dump_json())
    before = sorted(p.name for p in out.iterdir())
    assert main(["run", "--resume", str(out), "--quiet", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0] and "planned with max_seeds = 20 and seed_batch = 2" in err[0]
    assert sorted(p.name for p in out.iterdir()) == before


@pytest.mark.slow
def test_repeated_p_values_never_rise_with_pairs_missing():
    """cost_to_target missing in a quarter of arm-seeds: each look read against the schedule the
    study planned (3, 5, ..., 19, 20 seeds), not one re-derived from the pairs with a test, so a
    repeated p-value never rises from a look to the next (before: it rose in 6 of 6 such studies,
    e.g. 0.7077 to 0.7079); here 3 such studies, each summarised at every look."""
    from groupfel.experiments.stats import METRICS, summarize_seeds

    schedule = seq.looks(3, 2, 20)
    for study in range(3):
        rng = np.random.default_rng(100 + study)
        rows = []
        for s in range(20):
            for arm, shift in (("a", 0.0), ("b", 0.3), ("c", 0.0)):
                v = 0.9 + shift * 0.01 + rng.normal(0, 0.01)
                cost = 1000 * (1 + shift * 0.1) + rng.normal(0, 150)
                rows.append({"seed": s, "arm": arm, "final_acc": v, "acc_at_common_cost": v + rng.normal(0, 0.005),
                             "sim_time_s": 100 + rng.normal(0, 5),
                             "cost_to_target": np.nan if rng.uniform() < 0.25 else cost, "cost": 1.0, "common_cost": 1.0})
        per_seed = pd.DataFrame(rows)
        before = None
        for k, n in enumerate(schedule):
            s = summarize_seeds(per_seed[per_seed["seed"] < n], ["a", "b", "c"], looks=schedule[:k + 1], max_seeds=20,
                                seed_batch=2)
            now = s.iloc[1:][[f"{m}_{h}_p" for m in METRICS for h in ("diff", "eq")]].to_numpy(float)
            if before is not None:
                both = np.isfinite(before) & np.isfinite(now)
                assert (now[both] <= before[both]).all(), (study, n)
                assert not (np.isfinite(before) & ~np.isfinite(now)).any()
            before = now


def test_skewed_differences_are_reported_and_flagged():
    """One bad seed among 12 (a run that went wrong): the paired differences' skewness is in the
    summary and beside the decision, which the simulations show no longer holds 5 %."""
    from groupfel.experiments.stats import render_summary, summarize_seeds

    rng = np.random.default_rng(3)
    base = 0.9 + rng.normal(0, 0.01, 12)
    other = base + rng.normal(0, 0.005, 12)
    other[4] -= 0.2
    s = summarize_seeds(_per_seed({"a": list(base), "b": list(other)}), ["a", "b"])
    assert s.iloc[1]["final_acc_diff_skew"] < -2.5
    assert "skewness -3.4: 5 % not held" in s.iloc[1]["final_acc_verdict"]
    assert "bootstrap-t from 8 pairs on" in render_summary(s, None)
    # the skewed rows of the simulations skew the paired differences (one arm's own noise skewed)
    values = seq.simulated_values(np.random.default_rng(0), 20_000, np.array([[0.02], [2.0]]), np.zeros((1, 1)),
                                  np.zeros(1), 0.0, "gamma(0.5)", 5)
    d = (values[:, 1] - values[:, 0]).ravel()
    assert seq.skewness(d) == pytest.approx(seq.SKEWED["gamma(0.5)"], abs=0.3)


def test_a_study_that_runs_to_its_maximum_says_so():
    """Before: "stopped at look 2, after 5 of at most 5 seeds" for a study that ran out with
    comparisons open."""
    from groupfel.experiments.stats import conclusion, render_summary, summarize_seeds

    rng = np.random.default_rng(4)
    base = 0.9 + rng.normal(0, 0.02, 20)
    s = summarize_seeds(_per_seed({"a": list(base), "b": list(base + rng.normal(0, 0.03, 20))}), ["a", "b"],
                        looks=seq.looks(3, 2, 20), max_seeds=20, seed_batch=2)
    text = render_summary(s, None)
    assert "seeds added until decided: ran to its maximum (20 seeds) with 2 comparisons open" in text
    assert "a fixed-seed table of the same seeds read beside these decisions would be a second test" in text
    assert "this study ran to its maximum (20 seeds) with 2 comparisons open" in conclusion(s, None)


def test_a_statistic_beyond_every_resample_keeps_the_floor_never_zero():
    """Where the observed statistic lies beyond every bootstrap resample, the tail is the
    bootstrap's floor 1/(B + 1) (never 0, never the t-test's lighter tail, which under skewed nulls
    let false decisions through); elsewhere the larger of the two. The refused fallback differs."""
    b = 99
    floor = 1 / (b + 1)
    t_tail, boot = np.array([1e-7, 1e-7, 0.3]), np.array([floor, 3 * floor, 0.2])
    assert seq.beyond_every_resample(t_tail, boot, b).tolist() == [floor, 3 * floor, 0.3]
    assert seq.t_fallback(t_tail, boot, b).tolist() == [1e-7, 3 * floor, 0.3]
    d = np.array([1.0, 1.1, 0.9, 1.05, 0.95, 1.02, 0.98, 1.01, 0.99])
    p_diff, _, _ = seq.look_pvalues(d, 0.01, resamples=999)
    assert p_diff == pytest.approx(2 / 1000)


def test_a_decision_resting_on_one_rare_seed_says_so():
    from groupfel.experiments.stats import render_summary, summarize_seeds

    seed, z = seq.rare_seed([0.1, 0.2, 0.15, 0.12, 3.0, 0.18], seeds=[0, 1, 2, 3, 7, 9])
    assert seed == 7 and z > 20
    assert np.isnan(seq.rare_seed([1.0, 1.0, 1.0, 1.0])[1])
    rng = np.random.default_rng(5)
    base = 0.9 + rng.normal(0, 0.01, 10)
    other = base + 0.02 + rng.normal(0, 0.004, 10)
    other[6] += 0.1
    s = summarize_seeds(_per_seed({"a": list(base), "b": list(other)}), ["a", "b"])
    words = s.iloc[1]["final_acc_verdict"]
    assert words.startswith("higher") and "seed 6 lies" in words and "rests on one rare seed" in words
    assert "rests on one rare seed': one seed's paired difference" in render_summary(s, None)


def test_a_study_heading_nowhere_stops_early_and_says_so():
    """Non-binding futility: a study whose open comparisons have little predictive power of a
    decision by max_seeds stops undecided; stopping makes no decision, so rates cannot grow."""
    from groupfel.experiments.stats import conclusion, heading_nowhere, render_summary, summarize_seeds

    assert seq.futile(0.02, 1.0, 11, 20, 0.05, 1) and not seq.futile(0.9, 1.0, 11, 20, 0.05, 1)
    assert not seq.futile(0.02, 1.0, 5, 20, 0.05, 1)          # no test yet at 5 pairs
    assert not seq.futile(0.02, 1.0, 11, 20, 0.05, 1, threshold=0.0)
    power_diff, power_eq = seq.predictive_power(np.array([0.0, 1.5]), 1.0, 11, 20, 1.0, 1)
    assert power_diff[1] > 0.9 > power_eq[1] and power_eq[0] > 0.9 > power_diff[0]
    rng = np.random.default_rng(8)
    base = 0.9 + rng.normal(0, 0.02, 11)
    noise = rng.normal(0, 1, 11)
    # nearly equal arms, a spread 5 times the 1-point margin: neither a difference nor equivalence in reach
    other = base + 0.002 + 0.05 * (noise - noise.mean()) / noise.std(ddof=1)
    s = summarize_seeds(_per_seed({"a": list(base), "b": list(other)}), ["a", "b"],
                        looks=seq.looks(3, 2, 20)[:5], max_seeds=20, seed_batch=2)
    assert heading_nowhere(s)
    assert "stopped at look 5, after 11 of at most 20 seeds, with 2 comparisons open and heading nowhere" in \
        render_summary(s, None)
    assert "deciding the rest takes a new study" in conclusion(s, None)
    # a small true difference: futility stops most studies early and costs under a point of power
    sd, margin, true = np.array([[0.0], [1.0]]), np.array([0.05]), np.array([[0.5]])
    never, used_never = _sim(1000, sd, margin, true, corr=0.0, seed=31, futility=0.0)
    now, used = _sim(1000, sd, margin, true, corr=0.0, seed=31)
    assert used.mean() < used_never.mean() - 1.5
    assert (now == seq.HIGHER).mean() >= (never == seq.HIGHER).mean() - 0.015
    assert not ((now != seq.UNDECIDED) & (now != never)).any()     # stopping adds no decision


def test_the_skew_correction_keeps_a_skewed_null_sample_from_deciding():
    """12 pairs of right-skewed differences (gamma(0.5) noise, skewness 2.8) with a true mean of 0,
    seeded: the paired t-test's p is 0.0025 (its lower tail, the heavy one of the studentised mean,
    is far too light here), the look's test, which follows the skew, gives 0.08; so does Hall's
    skewness-corrected t (the benchmark's alternative). Without the skew correction this fails."""
    from scipy import stats

    d = seq.noise_draw(np.random.default_rng(20), "gamma(0.5)", 12)
    assert stats.ttest_1samp(d, 0.0).pvalue < 0.005
    p_diff, _, _ = seq.look_pvalues(d, 0.5)
    assert p_diff > 0.05
    saved = seq.design.TEST
    try:
        seq.design.TEST = "hall"
        assert seq.look_pvalues(d, 0.5)[0] > 0.05
    finally:
        seq.design.TEST = saved


def test_the_heavy_tail_of_skewed_differences_rejects_near_its_level():
    """2,000 null samples of 12 right-skewed pairs (gamma(0.5)): at one-sided level 0.02 the
    t-test's heavy (lower) tail rejects about 6 times as often as the level says; the look's test
    about 2.4 times (the residue the docs report; the sequential boundaries and their calibration
    carry the rest)."""
    from scipy import stats

    d = seq.noise_draw(np.random.default_rng(7), "gamma(0.5)", (2000, 12))
    t_lower = stats.t.cdf(np.sqrt(12) * d.mean(axis=-1) / d.std(axis=-1, ddof=1), 11)
    _, _, p_hi = seq.look_pvalues(d, 0.0, resamples=999)     # margin 0: TOST's tails are the two tails at 0
    assert (t_lower <= 0.02).mean() > 5 * 0.02
    assert (p_hi <= 0.02).mean() < 3.5 * 0.02


def test_halls_statistic_is_the_t_statistic_without_skew_and_monotone_in_the_mean():
    """Hall (1992): no skewness, no correction; a right-skewed law pulls the lower tail in (the
    heavy one of the studentised mean) and the statistic stays increasing in the mean."""
    n, sd = 12, 2.0
    means = np.linspace(-3, 3, 61)
    t = means / (sd / np.sqrt(n))
    assert seq.hall_statistic(means, sd, 0.0, n) == pytest.approx(t)
    h = seq.hall_statistic(means, sd, 2.0, n)
    assert (np.diff(h) > 0).all()
    assert h[0] > t[0] and h[-1] > t[-1]


def test_a_skewed_comparison_is_withheld_where_asked_and_each_table_states_its_false_equivalent_rate():
    """withhold_skew: a comparison whose paired differences' |sample skewness| reaches it gets no
    decision (it stays open, saying why); the others keep theirs. Every verdict table states the
    false-`equivalent` rate measured for differences as skewed as its own."""
    from groupfel.experiments.stats import render_summary, summarize_seeds

    rng = np.random.default_rng(3)
    base = 0.9 + rng.normal(0, 0.01, 12)
    skewed = 0.05 + 0.01 * seq.noise_draw(np.random.default_rng(4), "gamma(0.5)", 12)
    per_seed = _per_seed({"a": list(base), "up": list(base + skewed)})
    plain = summarize_seeds(per_seed, ["a", "up"])
    held = summarize_seeds(per_seed, ["a", "up"], withhold_skew=1.2)
    assert abs(plain.iloc[1]["final_acc_diff_skew"]) >= 1.2
    assert plain.iloc[1]["final_acc_decision"] == "higher"
    assert held.iloc[1]["final_acc_decision"] == "undecided" and held.iloc[1]["final_acc_withheld"]
    assert "withheld: skewness +1.4, |skewness| >= 1.2" in held.iloc[1]["final_acc_verdict"]
    assert held.iloc[1]["sim_time_s_decision"] == plain.iloc[1]["sim_time_s_decision"]
    # skewness 1.43: the rows measured at 0, 1.4 and 2.9, the largest 6.44 % (at 1.4)
    assert ("false equivalent, simulated where it can happen (a true difference at the margin): up to 6.4 % for "
            "paired differences as skewed as these (|skewness| up to 1.4)") in render_summary(plain, None)


def test_withholding_skewed_comparisons_removes_decisions_only():
    """The simulation's withhold_skew: on the same simulated studies, every decision made with it is
    one made without it, or a later one of a study that went on."""
    sd, margin, true = np.array([[0.0], [1.0]]), np.array([0.05]), np.array([[1.0]])
    plain, used = _sim(300, sd, margin, true, corr=0.0, seed=8, noise="gamma(0.5)")
    held, used_held = _sim(300, sd, margin, true, corr=0.0, seed=8, noise="gamma(0.5)", withhold_skew=1.5)
    assert (held == seq.HIGHER).mean() <= (plain == seq.HIGHER).mean() and used_held.mean() >= used.mean()
    assert (held != seq.UNDECIDED).sum() < (plain != seq.UNDECIDED).sum()
