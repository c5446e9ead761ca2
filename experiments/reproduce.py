"""``groupfel reproduce``: the papers' tables and figures, one command each, ours beside theirs.

Each reproduction is a folder of ``experiments/reproductions/``:

    reproduction.toml   what it reproduces (paper, table/figure, data), the table's keys and
                        metrics, settings applied on top of the base ([set]) and the quick mode's
                        scaled-down settings ([quick]); ``kind = "study"`` runs a ``groupfel study``
    sweep.toml          a sweep file (groupfel.experiments.sweep) over the figure's axes
    [sources]           (in reproduction.toml) where every setting's value comes from: see
                        :func:`setting_sources`
    base.toml           its base run config (or the sweep names a shared one)
    paper.csv           the paper's numbers (one row per table cell, a ``source`` column citing the
                        table or figure), or its claims (a ``claim`` column) where it gives a figure only

``experiments/reproductions/quick.toml`` holds the scaled-down settings every quick run shares.
A run resolves the sweep (and base) with those settings, writes them to the output directory,
runs them with :func:`groupfel.experiments.sweep.run_sweep` (any backend; a rerun resumes) and writes
``<name>.csv`` (ours beside the paper's), ``accuracy_vs_cost.png``, ``report.html`` and
``NOTES.txt`` (which dataset stood in for which, what quick mode scaled down).
"""
from __future__ import annotations

import copy
import csv
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from groupfel.errors import InputError

from .flags import toml_value

ROOT = Path(__file__).parent / "reproductions"
# The papers' datasets and what stands in for them here (neither CIFAR-10, Speech Commands nor
# HCCT's five digit datasets can be downloaded on these machines).
STAND_INS = {"cifar10": ("CIFAR-10", "Fashion-MNIST"), "speech-commands": ("Speech Commands", "FSDD"),
             "digit-five": ("HCCT's Digit", "digit-domains")}
# The authors' settings on the paper's own dataset (--data-path), where they differ from the stand-in's.
PAPER_DATA_SET = {("Group-FEL", "cifar10"): {"train.model": "resnet-3", "train.lr": 0.01, "train.batch_size": 10}}
DATA_NAMES = {"digits": "scikit-learn digits", "fashion-mnist": "Fashion-MNIST", "fsdd": "FSDD",
              "cifar10": "CIFAR-10", "speech-commands": "Speech Commands",
              "digit-domains": "digit-domains (2 real digit domains)",
              "digit-five": "HCCT's five digit datasets"}


@dataclass(frozen=True)
class Metric:
    """A table column: ``ours`` is a per-seed value: a headline metric of per_seed.csv
    (``final_acc``), a manifest grouping field (``grouping.size_mean``, or of the final groups in
    per-group mode, ``final_grouping.objective``) or the last evaluation of a results column
    (``last.ipr``); ``scale`` converts it to the paper's unit (100 for %)."""
    name: str
    ours: str
    scale: float = 1.0

    @property
    def bounds(self) -> tuple[float, float] | None:
        """The range the value can take, in the paper's unit (its intervals are clipped to it)."""
        from .stats import BOUNDS

        key = self.ours.rpartition(".")[2]
        lo, hi = BOUNDS.get(key, (0.0, float("inf")) if self.ours.startswith("grouping.") else (None, None))
        return None if lo is None else (lo * self.scale, hi * self.scale)


@dataclass(frozen=True)
class Reproduction:
    name: str
    title: str
    paper: str
    figure: str
    paper_data: str                      # the paper's dataset (a DataConfig.dataset name)
    kind: str = "sweep"                  # sweep | study
    keys: dict[str, str] = field(default_factory=dict)   # table column -> sweep axis (dotted path)
    metrics: tuple[Metric, ...] = ()
    set: dict[str, Any] = field(default_factory=dict)
    quick: dict[str, Any] = field(default_factory=dict)  # set / seeds / axes
    needs: str = ""                      # a missing feature: the run is refused with this line
    notes: str = ""                      # the paper's setting and where ours differs
    sources: dict[str, str] = field(default_factory=dict)  # setting key -> where its value comes from
    curves: tuple[str, ...] = ()         # results columns also drawn against the round (a learning-curve figure)

    @property
    def folder(self) -> Path:
        return ROOT / self.name


