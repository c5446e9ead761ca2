"""groupfel.experiments.api: the same run as the command line, its tables as DataFrames, a notebook's own
class in a dict config, and the command's other tools as functions."""
import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from groupfel.emulator import Algorithm
from groupfel.errors import InputError
from groupfel.experiments import api
from groupfel.experiments.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _multi(tiny_dict, seeds=(0, 1)):
    tiny_dict.pop("seed", None)
    tiny_dict["seeds"] = list(seeds)
    tiny_dict["train"]["rounds"] = 3
    return tiny_dict


def test_api_run_is_the_cli_run(tiny_dict, tmp_path, capsys):
    """One code path: the API and the command write the same tables, bit for bit."""
    _multi(tiny_dict)
    study = api.run(tiny_dict, tmp_path / "api", jobs=1, progress=False)
    (tmp_path / "c.json").write_text(json.dumps(tiny_dict))
    import tomli_w

    (tmp_path / "c.toml").write_text(tomli_w.dumps(tiny_dict))
    assert main(["run", str(tmp_path / "c.toml"), "--output", str(tmp_path / "cli"), "--jobs", "1", "--quiet"]) == 0
    for name in ("runs.csv", "per_seed.csv", "summary.csv", "curves.csv"):
        pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "api" / name), pd.read_csv(tmp_path / "cli" / name),
                                      check_exact=True)
    # the Study's tables are the CSVs
    pd.testing.assert_frame_equal(study.runs, pd.read_csv(tmp_path / "api" / "runs.csv"))
    pd.testing.assert_frame_equal(study.per_seed, pd.read_csv(tmp_path / "api" / "per_seed.csv"))
    pd.testing.assert_frame_equal(study.curves, pd.read_csv(tmp_path / "api" / "curves.csv"))
    loaded = api.load(tmp_path / "api")
    pd.testing.assert_frame_equal(loaded.summary, pd.read_csv(tmp_path / "api" / "summary.csv"))
    assert list(loaded.summary["arm"]) == ["covg-esrcov", "rg-random"]
    ledger = loaded.ledger(1, "rg-random")
    last = loaded.runs.query("seed == 1 and arm == 'rg-random'")["cost"].iloc[-1]
    assert ledger["amount"].sum() == pytest.approx(last, rel=1e-12)     # Eq. 5 total = ledger sum
    manifest = loaded.manifest(1, "rg-random")
    assert manifest["seed"] == 1 and manifest["arm"] == "rg-random" and manifest["plugins"] == []
    with pytest.raises(InputError, match=r"seed: 7 is not a seed of this run; choose one of \[0, 1\]"):
        loaded.ledger(7, "rg-random")
    ax = loaded.plot()
    assert {line.get_label() for line in ax.get_lines()} == {"covg-esrcov (mean of 2 seeds)",
                                                              "rg-random (mean of 2 seeds)"}
    page = loaded.report(tmp_path / "r.html")
    assert page.exists() and "covg-esrcov" in page.read_text()


def test_single_seed_study(tiny_dict, tmp_path):
    tiny_dict["train"]["rounds"] = 2
    study = api.run(tiny_dict, tmp_path / "one", progress=False)
    assert set(study.runs["arm"]) == {"covg-esrcov", "rg-random"} and list(study.per_seed["seed"].unique()) == [3]
    assert study.ledger(None, "covg-esrcov")["amount"].sum() == pytest.approx(
        study.summary.set_index("arm").loc["covg-esrcov", "cost"], rel=1e-12)
    assert set(study.curves["arm"]) == {"covg-esrcov", "rg-random"}


