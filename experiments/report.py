"""``groupfel report DIR``: one self-contained HTML page for a run, a multi-seed run or a sweep.

Plots are PNG data URIs and the page loads nothing from the network. Sections: what was run (the
config and its cost profiles' curves), accuracy against cost and simulated time (bands over seeds),
the summary with CIs and paired differences, the Eq. 5 breakdown from the ledgers (training against
each group operation, per edge and per group size), grouping statistics from the manifests, the
makespan, and versions and wall time. Each image marks itself decoded on load and the page counts
script errors in ``<body data-errors>``, so a headless browser can check that it rendered.
"""
from __future__ import annotations

import base64
import datetime
import html
import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from groupfel.emulator.config import RunConfig, parse_config
from groupfel.errors import InputError
from groupfel.emulator.io import atomic_write
from groupfel.emulator.runfiles import complete_manifest, load_csv, load_json, load_parquet

from .stats import ALL_METRICS, conclusion, render_summary


@dataclass
class ArmRun:
    label: str       # the arm, or <point>/<arm> in a sweep
    seed: int
    path: Path       # the arm directory


@dataclass
class Study:
    kind: str                     # "run", "multi-seed run" or "sweep"
    root: Path
    config: RunConfig             # the (first point's) config
    arms: list[ArmRun]
    results: pd.DataFrame         # every evaluation row, arm = label
    summary: pd.DataFrame
    extra: dict


def load_study(root: Path) -> Study:
    root = Path(root)
    if (root / "sweep.json").exists():
        meta = load_json(root / "sweep.json")
        if not (root / "runs.csv").exists():
            raise InputError(f"report: {root} is an unfinished sweep; rerun its 'groupfel sweep' command first")
        config, arms = _sweep_arms(root, meta)
        results = load_csv(root / "runs.csv")
        results["arm"] = results["point"].astype(str) + "/" + results["arm"].astype(str)
        return Study("sweep", root, config, arms, results, load_csv(root / "summary.csv"), meta)
    if not (root / "config.json").exists():
        raise InputError(f"report: {root} holds no config.json; give a run or sweep directory")
    from .runner import resolved_config

    config = resolved_config(root)
    arms = _run_arms(root, config)
    if config.seeds is not None:
        if not (root / "runs.csv").exists():
            raise InputError(f"report: {root} is unfinished; resume it with 'groupfel run --resume {root}'")
        return Study("multi-seed run", root, config, arms, load_csv(root / "runs.csv"),
                     load_csv(root / "summary.csv"), {})
    missing = [str(a.path) for a in arms if not (a.path / "manifest.json").exists()]
    if missing or not (root / "summary.csv").exists():
        raise InputError(f"report: {root} is unfinished ({', '.join(missing) or 'no summary.csv'}); resume it "
                         f"with 'groupfel run --resume {root}'")
    results = pd.concat([load_csv(a.path / "results.csv") for a in arms], ignore_index=True)
    if "seed" not in results:
        results["seed"] = config.seed
    return Study("run", root, config, arms, results, load_csv(root / "summary.csv"), {})


def _sweep_arms(root: Path, meta: dict) -> tuple[RunConfig, list[ArmRun]]:
    points = list(meta["points"])
    configs = {p: parse_config(load_json(root / p / "config.json")) for p in points}
    arms = [ArmRun(f"{p}/{a.name}", s, root / p / f"seed-{s}" / a.name)   # a point may run some arms only
            for p in points for s in configs[p].seed_list for a in configs[p].arms]
    return configs[points[0]], arms


def _run_arms(root: Path, config: RunConfig) -> list[ArmRun]:
    if config.seeds is not None:
        return [ArmRun(a.name, s, root / f"seed-{s}" / a.name) for s in config.seed_list for a in config.arms]
    return [ArmRun(a.name, config.seed, root / a.name) for a in config.arms]


