"""The authors' Digit model with BatchNorm (``train.model = "digit-bn-cnn"``) and the authors'
"gradient", the change of the whole state dict (HCCT ``gradient = "state"``, MAXFL ``vector =
"state"``): the statistics travel in the flat vector, take no gradient step, and only the
``"state"`` options compare them."""
import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from groupfel.emulator.algorithms import algorithms
from groupfel.emulator.arm import ArmState
from groupfel.emulator.config import parse_config
from groupfel.emulator.driver import plan_arm, run_arm
from groupfel.emulator.models import build_model, trainable_mask
from groupfel.emulator.rounds.common import ArmTraining
from groupfel.emulator.training import BatchedEngine, TorchEngine
from groupfel.emulator.world import build_world
from groupfel.policies import EdgeView, groupings
from groupfel.topologies import Dataset


def _data(n=40, side=8, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 1, side, side)).astype(np.float32)
    return Dataset("t", x, rng.integers(0, 10, n), x[:8], rng.integers(0, 10, 8), 10)


def test_statistics_are_parameters_without_a_gradient_under_the_state_dict_names():
    model = build_model("digit-bn-cnn", (1, 8, 8), 10)
    names = dict(model.named_parameters())
    assert {"1.running_mean", "1.running_var", "1.num_batches_tracked"} <= set(names)
    assert not names["1.running_var"].requires_grad and names["1.weight"].requires_grad
    assert not any(model.buffers())                    # nothing outside the flat vector
    assert list(model.state_dict()) == list(names)     # the authors' state dict, entry for entry


def test_engine_matches_torch_sgd_and_leaves_the_statistics_to_batchnorm():
    """Weight decay and momentum step only the parameters; the statistics follow BatchNorm's
    running update and the counter counts the batches (the flat vector's state = torch's)."""
    ds = _data()
    engine = TorchEngine(ds, [np.arange(21)], "digit-bn-cnn", 0.05, 8, momentum=0.9, weight_decay=0.01)
    x0 = engine.initial_weights(0)
    out = engine.train(x0, [0], 2, [7])[0]
    ref = build_model("digit-bn-cnn", (1, 8, 8), 10)
    torch.nn.utils.vector_to_parameters(x0.clone(), ref.parameters())
    opt = torch.optim.SGD([p for p in ref.parameters() if p.requires_grad], lr=0.05, momentum=0.9, weight_decay=0.01)
    gen, idx = torch.Generator().manual_seed(7), torch.arange(21)
    ref.train()
    for _ in range(2):
        order = idx[torch.randperm(21, generator=gen)]
        for b in range(0, 21, 8):          # 8, 8, 5
            batch = order[b:b + 8]
            opt.zero_grad()
            nn.functional.cross_entropy(ref(torch.as_tensor(ds.x_train)[batch]),
                                        torch.as_tensor(ds.y_train)[batch]).backward()
            opt.step()
    want = torch.nn.utils.parameters_to_vector(ref.parameters()).detach()
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
    stats = torch.as_tensor(~trainable_mask(engine))
    assert (out[stats] != x0[stats]).any()
    counters = [p for n, p in ref.named_parameters() if n.endswith("num_batches_tracked")]
    assert all(float(c) == 6 for c in counters)        # 2 epochs of 3 batches


def test_a_training_batch_of_one_sample_trains():
    engine = TorchEngine(_data(), [np.arange(9)], "digit-bn-cnn", 0.05, 8)   # batches of 8 and 1
    out = engine.train(engine.initial_weights(0), [0], 1, [1])
    assert torch.isfinite(out).all()


def test_batched_engine_trains_it_client_by_client_as_the_sequential_engine():
    ds = _data()
    parts = [np.arange(20), np.arange(20, 40)]
    seq = TorchEngine(ds, parts, "digit-bn-cnn", 0.05, 8)
    bat = BatchedEngine(ds, parts, "digit-bn-cnn", 0.05, 8, formulation="stacked", workers=1)
    assert bat.formulation == "per-client"
    x0 = seq.initial_weights(0)
    torch.testing.assert_close(bat.train(x0, [0, 1], 1, [1, 2]), seq.train(x0, [0, 1], 1, [1, 2]),
                               rtol=1e-4, atol=1e-4)