NOTEBOOK = '''
import json, sys
from dataclasses import dataclass

import numpy as np

from groupfel.experiments import api
from groupfel.policies import EdgeGrouping, GroupingPolicy

config = json.loads(sys.argv[1])
out = sys.argv[2]
define = sys.argv[3] == "define"

if define:
    @dataclass(frozen=True)
    class Halves(GroupingPolicy):
        """Two groups per edge: the clients with more samples, and the rest."""

        min_group_size: int = 2

        def group(self, view, rng):
            order = np.argsort(-view.n_samples, kind="stable")
            half = view.n_clients // 2
            return EdgeGrouping([order[:half], order[half:]])

    config["arms"][0]["grouping"] = {"policy": Halves, "min_group_size": 3}
else:
    config["arms"][0]["grouping"] = {"policy": "__main__:Halves", "min_group_size": 3}
try:
    study = api.run(config, out, jobs=int(sys.argv[4]) if len(sys.argv) > 4 else None, progress=False)
except Exception as exc:
    print(f"ERROR {exc}")
    sys.exit(2)
print(json.dumps(study.manifest(1, "covg-esrcov")["plugins"]))
'''


@pytest.mark.slow
def test_a_class_defined_in_the_notebook_runs_in_process(tiny_dict, tmp_path):
    script = tmp_path / "nb.py"      # run as __main__, as a notebook's cells are
    script.write_text(NOTEBOOK)
    _multi(tiny_dict)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}

    def nb(*args):
        return subprocess.run([sys.executable, str(script), json.dumps(tiny_dict), str(tmp_path / "run"), *args],
                              env=env, capture_output=True, text=True, timeout=300)
    refused = nb("define", "2")
    assert refused.returncode == 2 and "arms[0].grouping.policy: '__main__:Halves' is defined in this process" \
        in refused.stdout and "jobs=1" in refused.stdout
    done = nb("define")
    assert done.returncode == 0, done.stderr + done.stdout
    (rec,) = json.loads(done.stdout.strip().splitlines()[-1])
    assert rec["import_path"] == "__main__:Halves" and rec["module_file"] is None and len(rec["sha256"]) == 64
    summary = pd.read_csv(tmp_path / "run" / "seed-0" / "summary.csv").set_index("arm")
    assert summary.loc["covg-esrcov", "grouping"] == "__main__:Halves" and summary.loc["covg-esrcov", "groups"] == 4
    # resuming needs the same class passed again
    again = nb("resume")
    assert again.returncode == 2 and "was defined in the process that started this run" in again.stdout
    # the command line cannot resume it either, and says why in one line
    proc = subprocess.run([sys.executable, "-m", "groupfel.experiments.cli", "run", "--resume", str(tmp_path / "run")],
                          env=env, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 2 and "'__main__:Halves' was defined in the process" in proc.stderr
    assert proc.stderr.count("\n") == 1


def test_a_changed_plugin_does_not_resume(tiny_dict, tmp_path, monkeypatch, capsys):
    d = tmp_path / "mods"
    d.mkdir()
    src = textwrap.dedent('''
        from dataclasses import dataclass
        from groupfel.policies.grouping import RandomGrouping

        @dataclass(frozen=True)
        class MyRG(RandomGrouping):
            """RG under another name."""
    ''')
    (d / "myrg.py").write_text(src)
    monkeypatch.syspath_prepend(str(d))
    tiny_dict["arms"][1]["grouping"] = {"policy": "myrg:MyRG", "min_group_size": 3}
    tiny_dict["train"]["rounds"] = 2
    api.run(tiny_dict, tmp_path / "run", progress=False)
    (d / "myrg.py").write_text(src + "\n# edited\n")
    with pytest.raises(InputError, match=r"arms\[1\].grouping.policy: 'myrg:MyRG' is not the plug-in this run "
                                         r"started with"):
        api.run(tiny_dict, tmp_path / "run", progress=False)
    sys.modules.pop("myrg", None)


def test_group_whatif_and_calibrate_as_functions(tmp_path, capsys):
    from groupfel.policies.grouping import RandomGrouping

    counts = pd.DataFrame({"a": [5, 0, 3, 0, 4, 1], "b": [0, 5, 1, 4, 0, 3], "edge": [0, 0, 0, 1, 1, 1]})
    covg = api.group(counts, "covg", min_group_size=3, max_cov=0.3)
    assert list(covg["size"]) == [3, 3] and list(covg["edge"]) == [0, 1]
    assert covg.attrs["summary"]["policy"] == "covg"
    assert (covg["a"] + covg["b"] == covg["samples"]).all()
    rg = api.group(counts.drop(columns="edge").to_numpy(), RandomGrouping, min_group_size=2)
    assert sorted(c for cl in rg["clients"] for c in cl) == list(range(6)) and len(rg) == 3
    counts.to_csv(tmp_path / "l.csv", index=False)
    assert main(["group", "--policy", "covg", "--label-matrix", str(tmp_path / "l.csv"), "--min-group-size", "3",
                 "--max-cov", "0.3", "--format", "json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    assert [g["clients"] for g in cli["groups"]] == list(covg["clients"])
    with pytest.raises(InputError, match="--policy hcct: needs client gradients"):
        api.group(counts, "hcct")

    table = api.whatif(range(2, 6), clients=200, rounds=3)
    assert main(["whatif", "--group-sizes", "2..5", "--clients", "200", "--rounds", "3", "--out",
                 str(tmp_path / "w")]) == 0
    pd.testing.assert_frame_equal(table, pd.read_csv(tmp_path / "w" / "whatif.csv"), check_dtype=False)

    (tmp_path / "m.csv").write_text("operation,group_size,seconds\nsecagg,2,1.0\nsecagg,3,2.1\nsecagg,4,3.9\n"
                                    "secagg,5,6.2\n")
    fits = api.calibrate(tmp_path / "m.csv", tmp_path / "cal")
    assert len(fits) == 1 and fits["r2"].iloc[0] > 0.99 and (tmp_path / "cal" / "profile.csv").exists()
    np.testing.assert_allclose(np.polyval(fits["coefficients"].iloc[0], 5), 6.2, rtol=0.05)


@dataclasses.dataclass
class DampedFedAvg(Algorithm):
    """x_{t+1} = x_t + gamma (FedAvg's aggregate - x_t): gamma = 1 is FedAvg exactly."""

    gamma: float = 1.0

    def server_state(self, weights):
        return {"model": weights.clone()}

    def aggregate_cloud(self, state, scratch, weights, models, members, n_samples):
        x = state.server["model"]
        new = x + self.gamma * (super().aggregate_cloud(state, scratch, weights, models, members, n_samples) - x)
        state.server["model"] = new
        return new


def test_an_algorithm_instance_in_a_dict_config_runs_through_the_hooks(tiny_dict, tmp_path):
    tiny_dict["arms"] = tiny_dict["arms"][:1]
    tiny_dict["train"]["rounds"] = 3
    plain = api.run(tiny_dict, tmp_path / "fedavg", jobs=1, progress=False)
    same = api.run({**tiny_dict, "train": {**tiny_dict["train"], "algorithm": DampedFedAvg(gamma=1.0)}},
                   tmp_path / "gamma1", jobs=1, progress=False)
    damped = api.run({**tiny_dict, "train": {**tiny_dict["train"], "algorithm": DampedFedAvg(gamma=0.5)}},
                     tmp_path / "gamma05", jobs=1, progress=False)
    cols = ["round", "cost", "accuracy", "loss"]
    # x + 1·(a − x) is a up to rounding (not bitwise: a − x then + x rounds twice)
    pd.testing.assert_frame_equal(plain.runs[cols], same.runs[cols], check_exact=False, rtol=1e-5)
    assert damped.runs["loss"].iloc[-1] != plain.runs["loss"].iloc[-1]
    manifest = damped.manifest(None, tiny_dict["arms"][0]["name"])
    assert manifest["algorithm"] == "test_api:DampedFedAvg"
    assert manifest["config"]["train"]["algorithm_params"] == {"gamma": 0.5}


SCRIPT = """import groupfel
study = groupfel.run({config!r}, {out!r}, jobs=2, progress=False)
print("ACC", len(study.runs))
"""


@pytest.fixture(scope="module")
def two_arm_cli_run(tmp_path_factory):
    """One seed, two arms, through the command (a pool of 2): what every other caller must equal."""
    import tomli_w

    from conftest import TINY

    root = tmp_path_factory.mktemp("scripts")
    raw = {**TINY, "seeds": [3], "train": {**TINY["train"], "rounds": 2}}
    raw.pop("seed")
    (root / "exp.toml").write_text(tomli_w.dumps(raw))
    assert main(["run", str(root / "exp.toml"), "--output", str(root / "cli"), "--jobs", "2", "--quiet"]) == 0
    return root, pd.read_csv(root / "cli" / "runs.csv")


@pytest.mark.slow
@pytest.mark.parametrize("how", ["script", "stdin", "-c", "notebook"])
def test_the_api_runs_from_a_plain_script_stdin_c_and_a_notebook_with_the_commands_numbers(two_arm_cli_run, how):
    """No ``if __name__ == "__main__":`` guard: the pool's workers must not re-run the caller."""
    import subprocess
    import sys

    root, cli = two_arm_cli_run
    out = root / f"api-{how.strip('-')}"
    code = SCRIPT.format(config=str(root / "exp.toml"), out=str(out))
    if how == "notebook":
        nbformat, nbclient = pytest.importorskip("nbformat"), pytest.importorskip("nbclient")
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
        nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                resources={"metadata": {"path": str(root)}}).execute()
        assert "ACC" in nb.cells[0].outputs[0]["text"]
        pd.testing.assert_frame_equal(pd.read_csv(out / "runs.csv"), cli, check_exact=True)
        return
    if how == "script":
        (root / "run.py").write_text(code)
        argv, stdin = [sys.executable, str(root / "run.py")], None
    elif how == "stdin":
        argv, stdin = [sys.executable, "-"], code
    else:
        argv, stdin = [sys.executable, "-c", code], None
    proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, cwd=root, timeout=600)
    assert proc.returncode == 0 and proc.stdout.count("ACC") == 1, proc.stderr[-2000:]
    runs = pd.read_csv(out / "runs.csv")
    pd.testing.assert_frame_equal(runs, cli, check_exact=True)


OLD_RUN = Path(__file__).parent / "fixtures" / "old-layout-run"   # written before groupfel.* (policies.…)


def test_a_run_directory_from_before_the_groupfel_namespace_loads_reports_and_resumes(tmp_path):
    import shutil

    import groupfel

    old = groupfel.load(OLD_RUN)
    assert old.config.arms[1].grouping["policy"] == "groupfel.policies.grouping:RandomGrouping"
    assert set(old.runs["arm"]) == {"covg-esrcov", "rg-plugin"}
    assert main(["report", str(OLD_RUN), "--out", str(tmp_path / "old.html")]) == 0
    # the plug-in arm lost: a resume runs it again, by the plug-in's current name, to the numbers a
    # fresh run of the same config gives here (the fixture's own were made under this machine's kernels)
    run_dir = tmp_path / "resumed"
    shutil.copytree(OLD_RUN, run_dir)
    shutil.rmtree(run_dir / "seed-3" / "rg-plugin")
    assert main(["run", "--resume", str(run_dir), "--jobs", "1", "--quiet"]) == 0
    again = json.loads(old.config.model_dump_json())
    again.pop("seed")   # the saved multi-seed config carries both; a config gives one
    groupfel.run(again, tmp_path / "fresh", jobs=1, progress=False)
    for name in ("results.csv", "ledger.parquet"):
        read = pd.read_csv if name.endswith(".csv") else pd.read_parquet
        pd.testing.assert_frame_equal(read(run_dir / "seed-3" / "rg-plugin" / name),
                                      read(tmp_path / "fresh" / "seed-3" / "rg-plugin" / name), check_exact=True)


def test_a_plug_in_path_in_groupfels_old_module_names_gets_the_new_name_in_one_line(tmp_path, capsys):
    config = OLD_RUN.parent / "old-layout-run.toml"
    assert main(["run", str(config), "--output", str(tmp_path / "r"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "groupfel: error: arms[1].grouping.policy: 'policies.grouping:RandomGrouping' names groupfel's old top-level "
        "module 'policies'; groupfel's modules now live beneath groupfel: write "
        "'groupfel.policies.grouping:RandomGrouping'"]
    assert not (tmp_path / "r").exists()