def load(name: str) -> Reproduction:
    """The reproduction NAME; a bad name fails with the list of names."""
    path = ROOT / name / "reproduction.toml"
    if not path.is_file():
        raise InputError(f"reproduce: no reproduction {name!r}; choose one of {', '.join(names())}")
    raw = tomllib.loads(path.read_text())
    raw["metrics"] = tuple(Metric(**m) for m in raw.get("metrics", []))
    raw["curves"] = tuple(raw.get("curves", ()))
    return Reproduction(name=name, **raw)


def names() -> list[str]:
    return sorted(p.parent.name for p in ROOT.glob("*/reproduction.toml"))


def data_used(rep: Reproduction, quick: bool) -> str:
    """Which dataset the run uses, and for which of the paper's it stands in."""
    if rep.kind == "study":
        return "synthetic Dir(α) label matrices, as the paper"
    dataset = resolve(rep, quick)[1]["data"]["dataset"]
    full = resolve(rep, False)[1]["data"]["dataset"]
    paper = DATA_NAMES[rep.paper_data]
    if dataset == rep.paper_data:
        return paper
    if dataset != full:
        return f"{DATA_NAMES[dataset]} stands in for {DATA_NAMES[full]}" + (f" (for {paper})" if full != rep.paper_data else "")
    return f"{DATA_NAMES[dataset]} stands in for {paper}"


