"""FedCollab's Table 1 base algorithms (emulator/algorithms/personal.py): each one's update rule on
a hand-computed case, whole per-group runs alone and "+FedCollab", their charges, and a resume.

The hand-computed cases use softmax regression with one input feature and two classes, flat
parameters [W₀, W₁, b₀, b₁], and one training sample x = 1, y = 0 (so every minibatch is that
sample, whatever the shuffle). At w = 0 the logits are 0, p = (½, ½), and the cross-entropy's
gradient is (p − e_y)·[x, 1] per class: g(0) = [−½, ½, −½, ½]. At a model whose logits are
(z, −z) it is (σ(2z) − 1)·[1, −1, 1, −1] (σ the logistic function).
"""
import copy
import math

import numpy as np
import pandas as pd
import pytest
import torch

from groupfel.emulator.io import read_checkpoint
from groupfel.emulator.algorithms.personal import _batches as personal_batches
from groupfel.emulator.rng import key, seed_of
from groupfel.emulator.algorithms import AlgorithmContext, GroupUpdate, algorithms, make_algorithm
from groupfel.emulator.config import parse_config
from groupfel.emulator.driver import CHECKPOINT, plan_arm, plan_arms, run_arm
from groupfel.errors import InputError
from groupfel.emulator.training import TorchEngine
from groupfel.emulator.world import build_world
from groupfel.topologies import Dataset

from conftest import TINY


def sigma(z: float) -> float:
    return 1 / (1 + math.exp(-z))


def _engine(lr=0.5):
    x = np.ones((1, 1, 1, 1), dtype=np.float32)
    y = np.zeros(1, dtype=np.int64)
    return TorchEngine(Dataset("one", x, y, x, y, 2), [np.array([0])], "linear", lr=lr, batch_size=1)


def _bound(name, engine, **params):
    alg = make_algorithm(name, params)
    alg.bind(AlgorithmContext(engine, np.array([1]), None, 0))
    return alg


def _close(got, want):
    torch.testing.assert_close(got, torch.tensor(want, dtype=got.dtype), rtol=0, atol=1e-6)


def test_fednova_normalises_each_clients_update_by_its_local_steps():
    # x_g = 0; client 1 took τ=1 step to y₁ = −1, client 2 τ=2 steps to y₂ = −4, p = (½, ½).
    # d = ((0+1)/1, (0+4)/2) = (1, 2); τ_eff = ½·1 + ½·2 = 1.5; x_g ← 0 − 1.5·(½·1 + ½·2) = −2.25
    # (FedAvg: ½·(−1) + ½·(−4) = −2.5: client 2 counts twice for its two steps).
    alg = algorithms["fednova"]()
    scratch = alg.begin_round(None, [0], np.array([0, 1]))
    start, trained = torch.zeros(1), torch.tensor([[-1.0], [-4.0]])
    alg.after_local(None, scratch, torch.tensor([0, 1]), torch.zeros(2, 1), trained, torch.tensor([1.0, 2.0]), 0.1,
                    None)
    update = GroupUpdate(0, np.array([5, 5]), None, torch.tensor([0.5, 0.5]), trained, slice(0, 2), start)
    _close(alg.aggregate_group(None, scratch, update), [-2.25])
    # equal steps: FedAvg exactly
    alg.after_local(None, scratch, torch.tensor([0, 1]), torch.zeros(2, 1), trained, torch.tensor([3.0, 3.0]), 0.1,
                    None)
    _close(alg.aggregate_group(None, scratch, update), [-2.5])


def test_finetune_evaluates_the_group_model_after_local_sgd():
    # one epoch, lr ½, from w = 0: w − ½·g(0) = [¼, −¼, ¼, −¼]
    engine = _engine(lr=0.5)
    alg = _bound("finetune", engine, epochs=1)
    _close(alg.personal_model(None, 0, torch.zeros(4)), [0.25, -0.25, 0.25, -0.25])
    assert alg.evaluation_passes == 1.0 and _bound("finetune", engine, epochs=3).evaluation_passes == 3.0


