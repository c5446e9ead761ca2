"""Runs that train together (emulator.stacking): a run's numbers do not depend on its partners.

The bound: with ``--stack 1`` a run trains as it always did (per-client formulation on a CPU);
stacked (any width > 1) its clients train in the stacked formulation (emulator.stacked). The two agree as
the stacked-vs-sequential engine tests require (tests/test_training.py: 1e-5 on every model after
a call): here the ledgers and costs are exactly equal and the accuracies and losses within 1e-5.
Between stacks of different widths and partners a run's numbers are bitwise equal on the CPU.
"""
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from groupfel.emulator.config import parse_config
from groupfel.emulator.training import BatchedEngine
from groupfel.experiments.backends import shards
from groupfel.experiments.runner import run_experiment
from groupfel.experiments.tasks import Task
from groupfel.topologies import load_dataset

from test_backends import ROOT

BOUND = 1e-5   # the stacked-vs-sequential engine tests' tolerance


def _study(tiny_dict, seeds=(0, 1), rounds=4) -> dict:
    raw = {**tiny_dict, "seeds": list(seeds), "train": {**tiny_dict["train"], "rounds": rounds}}
    raw.pop("seed")
    return raw


def _tables(out: Path, raw: dict) -> dict:
    return {(s, a["name"]): (pd.read_csv(out / f"seed-{s}" / a["name"] / "results.csv"),
                             pd.read_parquet(out / f"seed-{s}" / a["name"] / "ledger.parquet"))
            for s in raw["seeds"] for a in raw["arms"]}


def test_a_clients_models_do_not_depend_on_its_stack_partners():
    """The same client, alone (padded to a stack of two) or beside 2 or 39 others: bitwise the same
    model and momentum, on the CPU."""
    data = load_dataset("digits")
    rng = np.random.default_rng(0)
    parts = [np.sort(rng.choice(len(data.y_train), size=int(n), replace=False)) for n in rng.integers(5, 30, 40)]
    eng = BatchedEngine(data, parts, "cnn", lr=0.05, batch_size=8, formulation="stacked", workers=1, momentum=0.9)
    start = eng.initial_weights(0)
    got = []
    for partners in ([], [1, 2], list(range(1, 40))):
        momentum = torch.zeros(1 + len(partners), eng.n_params)
        out = eng.train(start, [0, *partners], 2, [7, *partners], momentum=momentum)
        got.append((out[0], momentum[0]))
    for model, momentum in got[1:]:
        assert torch.equal(model, got[0][0]) and torch.equal(momentum, got[0][1])


EVERY = range(1, 41)
SOME = (1, 2, 3, 4, 5, 8, 13, 24, 40)   # the ResNets are slow to step 40 times: the widths that matter


@pytest.mark.parametrize("model,shape,widths", [
    ("cnn", (1, 8, 8), EVERY), ("cnn", (3, 8, 8), EVERY), ("audio-cnn", (1, 10, 7), EVERY), ("mlp", (1, 8, 8), EVERY),
    ("mlp3", (1, 8, 8), SOME), ("linear", (1, 8, 8), SOME), ("resnet-1", (1, 8, 8), SOME),
    ("resnet-1", (3, 8, 8), SOME), ("resnet-3", (1, 4, 4), SOME)])
def test_a_cpu_step_gives_a_client_the_same_gradients_at_every_stack_width(model, shape, widths):
    """The written-out CPU step (emulator.stacked.GroupedNet), at the rows it computes for numbers
    of live clients from 1 to 40: client 0's gradients bitwise the same, every shipped model.
    (oneDNN takes another convolution kernel for exactly 3 input channels; rows() never stacks to that.)"""
    from groupfel.emulator.models import build_model
    from groupfel.emulator.stacked import GroupedNet

    torch.manual_seed(0)
    net = build_model(model, shape, 10)
    grouped = GroupedNet.of(net)
    assert grouped is not None
    params = [p.detach().unsqueeze(0) + 0.01 * torch.randn(40, *p.shape) for p in net.parameters()]
    x, y, m = torch.randn(40, 5, *shape), torch.randint(0, 10, (40, 5)), torch.ones(40, 5)
    m[0, 3:] = 0   # a partial last batch
    first = None
    for live in widths:
        n = grouped.rows(live)
        got = [g[0] for g in grouped([p[:n] for p in params], x[:n], y[:n], m[:n])]
        first = first or got
        assert all(torch.equal(a, b) for a, b in zip(got, first)), (live, n)