def planned_arms(root: Path) -> tuple[RunConfig, list[ArmRun]] | None:
    """The config and the arm runs the report of the study in ``root`` will show, known from its
    configs before its tables exist; None where not known yet (no config written, or a study whose
    seeds are still being decided)."""
    root = Path(root)
    try:
        if (root / "sweep.json").exists():
            config, arms = _sweep_arms(root, load_json(root / "sweep.json"))
        elif (root / "config.json").exists():
            from .runner import resolved_config

            config = resolved_config(root)
            arms = _run_arms(root, config)
        else:
            return None
    except (InputError, OSError, ValueError, KeyError):
        return None
    return None if config.seeds == "auto" else (config, arms)


SECTIONS = ("profiles", "breakdown", "grouping")   # the sections prepare_sections draws


def prepare_sections(root: Path, config: RunConfig, arms: list[ArmRun], parts=SECTIONS) -> dict:
    """The report's sections that need only the config (its cost profiles) or also the finished
    arms' own files (the Eq. 5 breakdown, the grouping), drawn ahead of the study's tables: a
    tracker draws them while the runner writes those, and :func:`build_report` takes them as
    ``prepared``."""
    study = Study("prepared", Path(root), config, arms, pd.DataFrame(), pd.DataFrame(), {})
    draw = {"profiles": lambda: _profiles_figure(_cost_model(study)), "breakdown": lambda: _breakdown(study),
            "grouping": lambda: _grouping(study)}
    return {"arms": _key(arms), **{part: draw[part]() for part in parts}}


def _key(arms: list[ArmRun]) -> list[tuple[str, int, str]]:
    return [(a.label, a.seed, str(a.path)) for a in arms]


def _png(fig) -> str:
    from .plots import plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return _img(buf.getvalue())


def _png_file(path: Path) -> str:
    return _img(Path(path).read_bytes())


# the band plots a multi-seed run's own tables come with (runner.finish draws them from the same rows)
OWN_PLOTS = {"cost": "accuracy_vs_cost.png", "sim_time_s": "accuracy_vs_time.png", "energy_j": "accuracy_vs_energy.png"}


def _own_plot(study: Study, x: str) -> str | None:
    """The run's own band plot against ``x`` where it was drawn from the runs.csv the report reads
    (not older than it): embedded as it is rather than drawn a second time."""
    if study.kind != "multi-seed run":
        return None
    path, runs = study.root / OWN_PLOTS[x], study.root / "runs.csv"
    try:
        fresh = path.stat().st_mtime_ns >= runs.stat().st_mtime_ns
    except OSError:
        return None
    return _png_file(path) if fresh else None


def _img(png: bytes) -> str:
    return (f'<img alt="plot" src="data:image/png;base64,{base64.b64encode(png).decode()}" '
            f'onload="this.dataset.decoded=1" onerror="this.dataset.decoded=0">')


def _table(df: pd.DataFrame) -> str:
    return df.to_html(index=False, float_format=lambda v: f"{v:.4g}", na_rep="–", border=0, classes="t")


def _cost_model(study: Study):
    """The study's Eq. 5 cost model, with the training curve and group operations its first arm's
    run resolved (recorded in its manifest; runs that predate the record: the algorithm's
    declarations, which import torch)."""
    from groupfel.emulator.eq5 import build_cost_model

    manifest = complete_manifest(study.arms[0].path) if study.arms else None
    return build_cost_model(study.config, declared=(manifest or {}).get("cost_model"))


def _profiles_figure(cost) -> str:
    from .plots import plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6), dpi=100)
    sizes, samples = np.arange(2, 41), np.arange(1, 401)
    for device, prof in cost.profiles.items():
        for op in cost.operations:
            ax1.plot(sizes, prof.group_overhead[op](sizes), label=f"{device} {op}")
        ax2.plot(samples, prof.training[cost.training_method](samples), label=f"{device} {cost.training_method}")
    ax1.set(xlabel="group size |g| (clients)", ylabel="O_g(|g|): per-client overhead (s)", title="group operations")
    ax2.set(xlabel="samples n (samples)", ylabel="H(n): one epoch (s)", title="training")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return _png(fig)