def test_finetune_steps_takes_that_many_minibatch_steps():
    # FedCollab's code: 2 steps, lr ½, from w = 0: w₁ = [¼, −¼, ¼, −¼] (logits (½, −½)),
    # w₂ = w₁ − ½·(σ(1) − 1)·[1, −1, 1, −1] = ¼ + ½(1 − σ(1)) (one sample: one batch an epoch)
    engine = _engine(lr=0.5)
    alg = _bound("finetune", engine, steps=2)
    w = 0.25 + 0.5 * (1 - sigma(1.0))
    _close(alg.personal_model(None, 0, torch.zeros(4)), [w, -w, w, -w])
    assert alg.evaluation_passes == 1.0
    with pytest.raises(ValueError, match="steps must be an integer from 1 to 10,000"):
        make_algorithm("finetune", {"steps": 0})


def _two_labels_engine():
    """Two samples, x = 1 with y = 0 and y = 1, in one minibatch of 2."""
    x = np.ones((2, 1, 1, 1), dtype=np.float32)
    y = np.array([0, 1], dtype=np.int64)
    return TorchEngine(Dataset("two", x, y, x, y, 2), [np.array([0, 1])], "linear", lr=0.1, batch_size=2)


def test_per_fedavg_halves_splits_each_minibatch_into_d_and_d_prime():
    # FedCollab's code: D and D' are the two halves of one minibatch {y=0, y=1} (either order).
    # D = {y=0}: w̃ = α/2·[1, −1, 1, −1], logits (α, −α); on D' = {y=1} the gradient is
    # σ(2α)·[1, −1, 1, −1], so w = −β·σ(2α)·[1, −1, 1, −1]; D = {y=1} flips every sign.
    # Independent batches of both samples: ∇ at 0 is 0, so w̃ = 0 and w stays 0.
    engine = _two_labels_engine()
    halves = _bound("perfedavg", engine, alpha=0.5, batches="halves")
    out = halves.local_update(engine, halves.init_state(1, torch.zeros(4)), None, torch.zeros(1, 4), [0], [0], 1,
                              [7], 0.1, None, None)[0]
    v = 0.1 * sigma(1.0)
    _close(out * torch.sign(out[1]) * -1, [v, -v, v, -v])
    assert halves.training_passes == 1.0
    plain = _bound("perfedavg", engine, alpha=0.5)
    out = plain.local_update(engine, plain.init_state(1, torch.zeros(4)), None, torch.zeros(1, 4), [0], [0], 1,
                             [7], 0.1, None, None)[0]
    _close(out, [0.0] * 4)
    assert plain.training_passes == 2.0


def _authors_perfedavg_reference(x, y, w, batches, lr):
    """FedCollab's PerFedAvg.py local_train, line by line, on softmax regression [W₀, W₁, b₀, b₁]:
    batches under 4 skipped; pivot = len(Y) // 2; one SGD step at lm_lr on the first part, the
    gradient on the second part at the adapted model, the state restored, then a step at lm_lr."""
    def grad(w, idx):
        w = w.clone().requires_grad_()
        logits = x[idx, None] * w[:2] + w[2:]
        torch.nn.functional.cross_entropy(logits, y[idx]).backward()
        return w.grad
    for b in batches:
        if len(b) < 4:
            continue
        pivot = len(b) // 2
        state = w.clone()
        adapted = w - lr * grad(w, b[:pivot])
        w = state - lr * grad(adapted, b[pivot:])
    return w


def test_per_fedavg_authors_is_fedcollab_perfedavg_py():
    # 11 samples, batches of 5: shuffled batches of 5, 5, 1; the last skipped, each 5 split 2 | 3.
    rng = np.random.default_rng(3)
    xs, ys = rng.normal(size=11).astype(np.float32), rng.integers(0, 2, 11)
    engine = TorchEngine(Dataset("eleven", xs.reshape(11, 1, 1, 1), ys, xs.reshape(11, 1, 1, 1), ys, 2),
                         [np.arange(11)], "linear", lr=0.3, batch_size=5)
    alg = _bound("perfedavg", engine, alpha=0.01, batches="authors")
    w0 = torch.tensor([0.2, -0.1, 0.05, 0.0])
    out = alg.local_update(engine, alg.init_state(1, w0), None, w0[None].clone(), [0], [0], 2, [7], 0.3, None,
                           None)[0]
    order = [b.cpu().numpy() for b in personal_batches(engine, 0, 2, 7)]
    assert [len(b) for b in order] == [5, 5, 1, 5, 5, 1]
    want = _authors_perfedavg_reference(torch.tensor(xs), torch.tensor(ys), w0, order, 0.3)
    torch.testing.assert_close(out, want.to(out.dtype), rtol=0, atol=1e-6)
    assert alg.training_passes == 1.0
    # evaluation: LocalFinetune.py with finetune_steps = 1: one step at lm_lr on the first shuffled batch
    first = next(personal_batches(engine, 0, 1, seed_of(key(0, "finetune", 0)))).cpu().numpy()
    x, y = torch.tensor(xs), torch.tensor(ys)
    w = w0.clone().requires_grad_()
    torch.nn.functional.cross_entropy(x[first, None] * w[:2] + w[2:], y[first]).backward()
    torch.testing.assert_close(alg.personal_model(None, 0, w0), (w0 - 0.3 * w.grad).to(out.dtype), rtol=0, atol=1e-6)


