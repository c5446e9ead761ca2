"""Adam as the clients' optimiser (the Group-FEL authors' Speech Commands clients): torch's own
arithmetic in every engine formulation, its state kept across rounds and dropped with the rate."""
import copy

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from groupfel.emulator.config import parse_config
from groupfel.emulator.driver import CHECKPOINT, plan_arm, run_arm
from groupfel.emulator.io import read_checkpoint
from groupfel.emulator.rounds.common import round_lr
from groupfel.emulator.training import BatchedEngine, TorchEngine, flatten, load_flat
from groupfel.emulator.world import build_world
from groupfel.errors import InputError
from groupfel.topologies import Dataset

SIZES = (37, 63, 13, 87, 15)   # ragged: the stacked step masks the rows that are done
SEEDS = (5, 6, 7, 8, 9)


def _data(shape=(1, 8, 8)) -> tuple[Dataset, list[np.ndarray]]:
    rng = np.random.default_rng(0)
    n = sum(SIZES)
    x = rng.normal(size=(n, *shape)).astype(np.float32)
    y = rng.integers(0, 10, n).astype(np.int64)
    ends = np.cumsum((0,) + SIZES)
    return Dataset("t", x, y, x[:50], y[:50], 10), [np.arange(a, b) for a, b in zip(ends[:-1], ends[1:])]


def _two_rounds(engine) -> tuple[torch.Tensor, torch.Tensor]:
    """Two calls with the clients' state kept between them (a persistent round), the second at
    another rate: (models after the second, state)."""
    clients = list(range(len(SIZES)))
    state = torch.zeros(len(clients), engine.state_width)
    first = engine.train(engine.initial_weights(0), clients, 2, SEEDS, momentum=state)
    last = engine.train(first, clients, 1, [s + 10 for s in SEEDS], momentum=state, lr=0.002)
    return last, state


