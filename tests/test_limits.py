"""Every number at its limits, by construction.

The numeric config fields are read off the pydantic models and the numeric flags off the
argparse parsers; each is tried with every value of LIMITS. It must either stop with exit 2 and
one line naming the field or flag (writing nothing), or run to finite outputs: no inf or NaN in
results, ledger or manifest, and no round that costs 0. A field or flag the harness has no base
for fails test_every_field_and_flag_is_covered, so a new one is covered when it is added.

The parse-level verdict of every (field or flag, value) runs by default; the runs of the values
that are accepted are slow (marked), except a few in the default suite.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import types
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

import numpy as np
import pandas as pd
import pytest
from pydantic import BaseModel

from conftest import TINY, write_toml
from groupfel.emulator.config import RunConfig, parse_config
from groupfel.errors import InputError
from groupfel.experiments import flags
from groupfel.experiments.cli import build_parser, main

LIMITS = ["0", "-1", "1e-300", "1e308", "nan", "inf", str(2**63), "abc", ""]


# -- the config's numeric fields ---------------------------------------------------------------------

def _leaves(tp) -> list[tuple]:
    origin = get_origin(tp)
    if origin is Annotated:
        return _leaves(get_args(tp)[0])
    if origin in (Union, types.UnionType):
        return [leaf for a in get_args(tp) for leaf in _leaves(a)]
    if origin in (list, dict):
        return [("[]" if origin is list else "{}", *leaf) for leaf in _leaves(get_args(tp)[-1])]
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [("model", tp)]
    return [("num",)] if tp in (int, float) else []


def numeric_fields(model: type[BaseModel] = RunConfig, prefix: str = "") -> list[str]:
    """Every int or float a config holds, as a path: ``topology.devices{}``, ``seeds[]``."""
    out = set()
    for name, f in model.model_fields.items():
        for leaf in _leaves(f.annotation):
            path = prefix + name + "".join(p for p in leaf if p in ("[]", "{}"))
            if "model" in leaf:
                out |= set(numeric_fields(leaf[-1], path + "."))
            else:
                out.add(path)
    return sorted(out)


def _tiny() -> dict:
    d = copy.deepcopy(TINY)
    d["arms"] = [d["arms"][1]]
    d["train"].update(rounds=1, group_rounds=1)
    d["faults"] = {}
    return d


def _shift(d, partition, field, value):
    d["data"].update(partition=partition, min_samples=20, max_samples=20,
                     types=[{"clients": 6, field: value}, {"clients": 6, field: value}])


def _per_group_arrivals(d):
    d.update(mode="per-group")
    d["topology"]["arrivals"] = {"initial": 6, "every": 1, "per_arrival": 6}
    d["train"]["rounds"] = 2


# the base config in which each field means something (by the longest matching prefix)
BASES = {
    "": lambda d: None,
    "seeds[]": lambda d: (d.pop("seed"), d.update(seeds=[1])),
    "arms[].sampling.data_fraction": lambda d: d["arms"][0].update(sampling={"policy": "random", "data_fraction": 0.5}),
    "data.n_shards": lambda d: d["data"].update(partition="shards", n_shards=12),
    "data.types[].label_weights[]": lambda d: _shift(d, "label-shift", "label_weights", [1.0] * 10),
    "data.types[].rotation": lambda d: _shift(d, "feature-shift", "rotation", 90.0),
    "data.types[].permutation[]": lambda d: _shift(d, "concept-shift", "permutation", list(range(10))),
    "data.types[].domain": lambda d: _shift(d, "feature-shift", "domain", 0),
    "data.types[].clients": lambda d: _shift(d, "concept-shift", "permutation", list(range(10))),
    "data.types[].samples": lambda d: _shift(d, "concept-shift", "permutation", list(range(10))),
    "faults.straggler.sigma": lambda d: d["faults"].update(straggler={"distribution": "lognormal"}),
    "faults.straggler.shape": lambda d: d["faults"].update(straggler={"distribution": "pareto"}),
    "faults.recovery_multiple": lambda d: d["faults"].update(dropout=0.3),
    "topology.arrivals": _per_group_arrivals,
    "topology.client_link": lambda d: d["topology"].update(client_link={"bandwidth_mbps": 20.0, "latency_s": 0.02}),
    "topology.edge_link": lambda d: d["topology"].update(edge_link={"bandwidth_mbps": 1000.0, "latency_s": 0.01}),
    "topology.availability": lambda d: d["topology"].update(availability={"mean_on_s": 40.0, "mean_off_s": 10.0}),
    "topology.heterogeneity": lambda d: d["topology"].update(heterogeneity={}),
    "topology.clients_per_edge[]": lambda d: d["topology"].update(clients_per_edge=[6, 6]),
    "topology.edge_access_mbps": lambda d: d["topology"].update(edge_access_mbps=50.0),
    "topology.devices{}": lambda d: d["topology"].update(devices={"raspberry-pi-4": 1.0}),
    "train.budget": lambda d: d["train"].update(budget=1e6),
    "train.mu": lambda d: d["train"].update(algorithm="fedprox"),
}


def _set(d: dict, path: str, value: Any) -> None:
    """Put ``value`` at ``path`` (``[]``: the first element, ``{}``: the first key)."""
    keys = path.split(".")
    for i, key in enumerate(keys):
        name, rest = key.split("[]")[0].split("{}")[0], key[len(key.split("[]")[0].split("{}")[0]):]
        last = i == len(keys) - 1
        holder = d[0] if isinstance(d, list) else d
        if not rest:
            if last:
                holder[name] = value
            else:
                d = holder.setdefault(name, {})
            continue
        inner = holder[name]
        if rest == "[]":
            if last:
                inner[0] = value
            else:
                d = inner
        else:   # {}
            inner[next(iter(inner))] = value


def field_config(path: str, value: Any) -> dict:
    d = _tiny()
    base = max((p for p in BASES if path.startswith(p)), key=len)
    BASES[base](d)
    _set(d, path, value)
    return d


def _value(text: str) -> Any:
    """The TOML value a user would write for a limit: numbers as numbers, the rest as strings."""
    try:
        v = float(text)
    except ValueError:
        return text
    return int(text) if text.lstrip("-").isdigit() else v


def _leaf(path: str) -> str:
    return path.split(".")[-1].rstrip("[]{}")


def verdicts() -> list[tuple[str, str, str | None]]:
    """(field, value, None if accepted else the one-line error) for every field and limit."""
    out = []
    for path in numeric_fields():
        for text in LIMITS:
            try:
                parse_config(field_config(path, _value(text)))
                out.append((path, text, None))
            except InputError as exc:
                out.append((path, text, str(exc)))
    return out


# -- the parsers' numeric flags ----------------------------------------------------------------------

def numeric_flags() -> list[tuple[str, str]]:
    """(subcommand, flag) of every numeric flag: typed by :class:`flags.Number` or holding sizes."""
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    out = set()
    for name, parser in sub.choices.items():
        for a in parser._actions:
            if a.type in (int, float):
                raise AssertionError(f"{name} {a.option_strings}: a bare {a.type.__name__}; give it a flags.Number")
            if isinstance(a.type, (flags.Number, flags.SizesText)):
                out.add((name, a.option_strings[-1]))
    return sorted(out)


def _flag_bases(tmp: Path) -> dict[tuple[str, str], list[str]]:
    labels = tmp / "labels.csv"
    labels.write_text("c0,c1,c2\n" + "\n".join(f"{i % 5},{(i * 3) % 7},{i % 2 + 1}" for i in range(12)) + "\n")
    cfg = write_toml(tmp, _tiny(), "tiny.toml")
    out = str(tmp / "out")
    edge = ["whatif", "--clients", "200", "--rounds", "2", "--group-sizes", "2..6:2", "--edge-clients", "12",
            "--out", out]
    grouped = ["whatif", "--policy", "covg", "--alpha", "0.5", "--clients", "200", "--clients-per-edge", "100",
               "--rounds", "2", "--jobs", "1", "--out", out]
    run = ["run", str(cfg), "--output", out, "--quiet"]
    bases = {("run", f): run for f in ("--jobs", "--gpus-per-task", "--stack")}
    bases |= {("run", "--max-seeds"): [*run, "--seeds", "auto"]}
    bases |= {("sweep", f): ["sweep", str(tmp / "none.toml"), "--output", out] for f in ("--jobs", "--gpus-per-task", "--stack")}
    bases |= {("reproduce", f): ["reproduce", "table1", "--output", out] for f in ("--jobs", "--stack")}
    bases |= {("measure", f): ["measure", "secagg", "--sizes", "2", "--params", "16", "--repeats", "1",
                               "--out", str(tmp / "out.csv")] for f in ("--repeats", "--params", "--threads", "--sizes")}
    bases |= {("group", f): ["group", "--policy", "covg", "--label-matrix", str(labels)]
              for f in ("--min-group-size", "--max-cov", "--seed")}
    bases |= {("study", f): ["study", "fig5", "--max-clients", "100", "--out", out] for f in ("--max-clients", "--seed")}
    bases |= {("timeline", "--round"): ["timeline", str(tmp / "no-run")]}
    bases |= {("whatif", f): edge for f in ("--clients", "--samples-mean", "--rounds", "--group-rounds",
                                             "--local-epochs", "--groups-per-round", "--participation", "--seed",
                                             "--access-mbps", "--edge-cores", "--edge-clients", "--model-mb",
                                             "--client-mbps", "--latency-s", "--group-sizes")}
    bases |= {("whatif", f): grouped for f in ("--alpha", "--clients-per-edge", "--labels", "--max-cov", "--jobs",
                                                "--min-group-size")}
    return bases


def _default(command: str, flag: str):
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return next(a.default for a in sub.choices[command]._actions if flag in a.option_strings)


# -- the checks ----------------------------------------------------------------------------------------

def _finite_json(obj, where: str) -> None:
    if isinstance(obj, float):
        assert math.isfinite(obj), where
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _finite_json(v, f"{where}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            _finite_json(v, f"{where}[{i}]")


def _check_run_outputs(out: Path) -> None:
    for results in out.rglob("results.csv"):
        df = pd.read_csv(results)
        for col in ("cost", "sim_time_s", "accuracy", "loss"):
            if col in df:
                assert np.isfinite(df[col]).all(), (results, col, df[col].tolist())
    for ledger in out.rglob("ledger.parquet"):
        led = pd.read_parquet(ledger)
        assert np.isfinite(led[["amount", "start", "end"]].to_numpy()).all(), ledger
        per_round = led.groupby("round")["amount"].sum()
        assert (per_round > 0).all(), f"{ledger}: a round costs 0: {per_round.to_dict()}"
    for manifest in out.rglob("manifest.json"):
        _finite_json(json.loads(manifest.read_text()), str(manifest))


def _check_table(path: Path) -> None:
    df = pd.read_csv(path)
    nums = df.select_dtypes("number")
    assert not np.isinf(nums.to_numpy()).any(), path
    for col in ("total_per_round", "makespan_s", "edge_cost"):
        if col in df:
            assert (df[col] > 0).all() and np.isfinite(df[col]).all(), (path, col, df[col].tolist())


def _refused(err: str, names: tuple[str, ...]) -> None:
    err = err.strip()
    assert err.startswith("groupfel: error: ") and "\n" not in err and "Traceback" not in err, err
    assert any(n in err for n in names), (names, err)


def run_field(tmp: Path, path: str, text: str, capsys) -> str:
    """A run of the tiny config with ``path`` at ``text``: refused naming the field and writing
    nothing, or finite outputs. Returns what happened."""
    cfg = write_toml(tmp, field_config(path, _value(text)), "c.toml")
    out = tmp / "run"
    code = main(["run", str(cfg), "--output", str(out), "--quiet"])
    err = capsys.readouterr().err
    if code == 2:
        _refused(err, (_leaf(path), path.split(".")[0]))
        assert not out.exists(), sorted(out.rglob("*"))
        return err.strip()
    assert code == 0, err
    _check_run_outputs(out)
    return "ran"


def run_flag(tmp: Path, command: str, flag: str, text: str, capsys) -> str:
    base = _flag_bases(tmp)[(command, flag)]
    before = {p for p in tmp.rglob("*")}
    code = main([*base, f"{flag}={text}"])
    err = capsys.readouterr().err
    if code == 2:
        _refused(err, (flag,))
        assert {p for p in tmp.rglob("*")} == before, "wrote files before refusing"
        return err.strip()
    assert code == 0, err
    for table in tmp.rglob("*.csv"):
        if table.name != "labels.csv":
            _check_table(table)
    return "ran"


# -- the tests -----------------------------------------------------------------------------------------

def test_every_field_and_flag_is_covered(tmp_path):
    """A numeric field with no base config, or a numeric flag with no base command, fails here:
    the harness covers what is added after it."""
    fields = numeric_fields()
    assert len(fields) >= 54
    for path in fields:
        field_config(path, 1)   # a base exists and the path can be set
    found = numeric_flags()
    missing = sorted(set(found) - set(_flag_bases(tmp_path)))
    assert not missing, f"numeric flags without a base command in test_limits._flag_bases: {missing}"
    assert len(found) >= 30


def test_every_field_refuses_or_accepts_each_limit_in_one_line():
    """Parse level, every field x every limit: a refusal is one line naming the field; inf,
    NaN, 2^63, a string and an empty value are refused everywhere."""
    accepted = []
    for path, text, error in verdicts():
        if error is None:
            accepted.append((path, text))
            continue
        assert "\n" not in error and error.startswith("config: "), error
        assert _leaf(path) in error, (path, text, error)
    names = {"data.types[].domain"}    # a domain is an index or a name: "abc" is read as a name
    assert not [(p, t) for p, t in accepted if t in {"nan", "inf", ""} or t == "abc" and p not in names], accepted
    # 2^63 is beyond every int field; a float field may hold it where its bounds allow
    assert {t for _, t in accepted} <= {"0", "-1", "1e-300", "1e308", str(2**63), "abc"}
    print(f"{len(numeric_fields())} fields x {len(LIMITS)} limits: {len(accepted)} accepted: {accepted}")


def test_every_flag_refuses_bad_values_in_one_line_before_any_work(tmp_path, capsys):
    """Parse level, every flag x every limit: argparse's check, so nothing is written."""
    for command, flag in numeric_flags():
        action = next(a for a in build_parser()._subparsers._group_actions[0].choices[command]._actions
                      if flag in a.option_strings)
        for text in LIMITS:
            try:
                action.type(text)
            except argparse.ArgumentTypeError as exc:
                assert "\n" not in str(exc) and "give" in str(exc), (flag, text, exc)
                continue
            assert text in ("0", "1e-300", "1e308") or isinstance(action.type, flags.SizesText), (flag, text)


