"""Statistics over seeds: t intervals, paired differences, curves on a common cost grid."""
import numpy as np
import pandas as pd
import pytest

from groupfel.experiments.stats import (conclusion, curves_on_grid, mean_ci, paired_diff, per_seed_metrics, render_summary,
                               summarize_seeds, supported)

T_975_DF3 = 3.182446305284263   # Student t 97.5 % quantile, 3 degrees of freedom (printed tables)
T_975_DF2 = 4.302652729911275


def test_mean_ci_hand_case():
    mean, low, high = mean_ci([1.0, 2.0, 3.0, 4.0])
    sem = np.sqrt(((1.5**2 + 0.5**2) * 2) / 3) / 2          # sample sd / sqrt(n)
    assert mean == 2.5
    assert low == pytest.approx(2.5 - T_975_DF3 * sem, rel=1e-12)
    assert high == pytest.approx(2.5 + T_975_DF3 * sem, rel=1e-12)
    assert (low, high) == pytest.approx((0.4457397432, 4.5542602568), abs=1e-9)


def test_mean_ci_edge_cases():
    m, lo, hi = mean_ci([0.7])                      # one seed: no interval
    assert m == 0.7 and np.isnan(lo) and np.isnan(hi)
    assert mean_ci([0.5, 0.5, 0.5]) == (0.5, 0.5, 0.5)
    m, lo, hi = mean_ci([np.nan, 2.0, 4.0])         # NaN (e.g. target never reached) is left out
    assert m == 3.0 and lo < 3.0 < hi
    assert all(np.isnan(mean_ci([np.nan, np.nan])))


def test_paired_difference_hand_case():
    a, b = [0.80, 0.70, 0.90], [0.85, 0.78, 0.93]
    d = np.array([0.05, 0.08, 0.03])
    mean, low, high, n = paired_diff(a, b)
    half = T_975_DF2 * d.std(ddof=1) / np.sqrt(3)
    assert n == 3 and mean == pytest.approx(d.mean())
    assert (low, high) == pytest.approx((d.mean() - half, d.mean() + half), rel=1e-9)
    assert supported(low, high) == "not supported (CI includes 0)"      # -0.0092 .. 0.1158
    # a consistent gain is supported although each seed's gain is small
    mean, low, high, _ = paired_diff([0.80, 0.70, 0.90], [0.81, 0.71, 0.912])
    assert low > 0 and supported(low, high).startswith("higher (supported")
    assert paired_diff([1.0, np.nan, 3.0], [2.0, 5.0, np.nan])[3] == 1   # only seeds where both are finite


def test_curves_interpolate_onto_a_common_cost_grid():
    results = pd.DataFrame({
        "arm": "a", "seed": [0, 0, 0, 1, 1, 1, 1], "round": [0, 1, 2, 0, 1, 2, 3],
        "cost": [0, 10, 20, 0, 5, 15, 30], "accuracy": [0.0, 0.5, 1.0, 0.2, 0.4, 0.6, 0.9]})
    c = curves_on_grid(results, points=5)
    assert list(c["cost"]) == [0, 5, 10, 15, 20]                 # up to the smallest final cost
    seed0 = np.array([0.0, 0.25, 0.5, 0.75, 1.0])
    seed1 = np.array([0.2, 0.4, 0.5, 0.6, 0.7])                  # 20 lies between 15 (0.6) and 30 (0.9)
    np.testing.assert_allclose(c["accuracy_mean"], (seed0 + seed1) / 2)
    # at cost 10 the mean is 0.5, not the mean of the round-1 rows (0.5 at cost 10, 0.4 at cost 5)
    assert c["accuracy_mean"].iloc[2] == pytest.approx(0.5)
    half = 12.706204736174698 * np.abs(seed0 - seed1) / 2         # t(0.975, 1 df) · sem of two values
    # the band stays inside accuracy's range [0, 1]
    np.testing.assert_allclose(c["accuracy_ci95_high"], np.minimum(c["accuracy_mean"] + half, 1.0), atol=1e-12)
    np.testing.assert_allclose(c["accuracy_ci95_low"], np.maximum(c["accuracy_mean"] - half, 0.0), atol=1e-12)
    assert c["accuracy_ci95_high"].max() <= 1.0 and c["accuracy_ci95_low"].min() >= 0.0 and c["clipped"].all()