def test_per_fedavg_authors_skips_minibatches_under_four():
    engine = _two_labels_engine()
    alg = _bound("perfedavg", engine, batches="authors")
    w0 = torch.tensor([0.3, -0.2, 0.1, 0.4])
    out = alg.local_update(engine, alg.init_state(1, w0), None, w0[None].clone(), [0], [0], 3, [7], 0.1, None, None)
    _close(out[0], w0.tolist())


def test_per_fedavg_takes_the_maml_step_and_adapts_one_step_for_evaluation():
    # α = ½: w̃ = 0 − ½·g(0) = [¼, −¼, ¼, −¼], logits (½, −½), g(w̃) = (σ(1) − 1)·[1, −1, 1, −1];
    # β = lr = 0.1: w ← 0 − 0.1·g(w̃) = 0.1·(1 − σ(1))·[1, −1, 1, −1] = 0.0268941·[1, −1, 1, −1]
    # (FedAvg's plain step would be 0.05·[1, −1, 1, −1]).
    engine = _engine()
    alg = _bound("perfedavg", engine, alpha=0.5)
    out = alg.local_update(engine, alg.init_state(1, torch.zeros(4)), None, torch.zeros(1, 4), [0], [0], 1, [7],
                           0.1, None, None)
    a = 0.1 * (1 - sigma(1.0))
    _close(out[0], [a, -a, a, -a])
    # evaluation: one step of size α on all its data: the same w̃ from w = 0
    _close(alg.personal_model(None, 0, torch.zeros(4)), [0.25, -0.25, 0.25, -0.25])


def test_pfedme_solves_the_moreau_envelope_then_moves_the_local_model():
    # λ = 2, K = 2 inner steps of size 0.2, η = lr = 0.1, from w = θ = 0:
    #   θ₁ = 0 − 0.2·(g(0) + 2·0) = [0.1, −0.1, 0.1, −0.1]
    #   θ₂ = θ₁ − 0.2·(g(θ₁) + 2·θ₁), logits (0.2, −0.2): g(θ₁) = (σ(0.4) − 1)·[1, −1, 1, −1]
    #      = 0.1 + 0.2·(1 − σ(0.4) − 0.2) = 0.1402624 (first coordinate; signs alternate)
    #   w ← 0 − η·λ·(0 − θ₂) = 0.2·θ₂ = 0.0280525
    engine = _engine()
    alg = _bound("pfedme", engine, lam=2.0, inner_steps=2, personal_lr=0.2)
    state = alg.init_state(1, torch.zeros(4))
    assert alg.personal_model(state, 0, torch.full((4,), 9.0))[0] == 9.0   # untrained: its group's model
    out = alg.local_update(engine, state, None, torch.zeros(1, 4), [0], [0], 1, [7], 0.1, None, None)
    theta = 0.1 + 0.2 * (1 - sigma(0.4) - 0.2)
    _close(state.clients["personal"][0], [theta, -theta, theta, -theta])
    _close(out[0], [0.2 * theta, -0.2 * theta, 0.2 * theta, -0.2 * theta])
    _close(alg.personal_model(state, 0, torch.zeros(4)), [theta, -theta, theta, -theta])   # evaluated with θ
    assert alg.training_passes == 2.0
    # β mixes the group's old model: x ← (1 − β)·x + β·mean
    mixed = _bound("pfedme", engine, beta=0.5).aggregate_group(
        state, None, GroupUpdate(0, np.array([1]), None, torch.ones(1), torch.full((1, 4), 2.0), slice(0, 1),
                                 torch.zeros(4)))
    _close(mixed, [1.0] * 4)