# the accepted values: the first few run in the default suite, all of them with -m slow
def _accepted_fields() -> list[tuple[str, str]]:
    return [(p, t) for p, t, e in verdicts() if e is None]


def _accepted_flags() -> list[tuple[str, str, str]]:
    out = []
    for command, flag in numeric_flags():
        sub = build_parser()._subparsers._group_actions[0].choices[command]
        action = next(a for a in sub._actions if flag in a.option_strings)
        for text in LIMITS:
            try:
                value = action.type(text)
            except argparse.ArgumentTypeError:
                continue
            if value != action.default:   # the default is every test's run of the command
                out.append((command, flag, text))
    return out


FAST_FIELDS = [("topology.edge_access_mbps", "1e308"), ("topology.client_link.latency_s", "1e308"),
               ("topology.heterogeneity.slowdown_sigma", "1e308"), ("topology.client_link.bandwidth_mbps", "1e-300")]


@pytest.mark.parametrize("path, text", FAST_FIELDS)
def test_shared_edge_fields_at_their_limits(tmp_path, capsys, path, text):
    """Before: edge_access_mbps = 1e308 was a traceback that left config.json, numerics.json and a
    lock behind; a latency of 1e308 gave makespans of inf and NaN; a bandwidth of 1e-300 gave
    3.3e299 s and a round that cost 0."""
    said = run_field(tmp_path, path, text, capsys)
    assert said != "ran" and _leaf(path) in said


