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
import re
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

POWER = str(Path(__file__).parent / "fixtures" / "power-rpi4-rest.toml")   # the states the shipped profile lacks
LIMITS = ["0", "-1", "1e-300", "1e308", "nan", "inf", str(2**63), str(10**30), "abc", ""]
FEDSCALE_SAMPLE = Path(__file__).resolve().parents[1] / "docs/guide/fedscale/device_capacity.pkl"


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


def _authors_deal(d):
    """The FedCollab authors' label-shift deal, which sets every client's sample counts itself."""
    d.update(mode="per-group")
    d["data"] = {"dataset": "digits", "partition": "label-shift", "label_shift_deal": "authors"}


def _per_group_arrivals(d):
    d.update(mode="per-group")
    d["topology"]["arrivals"] = {"initial": 6, "every": 1, "per_arrival": 6}
    d["train"]["rounds"] = 2


# the base config in which each field means something (by the longest matching prefix)
BASES = {
    "": lambda d: None,
    "track.": lambda d: d.update(track={"tracker": "tensorboard"}),
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
    "topology.heterogeneity.reference_ms_per_sample": lambda d: d["topology"].update(
        heterogeneity={"fedscale_file": str(FEDSCALE_SAMPLE)}),
    "topology.clients_per_edge[]": lambda d: d["topology"].update(clients_per_edge=[6, 6]),
    "topology.edge_access_mbps": lambda d: d["topology"].update(edge_access_mbps=50.0),
    "topology.devices{}": lambda d: d["topology"].update(devices={"raspberry-pi-4": 1.0}),
    "train.budget": lambda d: d["train"].update(budget=1e6),
    "train.energy_budget": lambda d: d["cost"].update(energy=True, profiles_file=POWER),
    "train.client_energy_budget": lambda d: d["cost"].update(energy=True, profiles_file=POWER),
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
            if isinstance(a.type, (flags.Number, flags.SizesText, flags.AutoOr)):
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
    bases |= {("run", "--max-seeds"): [*run, "--seeds", "auto"], ("run", "--seeds"): run}
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
    bases |= {("whatif", "--carbon-intensity"): [*edge, "--energy"]}
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
        for col in ("cost", "sim_time_s", "accuracy", "loss",
                    *[c for c in df if c.endswith("_energy_j") or c.startswith("energy_") and c.endswith("_j")
                      or c.endswith("carbon_g")]):
            if col in df:
                assert np.isfinite(df[col]).all(), (results, col, df[col].tolist())
    for ledger in out.rglob("ledger.parquet"):
        led = pd.read_parquet(ledger)
        assert np.isfinite(led[["amount", "start", "end"]].to_numpy()).all(), ledger
        per_round = led.groupby("round")["amount"].sum()
        assert (per_round > 0).all(), f"{ledger}: a round costs 0: {per_round.to_dict()}"
    for energy in out.rglob("energy.parquet"):
        e = pd.read_parquet(energy)
        values = e[["seconds", "joules"]].to_numpy()
        assert np.isfinite(values).all() and (values >= 0).all(), energy
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
    assert {t for _, t in accepted} <= {"0", "-1", "1e-300", "1e308", str(2**63), str(10**30), "abc"}
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


@pytest.mark.parametrize("text", ["1e-6", "1e9"])
def test_a_trace_reference_at_its_limits_is_refused_naming_it(tmp_path, capsys, text):
    """The bounds of reference_ms_per_sample parse; against the sample trace (12 to 120 ms per
    sample) they make slowdowns beyond 0.001..1000, refused in one line before any work."""
    said = run_field(tmp_path, "topology.heterogeneity.reference_ms_per_sample", text, capsys)
    assert "set reference_ms_per_sample nearer" in said, said


def test_an_energy_budget_below_the_first_round_is_refused_before_any_work(tmp_path, capsys):
    said = run_field(tmp_path, "train.energy_budget", "1e-300", capsys)
    assert "train.energy_budget: 1e-300 J is below the first round's" in said


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
    from groupfel.emulator.network import client_net

    f = tmp_path / "links.csv"
    f.write_text("client,bandwidth_mbps,latency_s,slowdown\n0,10,0.1,2\n1,10,0.1,1\n")
    assert client_net(HeterogeneityConfig(file=str(f)), 2, 20.0, 0.02, 0).slowdown.tolist() == [2.0, 1.0]
    with pytest.raises(InputError, match="slowdown_sigma: .* has a slowdown column, so the sigma would be ignored"):
        client_net(HeterogeneityConfig(file=str(f), slowdown_sigma=0.3), 2, 20.0, 0.02, 0)


def test_a_run_where_no_client_is_online_yet_waits_for_the_first_online_time(tmp_path, capsys):
    """Before: every client offline in every round, nothing trained, exit 0; then refused. Now,
    as FedScale's clock: nobody is online until 1000 s, so the first round starts then."""
    late = tmp_path / "late.csv"
    late.write_text("client,start_s,end_s\n" + "".join(f"{c},1000,2000\n" for c in range(12)))
    d = _tiny()
    d["topology"]["availability"] = {"file": str(late)}
    cfg = write_toml(tmp_path, d)
    out = tmp_path / "run"
    assert main(["run", str(cfg), "--output", str(out), "--quiet"]) == 0
    manifest = json.loads(next(out.rglob("manifest.json")).read_text())
    assert manifest["network"]["rounds"][0]["start_s"] == 1000.0 and not manifest["network"]["offline"]


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


# -- issue 42: classes covered by construction -------------------------------------------------------

def _value_actions() -> list[tuple[str, argparse.Action]]:
    """(subcommand, action) of every flag or argument that takes a value, on every subcommand."""
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return [(name, a) for name, parser in sub.choices.items() for a in parser._actions
            if a.nargs != 0 and not isinstance(a, argparse._HelpAction)]


def _name(action: argparse.Action) -> str:
    return action.option_strings[-1] if action.option_strings else action.dest


def test_every_value_flag_refuses_empty_and_arbitrary_size_integers():
    """Every flag or argument that takes a value, those added later included: an empty value is
    refused (before: ``--device ''`` ran with the config's device, ``--out ''`` wrote the default
    file), and every numeric one refuses integers of any size (before: ``--seeds
    99999999999999999999`` was an OverflowError traceback)."""
    counts = {"empty": 0, "huge": 0}
    for command, action in _value_actions():
        if action.choices is not None:    # argparse refuses what is not a choice, '' included
            continue
        assert action.type is not None, f"{command} {_name(action)}: a value flag without a type"
        with pytest.raises(argparse.ArgumentTypeError) as e:
            action.type("")
        assert "\n" not in str(e.value), (command, _name(action), e.value)
        counts["empty"] += 1
        if isinstance(action.type, (flags.Number, flags.SizesText, flags.AutoOr)):
            for huge in (str(10**30), str(2**64), "9" * 400):
                with pytest.raises(argparse.ArgumentTypeError) as e:
                    action.type(huge)
                assert "\n" not in str(e.value) and "give" in str(e.value), (command, _name(action), e.value)
            counts["huge"] += 1
    print(f"value flags refusing '': {counts['empty']}; numeric flags refusing integers of any size: {counts['huge']}")
    assert counts["empty"] >= 60 and counts["huge"] >= 30


@pytest.mark.parametrize("argv, says", [
    (["run", "{cfg}", "--seeds", "99999999999999999999"], "argument --seeds: '99999999999999999999': give auto or an integer from 1 to 10,000"),
    (["run", "{cfg}", "--device", ""], "argument --device: '': give a value (it is empty)"),
    (["sweep", "{cfg}", "--device", ""], "argument --device: '': give a value"),
    (["reproduce", "table1", "--device", ""], "argument --device: '': give a value"),
    (["report", "{out}", "--out", ""], "argument --out: '': give a value"),
])
def test_flag_values_end_to_end_are_one_line_and_write_nothing(tmp_path, capsys, argv, says):
    cfg = write_toml(tmp_path, _tiny(), "tiny.toml")
    before = set(tmp_path.rglob("*"))
    argv = [a.format(cfg=cfg, out=tmp_path / "out") for a in argv]
    assert main([*argv, "--output" if argv[0] != "report" else "--quiet-not", str(tmp_path / "out")][:len(argv)]) == 2
    _refused(capsys.readouterr().err, (says,))
    assert set(tmp_path.rglob("*")) == before


def test_numbers_written_as_text_or_booleans_are_refused_in_every_numeric_field():
    """Every numeric field, by construction: '1' (TOML text) and true are refused, not coerced
    (before: max_seeds = '10' and a margin "0.01" were read as numbers)."""
    checked = 0
    for path in numeric_fields():
        for value in ("1", True):
            if path == "data.types[].domain" and value == "1":   # a domain is an index or a name
                continue
            with pytest.raises(InputError) as e:
                parse_config(field_config(path, value))
            said = str(e.value)
            assert "\n" not in said and _leaf(path) in said and "not a number" in said, (path, value, said)
            checked += 1
    assert checked >= 2 * len(numeric_fields()) - 1


# a config in the mode where each ONLY_IN key means nothing, and a valid value for the key there
OTHER_MODE = {
    "seed_batch": (lambda d: None, 4),
    "max_seeds": (lambda d: (d.pop("seed"), d.update(seeds=[0, 1])), 10),
    "margins": (lambda d: None, {"final_acc": 0.02}),
    "withhold_skew": (lambda d: None, 1.5),
    "data.n_shards": (lambda d: None, 12),   # the default partition is dirichlet
    "data.shards_deal": (lambda d: d["data"].update(sizes="half-normal"), "authors"),
    "data.shard_samples": (lambda d: d["data"].update(partition="shards"), 500),
    "data.std_samples": (lambda d: d["data"].update(sizes="uniform"), 2.0),
    "data.local_test": (lambda d: _shift(d, "feature-shift", "domain", 0), "domain"),   # _tiny() runs in global mode
    "data.types[].label_weights": (lambda d: _shift(d, "feature-shift", "rotation", 90.0), [1.0] * 10),
    "data.types[].rotation": (lambda d: _shift(d, "label-shift", "label_weights", [1.0] * 10), 90.0),
    "data.types[].permutation": (lambda d: _shift(d, "label-shift", "label_weights", [1.0] * 10), list(range(10))),
    "faults.straggler.sigma": (lambda d: d["faults"].update(straggler={"distribution": "pareto"}), 0.7),
    "faults.straggler.shape": (lambda d: d["faults"].update(straggler={"distribution": "lognormal"}), 2.5),
    "topology.heterogeneity.reference_ms_per_sample": (lambda d: None, 50.0),
    "topology.heterogeneity.fedscale_pairing": (lambda d: None, "fedscale"),
    "topology.availability.fedscale_pairing": (
        lambda d: d["topology"].update(availability={"mean_on_s": 40.0, "mean_off_s": 10.0}), "sorted"),
    "train.report_best": (lambda d: None, True),          # _tiny() runs in global mode
    "data.label_shift_deal": (lambda d: None, "authors"),   # the default partition is dirichlet
    "track.dir": (lambda d: d.update(track={"tracker": "mlflow"}), "tb"),
    "track.uri": (lambda d: d.update(track={"tracker": "tensorboard"}), "sqlite:///x.db"),
    "track.experiment": (lambda d: d.update(track={"tracker": "tensorboard"}), "e"),
    "track.report": (lambda d: d.update(track={"tracker": "tensorboard"}), False),
    "data.cluster_k": (lambda d: _shift(d, "label-shift", "label_weights", [1.0] * 10), 0.5),
    "data.subsample_decay": (lambda d: _shift(d, "label-shift", "label_weights", [1.0] * 10), 2.0),
    **{f"data.{key}": (_authors_deal, value) for key, value in (
        ("min_samples", 30), ("max_samples", 100), ("test_samples", 10), ("mean_samples", 50.0),
        ("types", [{"clients": 12, "label_weights": [1.0] * 10}]))},
    "train.local_reference": (lambda d: None, False),
}


def _mode_words() -> set[str]:
    """Every Literal choice of the config schema (dirichlet, shards, lognormal, pareto, ...)."""
    words, todo, seen = set(), [RunConfig], set()
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.add(model)
        for f in model.model_fields.values():
            for tp in [f.annotation, *get_args(f.annotation)]:
                words |= {a for a in get_args(tp) if isinstance(a, str)} if "Literal" in str(tp) else set()
            todo += [leaf[-1] for leaf in _leaves(f.annotation) if "model" in leaf]
    return words


def _field(path: str):
    model, f = RunConfig, None
    for key in path.split("."):
        f = model.model_fields[key.rstrip("[]{}")]
        model = next((leaf[-1] for leaf in _leaves(f.annotation) if "model" in leaf), None)
    return f


def test_every_mode_only_key_is_refused_in_the_other_mode():
    """Each key of ONLY_IN, written in a config of the other mode, is one line naming the key and
    the mode it needs (before: seed_batch with fixed seeds was silently ignored). By construction:
    a field whose description opens with the mode it needs ('With seeds = "auto":', 'pareto:',
    'dirichlet:', 'normal sizes:') must be in ONLY_IN, and every ONLY_IN key needs a case here."""
    from groupfel.emulator.config import ONLY_IN
    from groupfel.experiments.api import as_config

    words = _mode_words()
    described = set()
    for path in _all_fields():
        desc = _field(path).description or ""
        head = desc.split(":")[0] if ":" in desc[:40] else ""
        own = {a for a in get_args(_field(path).annotation) if isinstance(a, str)}
        if head.startswith("With ") or (head.split(" ")[0].lower() in words - own and head):
            described.add(path)
    from groupfel.emulator.config import DIRICHLET_CARRIED

    missing = described - set(ONLY_IN) - set(DIRICHLET_CARRIED)
    assert not missing, f"mode-only keys (by their description) missing from ONLY_IN: {missing}"
    assert set(ONLY_IN) <= set(OTHER_MODE), f"ONLY_IN keys without a case in OTHER_MODE: {set(ONLY_IN) - set(OTHER_MODE)}"
    for path, (edit, value) in OTHER_MODE.items():
        d = _tiny()
        edit(d)
        _set(d, path, value) if "[]" not in path else [t.update({_leaf(path): value}) for t in d["data"]["types"]]
        with pytest.raises(InputError) as e:
            as_config(d)
        said = str(e.value)
        assert "\n" not in said and path.split(".")[-1].rstrip("[]") in said and ("only used with" in said
                                                                                  or "needs seeds" in said), said
    print(f"{len(OTHER_MODE)} mode-only keys refused in the other mode; {len(described)} found by description")


@pytest.mark.parametrize("value", ["yes", "true", 1, 0.0])
def test_every_boolean_field_refuses_text_and_numbers(value):
    """By construction over the schema: a boolean written as text or a number is one line naming the
    key, never coerced (before: cost.energy = 'yes' ran as true)."""
    from groupfel.experiments.api import as_config

    paths = [p for p in _all_fields() if _field(p).annotation is bool and "[]" not in p and "{}" not in p]
    assert len(paths) >= 3, paths
    for path in paths:
        d = _tiny()
        _set(d, path, value)
        with pytest.raises(InputError) as e:
            as_config(d)
        said = str(e.value)
        assert "\n" not in said and _leaf(path) in said and "is not true or false" in said, (path, said)


def test_a_saved_config_passed_back_keeps_its_default_mode_only_keys():
    """A config the tool wrote (model_dump: every key, the mode-only ones at their defaults) runs
    again as it is: a default changes nothing in any mode, so only a changed value is refused."""
    from groupfel.experiments.api import as_config

    saved = json.loads(as_config(_tiny()).model_dump_json())
    saved.pop("seeds")   # a single-seed config's dump carries seeds = None beside its seed
    assert as_config(saved) == as_config(_tiny())
    saved["seed_batch"] += 1
    with pytest.raises(InputError, match="seed_batch: only used with"):
        as_config(saved)


def _all_fields(model: type[BaseModel] = RunConfig, prefix: str = "") -> list[str]:
    out = []
    for name, f in model.model_fields.items():
        out.append(prefix + name)
        for leaf in _leaves(f.annotation):
            if "model" in leaf:
                out += _all_fields(leaf[-1], prefix + name + "".join(p for p in leaf if p in ("[]", "{}")) + ".")
    return out


# -- issue 42: the cases -------------------------------------------------------------------------------

@pytest.mark.parametrize("edit, says", [
    (lambda d: d.update(name=".."), "config: name: '..' is the parent folder"),
    (lambda d: d.update(name="."), "config: name: '.' is the current folder"),
    (lambda d: d["arms"][0].update(name=".."), "config: arms.0.name: '..' is the parent folder"),
    (lambda d: d.update(max_seeds="10", seeds="auto", seed=None) or d.pop("seed"),
     "config: max_seeds: '10' is text, not a number; write the number without quotes (e.g. max_seeds = 10)"),
    (lambda d: d.update(seeds="auto", margins={"final_acc": 1e-300}) or d.pop("seed"),
     "config: margins.final_acc: 1e-300 is out of range; give a number at least 0.0001"),
    (lambda d: d.update(seeds=[0, 1], seed_batch=5) or d.pop("seed"),
     "config: seed_batch: only used with seeds = \"auto\""),
])
def test_names_text_numbers_margins_and_mode_keys_are_one_line(tmp_path, capsys, edit, says):
    """Before: a run or arm named '..' wrote into the current folder or results/ (and a --force rerun
    of it deleted another run's folder there); max_seeds = '10' was read as 10; a margin of 1e-300
    ran to max_seeds without a word; seed_batch beside fixed seeds was ignored."""
    d = _tiny()
    edit(d)
    cfg = write_toml(tmp_path, d)
    out = tmp_path / "sub" / "run"
    assert main(["run", str(cfg), "--output", str(out), "--quiet"]) == 2
    _refused(capsys.readouterr().err, (says,))
    assert not (tmp_path / "sub").exists()


def test_a_sweep_named_dot_dot_or_with_seeds_as_text_is_refused():
    """Before: a sweep named '..' wrote beside its parent; seeds = ["0"] ran seed 0."""
    from pydantic import ValidationError

    from groupfel.experiments.sweep import SweepConfig

    for name, seeds, says in ((  "..", [0], "parent folder"), ("s", ["0"], "valid integer")):
        with pytest.raises(ValidationError, match=says):
            SweepConfig.model_validate({"name": name, "base": "b.toml", "seeds": seeds, "axes": {"train.lr": [0.1]}})


def test_force_never_deletes_outside_the_runs_own_folder(tmp_path, capsys):
    """A --force rerun replaces the run's arm and seed folders; one that resolves elsewhere (a link
    left in the run directory) is refused and the folder it points at survives."""
    from groupfel.emulator.io import remove_inside

    victim = tmp_path / "other-run"
    victim.mkdir()
    (victim / "keep.csv").write_text("precious\n")
    d = _tiny()
    cfg = write_toml(tmp_path, d)
    run = tmp_path / "run"
    run.mkdir()
    (run / d["arms"][0]["name"]).symlink_to(victim)
    (run / "config.json").write_text(json.dumps({"not": "this config"}))
    assert main(["run", str(cfg), "--output", str(run), "--force", "--quiet"]) == 2
    _refused(capsys.readouterr().err, ("outside", "refusing to delete"))
    assert (victim / "keep.csv").read_text() == "precious\n"
    for target in (run / "..", run, run / "a" / ".." / ".."):
        with pytest.raises(InputError, match="refusing to delete"):
            remove_inside(target, run)
    assert (victim / "keep.csv").exists() and tmp_path.exists()


def test_a_run_never_lies_inside_or_holds_another_run(tmp_path, capsys):
    """Before: output_dir = "results/fin", name = "seed-1" with --force replaced seed 1 of the
    multi-seed run results/fin, whose rerun then counted seed 0 twice. A run inside another run or
    sweep, or a run whose folder holds one, is refused, --force or not."""
    from groupfel.experiments.runner import check_own_place

    d = _tiny()
    d.update(output_dir=str(tmp_path / "results"), name="fin", seeds=[0, 1])
    del d["seed"]
    assert main(["run", str(write_toml(tmp_path, d, "fin.toml")), "--quiet", "--jobs", "1"]) == 0
    fin = tmp_path / "results" / "fin"
    files = lambda: {p: p.read_bytes() for p in sorted((fin / "seed-1").rglob("*")) if p.is_file()}  # noqa: E731
    before = files()
    capsys.readouterr()
    inner = _tiny()
    inner.update(output_dir=str(fin), name="seed-1")
    inner["train"]["lr"] = 0.01
    assert main(["run", str(write_toml(tmp_path, inner, "inner.toml")), "--force", "--quiet"]) == 2
    _refused(capsys.readouterr().err, (f"output_dir/name: {fin / 'seed-1'} lies inside the run or sweep {fin}",))
    assert files() == before
    outer = _tiny()
    outer.update(output_dir=str(tmp_path), name="results")
    assert main(["run", str(write_toml(tmp_path, outer, "outer.toml")), "--force", "--quiet"]) == 2
    _refused(capsys.readouterr().err, (f"holds the run or sweep {fin}",))
    assert not (tmp_path / "results" / "config.json").exists()
    runs = pd.read_csv(fin / "runs.csv")
    assert sorted(runs["seed"].unique()) == [0, 1]
    # a folder with another tool's config.json is no run: a run may go inside it
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "config.json").write_text('{"editor": "vim"}')
    check_own_place(tmp_path / "project" / "run")
    (tmp_path / "project" / "config.json").write_text('{"editor": "vim", // JSON with comments\n}')
    check_own_place(tmp_path / "project" / "run")
    with pytest.raises(InputError, match="lies inside the run or sweep"):
        check_own_place(fin / "seed-0" / "deeper" / "still")