def _ledgers(study: Study) -> pd.DataFrame:
    """Every Eq. 5 charge, with the arm label, the seed and the size of the charged group."""
    frames = []
    for a in study.arms:
        led = load_parquet(a.path / "ledger.parquet")
        grouped = led[led["group"] >= 0]
        size = grouped.groupby(["round", "group"])["client"].nunique().rename("group_size")
        led = led.join(size, on=["round", "group"])
        frames.append(led.assign(arm=a.label, seed=a.seed))
    return pd.concat(frames, ignore_index=True)


def _breakdown(study: Study) -> str:
    from .plots import plt

    led = _ledgers(study)
    n_seeds = led.groupby("arm")["seed"].nunique()
    per_comp = led.pivot_table(index="arm", columns="component", values="amount", aggfunc="sum", sort=False)
    per_comp = per_comp.div(n_seeds.reindex(per_comp.index), axis=0)
    table = per_comp.assign(total=per_comp.sum(axis=1)).reset_index()
    for c in per_comp.columns:
        table[f"{c} share"] = per_comp[c].to_numpy() / table["total"].to_numpy()
    from .timeline import color   # a component has one colour in every chart, the timeline's included

    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2), dpi=100)
    per_comp.plot.barh(stacked=True, ax=axes[0], color=[color(c) for c in per_comp.columns])
    axes[0].set(xlabel="Eq. 5 cost per seed (device s)", ylabel="", title="by component")
    edge = led.pivot_table(index="edge", columns="component", values="amount", aggfunc="sum") / len(study.arms)
    edge.plot.bar(stacked=True, ax=axes[1], color=[color(c) for c in edge.columns])
    axes[1].set(xlabel="edge (index)", ylabel="Eq. 5 cost per arm run (device s)", title="by edge (all arms)")
    grouped = led[led["group_size"].notna()]
    per_client = grouped.groupby(["group_size", "component"])["amount"].mean().unstack()
    per_client.plot(marker="o", ax=axes[2], color=[color(c) for c in per_client.columns])
    axes[2].set(xlabel="group size |g| (clients)", ylabel="mean charge per client per group round (s)",
                title="by group size: O_g(|g|) against E·H(n)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return (f"<p>Mean over seeds of each arm's ledger ({len(led):,} charges in all). Training includes "
            f"any gradient probe (group −1).</p>{_table(table)}{_png(fig)}")


def _energy(study: Study, bands: dict) -> str:
    """Accuracy against energy and the joules by state (runs with cost.energy)."""
    last = study.results.groupby(["arm", "seed"], sort=False).last()
    cols = [c for c in last.columns if c.startswith("energy_") and c.endswith("_j") and c != "energy_j"]
    by_state = last[["energy_j", *cols]].groupby(level="arm", sort=False).mean()
    by_state.columns = ["total (J)", *[c.removeprefix("energy_").removesuffix("_j") + " (J)" for c in cols]]
    from .plots import ACCOUNTING
    from .runner import assumed_powers

    acc = study.config.cost.energy_accounting
    assumed = assumed_powers(study.root)
    return (f"<h2>Accuracy against energy</h2><p>Energy: each client's power in each state × the simulated "
            f"seconds it spent there (cost.energy), summed over clients under the {acc} accounting "
            f"(cost.energy_accounting: {ACCOUNTING.get(acc, acc)}); line: mean, band: 95 % CI over seeds.</p>"
            f"<p>{html.escape(assumed) if assumed else 'Every power used is a measurement (power_sources in each manifest).'}</p>"
            f"{bands['energy_j']}<p>Energy by state at the end of each arm run, mean over seeds:</p>"
            f"{_table(by_state.round(4).reset_index())}{_sites_and_carbon(last)}{_energy_views(study, acc)}")