def _results(acc_by_seed_arm: dict) -> pd.DataFrame:
    rows = []
    for (seed, arm), (costs, accs) in acc_by_seed_arm.items():
        rows += [{"seed": seed, "arm": arm, "round": i, "cost": c, "accuracy": a, "sim_time_s": 2.0 * c}
                 for i, (c, a) in enumerate(zip(costs, accs))]
    return pd.DataFrame(rows)


def test_summary_columns_paired_and_target_counts():
    results = _results({
        (0, "covg"): ([0, 10, 20], [0.1, 0.6, 0.9]), (0, "rg"): ([0, 12, 24], [0.1, 0.5, 0.8]),
        (1, "covg"): ([0, 10, 20], [0.1, 0.5, 0.84]), (1, "rg"): ([0, 12, 24], [0.1, 0.45, 0.7]),
        (2, "covg"): ([0, 10, 20], [0.1, 0.7, 0.95]), (2, "rg"): ([0, 12, 24], [0.1, 0.55, 0.75])})
    per_seed = per_seed_metrics(results, target=0.85)
    covg0 = per_seed[(per_seed.seed == 0) & (per_seed.arm == "covg")].iloc[0]
    assert covg0["cost_to_target"] == 20 and covg0["common_cost"] == 20
    rg0 = per_seed[(per_seed.seed == 0) & (per_seed.arm == "rg")].iloc[0]
    assert rg0["acc_at_common_cost"] == 0.5 and np.isnan(rg0["cost_to_target"])
    s = summarize_seeds(per_seed, ["covg", "rg"])
    for m in ("final_acc", "acc_at_common_cost", "cost_to_target", "sim_time_s"):
        assert {f"{m}_mean", f"{m}_ci95_low", f"{m}_ci95_high", f"{m}_diff_mean"} <= set(s.columns)
    covg, rg = s.iloc[0], s.iloc[1]
    assert covg["target_reached"] == 2 and rg["target_reached"] == 0      # 0.85 reached in seeds 0 and 2
    assert covg["final_acc_mean"] == pytest.approx((0.9 + 0.84 + 0.95) / 3)
    assert rg["final_acc_diff_mean"] == pytest.approx(-(0.1 + 0.14 + 0.2) / 3)
    assert rg["final_acc_diff_ci95_high"] < 0                              # rg lower in every seed
    text = render_summary(s, 0.85)
    # t-test p = 0.037; Holm's step-down keeps acc_at_common_cost's equivalence question open after its
    # difference is shown, so two comparisons remain: 2 x 0.037
    assert "undecided (Holm p = 0.074: close to the 5 % line" in text and "0/3" in text
    assert rg["final_acc_decision"] == "undecided" and rg["acc_at_common_cost_decision"] == "lower"
    sentence = conclusion(s, 0.85)
    assert sentence.startswith("Over 3 seeds") and "covg" in sentence and "2/3 seeds" in sentence