@pytest.mark.slow
def test_every_accepted_field_value_runs_to_finite_outputs(tmp_path, capsys):
    seen = []
    for i, (path, text) in enumerate(_accepted_fields()):
        (tmp_path / str(i)).mkdir()
        seen.append((path, text, run_field(tmp_path / str(i), path, text, capsys)))
    assert len(seen) >= 10


@pytest.mark.slow
def test_every_accepted_flag_value_runs_to_finite_outputs(tmp_path, capsys):
    seen = []
    for i, (command, flag, text) in enumerate(_accepted_flags()):
        (tmp_path / str(i)).mkdir()
        seen.append((command, flag, text, run_flag(tmp_path / str(i), command, flag, text, capsys)))
    assert len(seen) >= 3


# -- the cases the limits were found by ------------------------------------------------------------

@pytest.mark.parametrize("args, says", [
    (["--access-mbps", "1e308"], "argument --access-mbps: '1e308': give a number from 1e-06 to 1e+09 Mbit/s"),
    (["--access-mbps", ""], "argument --access-mbps: '': give a number from 1e-06 to 1e+09 Mbit/s"),
    (["--model-mb", "1e308"], "argument --model-mb: '1e308': give a number from 1e-06 to 1e+06 MB"),
    (["--edge-clients", str(10**7)], "argument --edge-clients: '10000000': give an integer from 1 to 10,000"),
    (["--latency-s", "-1"], "argument --latency-s: '-1': give a number from 0 to 86400 s"),
])
def test_whatif_limits_are_one_line_before_any_work(tmp_path, capsys, args, says):
    """Before: an OverflowError, a MemoryError after 37 s, 'ValueError: Negative delay', and
    'access nan Mbit/s' printed with exit 0."""
    assert main(["whatif", "--clients", "200", "--out", str(tmp_path / "w"), *args]) == 2
    _refused(capsys.readouterr().err, (says,))
    assert not (tmp_path / "w").exists()