def _sites_and_carbon(last: pd.DataFrame) -> str:
    """The edge servers' and the cloud's joules and every site's grams CO2e beside the clients'
    (cost.edge_power, cost.cloud_power, cost.carbon_intensity*), mean over seeds."""
    cols = [c for c in ("energy_j", "edge_energy_j", "cloud_energy_j", "carbon_g", "edge_carbon_g", "cloud_carbon_g")
            if c in last]
    if cols == ["energy_j"]:
        return ""
    table = last[cols].groupby(level="arm", sort=False).mean()
    table.columns = [{"energy_j": "clients (J)", "edge_energy_j": "edge servers (J)", "cloud_energy_j": "cloud (J)",
                      "carbon_g": "clients (g CO2e)", "edge_carbon_g": "edge servers (g CO2e)",
                      "cloud_carbon_g": "cloud (g CO2e)"}[c] for c in cols]
    source = last["carbon_intensity"].iloc[0] if "carbon_intensity" in last else None
    return (f"<h3>Clients, edge servers and the cloud</h3><p>Joules{' and grams CO2e' if source else ''} at the "
            f"end of each arm run, mean over seeds (the sites' joules include their PUE)"
            f"{f'; carbon intensity: {html.escape(str(source))}' if source else ''}.</p>"
            f"{_table(table.round(6).reset_index())}")


def _energy_views(study: Study, accounting: str) -> str:
    """Joules per round by state (mean over seeds, one panel per arm) and who pays: each client's
    joules over the run, spread across clients (a fairness view)."""
    from groupfel.cost_models.power import STATES

    from .plots import plt

    per_round, per_client = {}, []
    for a in study.arms:
        path = a.path / "energy.parquet"
        if not path.exists():
            continue
        e = pd.read_parquet(path, columns=["round", "client", "state", "joules"])
        e["state"] = e["state"].astype(str)
        per_round.setdefault(a.label, []).append(e.pivot_table(index="round", columns="state", values="joules",
                                                                aggfunc="sum", fill_value=0.0))
        c = e.groupby("client")["joules"].sum()
        per_client.append(pd.DataFrame({"arm": a.label, "seed": a.seed, "client": c.index, "joules": c.to_numpy()}))
    if not per_round:
        return ""
    arms = list(per_round)
    fig, axes = plt.subplots(1, len(arms), figsize=(4.2 * len(arms), 3.4), sharey=True, squeeze=False)
    for ax, arm in zip(axes[0], arms):
        mean = pd.concat(per_round[arm]).groupby(level=0).mean()
        mean = mean.reindex(columns=[s for s in STATES if s in mean.columns])
        bottom = np.zeros(len(mean))
        for state in mean.columns:
            ax.bar(mean.index, mean[state], bottom=bottom, label=state)
            bottom += mean[state].to_numpy()
        ax.set(title=arm, xlabel="global round")
        ax.set_xticks(mean.index)
        ax.grid(alpha=0.3, axis="y")
    axes[0][0].set_ylabel(f"joules per round (mean over seeds)\n{accounting}")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    clients = pd.concat(per_client, ignore_index=True)
    fig2, ax2 = plt.subplots(figsize=(max(4.0, 1.6 * len(arms)), 3.4))
    ax2.boxplot([clients.loc[clients.arm == arm, "joules"] for arm in arms])
    ax2.set_xticks(range(1, len(arms) + 1), arms)
    ax2.set(ylabel=f"a client's joules over the run\n({accounting}; every seed)", title="who pays: joules per client")
    ax2.grid(alpha=0.3, axis="y")
    fig2.tight_layout()

    def gini(x: np.ndarray) -> float:
        x = np.sort(np.asarray(x, dtype=float))
        return float((2 * np.arange(1, len(x) + 1) - len(x) - 1) @ x / (len(x) * x.sum())) if x.sum() > 0 else 0.0
    spread = clients.groupby(["arm", "seed"], sort=False)["joules"].agg(
        ["mean", "min", "max", gini]).groupby(level="arm", sort=False).mean()
    spread.columns = ["mean J per client", "least J", "most J", "Gini"]
    spread["most / mean"] = spread["most J"] / spread["mean J per client"]
    return (f"<h3>Joules per round by state</h3>{_png(fig)}<h3>Who pays: joules per client</h3>"
            f"<p>Each client's joules over its run (clients never sampled, and so charged nothing under "
            f"group-rounds, left out); the table is the mean over seeds of each run's spread (Gini 0: every "
            f"client pays alike).</p>{_table(spread.round(4).reset_index())}{_png(fig2)}")