def test_energy_and_carbon_are_compared_with_intervals_and_verdicts():
    """Runs that measured energy and carbon: both enter the paired differences. rg uses 100, 95
    and 110 J more than covg in seeds 0, 1, 2: a difference of 101.7 J whose interval lies above
    0, verdict 'higher'; the grams follow (380 g/kWh)."""
    results = _results({
        (0, "covg"): ([0, 10, 20], [0.1, 0.6, 0.9]), (0, "rg"): ([0, 12, 24], [0.1, 0.5, 0.8]),
        (1, "covg"): ([0, 10, 20], [0.1, 0.5, 0.84]), (1, "rg"): ([0, 12, 24], [0.1, 0.45, 0.7]),
        (2, "covg"): ([0, 10, 20], [0.1, 0.7, 0.95]), (2, "rg"): ([0, 12, 24], [0.1, 0.55, 0.75])})
    joules = {(0, "covg"): 1000.0, (0, "rg"): 1100.0, (1, "covg"): 980.0, (1, "rg"): 1075.0,
              (2, "covg"): 1020.0, (2, "rg"): 1130.0}
    results["energy_j"] = [joules[(s_, a)] * (r / 2) for s_, a, r in zip(results.seed, results.arm, results["round"])]
    results["carbon_g"] = results["energy_j"] / 3.6e6 * 380.0
    results["energy_accounting"] = "group-rounds"
    s = summarize_seeds(per_seed_metrics(results, None), ["covg", "rg"])
    rg = s.iloc[1]
    assert rg["energy_j_diff_mean"] == pytest.approx((100 + 95 + 110) / 3)
    assert rg["energy_j_diff_ci95_low"] > 0 and rg["energy_j_decision"] == "higher"
    assert rg["carbon_g_diff_mean"] == pytest.approx(rg["energy_j_diff_mean"] / 3.6e6 * 380.0)
    assert s["energy_accounting"].tolist() == ["group-rounds", "group-rounds"]
    text = render_summary(s, None)
    assert "energy_j" in text and "carbon_g" in text


def test_one_seed_says_there_is_no_interval():
    results = _results({(0, "covg"): ([0, 10], [0.1, 0.6]), (0, "rg"): ([0, 10], [0.1, 0.5])})
    s = summarize_seeds(per_seed_metrics(results, None), ["covg", "rg"])
    assert np.isnan(s["final_acc_ci95_low"]).all()
    assert "no confidence intervals" in render_summary(s, None)


# --- moved from test_trust3.py (what a new user hits with bad or odd input) ---------------------------


def _study(final_acc: dict, cost: dict | None = None):
    import pandas as pd

    from groupfel.experiments.stats import summarize_seeds

    rows = [{"seed": s, "arm": arm, "final_acc": v, "acc_at_common_cost": v, "sim_time_s": 10.0 + v,
             "cost_to_target": (cost or {}).get(arm, [np.nan] * len(vals))[s], "cost": 1.0, "common_cost": 1.0}
            for arm, vals in final_acc.items() for s, v in enumerate(vals)]
    return summarize_seeds(pd.DataFrame(rows), list(final_acc))


def test_holm_hand_case():
    from groupfel.experiments.stats import holm

    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04 -> monotone 0.02, 0.03, 0.06, 0.06
    assert holm([0.01, 0.04, 0.03, 0.005, np.nan]) == pytest.approx([0.03, 0.06, 0.06, 0.02, np.nan], nan_ok=True)


def test_bounded_intervals_are_clipped_with_a_footnote():
    from groupfel.experiments.reproduce import Metric
    from groupfel.experiments.stats import CLIPPED_NOTE, render_summary

    s = _study({"a": [0.99, 0.80, 0.97], "b": [0.5, 0.4, 0.45]}, cost={"a": [10.0, 4000.0, 20.0], "b": [5.0, 6, 7]})
    a = s.iloc[0]
    assert a["final_acc_ci95_high"] == 1.0 and a["final_acc_ci95_clipped"]       # the t interval passes 1
    assert a["cost_to_target_ci95_low"] == 0.0 and a["cost_to_target_ci95_clipped"]   # ... and 0
    text = render_summary(s, 0.85)
    assert "0.92 [0.661, 1]†" in text and "1343 [0, 7059]†" in text and CLIPPED_NOTE in text
    assert Metric("accuracy", "final_acc", 100).bounds == (0, 100)
    assert Metric("cost", "cost_to_target").bounds == (0, np.inf) and Metric("ipr", "last.ipr").bounds == (0, 1)   # IPR is a share of clients


