"""HCCT's baselines as algorithms (emulator/algorithms/hcct.py): FedFA, MAXFL, FLSC and the
personalisation layers of HCCT-P, each against a hand-computed case of its definition, then in
whole per-group runs (and a kill/resume for those with state)."""
import copy

import numpy as np
import pandas as pd
import pytest
import torch

from groupfel.emulator.algorithms import algorithms
from groupfel.emulator.algorithms.hcct import fedfa_weights, flsc_aggregate, flsc_choice, maxfl_joins
from groupfel.emulator.compute import LocalSpec, run_group_rounds
from groupfel.emulator.config import parse_config
from groupfel.emulator.arm import ArmState
from groupfel.emulator.driver import plan_arm, plan_arms, run_arm
from groupfel.errors import InputError
from groupfel.emulator.federation import Group, client_seeds
from groupfel.emulator.rng import rng
from groupfel.emulator.rounds.common import FORWARD_FRACTION, ArmTraining
from groupfel.emulator.world import build_world


def _pergroup(tiny_dict, algorithm, params=None, grouping=None, rounds=3):
    tiny_dict["mode"] = "per-group"
    tiny_dict["topology"] = {"edges": 1, "clients_per_edge": 6}
    tiny_dict["train"].update(rounds=rounds, group_rounds=1, algorithm=algorithm, algorithm_params=params or {})
    tiny_dict["arms"] = [{"name": "a", "grouping": grouping or {"policy": "global"}}]
    return parse_config(tiny_dict)


def _bound(world):
    """The world's algorithm bound to a fresh run's context (real scoring on the clients' data)."""
    x0 = world.engine.initial_weights(world.config.seed)
    return ArmTraining(world, ArmState(), True, x0), x0


def _one_group_round(world, training, x0, clients, seed=3):
    """Round 0, group round 0 of one group of ``clients`` from ``x0``, through the algorithm's hooks."""
    clients = np.asarray(clients)
    group = Group(0, clients, world.topology.n_samples[clients], 0.0)
    alg, state = training.algorithm, training.state
    scratch = alg.begin_round(state, [0], clients)
    spec = LocalSpec(seed, 1, world.config.train.local_epochs, world.config.train.lr)
    return run_group_rounds(world.engine, {0: x0}, {0: group}, 0, spec, alg, state, scratch)[0], scratch


# -- FedFA -------------------------------------------------------------------------------------------

def test_fedfa_weights_are_minus_log2_accuracy_normalised():
    # −log2(0.5) = 1, −log2(0.25) = 2, −log2(1) = 0: weights 1/3, 2/3, 0 (samples do not enter)
    np.testing.assert_allclose(fedfa_weights([0.5, 0.25, 1.0], [10, 30, 50]), [1 / 3, 2 / 3, 0.0])
    # accuracy 0 is floored at half a sample: n = 4 -> A = 1/8, −log2 = 3; with A = 0.5 (1): 1/4, 3/4
    np.testing.assert_allclose(fedfa_weights([0.5, 0.0], [4, 4]), [0.25, 0.75])
    # every client perfect: no accuracy signal, the samples' shares
    np.testing.assert_allclose(fedfa_weights([1.0, 1.0], [1, 3]), [0.25, 0.75])


def test_fedfa_floor_is_the_authors_1e_7_where_set():
    # A = 0 floored at 1e-7: −log2 = 23.25; beside A = 0.5 (1): 23.25/24.25 and 1/24.25
    q0 = -np.log2(1e-7)
    np.testing.assert_allclose(fedfa_weights([0.5, 0.0], [4, 4], 1e-7), [1 / (1 + q0), q0 / (1 + q0)])
    # the case: 3 of 6 clients at 0 weigh 0.300 with 1e-7 against 0.205 at half a sample
    acc, n = np.array([0.0, 0.0, 0.0, 0.5, 0.25, 0.125]), np.array([10, 20, 40, 10, 20, 40])
    assert fedfa_weights(acc, n, 1e-7)[:3].sum() > fedfa_weights(acc, n)[:3].sum()
    with pytest.raises(ValueError, match="floor must be an accuracy in"):
        algorithms.make("fedfa", {"floor": 0.0})