def list_table() -> str:
    rows = [("name", "paper", "table/figure", "data (full run)", "data (--quick)")]
    for n in names():
        rep = load(n)
        status = f" [needs {rep.needs.split(' (')[0]}]" if rep.needs else ""
        rows.append((n, rep.paper, rep.figure + status, data_used(rep, False), data_used(rep, True)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


# ----------------------------------------------------------------------------- resolving
def parse_overrides(items: list[str] | None) -> dict[str, Any]:
    """``--set PATH=VALUE`` items as {dotted path: value}; VALUE is a TOML value (a bare word is a
    string: ``train.model=mlp``)."""
    out: dict[str, Any] = {}
    for item in items or []:
        path, sep, text = item.partition("=")
        if not sep or not path.strip() or not text.strip():
            raise InputError(f"reproduce --set {item!r}: write PATH=VALUE, e.g. --set train.model=mlp")
        out[path.strip()] = toml_value(text.strip())
    return out


def resolve(rep: Reproduction, quick: bool, data_path: str | None = None,
            overrides: dict[str, Any] | None = None) -> tuple[dict, dict, list[str]]:
    """(sweep, base) as raw dicts with the reproduction's settings (and quick mode's, then the
    user's ``overrides``) applied, and one line per setting changed from the paper's run
    ("path: full -> ours")."""
    from .sweep import set_path

    sweep = tomllib.loads((rep.folder / "sweep.toml").read_text())
    base_path = (rep.folder / sweep["base"]).resolve()
    base = tomllib.loads(base_path.read_text())
    # reproductions give the same numbers on any x86-64 CPU with AVX2 (groupfel.emulator.numerics)
    base.setdefault("train", {}).setdefault("numerics", "portable")
    for path, value in copy.deepcopy(rep.set).items():   # a later setting below a table must not edit rep.set
        set_path(base, path, value)
    path = _get(base, "data.path")
    if path and not Path(path).is_absolute():   # relative to the repository root (shared/ beside it)
        set_path(base, "data.path", str((ROOT.parents[1] / path).resolve()))
    changed = []
    if data_path:
        set_path(base, "data.dataset", rep.paper_data)
        set_path(base, "data.path", str(Path(data_path).resolve()))
        for path, value in PAPER_DATA_SET.get((rep.paper, rep.paper_data), {}).items():
            set_path(base, path, value)
    elif quick:
        shared = _quick_shared() if rep.quick.get("shared", True) else {}
        for path, value in copy.deepcopy({**shared.get("set", {}), **rep.quick.get("set", {})}).items():
            old = _get(base, path)
            set_path(base, path, value)
            if old != value:
                changed.append(f"{path}: {old!r} -> {value!r}")
        seeds = rep.quick.get("seeds", shared.get("seeds", sweep["seeds"]))
        axes = {**sweep["axes"], **rep.quick.get("axes", {})}
        for key, value in (("seeds", seeds), ("axes", axes)):
            if sweep[key] != value:
                changed.append(f"sweep {key}: {sweep[key]!r} -> {value!r}")
            sweep[key] = value
    for path, value in (overrides or {}).items():
        if path.startswith(ARMS_ALL):   # every arm, in the base and in each arms axis value
            _set_every_arm(sweep, base, path, value)
            changed.append(f"{path}: -> {value!r} in every arm (--set)")
            continue
        old = _get(base, path)
        set_path(base, path, value)
        if old != value:
            changed.append(f"{path}: {old!r} -> {value!r} (--set)")
    sweep["base"] = "base.toml"
    return sweep, base, changed


ARMS_ALL = "arms.*."   # --set arms.*.PATH=VALUE: PATH in every arm the reproduction runs


def _set_every_arm(sweep: dict, base: dict, path: str, value: Any) -> None:
    """``arms.*.PATH`` set in every arm of the base config and of every value of an ``arms`` axis
    (a reproduction whose points run different arms: HCCT Table 4's)."""
    from .sweep import set_path

    rest = path.removeprefix(ARMS_ALL)
    arms = [*base.get("arms", []), *(a for value_ in sweep.get("axes", {}).get("arms", []) for a in value_)]
    if not rest or not arms:
        raise InputError(f"reproduce --set {path}=...: write arms.*.PATH=VALUE (e.g. arms.*.grouping.first=global), "
                         f"for a reproduction that runs arms")
    for arm in arms:
        set_path(arm, rest, copy.deepcopy(value))


def _quick_shared() -> dict:
    return tomllib.loads((ROOT / "quick.toml").read_text())


def _get(raw: dict, path: str) -> Any:
    node: Any = raw
    for key in path.split("."):
        try:
            node = node[int(key)] if isinstance(node, list) else node[key]
        except (KeyError, IndexError, ValueError):
            return None
    return node


def point_configs(rep: Reproduction, quick: bool):
    """The validated run config of every point (no running): what the tests check."""
    return point_configs_of(*resolve(rep, quick)[:2])


def point_configs_of(sweep: dict, base: dict):
    from .sweep import SweepConfig, point_configs as configs

    return configs(SweepConfig.model_validate(sweep), base)


# ----------------------------------------------------------------------------- sources
SOURCE_KINDS = ("paper", "code", "assumed")
# run bookkeeping, not settings of the experiment (and every arm's name)
NOT_SETTINGS = {"name", "seed", "seeds", "output_dir", "data.path"}


def _leaves(node: Any, prefix: str) -> list[str]:
    """Dotted paths of every scalar (or list of scalars) under ``node``; tables in lists by index."""
    if isinstance(node, dict):
        return [leaf for k, v in node.items() for leaf in _leaves(v, f"{prefix}.{k}" if prefix else str(k))]
    if isinstance(node, list) and node and all(isinstance(v, dict) for v in node):
        return [leaf for i, v in enumerate(node) for leaf in _leaves(v, f"{prefix}.{i}")]
    return [prefix]


def _under(path: str, key: str) -> bool:
    """``path`` is ``key`` or below it; ``*`` in ``key`` matches any one component."""
    p, k = path.split("."), key.split(".")
    return len(k) <= len(p) and all(kc in ("*", pc) for kc, pc in zip(k, p))


def _best(path: str, table: dict[str, str]) -> str | None:
    keys = [k for k in table if _under(path, k)]
    return max(keys, key=lambda k: (len(k.split(".")), -k.count("*"))) if keys else None


def _source_tables(rep: Reproduction) -> tuple[dict[str, str], dict[str, str]]:
    """(the shared base's sources, quick.toml's sources as ``quick.<path>``)."""
    base: dict[str, str] = {}
    if rep.kind == "sweep":
        sweep = tomllib.loads((rep.folder / "sweep.toml").read_text())
        path = ROOT / f"{Path(sweep['base']).stem}.sources.toml"
        if (rep.folder / sweep["base"]).resolve().parent == ROOT.resolve() and path.is_file():
            base = tomllib.loads(path.read_text())
    quick = {("quick." + k): v for k, v in _quick_shared().get("sources", {}).items()}
    return base, quick


def setting_leaves(rep: Reproduction) -> dict[str, str]:
    """Every setting a run of ``rep`` uses -> which file sets it: ``rep`` (reproduction.toml or its
    sweep.toml), ``base`` (the base config) or ``quick`` (quick.toml). Full-mode settings are
    run-config paths (``data.alpha``), sweep settings ``sweep.seeds`` / ``sweep.axes.<axis>``,
    quick-mode ones ``quick.<path>``, ``quick.seeds``, ``quick.axes.<axis>``."""
    out: dict[str, str] = {}
    if rep.kind == "sweep":
        sweep = tomllib.loads((rep.folder / "sweep.toml").read_text())
        base = tomllib.loads((rep.folder / sweep["base"]).read_text())
        from .sweep import set_path

        for path, value in rep.set.items():
            set_path(base, path, value)
        for leaf in _leaves(base, ""):
            if leaf not in NOT_SETTINGS and not leaf.endswith(".name"):
                out[leaf] = "rep" if any(_under(leaf, p) for p in rep.set) else "base"
        out["sweep.seeds"] = "rep"
        if "mode" in sweep:
            out["sweep.mode"] = "rep"
        out.update({f"sweep.axes.{a}": "rep" for a in sweep["axes"]})
        if rep.quick.get("shared", True):
            shared = _quick_shared()
            out.update({f"quick.{p}": "quick" for p in shared.get("set", {})})
            out["quick.seeds"] = "quick"
    for path in rep.quick.get("set", {}):
        out[f"quick.{path}"] = "rep"
    out.update({f"quick.axes.{a}": "rep" for a in rep.quick.get("axes", {})})
    for key in ("seeds", "max_clients"):
        if key in rep.quick:
            out[f"quick.{key}"] = "rep"
    return out


def setting_sources(rep: Reproduction) -> dict[str, tuple[str, str]]:
    """Every setting of ``rep`` -> (the sources key that covers it, its source).

    A source is the paper (``paper: Group-FEL Sec. 6.2``), the authors' code (``code: OWNER/REPO
    FILE``) or an assumption (``assumed: REASON``). Keys are setting paths (see
    :func:`setting_leaves`); a key covers the settings below it and ``*`` matches one component
    (``arms.*.grouping.max_cov``); the longest key wins. reproduction.toml's ``[sources]`` must
    cover every setting it or its sweep sets; a shared base's settings may be covered by its
    ``<base>.sources.toml`` and quick.toml's by its own ``[sources]``. A setting without a source,
    a source of no known kind or a key that covers no setting fails with the key's name."""
    where = f"experiments/reproductions/{rep.name}/reproduction.toml [sources]"
    for table, name in ((rep.sources, where), *zip(_source_tables(rep), ("the base's sources", "quick.toml [sources]"))):
        for key, text in table.items():
            kind, sep, rest = str(text).partition(":")
            if kind not in SOURCE_KINDS or not sep or not rest.strip():
                raise InputError(f"{name}: {key!r} = {text!r}: start it with one of "
                                 f"{', '.join(k + ':' for k in SOURCE_KINDS)} and say which section, file or reason")
    base, quick = _source_tables(rep)
    leaves = setting_leaves(rep)
    out: dict[str, tuple[str, str]] = {}
    for leaf, origin in leaves.items():
        key = _best(leaf, rep.sources)
        table = rep.sources
        if key is None and origin != "rep":
            table = base if origin == "base" else quick
            key = _best(leaf, table)
        if key is None:
            raise InputError(f"{where}: no source for {leaf!r}; add \"{leaf}\" = \"paper: ...\", "
                             "\"code: ...\" or \"assumed: ...\"")
        out[leaf] = (key, table[key])
    unused = [k for k in rep.sources if not any(_under(leaf, k) for leaf in leaves)]
    if unused:
        raise InputError(f"{where}: {unused[0]!r} names no setting of this reproduction; remove it or fix its path")
    return out


def sources_text(rep: Reproduction, quick: bool) -> list[str]:
    """One line per sources key in use: ``key: source`` (quick-mode keys only when ``quick``)."""
    seen: dict[str, str] = {}
    for leaf, (key, text) in setting_sources(rep).items():
        if quick or not leaf.startswith("quick."):
            seen.setdefault(key, text)
    return [f"{k}: {v}" for k, v in seen.items()]


# ----------------------------------------------------------------------------- the table
def paper_rows(rep: Reproduction) -> list[dict[str, str]]:
    with open(rep.folder / "paper.csv", newline="") as f:
        return list(csv.DictReader(f))


def _per_seed(rep: Reproduction, point_dir: Path, arm: str, seeds: list[int], runs) -> dict[str, list[float]]:
    import pandas as pd

    per_seed = pd.read_csv(point_dir / "per_seed.csv")
    out = {}
    for m in rep.metrics:
        values = []
        for s in seeds:
            if m.ours.startswith(("grouping.", "final_grouping.")):
                manifest = json.loads((point_dir / f"seed-{s}" / arm / "manifest.json").read_text())
                which, _, key = m.ours.partition(".")
                v = (manifest.get(which) or {}).get(key)
            elif m.ours.startswith("last."):
                r = runs[(runs["seed"] == s) & (runs["arm"] == arm)]
                v = r[m.ours.removeprefix("last.")].iloc[-1] if len(r) else None
            else:
                v = per_seed.loc[(per_seed["seed"] == s) & (per_seed["arm"] == arm), m.ours].iloc[0]
            values.append(float("nan") if v is None else float(v) * m.scale)
        out[m.name] = values
    return out


def _matches(row: dict[str, str], key_values: dict[str, Any]) -> bool:
    for k, v in key_values.items():
        if k not in row:
            continue
        try:
            if abs(float(row[k]) - float(v)) > 1e-9:
                return False
        except ValueError:
            if str(row[k]) != str(v):
                return False
    return True


def comparison(rep: Reproduction, root: Path):
    """One row per point x arm x metric: the keys, ours (mean, 95 % CI over seeds) and the paper's."""
    import pandas as pd

    from .stats import clip, mean_ci
    from .sweep import point_name

    sweep = json.loads((root / "sweep.json").read_text())
    seeds = sweep["sweep"]["seeds"]
    runs = pd.read_csv(root / "runs.csv")
    arms = list(dict.fromkeys(runs["arm"]))
    paper = paper_rows(rep)
    short = {v: k for k, v in rep.keys.items()}
    rows = []
    for i, point in enumerate(sweep["points"].values()):
        keys = {short.get(p, p): v for p, v in point.items() if p in short}
        d = root / point_name(i)
        point_runs = runs[runs["point"] == point_name(i)]
        for arm in [a for a in arms if a in set(point_runs["arm"])]:   # a point may run some arms only
            match = [r for r in paper if "claim" not in r and _matches(r, {**keys, "arm": arm})]
            bounds = {m.name: m.bounds for m in rep.metrics}
            for metric, values in _per_seed(rep, d, arm, seeds, point_runs).items():
                mean, low, high = mean_ci(values)
                low, high, clipped = clip(low, high, bounds[metric])
                cell = match[0].get(metric, "") if match else ""
                rows.append({**keys, "arm": arm, "metric": metric, "ours": mean, "ci95_low": low,
                             "ci95_high": high, "ci95_clipped": clipped, "seeds": sum(v == v for v in values),
                             "paper": float(cell) if cell not in ("", None) else float("nan")})
    return pd.DataFrame(rows)


def render(table) -> str:
    from .stats import CLIPPED_NOTE, TWO_SEEDS_NOTE

    def cell(r):
        if r["ours"] != r["ours"]:
            return "—"
        ci = f" [{r['ci95_low']:.4g}, {r['ci95_high']:.4g}]" if r["ci95_low"] == r["ci95_low"] else ""
        return f"{r['ours']:.4g}{ci}{'†' if bool(r.get('ci95_clipped', False)) else ''}"

    shown = table.assign(ours=[cell(r) for _, r in table.iterrows()],
                         paper=[f"{p:.4g}" if p == p else "—" for p in table["paper"]])
    text = shown.drop(columns=["ci95_low", "ci95_high", "ci95_clipped"], errors="ignore").to_string(index=False)
    if "ci95_clipped" in table and table["ci95_clipped"].astype(bool).any():
        text += "\n" + CLIPPED_NOTE.replace("accuracy in [0, 1]", "accuracy in [0, 1] or [0, 100] %")
    if len(table) and int(table["seeds"].max()) == 2:
        text += "\n" + TWO_SEEDS_NOTE
    return text


def figure(rep: Reproduction, root: Path, out: Path, log_cost: bool = False, x: str = "cost",
           y: str = "accuracy") -> Path:
    """Accuracy against Eq. 5 cost (or column ``y`` against ``x``): one mean curve (95 % band over
    seeds) per point and arm. ``log_cost``: a logarithmic cost axis from the first evaluation on,
    where methods that meet at a plateau still differ early in training."""
    import pandas as pd

    from groupfel.emulator.io import atomic_write

    from .plots import band_figure, plt

    runs = pd.read_csv(root / "runs.csv")
    short = {v: k for k, v in rep.keys.items()}
    axes = json.loads((root / "sweep.json").read_text())["sweep"]["axes"]
    labelled = {}
    for point, df in runs.groupby("point", sort=True):
        label = ", ".join(f"{short.get(a, a.rsplit('.', 1)[-1])}={df[a].iloc[0]}" for a in axes
                          if runs.groupby("point")[a].nunique().max() == 1 and runs[a].nunique() > 1
                          and not str(df[a].iloc[0]).startswith(("[", "{"))) or point   # an arms list names itself per curve
        labelled[label] = df
    fig = band_figure(labelled, x=x, y=y, title=f"{rep.paper} {rep.figure} (groupfel)")
    fig.axes[0].set_ylim(0, 1)   # 2-seed t bands reach far past [0, 1]
    if log_cost:
        fig.axes[0].set_xscale("log", nonpositive="mask")
        trained = runs.loc[runs["cost"] > 0]
        fig.axes[0].set_xlim(left=float(trained["cost"].min()))
        fig.axes[0].set_ylim(max(0.0, float(trained["accuracy"].min()) - 0.02),
                             min(1.0, float(trained["accuracy"].max()) + 0.02))
    atomic_write(out, lambda p: fig.savefig(p, format="png"))
    plt.close(fig)
    return out


# ----------------------------------------------------------------------------- running
def notes(rep: Reproduction, quick: bool, changed: list[str], data_path: str | None) -> str:
    lines = [f"{rep.paper} {rep.figure}: {rep.title}", f"data: {data_used(rep, quick) if not data_path else DATA_NAMES[rep.paper_data] + ' from ' + data_path}"]
    if quick:
        lines.append("quick mode: NOT the paper's setting; scaled down for a first look on 2 cores:")
        lines += [f"  {c}" for c in changed]
    elif changed:
        lines.append("changed from the paper's setting:")
        lines += [f"  {c}" for c in changed]
    if rep.notes:
        lines.append(f"setting: {rep.notes.strip()}")
    lines.append("settings and their sources (paper: the paper's text; code: the authors' code; assumed: ours):")
    lines += [f"  {line}" for line in sources_text(rep, quick)]
    return "\n".join(lines)


def run_study(rep: Reproduction, quick: bool, out: Path) -> int:
    from . import grouping_studies

    kwargs = {"seed": 0}
    if rep.name == "fig5":
        kwargs["max_clients"] = rep.quick.get("max_clients", 1000) if quick else 10000
    df = getattr(grouping_studies, rep.name)(out, **kwargs)
    print(notes(rep, quick, [f"max_clients: 10000 -> {kwargs['max_clients']}"] if "max_clients" in kwargs and quick
                else [], None))
    print(df.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    claims = paper_rows(rep) if (rep.folder / "paper.csv").is_file() else []
    for c in claims:
        print(f"paper ({c['source']}): {c['claim']}")
    print(f"\ncompare {out / (rep.name + '.png')} with the paper's {rep.figure} (this is `groupfel study {rep.name}`)")
    return 0


def run(name: str, *, quick: bool = False, backend: str = "local", jobs: int | None = None,
        output: str | None = None, data_path: str | None = None, progress: bool = True,
        overrides: dict[str, Any] | None = None, stack: int | None = None, track=None) -> int:
    from contextlib import ExitStack

    import tomli_w

    from groupfel.emulator.io import atomic_write, check_writable, run_lock

    from .sweep import SweepConfig, run_loaded_sweep

    rep = load(name)
    setting_sources(rep)                     # every setting names its source, before any work
    if rep.needs:
        raise InputError(f"reproduce {name}: needs {rep.needs}, which this version of groupfel lacks")
    if data_path and rep.paper_data not in STAND_INS:
        raise InputError(f"reproduce --data-path: {name} already uses the paper's dataset "
                         f"({DATA_NAMES[rep.paper_data]}); leave --data-path out")
    from groupfel.topologies.datasets import DATASETS

    if data_path and rep.paper_data not in DATASETS:
        raise InputError(f"reproduce --data-path: groupfel cannot read {DATA_NAMES[rep.paper_data]}; "
                         f"leave --data-path out")
    for path in overrides or {}:   # the sweep names its points and runs its seeds at every one: ignored
        if path in ("seed", "seeds", "max_seeds", "seed_batch", "name", "output_dir"):
            raise InputError(f"reproduce --set {path}=...: a reproduction runs its sweep's seeds at every point, "
                             f"names the points itself and writes to --output, so {path} would be ignored; leave "
                             f"it out")
    if overrides and rep.kind == "study":
        raise InputError(f"reproduce {name} --set: {name} is `groupfel study {name}`, which has no run "
                         "settings to change; leave --set out")
    out = check_writable(Path(output) if output else Path("results/reproductions") / (name + ("-quick" if quick else "")),
                         "dir", "--output")
    if rep.kind == "study":
        return run_study(rep, quick, out)
    sweep, base, changed = resolve(rep, quick, data_path, overrides)
    sweep["name"] = name
    if stack:   # how the runs share the machine, not a change of the paper's setting
        base.setdefault("train", {})["stack"] = stack
    from groupfel.emulator import numerics

    numerics.apply(base.get("train", {}).get("numerics", "native"))   # before anything loads torch
    try:
        point_configs_of(sweep, base)        # a bad --set fails here, before anything is written
    except InputError as exc:
        for path, value in (overrides or {}).items():   # name the --set item first
            if str(exc).startswith(f"config: {path}:"):
                detail = str(exc).removeprefix(f"config: {path}:").split(" (in sweep point")[0].strip()
                raise InputError(f"reproduce --set {path}={value!r}: {detail}") from None
        raise
    text = notes(rep, quick, changed, data_path)
    print(text)

    with ExitStack() as held:
        def write_inputs(root: Path) -> None:   # once every point is valid (its data found), under the lock,
            held.enter_context(run_lock(root))   # which stays held for the tables and figures below
            atomic_write(root / "base.toml", lambda p: p.write_text(tomli_w.dumps(base)))
            atomic_write(root / "sweep.toml", lambda p: p.write_text(tomli_w.dumps(sweep)))

        run_loaded_sweep(SweepConfig.model_validate(sweep), base, backend=backend, jobs=jobs, output=out,
                         progress=progress, before_write=write_inputs, track=track)
        return _finish(rep, name, out, text, sweep)


def _finish(rep: Reproduction, name: str, out: Path, text: str, sweep: dict) -> int:
    from groupfel.emulator.io import atomic_write

    from .report import build_report
    from .runner import diverged_runs, report_diverged

    table = comparison(rep, out)
    atomic_write(out / f"{name}.csv", lambda p: table.to_csv(p, index=False))
    fig = figure(rep, out, out / "accuracy_vs_cost.png")
    fig_log = figure(rep, out, out / "accuracy_vs_cost_log.png", log_cost=True)
    curves = [figure(rep, out, out / f"{y}_vs_round.png", x="round", y=y) for y in rep.curves]
    report = build_report(out)
    atomic_write(out / "NOTES.txt", lambda p: p.write_text(text + "\n"))
    # one line per (seed, arm) run that stopped diverged, so that the committed folder records it
    atomic_write(out / "diverged.txt", lambda p: p.write_text("".join(f"{line}\n" for line in diverged_runs(out))))
    claims = [r for r in paper_rows(rep) if "claim" in r]
    print(f"\nours: mean [95 % CI] over seeds {sweep['seeds']}; paper: {rep.paper} {rep.figure}")
    print(render(table))
    for c in claims:
        print(f"paper ({c['source']}): {c['claim']}")
    if claims:
        print(ranking(table))
    print(f"\ntable: {out / (name + '.csv')}\nfigure: {fig} (log cost: {fig_log.name})"
          + "".join(f"\nfigure: {c}" for c in curves) + f"\nreport: {report}\nnotes: {out / 'NOTES.txt'}")
    return report_diverged(out)


def ranking(table) -> str:
    """Ours ranked by the first metric (for figures whose paper claim is an order)."""
    first = table[table["metric"] == table["metric"].iloc[0]].sort_values("ours", ascending=False)
    keys = [c for c in table.columns if c not in ("metric", "ours", "ci95_low", "ci95_high", "ci95_clipped", "seeds", "paper")]
    items = [" ".join(str(r[k]) for k in keys) + f" {r['ours']:.4g}" for _, r in first.iterrows()]
    return f"ours, ranked by {first['metric'].iloc[0]}: " + " > ".join(items)