def test_hcct_compares_the_parameters_or_the_whole_state():
    """Four clients whose parameter gradients are orthogonal pairs but whose statistics moved
    alike (the authors' vector): only ``gradient = "state"`` merges them."""
    params = np.kron(np.eye(4), np.ones(3))             # 4 clients × 12 parameter entries, orthogonal
    stats = np.full((4, 40), 5.0)                        # 40 statistic entries that moved the same way
    grads = np.hstack([params, stats])
    trainable = np.r_[np.ones(12, bool), np.zeros(40, bool)]
    view = EdgeView(np.full((4, 10), 20), grads, (slice(0, 12), slice(12, 52)), trainable=trainable)
    rng = np.random.default_rng(0)
    own = groupings.make("hcct", {"alpha": 1.0}).group(view, rng).groups
    authors = groupings.make("hcct", {"alpha": 1.0, "gradient": "state"}).group(view, rng).groups
    assert len(own) == 4 and len(authors) == 1
    # without a mask (a model with no statistics) the two options are one
    plain = EdgeView(view.label_counts, grads)
    assert len(groupings.make("hcct", {"alpha": 1.0}).group(plain, rng).groups) == 1
    # HCCT-E picks its layer among the parameters' columns only, unless "state"
    e_own = groupings.make("hcct-e", {"alpha": 1.0})._gradients(view)
    e_state = groupings.make("hcct-e", {"alpha": 1.0, "gradient": "state"})._gradients(view)
    assert e_own.shape[1] == 12 and e_state.shape[1] in (12, 40)
    with pytest.raises(ValueError, match="gradient must be one of parameters, state"):
        groupings.make("hcct", {"gradient": "buffers"})


def test_hcct_e_signed_ratio_is_the_authors_layer_choice():
    # layer 0: large variance, mean gradient -1 (signed ratio negative); layer 1: small variance, mean +1
    g = np.array([[-3.0, 1.1], [1.0, 0.9], [-1.0, 1.0]])
    from groupfel.policies.hcct import relative_variance_layer
    layers = (slice(0, 1), slice(1, 2))
    assert relative_variance_layer(g, layers) == 0
    assert relative_variance_layer(g, layers, "signed") == 1


def _bn_world(tiny_dict, params):
    tiny_dict["mode"] = "per-group"
    tiny_dict["topology"] = {"edges": 1, "clients_per_edge": 4}
    tiny_dict["train"].update(model="digit-bn-cnn", rounds=2, group_rounds=1, algorithm="maxfl",
                              algorithm_params=params)
    tiny_dict["arms"] = [{"name": "a", "grouping": {"policy": "global"}}]
    return build_world(parse_config(tiny_dict))


def test_maxfl_distance_over_the_parameters_or_the_state(tiny_dict):
    world = _bn_world(tiny_dict, {"threshold": "distance"})
    x0 = world.engine.initial_weights(world.config.seed)
    own = x0.repeat(2, 1)
    own[:, torch.as_tensor(~trainable_mask(world.engine))] += 10.0   # ŵ_i differs in its statistics only
    loss = np.array([0.5, 0.5])
    for vector, joins in (("parameters", [False, False]), ("state", [True, True])):
        alg = algorithms.make("maxfl", {"threshold": "distance", "vector": vector})
        ArmTraining(world, ArmState(), True, x0, alg)
        assert alg._joins(loss, own, x0.repeat(2, 1), [0, 1]).tolist() == joins


def test_maxfl_rows_count_its_participants(tiny_dict, tmp_path):
    world = _bn_world(tiny_dict, {"threshold": "distance", "prior": "once", "vector": "state"})
    rows = run_arm(world, plan_arm(world, 0), tmp_path / "a")
    assert np.isnan(rows["maxfl_participants"].iloc[0])
    assert rows["maxfl_participants"].iloc[1] == 4        # round 0 (the authors' epoch 0): every client
    assert 0 <= rows["maxfl_participants"].iloc[2] <= 4
    assert isinstance(rows, pd.DataFrame)