def test_fedfa_aggregates_a_group_by_its_clients_training_accuracy(tiny_dict):
    world = build_world(_pergroup(tiny_dict, "fedfa"))
    training, x0 = _bound(world)
    clients = np.array([0, 1, 2])
    model, scratch = _one_group_round(world, training, x0, clients)
    # A_i: the received model's accuracy on client i's training data, before its local steps
    acc = np.array([training.algorithm.ctx.score_train(x0, [c])[0][0] for c in clients])
    np.testing.assert_array_equal(scratch.accuracy, acc)
    trained = world.engine.train(x0, clients.tolist(), 1, client_seeds(3, 0, 0, clients).tolist())
    q = -np.log2(np.maximum(acc, 1 / (2 * world.topology.n_samples[clients])))
    torch.testing.assert_close(model, torch.as_tensor(q / q.sum(), dtype=torch.float32) @ trained)
    # not FedAvg's sample-weighted mean
    n = world.topology.n_samples[clients]
    assert not torch.allclose(model, torch.as_tensor(n / n.sum(), dtype=torch.float32) @ trained)


# -- MAXFL -------------------------------------------------------------------------------------------

def test_maxfl_joins_while_the_global_loss_is_within_the_threshold():
    # global 0.5 ≤ own 0.6: joins; 0.9 > 0.8: trains alone; a tie joins
    assert maxfl_joins([0.5, 0.9, 0.7], [0.6, 0.8, 0.7]).tolist() == [True, False, True]
    # a margin of 0.15 raises every threshold: 0.9 ≤ 0.8 + 0.15
    assert maxfl_joins([0.5, 0.9, 0.7], [0.6, 0.8, 0.7], margin=0.15).tolist() == [True, True, True]


def test_maxfl_distance_threshold_is_the_authors_squared_distance(tiny_dict):
    # strict: a tie does not join
    assert maxfl_joins([0.5, 0.7], [0.6, 0.7], strict=True).tolist() == [True, False]
    world = build_world(_pergroup(tiny_dict, "maxfl", {"threshold": "distance"}))
    training, x0 = _bound(world)
    alg, own = training.algorithm, training.state.clients["own"]
    # client 0's own model is x_0 + 0.1 everywhere, ‖ŵ_0 − x_0‖² = 0.01·M above its loss: it joins;
    # client 1's own model is x_0 (distance 0 < any loss): it stays out
    own[0] = x0 + 0.1
    assert 0.01 * len(x0) > alg.ctx.score_train(x0, [0])[1][0]
    _, scratch = _one_group_round(world, training, x0, [0, 1])
    assert scratch.joins == {0: True, 1: False}
    with pytest.raises(ValueError, match="threshold must be one of loss, distance"):
        algorithms.make("maxfl", {"threshold": "gap"})


def test_maxfl_global_model_is_the_mean_of_its_participants_only(tiny_dict):
    world = build_world(_pergroup(tiny_dict, "maxfl"))
    training, x0 = _bound(world)
    alg, own = training.algorithm, training.state.clients["own"]
    # client 0's own model has learnt its data (its loss beats the global model's): it stays out;
    # client 1's own model is still x_0, as good as the global model: a tie, so it joins
    own[0] = world.engine.train(x0, [0], 20, [7])[0]
    before = own.clone()
    model, scratch = _one_group_round(world, training, x0, [0, 1])
    assert scratch.joins == {0: False, 1: True}
    s0, s1 = client_seeds(3, 0, 0, np.array([0, 1])).tolist()
    # the group's model: client 1's trained model alone (weight n_1 / n_1 = 1)
    torch.testing.assert_close(model, world.engine.train(x0, [1], 1, [s1])[0])
    # client 0 trained its own model (its group-round seed); client 1 trained its own as well
    torch.testing.assert_close(own[0], world.engine.train(before[0], [0], 1, [s0])[0])
    independent = int(rng(3, "independent", 0, 0, 1).integers(2**31))
    torch.testing.assert_close(own[1], world.engine.train(before[1], [1], 1, [independent])[0])
    # evaluation: the model each one uses
    assert torch.equal(alg.personal_model(training.state, 0, model), own[0])
    assert torch.equal(alg.personal_model(training.state, 1, model), model)


# -- FLSC --------------------------------------------------------------------------------------------

def test_flsc_averages_each_clients_lowest_loss_models_and_updates_the_chosen_ones():
    losses = np.array([[0.1, 0.5, 0.9],     # client 0: clusters 0, 1
                       [0.9, 0.2, 0.1],     # client 1: clusters 2, 1
                       [0.3, 0.2, 0.4]])    # client 2: clusters 1, 0
    choice = flsc_choice(losses, 2)
    assert choice.tolist() == [[0, 1], [2, 1], [1, 0]]
    clusters = torch.tensor([[0.0, 0.0], [2.0, 0.0], [0.0, 4.0]])
    # each client's start: the average of its two models
    starts = clusters[torch.as_tensor(choice)].mean(dim=1)
    assert starts.tolist() == [[1.0, 0.0], [1.0, 2.0], [1.0, 0.0]]
    trained = torch.tensor([[1.0, 1.0], [3.0, 3.0], [5.0, 5.0]])
    n = np.array([1, 2, 1])
    new = flsc_aggregate(clusters, choice, trained, n)
    # cluster 0, chosen by clients 0 and 2 (1 sample each): (1 + 5) / 2 = 3
    # cluster 1, chosen by all: (1·1 + 2·3 + 1·5) / 4 = 3
    # cluster 2, chosen by client 1 alone: 3
    assert new.tolist() == [[3.0, 3.0], [3.0, 3.0], [3.0, 3.0]]
    # a cluster nobody chose keeps its model
    assert flsc_aggregate(clusters, np.array([[0], [0], [0]]), trained, n)[1:].tolist() == [[2.0, 0.0], [0.0, 4.0]]


