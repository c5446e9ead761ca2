"""Plug-ins by import path and by entry point: a grouping policy, a model and a dataset from a module
outside the package, run in-process, on the local pool and on Ray with the same numbers; bad
plug-ins fail in one line before any work; the manifest records them; report never imports them."""
import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from groupfel.experiments.cli import main

ROOT = Path(__file__).resolve().parents[1]

PLUGIN = '''
"""A user's plug-ins: a grouping policy, a training algorithm, a model and a dataset."""
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from groupfel.emulator.algorithms import Algorithm
from groupfel.policies import EdgeGrouping, EdgeView, GroupingPolicy
from groupfel.topologies import Dataset

IMPORTED = []   # filled on import: the tests check who imported this module


@dataclass(frozen=True)
class DealByLabel(GroupingPolicy):
    """Sort the clients by their majority label and deal them round-robin into groups, so that each
    group gets clients of different majority labels (a one-pass CoVG look-alike)."""

    min_group_size: int = 3

    def group(self, view: EdgeView, rng: np.random.Generator) -> EdgeGrouping:
        major = np.argmax(view.label_counts, axis=1)
        order = np.lexsort((rng.permutation(view.n_clients), major))
        n_groups = max(1, view.n_clients // self.min_group_size)
        return EdgeGrouping([order[k::n_groups] for k in range(n_groups)])


@dataclass
class ServerMomentum(Algorithm):
    """FedAvgM (Hsu et al. 2019): the cloud keeps a velocity v and steps x <- x - v with
    v <- beta v + (x - the aggregate of the sampled groups' models)."""

    beta: float = 0.5

    def server_state(self, weights):
        return {"model": weights.clone(), "velocity": torch.zeros_like(weights)}

    def aggregate_cloud(self, state, scratch, weights, models, members, n_samples):
        x, v = state.server["model"], state.server["velocity"]
        v = self.beta * v + (x - super().aggregate_cloud(state, scratch, weights, models, members, n_samples))
        state.server["model"], state.server["velocity"] = x - v, v
        return x - v


def tiny_linear(input_shape, num_classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(input_shape)), num_classes))


def digits_even(path):
    """scikit-learn's digits, the even digits only (labels 0..4), as (N, 1, 8, 8) float32."""
    from sklearn.datasets import load_digits

    d = load_digits()
    keep = d.target % 2 == 0
    x = (d.images[keep] / 16.0).astype(np.float32)[:, None]
    y = (d.target[keep] // 2).astype(np.int64)
    rng = np.random.default_rng(0)
    idx = rng.permutation(len(y))
    test, train = idx[:150], idx[150:]
    return Dataset("digits-even", x[train], y[train], x[test], y[test], 5)


IMPORTED.append(True)
open(__file__ + ".imported", "a").write("x")   # a mark on disk that some process imported it
'''

CONFIG = """
name = "plug"
seeds = [0, 1]
[data]
dataset = "userplug:digits_even"
alpha = 0.5
min_samples = 8
max_samples = 20
[topology]
edges = 2
clients_per_edge = 6
[train]
model = "userplug:tiny_linear"
algorithm = "userplug:ServerMomentum"
algorithm_params = { beta = 0.5 }
lr = 0.1
batch_size = 8
group_rounds = 2
local_epochs = 1
rounds = 4
eval_every = 1
[[arms]]
name = "deal"
grouping = { policy = "userplug:DealByLabel", min_group_size = 3 }
sampling = { policy = "random", groups_per_round = 2 }
[[arms]]
name = "covg"
grouping = { policy = "covg", min_group_size = 3 }
sampling = { policy = "random", groups_per_round = 2 }
"""


@pytest.fixture
def plugin_dir(tmp_path):
    """The plug-in module in a fresh directory (and forgotten by this process afterwards, since every
    test writes its own copy under the same module name)."""
    d = tmp_path / "plugins"
    d.mkdir()
    (d / "userplug.py").write_text(PLUGIN)
    yield d
    for name in ("userplug", "badplug"):
        sys.modules.pop(name, None)


