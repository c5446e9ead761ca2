"""The HCCT authors' remaining choices (hiyuchang/HCCT: main_cluster.py, models/Fed.py,
utils/keyfunc.py) as named options, each against a hand or reference computation: HCCT-E's l*
chosen once, FLSC evaluated with each client's local model, HCCT-P swapping only the last layer at
evaluation, the epoch-0 global FedAvg, MAXFL's w_i trained once, each client's best accuracy over
the evaluations, BatchNorm statistics copied from client 0, and IPR intervals inside [0, 100]."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from groupfel.emulator.algorithms import algorithms
from groupfel.emulator.driver import plan_arm, run_arm
from groupfel.emulator.federation import client_seeds
from groupfel.emulator.rng import rng
from groupfel.emulator.rounds.per_group import PerGroupRounds
from groupfel.emulator.world import build_world
from groupfel.experiments import readme_render
from conftest import reproduction_script
from groupfel.experiments.stats import BOUNDS, clip
from groupfel.policies.grouping import EdgeView
from groupfel.policies.hcct import HCCTEGrouping, relative_variance_layer

from test_baselines_hcct import _bound, _one_group_round, _pergroup


# -- HCCT-E: l* once -----------------------------------------------------------------------------------

def test_hcct_e_layer_once_keeps_the_first_partitions_layer():
    slices = (slice(0, 2), slice(2, 4))
    # first gradients: layer 1 varies across clients (layer 0 equal) -> l* = 1
    first = np.array([[1.0, 1.0, 1.0, -1.0], [1.0, 1.0, -1.0, 1.0], [1.0, 1.0, 2.0, 2.0]])
    # later gradients: layer 0 varies, layer 1 equal -> l* = 0 when chosen afresh
    later = np.array([[1.0, -1.0, 1.0, 1.0], [-1.0, 1.0, 1.0, 1.0], [2.0, 2.0, 1.0, 1.0]])
    assert relative_variance_layer(first, slices) == 1 and relative_variance_layer(later, slices) == 0
    counts = np.full((3, 2), 5)
    once, every = HCCTEGrouping(alpha=1.0, layer="once"), HCCTEGrouping(alpha=1.0)
    memo: dict = {}
    np.testing.assert_array_equal(once._gradients(EdgeView(counts, first, slices, memo=memo)), first[:, 2:4])
    assert memo == {"hcct_e_layer": 1, "hcct_e_layer_name": "layer 1"}
    np.testing.assert_array_equal(once._gradients(EdgeView(counts, later, slices, memo=memo)), later[:, 2:4])
    np.testing.assert_array_equal(every._gradients(EdgeView(counts, later, slices, memo={})), later[:, 0:2])
    with pytest.raises(ValueError, match="layer must be one of every, once"):
        HCCTEGrouping(layer="first")


def test_a_per_group_run_writes_its_groups_and_hcct_e_layer_per_round(tiny_dict, tmp_path):
    """groups.csv: every round's groups that trained, a partition of the clients each round, and
    for HCCT-E the layer its Eq. 19 chose at that round's partition, by module name."""
    import pandas as pd
    from groupfel.emulator.models import model_layers
    cfg = _pergroup(tiny_dict, "fedavg", grouping={"policy": "hcct-e", "alpha": 1e6, "schedule": "alg1"}, rounds=3)
    world = build_world(cfg)
    results = run_arm(world, plan_arm(world, 0), tmp_path / "a")
    got = pd.read_csv(tmp_path / "a" / "groups.csv")
    assert sorted(got["round"].unique()) == [1, 2, 3]
    for r, rows in got.groupby("round"):
        members = sorted(int(c) for cs in rows["clients"] for c in str(cs).split())
        assert members == list(range(world.topology.n_clients))
        assert len(rows) == results.loc[results["round"] == r, "groups_sampled"].item()
    names = {layer.name for layer in model_layers(world.engine)}
    assert got.loc[got["round"] == 1, "layer"].isna().all()      # t = 0: every client alone, no partition
    assert set(got.loc[got["round"] > 1, "layer"]) <= names and got.loc[got["round"] > 1, "layer"].notna().all()