def test_flsc_round_through_the_hooks(tiny_dict):
    world = build_world(_pergroup(tiny_dict, "flsc", {"n_clusters": 3, "n_soft": 2}))
    training, x0 = _bound(world)
    alg, state = training.algorithm, training.state
    clusters = alg._clusters(state).clone()
    assert not torch.equal(clusters[0], clusters[1])            # each from its own initialisation
    clients = np.array([0, 1, 2, 3])
    _, scratch = _one_group_round(world, training, x0, clients)
    losses = np.stack([alg.ctx.score_train(x, clients)[1] for x in clusters], axis=1)
    choice = flsc_choice(losses, 2)
    assert np.array_equal(scratch.rows, choice)
    starts = clusters[torch.as_tensor(choice)].mean(dim=1)
    trained = world.engine.train(starts, clients.tolist(), 1, client_seeds(3, 0, 0, clients).tolist())
    torch.testing.assert_close(state.server["clusters"],
                               flsc_aggregate(clusters, choice, trained, world.topology.n_samples[clients]))


def test_flsc_shared_init_starts_every_cluster_at_the_initial_model(tiny_dict):
    world = build_world(_pergroup(tiny_dict, "flsc", {"n_clusters": 3, "n_soft": 2, "init": "shared"}))
    training, x0 = _bound(world)
    clusters = training.algorithm._clusters(training.state)
    assert all(torch.equal(c, x0) for c in clusters)
    # every loss ties: each client picks clusters 0 and 1 (ties to the lower index)
    _, scratch = _one_group_round(world, training, x0, np.array([0, 1, 2]))
    assert scratch.rows.tolist() == [[0, 1]] * 3


# -- HCCT-P (FedPer) ---------------------------------------------------------------------------------

def test_fedper_keeps_the_classifier_with_each_client(tiny_dict):
    world = build_world(_pergroup(tiny_dict, "fedper", grouping={"policy": "hcct", "alpha": 1.0}))
    training, x0 = _bound(world)
    alg, own = training.algorithm, training.state.clients["own"]
    # the tiny MLP on 8×8 digits: Linear(64, 64) = 4096 + 64 = 4160 parameters, then the
    # classifier Linear(64, 10) = 640 + 10 = 650: parameters 4160..4810 stay local
    assert world.engine.n_params == 4810 and alg.head == slice(4160, 4810)
    own[1, alg.head] = 0.5                           # client 1 already has a classifier of its own
    model, _ = _one_group_round(world, training, x0, [0, 1])
    start1 = x0.clone()
    start1[4160:] = 0.5                              # the group's shared layers, its own classifier
    s0, s1 = client_seeds(3, 0, 0, np.array([0, 1])).tolist()
    y0, y1 = world.engine.train(x0, [0], 1, [s0])[0], world.engine.train(start1, [1], 1, [s1])[0]
    n = world.topology.n_samples[[0, 1]]
    torch.testing.assert_close(model, float(n[0] / n.sum()) * y0 + float(n[1] / n.sum()) * y1)
    torch.testing.assert_close(own[1, 4160:], y1[4160:])
    personal = alg.personal_model(training.state, 1, model)
    assert torch.equal(personal[:4160], model[:4160]) and torch.equal(personal[4160:], own[1, 4160:])


def test_fedper_refuses_a_model_with_nothing_shared(tiny_dict, tmp_path):
    world = build_world(_pergroup(tiny_dict, "fedper", {"personal_layers": 2}))
    with pytest.raises(InputError, match="^train.algorithm_params.personal_layers: 2 leaves no shared layer"):
        run_arm(world, plan_arm(world, 0), tmp_path / "a")


# -- whole runs --------------------------------------------------------------------------------------

class Killed(Exception):
    pass