def test_reproduce_set_seeds_auto_follows_the_sweeps_rule(tmp_path, capsys):
    """Before: 'reproduce NAME --set seeds=auto' started running (the sweep's seeds silently won),
    while a sweep file with seeds = "auto" was refused."""
    out = tmp_path / "rep"
    for item, says in (("seeds=auto", "reproduce --set seeds=...: a reproduction runs its sweep's seeds"),
                       ("seeds=[0]", "reproduce --set seeds=...: a reproduction runs its sweep's seeds"),
                       ("seed_batch=3", "reproduce --set seed_batch=...: a reproduction runs its sweep's seeds"),
                       ("name=..", "reproduce --set name=...: a reproduction runs its sweep's seeds")):
        assert main(["reproduce", "table1", "--quick", "--set", item, "--output", str(out), "--quiet"]) == 2
        _refused(capsys.readouterr().err, (says,))
        assert not out.exists()


def _per_group(tmp: Path, **train) -> Path:
    d = _tiny()
    d.update(mode="per-group")
    d["arms"] = [{"name": "ifca", "grouping": {"policy": "ifca", "n_clusters": 2}}]
    d["train"].update(rounds=2, **train)
    return write_toml(tmp, d)


@pytest.mark.parametrize("train, says", [
    ({"algorithm": "perfedavg", "algorithm_params": {"alpha": 1e308}}, "train.algorithm_params.alpha: 1e+308 is out of range"),
    ({"algorithm": "pfedme", "algorithm_params": {"lam": 1e308}}, "train.algorithm_params.lam: 1e+308 is out of range"),
    ({"algorithm": "finetune", "algorithm_params": {"steps": 10**12}}, "train.algorithm_params.steps: 1000000000000 is out of range"),
    ({"algorithm": "finetune", "algorithm_params": {"steps": 10**5}}, "steps must be an integer from 1 to 10,000"),
    ({"algorithm": "pfedme", "algorithm_params": {"inner_steps": 10**9}}, "train.algorithm_params.inner_steps"),
    ({"algorithm": "flsc", "algorithm_params": {"n_clusters": 10**9}}, "train.algorithm_params.n_clusters"),
    ({"algorithm": "flsc", "algorithm_params": {"n_clusters": 13}}, "train.algorithm_params.n_clusters: 13 exceeds the run's 12 clients"),
    ({"algorithm": "perfedavg", "algorithm_params": {"alpha": "0.1"}}, "train.algorithm_params.alpha: '0.1' is not a number"),
])
def test_algorithm_parameters_are_bounded_before_any_work(tmp_path, capsys, train, says):
    """Before: alpha = 1e308 or lam = 1e308 ended in NaN losses with exit 0; steps = 10**12,
    inner_steps = 10**9 and n_clusters = 10**9 ran for ever."""
    out = tmp_path / "run"
    assert main(["run", str(_per_group(tmp_path, **train)), "--output", str(out), "--quiet"]) == 2
    _refused(capsys.readouterr().err, (says,))
    assert not out.exists()