def test_the_python_whatif_has_the_flags_bounds():
    from groupfel.experiments import api

    with pytest.raises(InputError, match=r"^latency_s: '-1.0': give a number from 0 to 86400 s$"):
        api.whatif([2], clients=200, rounds=2, latency_s=-1.0, edge_clients=12)


@pytest.mark.parametrize("edit, says", [
    (lambda t: t.update(heterogeneity={"speed_sigma": 0.2}),
     "config: topology.heterogeneity: speed_sigma is now slowdown_sigma (a factor: 2 is twice as slow); rename the key"),
    (lambda t: t.update(heterogeneity={"file": "links.csv", "bandwidth_sigma": 0.5}),
     "config: topology.heterogeneity: bandwidth_sigma: the file gives every client's link, so bandwidth_sigma would "
     "be ignored; remove bandwidth_sigma or the file"),
    (lambda t: t.update(edge_access_mbps=1e-300),
     "config: topology.edge_access_mbps: 1e-300 is out of range; give a number at least 1e-06"),
    (lambda t: t.update(edge_access_mbps=1e308),
     "config: topology.edge_access_mbps: 1e+308 is out of range; give a number at most 1e+09"),
    (lambda t: t.update(client_link={"bandwidth_mbps": 1e-300, "latency_s": 0.02}),
     "config: topology.client_link.bandwidth_mbps: 1e-300 is out of range; give a number at least 1e-06"),
    (lambda t: t.update(client_link={"bandwidth_mbps": 20.0, "latency_s": 1e308}),
     "config: topology.client_link.latency_s: 1e+308 is out of range; give a number at most 86400"),
    (lambda t: t.update(edge_access_mbps=math.inf),
     "config: topology.edge_access_mbps: inf is not a finite number; give one"),
])
def test_shared_edge_keys_out_of_bounds_or_together_are_refused(edit, says):
    d = _tiny()
    edit(d["topology"])
    with pytest.raises(InputError) as e:
        parse_config(d)
    assert str(e.value).startswith(says), str(e.value)