@pytest.mark.parametrize("algorithm,params,grouping", [
    ("maxfl", {}, None),
    ("flsc", {"n_clusters": 3, "n_soft": 2}, None),
    ("fedper", {}, {"policy": "hcct", "alpha": 1.0}),
    ("fedfa", {}, None),
    ("maxfl", {"threshold": "distance", "prior": "once"}, None),
    ("fedavg", {}, {"policy": "hcct-e", "alpha": 1.0, "layer": "once", "first": "global"})])
def test_per_group_run_resumes_bitwise(tiny_dict, tmp_path, algorithm, params, grouping):
    cfg = _pergroup(tiny_dict, algorithm, params, grouping, rounds=3)
    world = build_world(cfg)
    full = run_arm(world, plan_arm(world, 0), tmp_path / "full")
    assert list(full["round"]) == [0, 1, 2, 3]
    assert full["local_error_mean"].iloc[-1] < full["local_error_mean"].iloc[0]   # the clients learn

    def kill(t, cost, acc):
        if t == 2:
            raise Killed
    with pytest.raises(Killed):
        run_arm(world, plan_arm(world, 0), tmp_path / "killed", kill)
    world = build_world(cfg)
    pd.testing.assert_frame_equal(full, run_arm(world, plan_arm(world, 0), tmp_path / "killed"), check_exact=True)


def test_maxfl_charges_two_training_passes(tiny_dict, tmp_path):
    cfg = _pergroup(tiny_dict, "maxfl", rounds=1)
    world = build_world(cfg)
    maxfl = run_arm(world, plan_arm(world, 0), tmp_path / "maxfl")
    tiny_dict["train"]["algorithm"] = "fedavg"
    world = build_world(parse_config(tiny_dict))
    fedavg = run_arm(world, plan_arm(world, 0), tmp_path / "fedavg")
    topo = world.topology
    epoch = world.cost.training_cost([topo.client_device[c] for c in range(topo.n_clients)], topo.n_samples, 1).sum()
    # plus its scoring: 2 models a client when it decides (round 0) and at each of 2 evaluations
    assert maxfl["training_cost"].iloc[-1] == pytest.approx(2 * fedavg["training_cost"].iloc[-1]
                                                            + 3 * 2 * FORWARD_FRACTION * epoch)


def test_scoring_forward_passes_are_charged_as_training(tiny_dict, tmp_path):
    """Every model a client scores on its training data is a third of an epoch of Eq. 5 training
    (FORWARD_FRACTION, as IFCA's): FedFA scores its start model once a group round; MAXFL scores
    the global model and its own at every evaluation to pick the one it uses."""
    tiny_dict["train"]["local_epochs"] = 1
    runs = {}
    for name in ("fedavg", "fedfa", "maxfl"):
        world = build_world(_pergroup(copy.deepcopy(tiny_dict), name, rounds=1))
        runs[name] = run_arm(world, plan_arm(world, 0), tmp_path / name)
    topo = world.topology
    epoch = world.cost.training_cost([topo.client_device[c] for c in range(topo.n_clients)], topo.n_samples, 1).sum()
    assert runs["fedavg"]["training_cost"].iloc[0] == 0.0
    assert runs["fedfa"]["training_cost"].iloc[-1] == pytest.approx(
        runs["fedavg"]["training_cost"].iloc[-1] + FORWARD_FRACTION * epoch)
    # round 0's evaluation: 2 models scored by each client, before any training
    assert runs["maxfl"]["training_cost"].iloc[0] == pytest.approx(2 * FORWARD_FRACTION * epoch)


def test_fedfa_runs_in_global_mode_and_the_others_refuse_it(tiny_dict, tmp_path):
    tiny_dict["train"].update(rounds=2, algorithm="fedfa")
    tiny_dict["arms"] = tiny_dict["arms"][:1]
    world = build_world(parse_config(tiny_dict))
    assert len(run_arm(world, plan_arm(world, 0), tmp_path / "a")) == 3
    for name in ("maxfl", "flsc", "fedper"):
        tiny_dict["train"]["algorithm"] = name
        with pytest.raises(InputError, match=f"^train.algorithm: '{name}' runs in mode = \"per-group\" only"):
            plan_arms(build_world(parse_config(tiny_dict)))


def test_flsc_parameters_are_checked_with_one_line_naming_the_field(tiny_dict):
    with pytest.raises(InputError, match=r"^train.algorithm_params: n_soft \(FLSC's N_g\) must be an integer from 1 "
                                         r"to n_clusters = 2, got 3"):
        build_world(_pergroup(tiny_dict, "flsc", {"n_clusters": 2, "n_soft": 3}))
    assert set(algorithms) >= {"fedfa", "maxfl", "flsc", "fedper"}