@pytest.mark.parametrize("foreach", [False, True])
def test_the_sequential_engine_is_torchs_adam_bitwise_with_state_kept_across_rounds(foreach):
    data, samples = _data()
    engine = TorchEngine(data, samples, "cnn", 0.01, 10, optimizer="adam", weight_decay=1e-4)
    assert engine.state_width == 2 * engine.n_params + 1
    last, state = _two_rounds(engine)
    model = engine.model
    params = list(model.parameters())
    for i, (idx, seed) in enumerate(zip(samples, SEEDS)):
        # the authors' client: one optimiser kept across rounds, the start model loaded into it
        load_flat(params, engine.initial_weights(0))
        opt = torch.optim.Adam(params, lr=0.01, weight_decay=1e-4, foreach=foreach)
        for epochs, s, lr in ((2, seed, 0.01), (1, seed + 10, 0.002)):
            opt.param_groups[0]["lr"] = lr
            gen = torch.Generator().manual_seed(s)
            for _ in range(epochs):
                order = torch.as_tensor(idx)[torch.randperm(len(idx), generator=gen)]
                for b in range(0, len(order), 10):
                    batch = order[b:b + 10]
                    opt.zero_grad()
                    F.cross_entropy(model(engine.x[batch]), engine.y[batch]).backward()
                    opt.step()
            if epochs == 2:   # the round's model goes to the cloud; the next starts from the averaged one
                mine = flatten(params).clone()
                load_flat(params, mine)
        assert torch.equal(flatten(params), last[i])
        P = engine.n_params
        moments = torch.cat([torch.cat([opt.state[p][k].reshape(-1) for p in params]) for k in ("exp_avg", "exp_avg_sq")])
        assert torch.equal(moments, state[i, :2 * P])
        assert state[i, 2 * P] == opt.state[params[0]]["step"] == 3 * -(-len(idx) // 10)


def test_the_per_client_workers_and_the_stacked_step_train_as_the_sequential_engine():
    data, samples = _data()
    kw = dict(optimizer="adam", weight_decay=1e-4)
    seq, seq_state = _two_rounds(TorchEngine(data, samples, "mlp", 0.01, 10, **kw))
    workers, workers_state = _two_rounds(BatchedEngine(data, samples, "mlp", 0.01, 10, workers=2,
                                                       formulation="per-client", **kw))
    stacked, stacked_state = _two_rounds(BatchedEngine(data, samples, "mlp", 0.01, 10, formulation="stacked", **kw))
    # the workers run the sequential loop (their state through the shared block), the stacked step
    # each row's own step count and bias corrections; other threads and kernels sum in another order
    for models, state in ((workers, workers_state), (stacked, stacked_state)):
        assert torch.equal(state[:, -1], seq_state[:, -1])
        torch.testing.assert_close(models, seq, rtol=0, atol=1e-5)
        torch.testing.assert_close(state, seq_state, rtol=0, atol=1e-6)


def test_a_stacked_row_past_its_last_step_keeps_its_model_and_state():
    data, samples = _data()
    engine = BatchedEngine(data, samples, "mlp", 0.01, 10, formulation="stacked", optimizer="adam")
    start = engine.initial_weights(0)
    state = torch.zeros(2, engine.state_width)
    state[1, -1] = 4.0   # a client with Adam steps behind it: its bias corrections go on from there
    alone = [engine.train(start, [c], 1, [SEEDS[c]], momentum=s.unsqueeze(0).clone()) for c, s in zip((2, 3), state)]
    both = engine.train(start, [2, 3], 1, [SEEDS[2], SEEDS[3]], momentum=state)   # 2 steps beside 9
    torch.testing.assert_close(both, torch.cat(alone), rtol=0, atol=1e-6)
    assert state[:, -1].tolist() == [2.0, 13.0]


def _adam_run(tiny: dict, **train) -> dict:
    d = copy.deepcopy(tiny)
    d["arms"] = d["arms"][:1]
    d["train"].update(optimizer="adam", lr=0.01, weight_decay=1e-4, rounds=4, engine="batched", workers=2, **train)
    return d


def test_a_run_keeps_adams_state_per_client_and_resumes_bitwise(tiny_dict, tmp_path):
    config = parse_config(_adam_run(tiny_dict, client_state="persistent"))
    world = build_world(config)
    full = run_arm(world, plan_arm(world, 0), tmp_path / "full")
    seen = {}

    class Killed(Exception):
        pass

    def kill(t, cost, acc):
        if t == 2:
            seen.update(read_checkpoint(tmp_path / "killed" / CHECKPOINT))
            raise Killed
    with pytest.raises(Killed):
        run_arm(build_world(config), plan_arm(build_world(config), 0), tmp_path / "killed", kill)
    state, P = seen["momentum"], world.engine.n_params
    assert state.shape == (world.topology.n_clients, 2 * P + 1)
    assert (state[:, -1] > 0).any() and (state[:, -1] == state[:, -1].round()).all()   # whole step counts
    resumed = run_arm(build_world(config), plan_arm(build_world(config), 0), tmp_path / "killed")
    pd.testing.assert_frame_equal(full, resumed, check_exact=True)
    fresh = run_arm(w := build_world(parse_config(_adam_run(tiny_dict))), plan_arm(w, 0), tmp_path / "fresh")
    assert fresh["loss"].iloc[0] == full["loss"].iloc[0] and fresh["loss"].iloc[-1] != full["loss"].iloc[-1]


def test_the_rate_drops_as_the_authors_lr_interval_and_per_rate_state_starts_afresh(tiny_dict, tmp_path):
    d = _adam_run(tiny_dict, lr_decay=0.2, lr_decay_every=50)
    world = build_world(parse_config(d))
    # the authors' GFL.run: the rate drops before rounds 49, 99, ... (i % 50 == 49)
    assert [round_lr(world, t) for t in (0, 48, 49, 98, 99)] == pytest.approx([0.01, 0.01, 0.002, 0.002, 0.0004])
    d = _adam_run(tiny_dict, lr_decay=0.5, lr_decay_every=2)   # drops before rounds 1 and 3
    runs = {}
    for kept in ("persistent", "per-rate"):
        d["train"]["client_state"] = kept
        runs[kept] = run_arm(w := build_world(parse_config(d)), plan_arm(w, 0), tmp_path / kept)
    assert runs["per-rate"]["loss"].iloc[0] == runs["persistent"]["loss"].iloc[0]
    assert runs["per-rate"]["loss"].iloc[-1] != runs["persistent"]["loss"].iloc[-1]
    d["train"]["lr_decay"] = 1.0   # a rate that never drops: per-rate is persistent
    same = {}
    for kept in ("persistent", "per-rate"):
        d["train"]["client_state"] = kept
        same[kept] = run_arm(w := build_world(parse_config(d)), plan_arm(w, 0), tmp_path / f"same-{kept}")
    pd.testing.assert_frame_equal(same["persistent"], same["per-rate"], check_exact=True)


def test_per_rate_state_is_zeroed_exactly_at_a_drop(tiny_dict):
    from groupfel.emulator.arm import ArmState
    from groupfel.emulator.rounds.common import start_round_state

    d = _adam_run(tiny_dict, lr_decay=0.5, lr_decay_every=3, client_state="per-rate")
    world = build_world(parse_config(d))
    state = ArmState.__new__(ArmState)
    state.momentum = torch.ones(3, 4)
    for t, kept in ((0, True), (1, True), (2, False)):   # drops before round 2: ⌊3 / 3⌋ = 1
        state.momentum.fill_(1.0)
        start_round_state(world, state, t)
        assert bool(state.momentum.all()) is kept


@pytest.mark.parametrize("change,field", [
    (dict(optimizer="adam", momentum=0.9), "momentum"),
    (dict(optimizer="adagrad"), "optimizer"),
    (dict(lr_decay_every=1), "lr_decay_every"),
])
def test_bad_optimiser_settings_fail_in_one_line_naming_the_field(tiny_dict, change, field):
    tiny_dict["train"].update(change)
    with pytest.raises(InputError) as err:
        parse_config(tiny_dict)
    message = str(err.value)
    assert "\n" not in message and field in message


def test_scaffold_with_adam_runs_with_a_warning(tiny_dict):
    from groupfel.emulator.config.run import config_warnings

    [warning] = config_warnings(parse_config(_adam_run(tiny_dict, algorithm="scaffold")))
    assert warning.startswith("train.optimizer = \"adam\" with SCAFFOLD") and "\n" not in warning
    assert not config_warnings(parse_config(_adam_run(tiny_dict)))


def test_algorithms_defined_by_sgds_steps_refuse_adam(tiny_dict, tmp_path):
    d = _adam_run(tiny_dict, algorithm="fednova")
    with pytest.raises(InputError, match="train.optimizer: FedNova"):
        run_arm(w := build_world(parse_config(d)), plan_arm(w, 0), tmp_path / "nova")
    d = _adam_run(tiny_dict, client_state="per-rate")
    d["mode"] = "per-group"
    d["arms"] = [{"name": "rg", "grouping": {"policy": "rg", "min_group_size": 3}}]
    with pytest.raises(InputError, match="per-rate"):
        parse_config(d)