def test_a_cluster_count_above_the_edge_is_refused(tmp_path, capsys):
    d = _tiny()
    d.update(mode="per-group")
    d["arms"] = [{"name": "ifca", "grouping": {"policy": "ifca", "n_clusters": 10**6}}]
    out = tmp_path / "run"
    assert main(["run", str(write_toml(tmp_path, d)), "--output", str(out), "--quiet"]) == 2
    _refused(capsys.readouterr().err, ("arms[0].grouping.n_clusters: 1,000,000 exceeds the 6 clients of edge 0",))
    assert not out.exists()


@pytest.mark.slow
def test_a_non_finite_per_group_loss_stops_the_run(tmp_path, capsys):
    """run.md: a non-finite test loss stops the run. Before, per-group mode went on with NaN
    losses and exited 0."""
    out = tmp_path / "run"
    cfg = _per_group(tmp_path, group_rounds=1, algorithm="pfedme", algorithm_params={"lam": 1e6})
    assert main(["run", str(cfg), "--output", str(out), "--quiet"]) == 1
    assert "training diverged: round 1: the local test loss of" in capsys.readouterr().err
    assert json.loads((out / "ifca" / "manifest.json").read_text())["stop_reason"] == "diverged"
    _check_run_outputs(out)


@pytest.fixture(scope="module")
def seeded_run(tmp_path_factory):
    """Two arms on three seeds, one round: a finished multi-seed run to damage."""
    tmp = tmp_path_factory.mktemp("seeded")
    d = _tiny()
    d["arms"] = copy.deepcopy(TINY["arms"])
    d["train"].update(rounds=1, group_rounds=1)
    d.pop("seed")
    d["seeds"] = [0, 1, 2]
    cfg = write_toml(tmp, d)
    assert main(["run", str(cfg), "--output", str(tmp / "run"), "--quiet", "--jobs", "1"]) == 0
    return cfg, tmp / "run"