def test_slowdown_reads_as_a_slowdown(tmp_path):
    """Before, ``speed = 2`` made a client twice as slow; a slowdown of 2 now says so."""
    from groupfel.emulator.config import HeterogeneityConfig
    from groupfel.emulator.contention import client_net

    f = tmp_path / "links.csv"
    f.write_text("client,bandwidth_mbps,latency_s,slowdown\n0,10,0.1,2\n1,10,0.1,1\n")
    assert client_net(HeterogeneityConfig(file=str(f)), 2, 20.0, 0.02, 0).slowdown.tolist() == [2.0, 1.0]
    with pytest.raises(InputError, match="slowdown_sigma: .* has a slowdown column, so the sigma would be ignored"):
        client_net(HeterogeneityConfig(file=str(f), slowdown_sigma=0.3), 2, 20.0, 0.02, 0)


def test_a_run_where_no_client_is_online_is_refused_before_training(tmp_path, capsys):
    """Before: every client offline in every round, nothing trained, exit 0."""
    late = tmp_path / "late.csv"
    late.write_text("client,start_s,end_s\n" + "".join(f"{c},1000,2000\n" for c in range(12)))
    d = _tiny()
    d["topology"]["availability"] = {"file": str(late)}
    cfg = write_toml(tmp_path, d)
    out = tmp_path / "run"
    assert main(["run", str(cfg), "--output", str(out), "--quiet"]) == 2
    _refused(capsys.readouterr().err, ("topology.availability: all 6 clients sampled in round 1 are offline at its "
                                       "start (0 s simulated), so nothing would train",))
    assert not out.exists(), sorted(out.rglob("*"))