def _grouping(study: Study) -> str:
    from .plots import plt

    rows, sizes, covs = [], {}, {}
    for a in study.arms:
        m = load_json(a.path / "manifest.json")
        g = m["grouping"]
        sizes.setdefault(a.label, []).extend(x["size"] for x in g["groups"])
        covs.setdefault(a.label, []).extend(x["cov"] for x in g["groups"])
        rows.append({"arm": a.label, "seed": a.seed, "policy": m["grouping_policy"], "groups": g["n_groups"],
                     "size min": g["size_min"], "size max": g["size_max"], "size mean": g["size_mean"],
                     "mean CoV": g["cov_mean"], "dropped": g["clients_dropped"],
                     "leftover rule": g["clients_touched_by_leftover_rule"]})
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4), dpi=100)
    top = max(max(v) for v in sizes.values())
    bins = np.arange(0.5, top + 1.5)
    for label, v in sizes.items():
        ax1.hist(v, bins=bins, histtype="step", linewidth=1.5, label=label)
    ax1.set(xlabel="group size (clients)", ylabel="groups (all seeds)", title="group sizes")
    for i, v in enumerate(covs.values()):    # one dot per group, jittered; the bar is the mean
        jitter = np.random.default_rng(i).uniform(-0.2, 0.2, len(v))
        ax2.scatter(v, i + jitter, s=10, alpha=0.6)
        ax2.plot([np.mean(v)] * 2, [i - 0.3, i + 0.3], color="k")
    ax2.set_yticks(range(len(covs)), list(covs))
    ax2.set(xlabel="group CoV (σ/μ of label counts)", title="group CoVs")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    ax1.legend(fontsize=7)
    fig.tight_layout()
    return _png(fig) + _table(pd.DataFrame(rows))


def _makespan(study: Study) -> tuple[str, str]:
    last = study.results.groupby(["arm", "seed"], sort=False).last().reset_index()
    rounds = study.results[study.results["round"] > 0]
    per_round = rounds.groupby("arm", sort=False)["round_time_s"].agg(["mean", "max"]) \
        if "round_time_s" in rounds else pd.DataFrame()
    table = last.groupby("arm", sort=False).agg(seeds=("seed", "nunique"), rounds=("round", "mean"),
                                                 sim_time_s=("sim_time_s", "mean"), cost=("cost", "mean"))
    table = table.join(per_round.add_prefix("round_time_s "), how="left").reset_index()
    versions, wall = {}, []
    for a in study.arms:
        m = load_json(a.path / "manifest.json")
        versions = m.get("versions", versions)
        if "numerics" in m:   # what decided the numbers: the kernels' mode and level, the BLAS, the threads
            n = m["numerics"]
            versions = {**versions, **n.get("versions", {}), "numerics": f"{n['mode']} (in effect: {n['in_effect']})",
                        "cpu": f"{n['cpu']} (ATen {n['cpu_capability']})", "blas": n.get("blas"),
                        "kernel settings": " ".join(f"{k}={v}" for k, v in n.get("env", {}).items() if v),
                        "torch threads": n.get("torch_threads")}
        wall.append({"arm": a.label, "seed": a.seed, "wall_s": m.get("wall_seconds_last_session", np.nan)})
    w = pd.DataFrame(wall)
    wall_html = (f"<p>Wall time of the last session of each arm run: total {w['wall_s'].sum():.1f} s "
                 f"(mean {w['wall_s'].mean():.1f} s per run).</p>")
    ver = _table(pd.DataFrame([{"package": k, "version": v} for k, v in versions.items()]))
    return (f"<p>Simulated wall-clock time: clients in parallel, a group round waits for its slowest member, "
            f"the cloud for its slowest group, plus link transfers.</p>{_table(table)}", wall_html + ver)