def _digit_bn_layers():
    """The layers of the HCCT authors' Digit model (FedBN's, ``digit-bn-cnn``) as an edge sees them."""
    from groupfel.emulator.models import build_model, model_layers, trainable_mask
    engine = SimpleNamespace(model=build_model("digit-bn-cnn", (1, 4, 4), 10))   # small inputs: a small fc1
    return model_layers(engine), trainable_mask(engine)


@pytest.mark.parametrize("ratio, gradient", [("absolute", "parameters"), ("signed", "state"), ("authors", "state")])
def test_hcct_e_never_picks_a_batchnorm_module_by_default(ratio, gradient):
    """On the authors' Digit model, BatchNorm modules whose gradients vary most (and, for the
    signed readings, have the largest positive mean) are never l* by default; with
    ``norm_layers = true`` they are, as before."""
    layers, trainable = _digit_bn_layers()
    assert [l.name for l in layers if not l.norm] == ["0 (Conv2d)", "4 (Conv2d)", "8 (Conv2d)", "12 (Linear)",
                                                      "15 (Linear)", "18 (Linear)"]   # the authors' candidates
    assert [l.name for l in layers if l.norm] == ["1 (BatchNorm2d)", "5 (BatchNorm2d)", "9 (BatchNorm2d)",
                                                  "13 (_BatchNorm1d)", "16 (_BatchNorm1d)"]
    n = 4
    for seed in range(2):
        rng = np.random.default_rng(seed)
        grads = 1e-3 * rng.normal(size=(n, len(trainable))) + 1e-3
        for layer in layers:   # every normalisation module: widely spread, positive mean
            if layer.norm:
                grads[:, layer.columns] = 1.0 + 5.0 * rng.normal(size=(n, layer.columns.stop - layer.columns.start))
        view = EdgeView(np.full((n, 10), 20), grads, layers, memo={}, trainable=trainable)
        chosen = HCCTEGrouping(alpha=100.0, layer_ratio=ratio, gradient=gradient)
        chosen._gradients(view)
        assert "BatchNorm" not in view.memo["hcct_e_layer_name"]
        before = EdgeView(view.label_counts, grads, layers, memo={}, trainable=trainable)
        HCCTEGrouping(alpha=100.0, layer_ratio=ratio, gradient=gradient, norm_layers=True)._gradients(before)
        assert "BatchNorm" in before.memo["hcct_e_layer_name"]


def test_hcct_e_authors_ratio_is_the_authors_expression():
    """``layer_ratio = "authors"`` against main_cluster.py's own lines, run on the same gradients
    in their layout (a dict of weight and bias arrays per client, a layer's value the sum of
    ``np.var(g) / np.mean(g)`` of its weight and its bias)."""
    from groupfel.policies.hcct import layer_ratios
    rng = np.random.default_rng(3)
    shapes = {"conv1": ((4, 1, 3, 3), (4,)), "fc1": ((5, 36), (5,)), "fc2": ((3, 5), (3,))}
    n = 4
    g_local_list = {k + ".weight": [] for k in shapes}
    g_local_list.update({k + ".bias": [] for k in shapes})
    rows = []
    for _ in range(n):
        row = []
        for key, (w, b) in shapes.items():
            gw, gb = rng.normal(0.01, 0.1, size=w), rng.normal(0.01, 0.1, size=b)
            g_local_list[key + ".weight"].append(gw)
            g_local_list[key + ".bias"].append(gb)
            row += [gw.ravel(), gb.ravel()]
        rows.append(np.concatenate(row))
    # main_cluster.py, "choose which layer for clustering", verbatim but for the names
    layer_values = {key: 0.0 for key in shapes}
    g_local_var = dict()
    for key in g_local_list.keys():
        g_local_var[key] = np.var(g_local_list[key]) / np.mean(g_local_list[key])
    for layer in layer_values.keys():
        layer_values[layer] += g_local_var[layer + ".weight"]
        layer_values[layer] += g_local_var[layer + ".bias"]
    cluster_layer = max(zip(layer_values.values(), layer_values.keys()))[1]
    # ours, on the flat rows with each layer's (weight, bias) ranges
    layers, offset = [], 0
    for w, b in shapes.values():
        nw, nb = int(np.prod(w)), int(np.prod(b))
        layers.append((slice(offset, offset + nw), slice(offset + nw, offset + nw + nb)))
        offset += nw + nb
    grads = np.stack(rows)
    np.testing.assert_allclose(layer_ratios(grads, layers, "authors"), list(layer_values.values()), rtol=1e-12)
    assert list(shapes)[relative_variance_layer(grads, layers, "authors")] == cluster_layer
    with pytest.raises(ValueError, match="layer_ratio must be one of absolute, signed, authors"):
        HCCTEGrouping(layer_ratio="pooled")