def compare_stacks(tiny_dict, out: Path, device: str = "cpu") -> None:
    """Two seeds x two arms on ``device``: --stack 1 (each run alone), 8 (all four together) and 2
    (two shards of two): the same ledgers and costs exactly; accuracies and losses within the bound
    against --stack 1. Between the stacked widths: bitwise on the CPU, within the bound elsewhere
    (cuBLAS and cuDNN may pick other kernels for other widths)."""
    raw = _study(tiny_dict)
    raw["train"]["device"] = device
    runs = {}
    for stack in (1, 8, 2):
        run_experiment(parse_config({**raw, "train": {**raw["train"], "stack": stack}}), out / f"stack{stack}",
                       jobs=1, progress=False)
        runs[stack] = _tables(out / f"stack{stack}", raw)
        manifest = json.loads((out / f"stack{stack}" / "seed-0" / raw["arms"][0]["name"] / "manifest.json").read_text())
        assert manifest["stack"]["width"] == stack
        assert manifest["stack"].get("runs", 1) == {1: 1, 8: 4, 2: 2}[stack]
    for key, (alone, ledger) in runs[1].items():
        for stack in (8, 2):
            results, led = runs[stack][key]
            pd.testing.assert_frame_equal(ledger, led, check_exact=True)
            exact = [c for c in alone if c not in ("accuracy", "loss")]
            pd.testing.assert_frame_equal(alone[exact], results[exact], check_exact=True)
            assert np.abs(alone[["accuracy", "loss"]].to_numpy() - results[["accuracy", "loss"]].to_numpy()).max() <= BOUND
        if device == "cpu":
            pd.testing.assert_frame_equal(runs[8][key][0], runs[2][key][0], check_exact=True)


def test_stack_1_against_stack_8_and_stacks_of_other_partners(tiny_dict, tmp_path):
    compare_stacks(tiny_dict, tmp_path)


def test_shards_split_runs_evenly_by_width_and_settings(tiny_dict):
    raw = parse_config({**tiny_dict, "train": {**tiny_dict["train"], "stack": 3}}).model_dump_json()
    other = json.loads(raw)
    other["train"]["model"] = "cnn"
    tasks = [Task(raw, "r", i) for i in range(7)] + [Task(json.dumps(other), "o", 0)]
    got = shards(tasks, None, 2)
    assert sorted(len(s) for s, w in got if s[0].run_dir == "r") == [2, 2, 3]   # 7 runs, at most 3 a stack
    assert [len(s) for s, w in got if s[0].run_dir == "o"] == [1]              # another model: its own stack
    assert [len(s) for s, _ in shards(tasks[:7], 1, 2)] == [1] * 7              # --stack 1: each run alone


def test_a_ray_task_of_a_stack_streams_each_runs_files(tiny_dict, tmp_path):
    """What a Ray task of a shard sends (run here as the plain generator it is): each run's
    checkpoints, tagged with the run, then each run's files, which are the local pool's."""
    from groupfel.experiments.backends import land, ray_task, run_shard

    raw = json.loads(parse_config({**tiny_dict, "train": {**tiny_dict["train"], "rounds": 3}}).model_dump_json())
    jobs = [(json.dumps({**raw, "seed": s}), 0) for s in (0, 1)]
    run_shard(tuple(Task(c, str(tmp_path / "local" / str(k)), arm) for k, (c, arm) in enumerate(jobs)), 4)
    messages = list(ray_task([(c, arm, {}, None) for c, arm in jobs], 4, 0.0))
    assert {i for kind, i, _ in messages if kind == "checkpoint"} == {0, 1}
    assert [(kind, i) for kind, i, _ in messages[-2:]] == [("done", 0), ("done", 1)]
    arm = raw["arms"][0]["name"]
    for kind, i, files in messages:
        land(tmp_path / "ray" / str(i), files, final=kind == "done")
    for k in (0, 1):
        for name in ("results.csv", "ledger.parquet"):
            assert (tmp_path / "ray" / str(k) / arm / name).read_bytes() == \
                (tmp_path / "local" / str(k) / arm / name).read_bytes()