def test_pfedme_theta_reset_restarts_the_inner_problem_at_w_every_minibatch():
    # FedCollab's code, K = 1, λ = 2, personal_lr 0.2, η = 0.1, two minibatches (two epochs of one
    # sample): θ = w − 0.2·g(w), w ← w − 0.2·(w − θ) = w − 0.04·g(w): SGD at lr 0.04.
    #   w₁ = 0.02·[1, −1, 1, −1] (logits (0.04, −0.04)); g(w₁) = (σ(0.08) − 1)·[1, −1, 1, −1]
    #   θ₂ = w₁ + 0.2·(1 − σ(0.08)), w₂ = w₁ + 0.04·(1 − σ(0.08))
    engine = _engine()
    alg = _bound("pfedme", engine, lam=2.0, inner_steps=1, personal_lr=0.2, theta="reset")
    state = alg.init_state(1, torch.zeros(4))
    out = alg.local_update(engine, state, None, torch.zeros(1, 4), [0], [0], 2, [7], 0.1, None, None)
    theta, w = 0.02 + 0.2 * (1 - sigma(0.08)), 0.02 + 0.04 * (1 - sigma(0.08))
    _close(state.clients["personal"][0], [theta, -theta, theta, -theta])
    _close(out[0], [w, -w, w, -w])
    # carried θ (the default) starts the second minibatch at θ₁ = 0.1, not at w₁: a different θ
    carry = _bound("pfedme", engine, lam=2.0, inner_steps=1, personal_lr=0.2)
    state = carry.init_state(1, torch.zeros(4))
    carry.local_update(engine, state, None, torch.zeros(1, 4), [0], [0], 2, [7], 0.1, None, None)
    carried = 0.1 - 0.2 * ((sigma(0.4) - 1) + 2 * (0.1 - 0.02))
    _close(state.clients["personal"][0], [carried, -carried, carried, -carried])
    with pytest.raises(ValueError, match="theta must be one of carry, reset"):
        make_algorithm("pfedme", {"theta": "keep"})


def test_ditto_trains_a_personal_model_pulled_to_the_group_model():
    # group model w = [1, 0, 0, 0], personal v = 0 (Ditto's v = w⁰), λ = ½, lr = ½:
    #   global (FedAvg): logits (1, 0): g(w) = (σ(1) − 1)·[1, −1, 1, −1]; w − ½·g(w)
    #   personal: v ← 0 − ½·(g(0) + ½·(0 − w)) = −½·([−½, ½, −½, ½] + [−½, 0, 0, 0]) = [½, −¼, ¼, −¼]
    engine = _engine()
    alg = _bound("ditto", engine, lam=0.5)
    state = alg.init_state(1, torch.zeros(4))
    w = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    out = alg.local_update(engine, state, None, w, [0], [0], 1, [7], 0.5, None, None)
    s = 0.5 * (1 - sigma(1.0))
    _close(out[0], [1 + s, -s, s, -s])
    _close(state.clients["personal"][0], [0.5, -0.25, 0.25, -0.25])
    _close(alg.personal_model(state, 0, w[0]), [0.5, -0.25, 0.25, -0.25])


# -- whole runs ----------------------------------------------------------------------------------

CONCEPTS = {"partition": "concept-shift", "test_fraction": 0.2,
            "types": [{"clients": 3, "samples": 30, "permutation": list(range(10))},
                      {"clients": 3, "samples": 24, "permutation": [1, 0, 3, 2, 5, 4, 7, 6, 9, 8]}]}
FAST = {"pfedme": {"inner_steps": 2}}


def _per_group(algorithm, params=None, rounds=2, **train):
    d = copy.deepcopy(TINY)
    d.update(mode="per-group", topology={"edges": 1, "clients_per_edge": 6}, data={**TINY["data"], **CONCEPTS})
    d["train"].update(rounds=rounds, algorithm=algorithm, algorithm_params=params or {}, **train)
    d["arms"] = [{"name": "alone", "grouping": {"policy": "global"}},
                 {"name": "fedcollab", "grouping": {"policy": "fedcollab"}}]
    return parse_config(d)


def _run(config, arm, out):
    world = build_world(config)
    return world, run_arm(world, plan_arm(world, arm), out)


def _training(ledger, rows):
    return ledger[(ledger["component"] == "training") & rows]["amount"].sum()


@pytest.fixture(scope="module")
def fedavg_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("fedavg")
    return {arm: _run(_per_group("fedavg"), i, out / arm) + (out / arm,) for i, arm in enumerate(("alone",
                                                                                                 "fedcollab"))}