# -- FLSC: each client's local model ---------------------------------------------------------------------

def test_flsc_local_evaluation_is_the_clients_last_trained_model(tiny_dict):
    world = build_world(_pergroup(tiny_dict, "flsc", {"n_clusters": 3, "n_soft": 2, "init": "shared",
                                                        "evaluate": "local"}))
    training, x0 = _bound(world)
    alg = training.algorithm
    assert torch.equal(alg.personal_model(training.state, 1, x0 + 1), x0)   # before training: the initial model
    clients = np.array([0, 1, 2])
    _, scratch = _one_group_round(world, training, x0, clients)
    # shared init: every cluster is x0, so each client trains E epochs from x0 with its own seed
    trained = world.engine.train(x0, clients.tolist(), 1, client_seeds(3, 0, 0, clients).tolist())
    for r, c in enumerate(clients):
        torch.testing.assert_close(alg.personal_model(training.state, int(c), x0), trained[r])
    clusters = alg._clusters(training.state)
    assert not torch.equal(clusters[0], trained[0])    # the default evaluates the cluster mix instead


# -- HCCT-P: swap only at evaluation ---------------------------------------------------------------------

def test_fedper_swap_at_evaluation_trains_as_fedavg(tiny_dict):
    world = build_world(_pergroup(tiny_dict, "fedper", {"swap": "evaluate"}, {"policy": "hcct", "alpha": 1.0}))
    training, x0 = _bound(world)
    alg, own = training.algorithm, training.state.clients["own"]
    own[1, alg.head] = 0.5                   # an own classifier does not enter training
    model, _ = _one_group_round(world, training, x0, [0, 1])
    s0, s1 = client_seeds(3, 0, 0, np.array([0, 1])).tolist()
    y = world.engine.train(x0, [0, 1], 1, [s0, s1])
    n = world.topology.n_samples[[0, 1]]
    torch.testing.assert_close(model, float(n[0] / n.sum()) * y[0] + float(n[1] / n.sum()) * y[1])
    torch.testing.assert_close(own[1, alg.head], y[1, alg.head])   # the classifier it trained stays
    personal = alg.personal_model(training.state, 1, model)
    assert torch.equal(personal[:alg.head.start], model[:alg.head.start])
    assert torch.equal(personal[alg.head], own[1, alg.head])


# -- MAXFL: w_i once ---------------------------------------------------------------------------------

def test_maxfl_prior_once_round0_is_global_and_w_prior_stays(tiny_dict):
    world = build_world(_pergroup(tiny_dict, "maxfl", {"threshold": "distance", "prior": "once"}))
    training, x0 = _bound(world)
    alg, state = training.algorithm, training.state
    assert alg.training_passes == 1.0 and algorithms.make("maxfl", {}).training_passes == 2.0
    clients = np.array([0, 1, 2])
    model, scratch = _one_group_round(world, training, x0, clients)
    assert all(scratch.joins.values())      # the authors' epoch 0: everyone in the global FedAvg
    y = world.engine.train(x0, clients.tolist(), 1, client_seeds(3, 0, 0, clients).tolist())
    n = torch.as_tensor(world.topology.n_samples[clients] / world.topology.n_samples[clients].sum(),
                        dtype=torch.float32)
    torch.testing.assert_close(model, n @ y)
    # w_prior: E epochs from the initial model at round 0's lr, a seed of its own per client
    seeds = [int(rng(world.config.seed, "maxfl-prior", int(c)).integers(2**31)) for c in clients]
    prior = world.engine.train(x0, clients.tolist(), 1, seeds, lr=world.config.train.lr)
    torch.testing.assert_close(state.clients["prior"][clients], prior)
    for c in clients:   # the participants hold the aggregate, and are evaluated with it
        torch.testing.assert_close(alg.personal_model(state, int(c), model), model)
    # round 1: the decision is f_i(x) < ‖w_prior − x‖² with the prior fixed
    scratch1 = alg.begin_round(state, [0], clients)
    starts = model.expand(len(clients), -1)
    alg.local_start(state, scratch1, torch.as_tensor(clients), starts, [0] * len(clients))
    loss = training.algorithm.ctx.score_train(model, clients)[1]
    bound = ((prior.double() - model.double()) ** 2).sum(dim=1).numpy()
    assert [scratch1.joins[int(c)] for c in clients] == (loss < bound).tolist()
    with pytest.raises(ValueError, match="prior must be one of trained, once"):
        algorithms.make("maxfl", {"prior": "never"})