def test_two_seeds_warn_and_equal_differences_are_too_few_seeds():
    from groupfel.experiments.stats import conclusion, render_summary

    s = _study({"a": [0.5, 0.6], "b": [0.6, 0.7]})           # +0.1 in both seeds: a zero-width interval
    text = render_summary(s, None)
    assert "supported:" not in text
    # before: a zero-width interval and "Holm's correction over the 0 comparisons"
    assert "fewer than 3: no confidence intervals" in text and "[" not in text.replace("seeds = [0, 1, 2]", "")
    assert "0 comparisons" not in text and "too few seeds to test any difference" in text
    assert s.iloc[1]["final_acc_verdict"] == "undecided: too few seeds (2 pairs)"
    s = _study({"a": [0.5, 0.6, 0.55], "b": [0.6, 0.7, 0.65]})   # three equal differences: no spread
    # (0.1 up to rounding in the last bit: a constant difference, not a t of 10^15)
    assert s.iloc[1]["final_acc_verdict"] == "constant difference +0.1 in every seed (3 pairs: no test)"
    assert s.iloc[1]["final_acc_decision"] == "no spread"
    assert s.iloc[1]["sim_time_s_verdict"] == "constant difference +0.1 s in every seed (3 pairs: no test)"
    assert "Decided: 0 of" in conclusion(s, None)
    s = _study({"a": [0.5, 0.6, 0.55], "b": [0.5, 0.6, 0.55]})
    assert s.iloc[1]["final_acc_verdict"] == "identical in every seed (3 pairs: no test)"
    assert s.iloc[1]["cost_to_target_verdict"] == "not measured (no value in any seed: no test)"
    assert s.attrs["comparisons"] == 0


def test_verdicts_are_holm_corrected_with_the_unadjusted_interval_beside():
    """Six arms against the first on three metrics: an unadjusted interval that just excludes 0
    is not a finding after the correction; a large consistent difference still is."""
    from groupfel.experiments.stats import render_summary

    base = [0.50, 0.60, 0.55, 0.52, 0.58]
    arms = {"a": base, "big": [v + 0.2 + 0.01 * i for i, v in enumerate(base)],
            "edge": [v + d for v, d in zip(base, [0.02, 0.001, 0.03, 0.005, 0.025])]}
    arms.update({f"null{k}": [v + d for v, d in zip(base, np.random.default_rng(k).normal(0, 0.02, 5))]
                 for k in range(4)})
    s = _study(arms)
    edge = s[s["arm"] == "edge"].iloc[0]
    assert edge["final_acc_diff_ci95_low"] > 0                   # unadjusted: excludes 0
    assert edge["final_acc_verdict"].startswith("undecided (Holm p")
    assert s[s["arm"] == "big"].iloc[0]["final_acc_verdict"].startswith("higher (Holm p")
    text = render_summary(s, None)
    assert "Holm's correction over the 18 comparisons" in text and "[95 % CI]" in text


def test_a_holm_p_near_the_line_says_so():
    """Within a factor of 2 of 5 % (0.025 <= p < 0.1) the verdict says the line is close."""
    from groupfel.experiments.stats import verdict

    assert verdict(0.03, 0.048, 3) == "higher (supported: Holm p = 0.048: close to the 5 % line)"
    assert verdict(0.03, 0.096, 3) == "not supported (Holm p = 0.096: close to the 5 % line)"
    assert verdict(-0.03, 0.025, 3) == "lower (supported: Holm p = 0.025: close to the 5 % line)"
    assert verdict(0.03, 0.024, 3) == "higher (supported: Holm p = 0.024)"
    assert verdict(0.03, 0.1, 3) == "not supported (Holm p = 0.1)"


def test_accuracy_at_cost_is_nan_where_the_first_row_already_costs_more():
    import pandas as pd

    from groupfel.experiments.stats import accuracy_at_cost

    df = pd.DataFrame({"cost": [50.0, 80.0, 120.0], "accuracy": [0.1, 0.4, 0.6]})
    assert accuracy_at_cost(df, 100.0) == 0.4
    assert np.isnan(accuracy_at_cost(df, 40.0))     # e.g. FedCollab's discriminators charged at round 0