@pytest.fixture(scope="module")
def shared_edge_arm(tmp_path_factory):
    """One round on shared edges with clients going offline and dropping out."""
    tmp = tmp_path_factory.mktemp("edge")
    d = _tiny()
    d["train"].update(group_rounds=2)
    d["arms"][0]["sampling"]["groups_per_round"] = 4
    d["faults"] = {"dropout": 0.3}
    d["topology"].update(edge_access_mbps=2.0, edge_cores=1, edge_profile="edge/cifar10-resnet",
                         availability={"mean_on_s": 30.0, "mean_off_s": 10.0})
    (tmp / "edge.csv").write_text("device,task,operation,method,a,b,c\n"
                                  "edge,cifar10-resnet,group_overhead,aggregation,0,0.0002,0.0001\n")
    d["cost"]["profiles_file"] = str(tmp / "edge.csv")
    assert main(["run", str(write_toml(tmp, d)), "--output", str(tmp / "run"), "--quiet"]) == 0
    return tmp / "run" / d["arms"][0]["name"]


def test_timeline_marks_offline_and_dropped_and_counts_who_trained(shared_edge_arm, tmp_path, capsys):
    """Before: members counted clients that were offline, a dropped client was only a missing bar,
    the legend covered bars, colours moved between charts and millisecond core holds were empty."""
    import matplotlib.pyplot as plt

    from groupfel.experiments.timeline import COLORS, load_network, load_round, member_states, summary

    rows = load_round(shared_edge_arm, 1)
    states = member_states(rows)
    table = summary(rows)
    assert states["offline"].any() and states["dropped"].any()
    assert (table["members"] == table.merge(states.groupby(["edge", "group", "group_round"])["trained"].sum()
                                            .reset_index())["trained"]).all()
    trained = rows[(rows.component == "training") & (rows.amount > 0)].groupby(["edge", "group", "group_round"])
    assert table.set_index(["edge", "group", "group_round"])["members"].tolist() == trained["client"].nunique().tolist()
    seen = []
    real = plt.Figure.savefig
    plt.Figure.savefig = lambda fig, *a, **k: (seen.append(fig), real(fig, *a, **k))[1]
    try:
        out = tmp_path / "missing" / "dir" / "t.png"       # before: FileNotFoundError
        assert main(["timeline", str(shared_edge_arm), "--out", str(out)]) == 0
    finally:
        plt.Figure.savefig = real
    assert out.stat().st_size > 0
    ax = seen[0].axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert {"offline: left the group", "dropped: update left out", "training", "secagg"} <= set(labels)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(seen[0]).get_renderer()
    seen[0].draw(renderer)
    legend = ax.get_legend().get_window_extent(renderer)
    assert legend.x0 >= ax.get_window_extent(renderer).x1   # beside the bars, not on them
    by_label = {h.get_label(): h for h in ax.containers}
    assert tuple(by_label["training"].patches[0].get_facecolor()) == plt.matplotlib.colors.to_rgba(COLORS["training"])
    cores = by_label["edge aggregation (at least 0.4 % of the round wide)"].patches
    span = max(rows["end"].max(), load_network(shared_edge_arm, 1)["end"].max())
    assert cores and min(p.get_width() for p in cores) >= 0.004 * span * 0.999


@pytest.mark.parametrize("name, damage, says", [
    ("ledger.parquet", b"not parquet", "ledger.parquet: damaged (not a readable Parquet file"),
    ("network.parquet", b"PAR1 broken", "network.parquet: damaged (not a readable Parquet file"),
    ("network.parquet", None, "network.parquet: damaged (no column 'round')"),
])
def test_timeline_reads_through_the_damaged_file_check(shared_edge_arm, tmp_path, capsys, name, damage, says):
    """Before: pyarrow's ArrowInvalid, or KeyError: 'round'."""
    import shutil

    arm = tmp_path / "arm"
    shutil.copytree(shared_edge_arm, arm)
    if damage is None:
        pd.DataFrame({"kind": ["core"]}).to_parquet(arm / name)
    else:
        (arm / name).write_bytes(damage)
    assert main(["timeline", str(arm), "--out", str(tmp_path / "t.png")]) == 2
    _refused(capsys.readouterr().err, (says,))
    assert not (tmp_path / "t.png").exists()