def _cli(args, pythonpath, cwd, timeout=500):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(pythonpath), str(ROOT)]), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "groupfel.experiments.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_external_plugins_give_the_same_numbers_on_the_local_pool_and_on_ray(tmp_path, plugin_dir):
    """The module reaches the pool's workers and Ray's workers through PYTHONPATH (Ray: the backend
    passes it on in the runtime_env)."""
    pytest.importorskip("ray")
    (tmp_path / "plug.toml").write_text(CONFIG)
    local = _cli(["run", "plug.toml", "--output", "local", "--jobs", "2", "--quiet"], plugin_dir, tmp_path)
    assert local.returncode == 0, local.stderr
    ray = _cli(["run", "plug.toml", "--output", "ray", "--backend", "ray", "--jobs", "2", "--quiet"],
               plugin_dir, tmp_path)
    assert ray.returncode == 0, ray.stderr
    for name in ("runs.csv", "per_seed.csv", "summary.csv"):
        pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "local" / name), pd.read_csv(tmp_path / "ray" / name),
                                      check_exact=True)
    runs = pd.read_csv(tmp_path / "local" / "runs.csv")
    assert sorted(runs["seed"].unique()) == [0, 1] and set(runs["arm"]) == {"deal", "covg"}
    assert runs.groupby(["seed", "arm"])["accuracy"].last().min() > 0.3   # it learned (5 classes: chance 0.2)
    manifest = json.loads((tmp_path / "local" / "seed-1" / "deal" / "manifest.json").read_text())
    rec = {r["kind"]: r for r in manifest["plugins"]}
    assert set(rec) == {"dataset", "model", "grouping", "algorithm"}
    assert rec["algorithm"]["import_path"] == "userplug:ServerMomentum" and manifest["algorithm"] == "userplug:ServerMomentum"
    assert rec["grouping"]["import_path"] == "userplug:DealByLabel"
    assert rec["grouping"]["field"] == "arms[0].grouping.policy"
    assert rec["model"]["sha256"] == hashlib.sha256((plugin_dir / "userplug.py").read_bytes()).hexdigest()
    assert rec["model"]["module_file"] == str((plugin_dir / "userplug.py").resolve())
    assert rec["dataset"]["distribution"] is None
    assert manifest["grouping_policy"] == "userplug:DealByLabel"


def _tiny(tmp_path, **edits):
    text = CONFIG.replace("seeds = [0, 1]", "seed = 0")
    for old, new in edits.items():
        text = text.replace(old, new)
    (tmp_path / "c.toml").write_text(text)
    return str(tmp_path / "c.toml")