@pytest.mark.parametrize("name", ["fednova", "finetune", "perfedavg", "pfedme", "ditto"])
def test_each_method_runs_alone_and_with_fedcollab_and_is_charged_its_work(name, fedavg_runs, tmp_path):
    config = _per_group(name, FAST.get(name))
    for i, arm in enumerate(("alone", "fedcollab")):
        world, df = _run(config, i, tmp_path / arm)
        _, base, base_dir = fedavg_runs[arm]
        assert list(df["round"]) == [0, 1, 2] and np.isfinite(df["loss"]).all()
        # IPR and RSD compare with the same local training (plain local SGD) whatever the algorithm
        pd.testing.assert_series_equal(df["local_accuracy_reference"], base["local_accuracy_reference"])
        assert df["loss"].iloc[-1] < df["loss"].iloc[0]                    # it learned
        manifest = pd.read_json(tmp_path / arm / "manifest.json", typ="series")
        assert manifest["algorithm"] == name
        if arm == "alone":
            assert manifest["grouping"]["n_groups"] == 1
        led = pd.read_parquet(tmp_path / arm / "ledger.parquet")
        ref = pd.read_parquet(base_dir / "ledger.parquet")
        train = lambda f: _training(f, f["group"] >= 0)  # noqa: E731 - group rounds
        evals = lambda f: _training(f, f["group"] == -1)  # noqa: E731 - client work outside them
        alg = world.algorithm
        # group rounds: training_passes × FedAvg's E·H_i(n_i); evaluations: evaluation_passes × H_i(n_i) each
        assert train(led) == pytest.approx(alg.training_passes * train(ref))
        per_eval = world.cost.training_cost([world.topology.client_device[c] for c in range(6)],
                                            world.topology.n_samples, 1).sum()
        assert evals(led) - evals(ref) == pytest.approx(3 * alg.evaluation_passes * per_eval)
        if name != "fednova":                     # a personal model is evaluated, not the group's
            assert not np.allclose(df["loss"].iloc[1:], base["loss"].iloc[1:])


def test_fednova_differs_from_fedavg_where_local_steps_differ(fedavg_runs, tmp_path):
    # batch 8: the types' 24 and 19 training samples both take 3 steps an epoch, so FedNova is FedAvg
    _, same = _run(_per_group("fednova"), 1, tmp_path / "same")
    np.testing.assert_allclose(same["loss"], fedavg_runs["fedcollab"][1]["loss"], rtol=1e-6)
    # batch 4: 6 and 5 steps (quantity shift), and FedNova normalises them
    _, avg = _run(_per_group("fedavg", batch_size=4), 0, tmp_path / "avg")
    _, nova = _run(_per_group("fednova", batch_size=4), 0, tmp_path / "nova")
    assert not np.allclose(nova["loss"].iloc[1:], avg["loss"].iloc[1:], rtol=0, atol=1e-6)


def test_personalised_methods_refuse_global_mode_and_momentum(tiny_dict, tmp_path):
    tiny_dict["train"]["algorithm"] = "ditto"
    world = build_world(parse_config(tiny_dict))
    with pytest.raises(InputError, match='^train.algorithm: \'ditto\' runs in mode = "per-group" only'):
        plan_arms(world)
    with pytest.raises(InputError, match="^train.momentum: pfedme's local steps are plain SGD"):
        _run(_per_group("pfedme", momentum=0.5), 1, tmp_path)
    with pytest.raises(InputError, match=r"^train.algorithm_params: lam must be >= 0"):
        make_algorithm("ditto", {"lam": -1.0})


class Killed(Exception):
    pass


def test_ditto_personal_models_survive_a_kill_and_resume_bitwise(tmp_path):
    config = _per_group("ditto", {"lam": 0.5}, rounds=2)
    _, full = _run(config, 1, tmp_path / "full")
    seen = {}

    def kill_after_round_1(t, cost, acc):
        if t == 1:
            seen.update(read_checkpoint(tmp_path / "killed" / CHECKPOINT))
            raise Killed
    world = build_world(config)
    with pytest.raises(Killed):
        run_arm(world, plan_arm(world, 1), tmp_path / "killed", kill_after_round_1)
    personal = seen["algorithm"]["clients"]["personal"]
    assert personal.shape == (6, world.engine.n_params) and personal.abs().sum() > 0
    _, resumed = _run(config, 1, tmp_path / "killed")
    pd.testing.assert_frame_equal(full, resumed, check_exact=True)