def test_maxfl_prior_epochs_trains_w_prior_as_long_as_the_authors(tiny_dict):
    """prior_epochs = N: w_prior is N epochs from the initial model (the authors' local_ep × epochs),
    not one group round's E; bad values are refused."""
    world = build_world(_pergroup(tiny_dict, "maxfl", {"threshold": "distance", "prior": "once", "prior_epochs": 3}))
    training, x0 = _bound(world)
    clients = np.array([0, 1, 2])
    _one_group_round(world, training, x0, clients)
    seeds = [int(rng(world.config.seed, "maxfl-prior", int(c)).integers(2**31)) for c in clients]
    three = world.engine.train(x0, clients.tolist(), 3, seeds, lr=world.config.train.lr)
    one = world.engine.train(x0, clients.tolist(), 1, seeds, lr=world.config.train.lr)
    torch.testing.assert_close(training.state.clients["prior"][clients], three)
    assert not torch.allclose(three, one)
    for bad, match in (({"prior": "once", "prior_epochs": -1}, "prior_epochs must be"),
                       ({"prior_epochs": 5}, "prior_epochs needs prior")):
        with pytest.raises(ValueError, match=match):
            algorithms.make("maxfl", bad)


# -- the epoch-0 global FedAvg -------------------------------------------------------------------------

def test_hcct_first_global_trains_epoch_0_as_one_fedavg(tiny_dict, tmp_path):
    cfg = _pergroup(tiny_dict, "fedavg", rounds=1, grouping={"policy": "hcct", "alpha": 1.0, "first": "global"})
    cfg = cfg.model_copy(update={"arms": [*cfg.arms, cfg.arms[0].model_copy(
        update={"name": "g", "grouping": {"policy": "global"}})]})
    world = build_world(cfg)
    hcct, glob = (run_arm(world, plan_arm(world, i), tmp_path / str(i)) for i in (0, 1))
    assert hcct["local_error_mean"].tolist() == glob["local_error_mean"].tolist()
    alone = build_world(_pergroup(tiny_dict, "fedavg", rounds=1, grouping={"policy": "hcct", "alpha": 1.0}))
    assert run_arm(alone, plan_arm(alone, 0), tmp_path / "alone")["local_error_mean"].iloc[-1] \
        != hcct["local_error_mean"].iloc[-1]


# -- best accuracy over evaluations ------------------------------------------------------------------

def test_best_accuracy_is_each_clients_best_after_round_0():
    state = SimpleNamespace(best_accuracy=None, t=0)
    host = SimpleNamespace(state=state)
    here = np.array([True, True, True])
    got = PerGroupRounds._best(host, np.array([0.9, 0.9, 0.9]), here)   # round 0: not counted
    assert np.isnan(got["local_error_best_mean"])
    state.t = 1
    PerGroupRounds._best(host, np.array([0.5, 0.8, 0.6]), here)
    state.t = 2
    got = PerGroupRounds._best(host, np.array([0.7, 0.4, 0.6]), here)
    best_err = 1 - np.array([0.7, 0.8, 0.6])
    assert got["local_error_best_mean"] == pytest.approx(best_err.mean())
    assert got["local_error_best_std"] == pytest.approx(best_err.std())
    assert (got["local_error_best_min"], got["local_error_best_max"]) == pytest.approx((0.2, 0.4))