def _copy(seeded_run, tmp_path) -> Path:
    import shutil

    run = tmp_path / "run"
    shutil.copytree(seeded_run[1], run)
    return run


def _ledgers(run: Path) -> dict:
    return {p: p.stat().st_mtime_ns for p in run.rglob("ledger.parquet")}


def _advice(err: str) -> str:
    import re

    return re.search(r"'(groupfel [^']+)'", err)[1]


@pytest.mark.slow
def test_recovery_advice_works_when_followed(seeded_run, tmp_path, capsys):
    """Each damaged file's advice, followed as printed (CONFIG: the config it ran from): it exits 0,
    repairs the file, retrains nothing, and the report then builds. Before: a damaged config.json
    led to '--force' (every arm retrained) and a report advice that failed; a damaged seed
    config.json or a missing runs.csv was left as it was by a rerun that exited 0."""
    from groupfel.experiments.report import load_study

    cfg, _ = seeded_run
    for damage, name in ((lambda r: (r / "config.json").write_text("garbage"), "config.json"),
                         (lambda r: (r / "seed-0" / "config.json").write_text("garbage"), "seed-0/config.json"),
                         (lambda r: (r / "runs.csv").unlink(), "runs.csv"),
                         (lambda r: (r / "seed-1" / "rg-random" / "manifest.json").write_text("[1, 2]"), "manifest")):
        sub = tmp_path / name.replace("/", "-")
        sub.mkdir()
        run = _copy(seeded_run, sub)
        kept = _ledgers(run)
        damage(run)
        code = main(["report", str(run)])
        err = capsys.readouterr().err
        if name == "seed-0/config.json":       # the report does not read it; a rerun of the run repairs it
            assert code == 0
            advice = f"groupfel run CONFIG --output {run}"
        else:
            assert code == 2, (name, err)
            _refused(err, (name.split("/")[-1].replace("manifest", "manifest.json"),))
            advice = _advice(err)
        argv = advice.replace("CONFIG", str(cfg)).split()[1:] + ["--quiet"]
        assert main(argv) == 0, (name, advice, capsys.readouterr().err)
        capsys.readouterr()
        load_study(run)        # what the report reads, every table parsed (building the page is slower)
        json.loads((run / "config.json").read_text())
        json.loads((run / "seed-0" / "config.json").read_text())
        assert (run / "runs.csv").exists()
        redone = {p for p, t in _ledgers(run).items() if kept.get(p) != t}
        assert redone <= ({run / "seed-1" / "rg-random" / "ledger.parquet"} if name == "manifest" else set()), name