@pytest.mark.parametrize("old, new, says", [
    ('"userplug:DealByLabel"', '"nosuchmod:DealByLabel"',
     "arms[0].grouping.policy: cannot import 'nosuchmod:DealByLabel': no module named 'nosuchmod'"),
    ('"userplug:DealByLabel"', '"userplug:Nope"',
     "arms[0].grouping.policy: 'userplug:Nope': module 'userplug' has no attribute 'Nope'"),
    ('"userplug:DealByLabel"', '"userplug:tiny_linear"',
     "arms[0].grouping.policy: 'userplug:tiny_linear' is not a subclass of groupfel.GroupingPolicy"),
    ('"userplug:tiny_linear"', '"userplug:DealByLabel"',
     "train.model: 'userplug:DealByLabel' has the wrong signature"),
    ('"userplug:digits_even"', '"userplug:tiny_linear"', "data.dataset: 'userplug:tiny_linear' has the wrong signature"),
    ('"userplug:digits_even"', '"userplug"', "data.dataset: unknown dataset 'userplug'"),
    ('"userplug:ServerMomentum"', '"userplug:DealByLabel"',
     "train.algorithm: 'userplug:DealByLabel' is not a subclass of groupfel.Algorithm"),
    ('"userplug:ServerMomentum"', '"fedavgx"', "train.algorithm: unknown algorithm 'fedavgx'"),
    ('beta = 0.5', 'gamma = 0.5', "train.algorithm_params.gamma: not a parameter of algorithm 'userplug:ServerMomentum'"),
    ('"userplug:digits_even"', '"user plug:x"', "data.dataset: 'user plug:x' is neither a name nor an import path"),
])
def test_a_bad_plugin_fails_in_one_line_naming_field_and_path(tmp_path, plugin_dir, monkeypatch, capsys, old, new,
                                                              says):
    monkeypatch.syspath_prepend(str(plugin_dir))
    out = tmp_path / "out"
    assert main(["run", _tiny(tmp_path, **{old: new}), "--output", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("groupfel: error: ") and says in err and "\n" not in err, err
    assert not out.exists()      # before any work


def test_wrong_method_signature_and_abstract_policy_are_refused(tmp_path, plugin_dir, monkeypatch, capsys):
    (plugin_dir / "badplug.py").write_text(textwrap.dedent('''
        from dataclasses import dataclass
        from groupfel.policies import GroupingPolicy

        @dataclass(frozen=True)
        class TwoArgs(GroupingPolicy):
            min_group_size: int = 3
            def group(self, view):
                return None

        @dataclass(frozen=True)
        class Abstract(GroupingPolicy):
            min_group_size: int = 3

        class NotADataclass(GroupingPolicy):
            def group(self, view, rng):
                return None
    '''))
    monkeypatch.syspath_prepend(str(plugin_dir))
    for attr, says in [("TwoArgs", "has the wrong signature: group(self, view); it must be group(self, view, rng)"),
                       ("Abstract", "does not implement group"), ("NotADataclass", "is not a dataclass")]:
        path = _tiny(tmp_path, **{'"userplug:DealByLabel"': f'"badplug:{attr}"'})
        assert main(["run", path, "--output", str(tmp_path / "o"), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert f"arms[0].grouping.policy: 'badplug:{attr}' {says}" in err, err


@pytest.mark.slow
def test_report_and_plot_never_import_a_plugin(tmp_path, plugin_dir, monkeypatch):
    monkeypatch.syspath_prepend(str(plugin_dir))
    out = tmp_path / "run"
    assert main(["run", _tiny(tmp_path), "--output", str(out), "--quiet"]) == 0
    mark = Path(str(plugin_dir / "userplug.py") + ".imported")
    assert mark.exists()
    mark.unlink()
    # a fresh process where the plug-in module is not even importable
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-m", "groupfel.experiments.cli", *args], env=env, cwd=tmp_path,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)   # side by side
             for args in (["report", str(out)], ["plot", str(out), "--out", str(tmp_path / "p.png")],
                          ["timeline", str(out / "deal"), "--round", "1", "--out", str(tmp_path / "t.png")])]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    assert not mark.exists()


@pytest.mark.slow
def test_entry_point_plugins_by_short_name(tmp_path, plugin_dir):
    """A real (tiny) installed distribution: a dist-info with entry_points.txt on sys.path."""
    dist = plugin_dir / "userplug-1.2.3.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: userplug\nVersion: 1.2.3\n")
    (dist / "top_level.txt").write_text("userplug\n")
    (dist / "RECORD").write_text("userplug.py,,\n")
    (dist / "entry_points.txt").write_text(
        "[groupfel.groupings]\ndeal = userplug:DealByLabel\n\n[groupfel.models]\ntiny = userplug:tiny_linear\n\n"
        "[groupfel.datasets]\ndigits-even = userplug:digits_even\n\n"
        "[groupfel.algorithms]\nmomentum = userplug:ServerMomentum\n")
    mark = Path(str(plugin_dir / "userplug.py") + ".imported")
    helps = [_cli(args, plugin_dir, tmp_path) for args in (["group", "--help"], ["run", "--help"])]
    assert all(h.returncode == 0 for h in helps)
    assert "deal" in helps[0].stdout
    assert all(n in helps[1].stdout for n in ("deal", "tiny", "digits-even", "momentum"))
    assert not mark.exists()      # --help read the metadata and imported nothing
    pd.DataFrame({"a": [5, 0, 3, 0, 4, 1], "b": [0, 5, 1, 4, 0, 3]}).to_csv(tmp_path / "l.csv", index=False)
    grouped = _cli(["group", "--policy", "deal", "--label-matrix", "l.csv", "--format", "json"], plugin_dir, tmp_path)
    assert grouped.returncode == 0, grouped.stderr
    assert json.loads(grouped.stdout)["summary"]["n_groups"] == 2
    _tiny(tmp_path, **{'"userplug:DealByLabel"': '"deal"', '"userplug:tiny_linear"': '"tiny"',
                       '"userplug:digits_even"': '"digits-even"', '"userplug:ServerMomentum"': '"momentum"'})
    run = _cli(["run", "c.toml", "--output", "out", "--quiet"], plugin_dir, tmp_path)
    assert run.returncode == 0, run.stderr
    summary = pd.read_csv(tmp_path / "out" / "summary.csv")
    assert summary.set_index("arm").loc["deal", "grouping"] == "deal"      # the report's name too
    manifest = json.loads((tmp_path / "out" / "deal" / "manifest.json").read_text())
    assert {r["name"]: r["distribution"] for r in manifest["plugins"]}["deal"] == {"name": "userplug",
                                                                                   "version": "1.2.3"}
    page = _cli(["report", "out"], tmp_path / "nowhere", tmp_path)
    assert page.returncode == 0, page.stderr


def test_sampling_and_aggregation_plugins(tmp_path, plugin_dir, monkeypatch):
    (plugin_dir / "cloudplug.py").write_text(textwrap.dedent('''
        from dataclasses import dataclass

        import numpy as np

        from groupfel.policies import AggregationRule, SamplingPolicy


        @dataclass(frozen=True)
        class Skewed(SamplingPolicy):
            """The least balanced groups first: w = CoV^power."""

            power: float = 1.0

            def log_weights(self, covs):
                return self.power * np.log(covs)


        @dataclass(frozen=True)
        class Equal(AggregationRule):
            def weights(self, n_g, log_pi, n_total):
                return np.full(len(n_g), 1.0 / len(n_g))
    '''))
    monkeypatch.syspath_prepend(str(plugin_dir))
    path = _tiny(tmp_path, **{'sampling = { policy = "random", groups_per_round = 2 }\n[[arms]]':
                              'sampling = { policy = "cloudplug:Skewed", groups_per_round = 2, power = 2.0 }\n'
                              'aggregation = "cloudplug:Equal"\n[[arms]]'})
    assert main(["run", path, "--output", str(tmp_path / "run"), "--quiet"]) == 0
    manifest = json.loads((tmp_path / "run" / "deal" / "manifest.json").read_text())
    assert manifest["sampling_policy"] == "cloudplug:Skewed" and manifest["aggregation"] == "cloudplug:Equal"
    assert {r["field"]: r["import_path"] for r in manifest["plugins"]} == {
        "data.dataset": "userplug:digits_even", "train.model": "userplug:tiny_linear",
        "train.algorithm": "userplug:ServerMomentum",
        "arms[0].grouping.policy": "userplug:DealByLabel", "arms[0].sampling.policy": "cloudplug:Skewed",
        "arms[0].aggregation": "cloudplug:Equal"}
    sys.modules.pop("cloudplug", None)


def test_an_algorithm_plugin_by_hand(plugin_dir, monkeypatch):
    """FedAvgM's cloud step through the public hooks, by hand: x = (1, 1), v = (0.2, 0), beta 0.5;
    groups (2, 0) and (0, 4) weighted 0.25 / 0.75 aggregate to (0.5, 3); v' = 0.5 (0.2, 0) +
    ((1, 1) - (0.5, 3)) = (0.6, -2); x' = x - v' = (0.4, 3)."""
    import torch

    from groupfel.emulator.algorithms import make_algorithm

    monkeypatch.syspath_prepend(str(plugin_dir))
    alg = make_algorithm("userplug:ServerMomentum", {"beta": 0.5})
    state = alg.init_state(2, torch.tensor([1.0, 1.0]))
    state.server["velocity"] = torch.tensor([0.2, 0.0])
    x = alg.aggregate_cloud(state, None, [0.25, 0.75], [torch.tensor([2.0, 0.0]), torch.tensor([0.0, 4.0])],
                            None, None)
    torch.testing.assert_close(x, torch.tensor([0.4, 3.0]))
    torch.testing.assert_close(state.server["velocity"], torch.tensor([0.6, -2.0]))
    assert state.clients == {}


# --- contracts at the seam: what a plug-in returns is checked where it enters ---------------------------

SEAM = '''
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from groupfel.emulator.algorithms import Algorithm
from groupfel.policies import AggregationRule, EdgeGrouping, GroupingPolicy, SamplingPolicy
from groupfel.topologies import Dataset


@dataclass(frozen=True)
class Twice(GroupingPolicy):
    min_group_size: int = 3
    def group(self, view, rng):
        n = view.n_clients
        return EdgeGrouping([np.arange(0, n // 2 + 1), np.arange(n // 2, n)])   # client n//2 in both


@dataclass(frozen=True)
class AsDocumented(GroupingPolicy):
    """Written exactly as docs/plugins.md's table says: group(self, view, rng), no min_group_size."""
    def group(self, view, rng):
        return EdgeGrouping([np.arange(view.n_clients)])


@dataclass(frozen=True)
class LeavesOne(GroupingPolicy):
    def group(self, view, rng):
        return EdgeGrouping([np.arange(1, view.n_clients)])


@dataclass(frozen=True)
class LeavesOneDeclared(LeavesOne):
    leaves_clients_out = True


@dataclass(frozen=True)
class EmptyGroup(GroupingPolicy):
    def group(self, view, rng):
        return EdgeGrouping([np.arange(view.n_clients), np.array([], dtype=int)])


@dataclass(frozen=True)
class OutOfRange(GroupingPolicy):
    def group(self, view, rng):
        return EdgeGrouping([np.arange(view.n_clients + 1)])


@dataclass(frozen=True)
class Crashes(GroupingPolicy):
    def group(self, view, rng):
        return helper(view)


def helper(view):
    return 1 / 0


@dataclass(frozen=True)
class NaNSampling(SamplingPolicy):
    def log_weights(self, covs):
        return np.full(len(covs), np.nan)


@dataclass(frozen=True)
class LongSampling(SamplingPolicy):
    def log_weights(self, covs):
        return np.zeros(len(covs) + 1)


@dataclass(frozen=True)
class ShortAggregation(AggregationRule):
    def weights(self, n_g, log_pi, n_total):
        return np.ones(len(n_g) + 1)


@dataclass
class FlatCloud(Algorithm):
    def aggregate_cloud(self, state, scratch, weights, models, members, n_samples):
        return torch.zeros(3)


def wide_model(input_shape, num_classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(input_shape)), num_classes + 3))


def big_labels(path):
    rng = np.random.default_rng(0)
    x = rng.random((200, 1, 8, 8)).astype(np.float32)
    y = rng.integers(0, 6, size=200)        # 6 labels, but num_classes = 5
    return Dataset("big-labels", x[:150], y[:150], x[150:], y[150:], 5)


def nan_features(path):
    rng = np.random.default_rng(0)
    x = rng.random((200, 1, 8, 8)).astype(np.float32)
    x[7, 0, 0, 0] = np.nan
    y = rng.integers(0, 5, size=200)
    return Dataset("nan", x[:150], y[:150], x[150:], y[150:], 5)
'''


@pytest.mark.parametrize("old, new, says", [
    ('"userplug:DealByLabel", min_group_size = 3', '"seam:Twice"',
     "arms[0].grouping.policy: 'seam:Twice' breaks the grouping contract: no client may be in two groups; got "
     "client 3 of edge 0 in groups 0 and 1"),
    ('"userplug:DealByLabel", min_group_size = 3', '"seam:LeavesOne"',
     "arms[0].grouping.policy: 'seam:LeavesOne' breaks the grouping contract: every client must be in a group "
     "unless the policy declares leaves_clients_out = True (or lists them in EdgeGrouping.dropped); got client(s) "
     "[0] of edge 0 in no group"),
    ('"userplug:DealByLabel", min_group_size = 3', '"seam:EmptyGroup"',
     "breaks the grouping contract: no group may be empty; got group 1 of edge 0 empty"),
    ('"userplug:DealByLabel", min_group_size = 3', '"seam:OutOfRange"',
     "breaks the grouping contract: client indices must lie in 0..5 (the edge's 6 clients); got 6 in group 0 of edge 0"),
    ('{ policy = "random", groups_per_round = 2 }\n[[arms]]', '{ policy = "seam:NaNSampling", groups_per_round = 2 }'
     '\n[[arms]]', "arms[0].sampling.policy: 'seam:NaNSampling' breaks the sampling contract: log_weights() must be "
     "finite; got nan for group 0 of"),
    ('{ policy = "random", groups_per_round = 2 }\n[[arms]]', '{ policy = "seam:LongSampling", groups_per_round = 2 }'
     '\n[[arms]]', "arms[0].sampling.policy: 'seam:LongSampling' breaks the sampling contract: log_weights() must be "
     "one number per group ("),
    ('{ policy = "random", groups_per_round = 2 }\n[[arms]]', '{ policy = "random", groups_per_round = 2 }\n'
     'aggregation = "seam:ShortAggregation"\n[[arms]]', "arms[0].aggregation: 'seam:ShortAggregation' breaks the "
     "aggregation contract: weights() must be one number per group (2 groups); got shape (3,)"),
    ('"userplug:tiny_linear"', '"seam:wide_model"', "train.model: 'seam:wide_model' breaks the model contract: one "
     "sample's output must have shape (1, num_classes) = (1, 5); got (1, 8)"),
    ('"userplug:digits_even"', '"seam:big_labels"', "data.dataset: 'seam:big_labels' breaks the dataset contract: "
     "labels must be integers in 0..4 (num_classes = 5); got 5 in y_train"),
    ('"userplug:digits_even"', '"seam:nan_features"', "data.dataset: 'seam:nan_features' breaks the dataset "
     "contract: features must be finite; got a NaN or infinity in x_train[7]"),
    ('"userplug:ServerMomentum"', '"seam:FlatCloud"', "train.algorithm: 'seam:FlatCloud' breaks the algorithm "
     "contract: aggregate_cloud() must return a tensor of shape (325,); got shape (3,)"),
])
def test_a_plugin_breaking_its_contract_stops_in_one_line_before_anything_is_written(
        tmp_path, plugin_dir, monkeypatch, capsys, old, new, says):
    """Before: exit 0 (a client trained and weighted twice; three outputs too many), numpy's 'pvals < 0,
    pvals > 1 or pvals contains NaNs', or a traceback from deep in the loop. The algorithm's broken
    return is found only in round 1: the run stops there and keeps nothing."""
    (plugin_dir / "seam.py").write_text(SEAM)
    monkeypatch.syspath_prepend(str(plugin_dir))
    drop = {"algorithm_params = { beta = 0.5 }": ""} if "ServerMomentum" in old else {}
    path = _tiny(tmp_path, **{old: new, **drop})
    out = tmp_path / "out"
    assert main(["run", path, "--output", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("groupfel: error: ") and "\n" not in err, err
    assert says in err, err
    assert not out.exists(), sorted(out.rglob("*"))
    sys.modules.pop("seam", None)


def test_a_policy_written_as_the_docs_say_runs_and_a_declared_leave_out_is_counted(tmp_path, plugin_dir,
                                                                                   monkeypatch):
    """Before: AttributeError: 'AsDocumented' object has no attribute 'min_group_size'."""
    (plugin_dir / "seam.py").write_text(SEAM)
    monkeypatch.syspath_prepend(str(plugin_dir))
    for policy, dropped in (("AsDocumented", 0), ("LeavesOneDeclared", 2)):
        path = _tiny(tmp_path, **{'"userplug:DealByLabel", min_group_size = 3': f'"seam:{policy}"',
                                  "rounds = 4": "rounds = 1"})
        out = tmp_path / policy
        assert main(["run", path, "--output", str(out), "--quiet"]) == 0
        manifest = json.loads(next(out.rglob("deal/manifest.json")).read_text())
        assert manifest["grouping"]["clients_dropped"] == dropped   # one client of each of the 2 edges
    sys.modules.pop("seam", None)


def test_a_plugin_exception_keeps_its_traceback_under_one_line_naming_it(tmp_path, plugin_dir, monkeypatch,
                                                                         capsys):
    (plugin_dir / "seam.py").write_text(SEAM)
    monkeypatch.syspath_prepend(str(plugin_dir))
    path = _tiny(tmp_path, **{'"userplug:DealByLabel", min_group_size = 3': '"seam:Crashes"'})
    assert main(["run", path, "--output", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == "Traceback (most recent call last):"
    assert any("in helper" in line for line in err) and "ZeroDivisionError: division by zero" in err
    assert err[-1] == ("groupfel: error: arms[0].grouping.policy: 'seam:Crashes' raised ZeroDivisionError in its "
                       "group() (its traceback is above; the bug is in that code)")
    assert not (tmp_path / "out").exists()
    sys.modules.pop("seam", None)


def test_a_multi_seed_run_stops_the_same_way(tmp_path, plugin_dir, monkeypatch, capsys):
    """Found in round 1 on the worker pool: exit 2, one line, no directory left; a plug-in's own
    exception found while validating keeps its traceback."""
    (plugin_dir / "seam.py").write_text(SEAM)
    monkeypatch.syspath_prepend(str(plugin_dir))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(plugin_dir), str(ROOT)]))
    (tmp_path / "c.toml").write_text(CONFIG.replace('"userplug:ServerMomentum"', '"seam:FlatCloud"')
                                     .replace("algorithm_params = { beta = 0.5 }", ""))
    assert main(["run", str(tmp_path / "c.toml"), "--output", str(tmp_path / "out"), "--quiet", "--jobs", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "aggregate_cloud() must return a tensor of shape (325,); got shape (3,)" in err, err
    assert not (tmp_path / "out").exists()
    (tmp_path / "c.toml").write_text(CONFIG.replace('"userplug:DealByLabel", min_group_size = 3', '"seam:Crashes"'))
    assert main(["run", str(tmp_path / "c.toml"), "--output", str(tmp_path / "out"), "--quiet", "--jobs", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == "Traceback (most recent call last):" and "ZeroDivisionError: division by zero" in err
    assert err[-1].startswith("groupfel: error: arms[0].grouping.policy: 'seam:Crashes' raised ZeroDivisionError")
    sys.modules.pop("seam", None)