def test_report_best_columns_in_a_run(tiny_dict, tmp_path):
    tiny_dict["train"]["report_best"] = True
    world = build_world(_pergroup(tiny_dict, "fedavg", rounds=2, grouping={"policy": "local"}))
    rows = run_arm(world, plan_arm(world, 0), tmp_path / "a")
    assert np.isnan(rows["local_error_best_mean"].iloc[0])
    assert rows["local_error_best_mean"].iloc[1] == pytest.approx(rows["local_error_mean"].iloc[1])
    assert rows["local_error_best_mean"].iloc[2] <= min(rows["local_error_mean"].iloc[1:]) + 1e-12


# -- BatchNorm: client 0's running statistics ------------------------------------------------------------

def test_batchnorm_statistics_copied_from_client_0():
    average_states = reproduction_script("hcct-batchnorm/hcct_batchnorm.py").average_states
    def state(v):
        return {"w": torch.tensor([v, 2 * v]), "bn.running_mean": torch.tensor([v]),
                "bn.running_var": torch.tensor([v + 1]), "bn.num_batches_tracked": torch.tensor(int(v))}
    trained = [state(1.0), state(3.0), state(5.0)]
    sizes = np.array([1, 1, 3])
    authors = average_states(trained, [1, 2], sizes, "client0")
    torch.testing.assert_close(authors["w"], torch.tensor([0.25 * 3 + 0.75 * 5, 2 * (0.25 * 3 + 0.75 * 5)]))
    assert authors["bn.running_mean"].item() == 1.0 and authors["bn.running_var"].item() == 2.0
    assert authors["bn.num_batches_tracked"].item() == 1   # client 0's, though not in the group
    mean = average_states(trained, [1, 2], sizes, "mean")
    assert mean["bn.running_mean"].item() == pytest.approx(4.5)
    # a group of one keeps its own statistics (the authors copy the member's state whole)
    alone = average_states(trained, [2], sizes, "client0")
    assert alone["bn.running_mean"].item() == 5.0 and alone["bn.num_batches_tracked"].item() == 5
    assert all(torch.equal(alone[k], average_states(trained, [2], sizes, "mean")[k]) for k in alone)


# -- IPR's interval ------------------------------------------------------------------------------------

def test_ipr_interval_is_clipped_to_0_100():
    assert BOUNDS["ipr"] == (0.0, 1.0)
    # the bad case: 40 [-87, 167] becomes 40 [0, 100]
    assert clip(-87.0, 167.0, (0.0, 100.0)) == (0.0, 100.0, True)
    assert readme_render._bounds("fedcollab-table2", "ipr") == (0.0, 100.0)


def test_rendered_ipr_interval_is_clipped(tmp_path, monkeypatch):
    d = tmp_path / "fedcollab-table2" / "quick"
    d.mkdir(parents=True)
    import pandas as pd
    pd.DataFrame([{"arm": "global", "metric": "ipr", "ours": 40.0, "ci95_low": -87.0, "ci95_high": 167.0}]) \
        .to_csv(d / "fedcollab-table2.csv", index=False)
    (tmp_path / "t.md").write_text('{{ ours("fedcollab-table2", "quick", "ipr", "global", 0) }}')
    monkeypatch.setattr(readme_render, "ROOT", tmp_path)
    readme_render._csv.cache_clear()
    assert readme_render.render(tmp_path / "t.md") == "40 [0, 100]"
    readme_render._csv.cache_clear()


def test_before_after_pairs_the_seeds_both_folders_ran(tmp_path, monkeypatch):
    import pandas as pd
    # before: seeds 0, 1, 2 at 30, 30, 90 %; after: seeds 0, 1 at 50, 70 % -> 30.0 → 60.0 (30.0 [t interval])
    for folder, last in (("after", {0: 0.5, 1: 0.7}), ("before", {0: 0.3, 1: 0.3, 2: 0.9})):
        d = tmp_path / "x" / folder
        d.mkdir(parents=True)
        pd.DataFrame([{"arm": "a", "seed": s, "round": r, "e": v if r else 0.0} for s, v in last.items()
                      for r in (0, 1)]).to_csv(d / "runs.csv", index=False)
    (tmp_path / "t.md").write_text('{{ before_after("x", "after", "before", "e", "a", 1) }}')
    monkeypatch.setattr(readme_render, "ROOT", tmp_path)
    readme_render._csv.cache_clear()
    assert readme_render.render(tmp_path / "t.md") == "30.0 → 60.0 (30.0 [-97.1, 157.1])"
    readme_render._csv.cache_clear()