@pytest.mark.slow
def test_a_random_bytes_checkpoint_restarts_its_arm_without_blaming_resume(seeded_run, tmp_path, capsys):
    import os

    cfg, _ = seeded_run
    run = _copy(seeded_run, tmp_path)
    arm = run / "seed-2" / "rg-random"
    (arm / "manifest.json").unlink()
    (arm / "checkpoint.pt").write_bytes(os.urandom(4096))
    assert main(["run", str(cfg), "--output", str(run), "--quiet", "--jobs", "1"]) == 0
    err = capsys.readouterr().err
    assert "damaged (truncated or not a checkpoint)" in err and "--resume" not in err, err
    assert json.loads((arm / "manifest.json").read_text())["complete"]


def test_damaged_or_unwritable_places_are_one_line(seeded_run, tmp_path, capsys, monkeypatch):
    """Before: a lock that is a directory was IsADirectoryError; report into a read-only run
    directory, report --out naming a directory and sweep --output into a read-only place were
    OSError tracebacks."""
    import os

    cfg, _ = seeded_run
    run = _copy(seeded_run, tmp_path)
    (run / ".groupfel.lock").unlink()
    (run / ".groupfel.lock").mkdir()
    assert main(["run", str(cfg), "--output", str(run), "--quiet"]) == 2
    _refused(capsys.readouterr().err, (".groupfel.lock: a directory where groupfel keeps its lock file",))
    (run / ".groupfel.lock").rmdir()
    (tmp_path / "adir").mkdir()
    assert main(["report", str(run), "--out", str(tmp_path / "adir")]) == 2
    _refused(capsys.readouterr().err, ("--out", "is a directory"))
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) in (run, tmp_path / "ro") else real(p, mode))
    assert main(["report", str(run)]) == 2
    _refused(capsys.readouterr().err, ("is not writable",))
    assert not (run / "report.html").exists()
    (tmp_path / "ro").mkdir()
    sweep = tmp_path / "s.toml"
    sweep.write_text(f'name = "s"\nbase = "{cfg}"\nseeds = [0]\n[axes]\n"train.lr" = [0.05]\n')
    assert main(["sweep", str(sweep), "--output", str(tmp_path / "ro" / "s"), "--quiet"]) == 2
    _refused(capsys.readouterr().err, ("--output", "is not writable"))
    assert not (tmp_path / "ro" / "s").exists()