@pytest.mark.slow
def test_a_stacked_campaign_of_quick_reproductions_runs_in_resumable_chunks(tmp_path):
    """benchmarks/gpu_reproductions.py on the CPU: a chunk too short to finish stops the
    reproduction and says so (exit 75); the same command then resumes it (in more 8-minute chunks
    where the machine is that busy) to its packed archive."""
    command = [sys.executable, str(ROOT / "benchmarks" / "gpu_reproductions.py"), "fig8", "--quick", "--device", "cpu",
               "--stack", "8", "--set", "train.budget=500", "--out", str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cut = subprocess.run([*command, "--chunk-minutes", "0.1"], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert cut.returncode == 75 and "chunk is used up; rerun this command to resume" in cut.stderr, cut.stderr
    assert not (tmp_path / "fig8.tar.gz").exists()
    for _ in range(4):
        done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
        if done.returncode != 75:
            break
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "fig8.tar.gz").stat().st_size > 0
    manifests = list((tmp_path / "fig8").glob("p*/seed-*/*/manifest.json"))
    assert len(manifests) == 8 and all(json.loads(p.read_text())["stack"]["width"] == 8 for p in manifests)


def _per_group_base() -> str:
    """test_sweep's tiny base in per-group mode: one edge of 6 clients, 3 rounds, arms local and global."""
    from test_sweep import BASE

    return ('mode = "per-group"\n' + BASE.split("[[arms]]")[0].replace("edges = 2", "edges = 1").replace("\nrounds = 6", "\nrounds = 3")
            + '[[arms]]\nname = "local"\ngrouping = { policy = "local" }\n'
            + '[[arms]]\nname = "global"\ngrouping = { policy = "global" }\n')


def test_a_seeds_stacked_runs_train_one_local_reference_and_get_its_numbers(tmp_path, monkeypatch):
    """Per-group mode's local-training reference (IPR, RSD) depends on neither the arm nor the
    training algorithm: the arms and algorithm points of a seed that train in one stack compute it
    once (the others wait outside the stack, which must not deadlock it) and get the numbers that
    each run alone computes for itself."""
    from groupfel.emulator.rounds import per_group
    from groupfel.experiments.sweep import run_sweep

    trained = []
    real = per_group._train_reference
    monkeypatch.setattr(per_group, "_train_reference", lambda world, data: trained.append(world.config.seed)
                        or real(world, data))
    (tmp_path / "base.toml").write_text(_per_group_base())
    (tmp_path / "sweep.toml").write_text('name = "s"\nbase = "base.toml"\nseeds = [0, 1]\nmode = "zip"\n[axes]\n'
                                         '"train.algorithm" = ["fedavg", "ditto"]\n')
    tables = {}
    for stack in (1, 8):
        trained.clear()
        run_sweep(tmp_path / "sweep.toml", output=tmp_path / f"stack{stack}", jobs=1, progress=False, stack=stack)
        tables[stack] = pd.read_csv(tmp_path / f"stack{stack}" / "runs.csv").sort_values(["point", "seed", "arm"])
        # alone: each point's seed computes its own (its second arm reads it from the run's folder);
        # stacked: one per seed for all four runs
        assert sorted(trained) == ([0, 0, 1, 1] if stack == 1 else [0, 1])
        refs = [torch.load(p, weights_only=True)["accuracy"]
                for p in sorted((tmp_path / f"stack{stack}").glob("p*/seed-0/local-reference-seed0.pt"))]
        assert len(refs) == 2 and torch.equal(refs[0], refs[1])
    for column in ("ipr", "rsd", "local_accuracy_reference"):
        assert np.abs(tables[1][column].to_numpy() - tables[8][column].to_numpy()).max() <= BOUND, column


def _label_shift_per_group(tiny_dict) -> str:
    """A tiny per-group run on label-shift data, whose placement copies the dataset's arrays:
    every run of a stack holds its own arrays of equal content."""
    raw = {**tiny_dict, "mode": "per-group", "topology": {"edges": 1, "clients_per_edge": 8},
           "data": {**tiny_dict["data"], "partition": "label-shift", "min_samples": 12, "max_samples": 40},
           "train": {**tiny_dict["train"], "rounds": 3},
           "arms": [{"name": "local", "grouping": {"policy": "local"}},
                    {"name": "global", "grouping": {"policy": "global"}}]}
    return parse_config(raw).model_dump_json()


def test_stacked_runs_on_equal_data_share_one_local_reference_found_by_content(tiny_dict, tmp_path, monkeypatch):
    """Two runs of a stack on equal data held in different arrays (label shift copies them) train
    the local-training reference once, and each gets bitwise the numbers it gets stacked alone;
    runs whose data differ (the same config, another dataset's content) each train their own."""
    from groupfel.emulator.rounds import per_group
    from groupfel.experiments.tasks import execute_stack

    trained = []
    real = per_group._train_reference
    monkeypatch.setattr(per_group, "_train_reference", lambda world, data: trained.append(id(world))
                        or real(world, data))
    config = _label_shift_per_group(tiny_dict)
    jobs = [(config, tmp_path / "together" / f"p{arm}", arm) for arm in (0, 1)]
    execute_stack(jobs, 2)
    assert len(trained) == 1
    refs = [torch.load(d / "local-reference-seed3.pt", weights_only=True)["accuracy"] for _, d, _ in jobs]
    assert torch.equal(refs[0], refs[1])
    for _, together, arm in jobs:
        alone = tmp_path / "alone" / together.name
        execute_stack([(config, alone, arm)], 2)
        name = ("local", "global")[arm]
        pd.testing.assert_frame_equal(pd.read_csv(together / name / "results.csv"),
                                      pd.read_csv(alone / name / "results.csv"), check_exact=True)
    assert len(trained) == 3   # alone, each run trains its own

    trained.clear()
    data = load_dataset("digits")
    other = dataclasses.replace(data, x_train=data.x_train[::-1].copy(), y_train=data.y_train[::-1].copy())
    jobs = [(config, tmp_path / "different" / f"p{i}", 0) for i in (0, 1)]
    execute_stack(jobs, 2, datasets=[data, other])
    assert len(trained) == 2
    refs = [torch.load(d / "local-reference-seed3.pt", weights_only=True)["accuracy"] for _, d, _ in jobs]
    assert not torch.equal(refs[0], refs[1])


def test_runs_of_other_algorithms_share_one_stacked_call_each_bitwise_as_alone(tiny_dict, tmp_path, monkeypatch):
    """FedAvg, FedProx (μ = 0.1), SCAFFOLD and FedAvg with momentum in one stack: one engine call a
    group round for all four runs (μ, momentum and corrections are per-row inputs), and each run's
    results, ledger and final model bitwise those of the run stacked alone (on the CPU)."""
    from groupfel.emulator.stacking import Batcher
    from groupfel.experiments.tasks import execute_stack

    variants = {"fedavg": {}, "fedprox": {"algorithm": "fedprox", "mu": 0.1}, "scaffold": {"algorithm": "scaffold"},
                "momentum": {"momentum": 0.9}}
    configs = {}
    for name, train in variants.items():
        raw = {**tiny_dict, "name": name, "arms": tiny_dict["arms"][:1],
               "train": {**tiny_dict["train"], "engine": "batched", "rounds": 3, **train}}
        configs[name] = parse_config(raw).model_dump_json()
    calls = []
    real = Batcher._train
    monkeypatch.setattr(Batcher, "_train", lambda self, batch: calls.append(len(batch)) or real(self, batch))
    execute_stack([(c, tmp_path / "together" / name, 0) for name, c in configs.items()], 4)
    assert calls and max(calls) == 4    # the four runs' group rounds in one call
    arm = tiny_dict["arms"][0]["name"]
    loss = {name: pd.read_csv(tmp_path / "together" / name / arm / "results.csv")["loss"] for name in configs}
    assert all(not loss[name].equals(loss["fedavg"]) for name in ("fedprox", "scaffold", "momentum"))   # each term acts
    for name, c in configs.items():
        execute_stack([(c, tmp_path / "alone" / name, 0)], 4)
        together, alone = tmp_path / "together" / name / arm, tmp_path / "alone" / name / arm
        pd.testing.assert_frame_equal(pd.read_csv(together / "results.csv"), pd.read_csv(alone / "results.csv"),
                                      check_exact=True)
        pd.testing.assert_frame_equal(pd.read_parquet(together / "ledger.parquet"),
                                      pd.read_parquet(alone / "ledger.parquet"), check_exact=True)