def _opening_sentence(study: Study) -> str:
    """A sweep's finding along its axes (:func:`groupfel.experiments.axes.opening_sentence`)."""
    from .axes import opening_sentence
    from .sweep import SweepConfig, reference_of

    summary = study.summary.copy()
    summary.attrs["axis_comparisons"] = int(sum(summary[c].notna().sum() for c in summary.columns
                                                if c.endswith("_vs_ref_p_holm")))
    return opening_sentence(summary, list(study.extra["sweep"]["axes"]),
                            reference_of(SweepConfig.model_validate(study.extra["sweep"])))


def _opening(study: Study) -> str:
    """What the page opens with: a sweep's finding along its axes, before how it was run."""
    return f"<p class='opening'><b>{html.escape(_opening_sentence(study))}</b></p>" if study.kind == "sweep" else ""


def _summary(study: Study) -> str:
    target = study.config.train.target_accuracy
    if study.kind == "multi-seed run":
        text = render_summary(study.summary, target)
        return (f"<p><b>{html.escape(conclusion(study.summary, target))}</b></p>"
                f"<pre>{html.escape(text)}</pre>")
    if study.kind == "sweep":
        from .stats import compact_summary, false_equivalent_note, notes

        axes = list(study.extra["sweep"]["axes"])
        cols = ["point", *axes, "arm", "seeds", "target_reached"]
        cols += [c for c in study.summary.columns if c.endswith(("_mean", "_ci95_low", "_ci95_high"))]
        plots = "".join(_png_file(p) for p in sorted(study.root.glob("*_vs_*.png")))
        compact = compact_summary(study.summary, ["point", *axes], target is not None)
        said = compact["verdict"]
        first = _opening_sentence(study)
        words = (f"{int(said.str.contains(' than ').sum())} of {int((said != 'reference').sum())} arms differ from "
                 f"their point's first arm in accuracy at equal cost after Holm's correction over the sweep, "
                 f"{int(said.str.startswith('equivalent').sum())} are equivalent to it; "
                 f"{int(said.str.startswith('undecided').sum())} comparisons are undecided (verdict column).")
        foot = "".join(f"<p>{html.escape(n)}</p>" for n in [*notes(study.summary, ALL_METRICS),
                                                             false_equivalent_note(study.summary, ALL_METRICS)] if n)
        return (f"<p><b>{html.escape(first)}</b></p><p>{html.escape(words)}</p><p>Mean [95 % CI] over seeds {study.extra['sweep']['seeds']}.</p>"
                f"{_table(compact)}{foot}<details><summary>full table (every metric, interval and paired "
                f"difference: summary.csv)</summary>{_table(study.summary[cols])}</details>{plots}")
    return "<p>One seed: no confidence intervals (give <code>seeds = [0, 1, 2]</code>).</p>" + _table(study.summary)


CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;color:#222}
h1{font-size:1.5em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:1.6em}
img{max-width:100%;display:block;margin:.6em 0}pre{background:#f6f6f6;padding:.8em;overflow:auto;font-size:12px}
table.t{border-collapse:collapse;font-size:12px;margin:.6em 0}table.t td,table.t th{padding:2px 8px;
border-bottom:1px solid #eee;text-align:right;white-space:nowrap}details{margin:.5em 0}"""

CHECK = """<script>
var errors = 0;
window.addEventListener('error', function () { errors += 1; document.body.dataset.errors = errors; }, true);
var consoleError = console.error;
console.error = function () { errors += 1; document.body.dataset.errors = errors; consoleError.apply(console, arguments); };
window.addEventListener('load', function () {
  var imgs = Array.prototype.slice.call(document.images);
  document.body.dataset.errors = errors;
  document.body.dataset.images = imgs.length;
  document.body.dataset.decoded = imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length;
});
</script>"""


def build_report(root: Path, out: Path | None = None, prepared: dict | None = None) -> Path:
    """Write the HTML page of a run or sweep directory; returns its path. ``prepared``: sections of
    :func:`prepare_sections`, used where drawn from the same arm runs as the study's."""
    import time

    from .plots import band_figure, energy_label

    t0 = time.perf_counter()
    study = load_study(Path(root))
    _check_numerics(study)
    pre = prepared if prepared is not None and prepared.get("arms") == _key(study.arms) else {}
    out = Path(out) if out else study.root / "report.html"
    energy = "energy_j" in study.results
    accounting = study.config.cost.energy_accounting
    bands = {x: _own_plot(study, x) or
             _png(band_figure({study.root.name: study.results}, x=x, title=f"{study.root.name}: accuracy",
                              xlabel=energy_label(accounting) if x == "energy_j" else None))
             for x in ("cost", "sim_time_s", *(("energy_j",) if energy else ()))}
    makespan, versions = _makespan(study)
    seeds = study.config.seed_list
    cost = _cost_model(study)
    title = f"groupfel {study.kind}: {study.root.name}"
    config_json = json.dumps(json.loads((study.root / ("sweep.json" if study.kind == "sweep" else "config.json"))
                                        .read_text()), indent=2)
    body = f"""<h1>{html.escape(title)}</h1>
<p>{html.escape(study.root.name)} · seeds {seeds} · {len(study.arms)} arm runs ·
generated {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}</p>
{_opening(study)}
<h2>What was run</h2>
<details><summary>configuration ({'sweep and its points' if study.kind == 'sweep' else 'resolved config'})</summary>
<pre>{html.escape(config_json)}</pre></details>
<p>Cost profiles: {', '.join(f'{d}/{study.config.cost.task}' for d in study.config.topology.devices)};
training <code>{cost.training_method}</code>; group operations
<code>{', '.join(cost.operations)}</code> (Eq. 5: K Σ<sub>i∈g</sub> (O<sub>g</sub>(|g|) + E·H(n<sub>i</sub>))).</p>
{pre.get('profiles') or _profiles_figure(cost)}
<h2>Accuracy against cost and simulated time</h2>
<p>Each seed's curve interpolated onto a common grid; line: mean, band: 95 % CI over seeds.</p>
{bands['cost']}{bands['sim_time_s']}
{_energy(study, bands) if energy else ""}
<h2>Summary</h2>
{_summary(study)}
<h2>Eq. 5 cost breakdown</h2>
{pre.get('breakdown') or _breakdown(study)}
<h2>Grouping</h2>
{pre.get('grouping') or _grouping(study)}
<h2>Makespan</h2>
{makespan}
<h2>Versions and wall time</h2>
{versions}
<p>Report built in {time.perf_counter() - t0:.1f} s.</p>"""
    page = (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{CSS}</style>{CHECK}</head>\n<body data-errors=\"0\">\n{body}\n</body></html>\n")
    atomic_write(out, lambda p: p.write_text(page))
    return out


def _check_numerics(study: Study) -> None:
    """One line when the run was made under other numerics or versions than this machine's."""
    from groupfel.emulator import numerics

    for a in study.arms[:1]:
        path = a.path / "manifest.json"
        if path.exists():
            numerics.check_loaded(study.root, load_json(path))   # damaged: one line naming it


def _cmd_report(args) -> int:
    from groupfel.emulator.io import check_writable

    out = Path(args.out) if args.out else Path(args.dir) / "report.html"
    check_writable(out, "file", "--out" if args.out else "report --out FILE.html (default DIR/report.html):")
    out = build_report(Path(args.dir), out)
    print(f"report: {out}")
    return 0


__all__ = ["build_report", "load_study"]