@pytest.mark.slow
def test_report_legend_counts_the_comparisons_and_colours_hold_across_charts(seeded_run, tmp_path, monkeypatch):
    """Before: the HTML report's decision legend always read 'undecided, too few seeds' (it lost the
    count reading summary.csv back), and the Eq. 5 breakdown's colours flipped between its charts."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgba

    from groupfel.experiments import report
    from groupfel.experiments.timeline import color

    run = _copy(seeded_run, tmp_path)
    seen = []
    real = plt.Figure.savefig
    monkeypatch.setattr(plt.Figure, "savefig", lambda fig, *a, **k: (seen.append(fig), real(fig, *a, **k))[1])
    page = report.build_report(run).read_text()
    import re

    assert re.search(r"Holm&#x27;s correction over the [1-9]\d* comparisons", page) and "too few seeds" not in page
    breakdown = next(f for f in seen if len(f.axes) == 3 and f.axes[0].get_title() == "by component")
    for ax in breakdown.axes:
        handles, labels = ax.get_legend_handles_labels()
        for h, label in zip(handles, labels):
            got = h.patches[0].get_facecolor() if hasattr(h, "patches") else h.get_color()   # bars, or a line
            assert to_rgba(got) == to_rgba(color(label)), (ax.get_title(), label)


def test_an_unreachable_ray_address_is_one_line_in_bounded_time(monkeypatch):
    """Before: 'run --backend ray --address' at an unreachable host still waited after 5 minutes."""
    import socket
    import time

    from groupfel.experiments import backends

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()                       # nothing listens there now
    t0 = time.monotonic()
    with pytest.raises(InputError, match=rf"^--address 127.0.0.1:{port}: cannot reach 127.0.0.1:{port} \("):
        backends._reachable(f"127.0.0.1:{port}", timeout=2)
    assert time.monotonic() - t0 < 5


# -- every file reader: special files, sizes, nesting, numbers, types, encodings -----------------------
# Each reader a user (or a run directory) hands a path to, with the suffix it reads. Every one must
# refuse a FIFO, a device, a folder and an oversized file before reading, and answer any content
# (fuzzed below) with its result or one InputError line: no other exception, no hang.

def _readers() -> dict[str, tuple[str, Any]]:
    from groupfel.cost_models.calibrate import read_measurements
    from groupfel.cost_models.energy_meter import PowerLog
    from groupfel.cost_models.power import read_power
    from groupfel.cost_models.profiles import read_profiles
    from groupfel.emulator import runfiles
    from groupfel.emulator.config import AvailabilityConfig, HeterogeneityConfig, load_config
    from groupfel.emulator.network import Availability, client_net
    from groupfel.emulator.driver import load_checkpoint
    from groupfel.emulator.network.fedscale import read_behaviour, read_capacity
    from groupfel.experiments.group_cli import read_label_matrix
    from groupfel.experiments.sweep import load_sweep

    return {
        "run config": (".toml", load_config),
        "sweep file": (".toml", load_sweep),
        "profiles TOML": (".toml", read_profiles),
        "profiles CSV": (".csv", read_profiles),
        "power TOML": (".toml", read_power),
        "heterogeneity CSV": (".csv", lambda p: client_net(HeterogeneityConfig(file=str(p)), 4, 20.0, 0.02, 0)),
        "availability CSV": (".csv", lambda p: Availability(AvailabilityConfig(file=str(p)), 4, 0)),
        "capacity pickle": ("", lambda p: read_capacity(str(p), "trace")),
        "capacity JSON": (".json", lambda p: read_capacity(str(p), "trace")),
        "capacity CSV": (".csv", lambda p: read_capacity(str(p), "trace")),
        "behaviour pickle": ("", lambda p: read_behaviour(str(p), "trace")),
        "behaviour JSON": (".json", lambda p: read_behaviour(str(p), "trace")),
        "behaviour CSV": (".csv", lambda p: read_behaviour(str(p), "trace")),
        "label matrix": (".csv", read_label_matrix),
        "measurements": (".csv", lambda p: read_measurements([p])),
        "power log": (".csv", lambda p: PowerLog(Path(p)).joules([(0.0, 1.0)])),
        "run's JSON": (".json", runfiles.load_json),
        "run's CSV": (".csv", runfiles.load_csv),
        "run's Parquet": (".parquet", runfiles.load_parquet),
        "checkpoint": (".pt", load_checkpoint),
    }


READERS = sorted(_readers())


def _answers_in_one_line(read, path) -> str | None:
    """``read(path)`` returns (None), or raises one short InputError line (its text); within 20 s,
    never another error."""
    import signal

    def hung(*_):
        raise AssertionError(f"reading {path} did not finish in 20 s")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    try:
        read(path)
    except InputError as exc:
        text = str(exc)
        assert "\n" not in text and len(text) < 1000, text[:3000]
        return text
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("reader", READERS)
def test_every_reader_refuses_fifos_devices_folders_and_oversized_files(tmp_path, monkeypatch, reader):
    """Before: a FIFO given as a trace, a config or a profiles file hung forever; /dev/zero as a
    trace ended in a MemoryError after 41 s; a 199 MB CSV took 13 GB before it was killed."""
    import os

    suffix, read = _readers()[reader]
    fifo = tmp_path / f"fifo{suffix}"
    os.mkfifo(fifo)
    folder = tmp_path / f"folder{suffix}"
    folder.mkdir()
    for path, says in ((fifo, "is a FIFO (named pipe), not a regular file"), (Path("/dev/zero"), "is a character device"),
                       (folder, "is a directory")):
        assert says in (_answers_in_one_line(read, path) or "")
    big = tmp_path / f"big{suffix}"
    big.write_bytes(b"0" * 5000)
    monkeypatch.setenv("GROUPFEL_MAX_FILE_MB", "0.001")
    assert re.search(r"4\.9 KB, more than the 1\.0 KB groupfel reads from one file; .*GROUPFEL_MAX_FILE_MB",
                     _answers_in_one_line(read, big) or "")


def _deep(fmt: str, depth: int) -> bytes:
    if fmt == "toml":
        return ("a = " + "[" * depth + "]" * depth + "\n").encode()
    if fmt == "json":
        return ("{\"1\": " + "[" * depth + "]" * depth + "}").encode()
    if fmt == "pickle":      # nested lists built on the unpickler's stack, no recursion in pickle.dumps
        return b"\x80\x02}K\x01" + b"]" * depth + b"a" * (depth - 1) + b"s."
    return b""


def _laughs() -> bytes:
    import pickle

    x: list = []
    for _ in range(30):
        x = [x, x]
    return pickle.dumps({1: x}, protocol=2)


def _format(suffix: str, reader: str) -> str:
    return {"": "pickle", ".json": "json", ".toml": "toml", ".csv": "csv"}.get(suffix, "binary")


@pytest.mark.parametrize("reader", READERS)
def test_every_reader_answers_deep_huge_and_shared_structures_in_one_line(tmp_path, reader):
    """Before: RecursionError tracebacks on deeply nested pickle, JSON and TOML; the 4,300-digit
    integer limit inside pickles; a 252-byte 'billion laughs' pickle that never finished."""
    import pickle

    suffix, read = _readers()[reader]
    fmt = _format(suffix, reader)
    cases = {"deep": _deep(fmt, 100_000), "long number": {
        "toml": b"a = " + b"9" * 5000 + b"\n", "json": b"{\"1\": " + b"9" * 5000 + b"}",
        "pickle": pickle.dumps({1: 10**5000}), "csv": b"a,b\n" + b"9" * 5000 + b",1\n"}.get(fmt, b"")}
    if fmt == "pickle":
        cases["billion laughs"] = _laughs()
        cases["protocol-0 long"] = b"(dp0\nI1\nL" + b"9" * 5000 + b"L\ns."
        cases["holds itself"] = b"\x80\x02}K\x01]q\x00h\x00as."
    for name, raw in cases.items():
        path = tmp_path / f"{name.replace(' ', '-')}{suffix}"
        path.write_bytes(raw)
        _answers_in_one_line(read, path)


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"


def _contents(fmt: str):
    """Fuzzed file contents of a format: its structures (nested, of every type), and raw bytes in
    other encodings."""
    from hypothesis import strategies as st

    leaf = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False, allow_infinity=False)
            | st.text(max_size=20))
    tree = st.recursive(leaf, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(
        st.text(min_size=1, max_size=8) | st.integers(0, 9), kids, max_size=4), max_leaves=30)
    raw = st.binary(max_size=300)
    encoded = st.text(max_size=200).flatmap(lambda t: st.sampled_from(["utf-16", "latin-1", "utf-8"]).map(
        lambda enc: t.encode(enc, errors="replace")))
    if fmt == "pickle":
        import pickle

        made = tree.map(lambda v: pickle.dumps(v, protocol=2))
    elif fmt == "json":
        made = tree.map(lambda v: json.dumps(v if not isinstance(v, dict) else {str(k): x for k, x in v.items()}).encode())
    elif fmt == "toml":
        table = st.dictionaries(st.sampled_from(["power", "curves", "arms", "train", "base", "axes", "name", "x"]),
                                tree.filter(lambda v: v is not None), max_size=4)
        made = table.map(lambda d: "\n".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in d.items()
                                             if "None" not in repr(v)).encode())
    elif fmt == "csv":
        cell = st.text(alphabet=st.characters(blacklist_characters="\x00"), max_size=12) | st.floats().map(repr)
        made = st.lists(st.lists(cell, min_size=1, max_size=5), min_size=1, max_size=6).map(
            lambda rows: "\n".join(",".join(r) for r in rows).encode("utf-8", errors="replace"))
    else:
        made = raw
    return made | raw | encoded


@pytest.mark.parametrize("reader", READERS)
def test_every_reader_answers_fuzzed_content_in_one_line(tmp_path, reader):
    from hypothesis import HealthCheck, given, settings

    suffix, read = _readers()[reader]
    path = tmp_path / f"fuzz{suffix}"

    @settings(max_examples=25, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(_contents(_format(suffix, reader)))
    def check(raw):
        path.write_bytes(raw)
        _answers_in_one_line(read, path)

    check()
