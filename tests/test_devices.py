"""Device placement: every tensor groupfel makes lives on the engine's device.

Model tables (the global model, group and cluster models, client state, momentum) live on the
engine's device; checkpoints hold CPU tensors and load onto the device of the run that reads them.
A CPU machine cannot mix devices, so :class:`DeviceDiscipline` enforces the rule that keeps a
CUDA run whole: each tensor factory groupfel's code calls (``torch.zeros``, ``torch.as_tensor``,
...) names its device, and each ``torch.load`` its ``map_location``. It runs over every shipped
algorithm in every mode it supports and over the per-group grouping policies, with faults,
momentum, a checkpoint and a resume; tests/test_gpu.py runs the same runs on CUDA where a GPU is.
"""
from __future__ import annotations

import copy
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from torch.overrides import TorchFunctionMode

from groupfel.emulator.algorithms import algorithms
from groupfel.emulator.config import parse_config
from groupfel.emulator.driver import plan_arm, run_arm
from groupfel.emulator.world import build_world

ROOT = Path(__file__).resolve().parents[1]
OURS = tuple(str(ROOT / d) + "/" for d in ("emulator", "policies", "topologies", "cost_models", "experiments",
                                           "groupfel"))
FACTORIES = {torch.zeros, torch.ones, torch.empty, torch.full, torch.tensor, torch.as_tensor, torch.arange,
             torch.randn, torch.rand, torch.randint, torch.randperm, torch.eye, torch.linspace}


class DeviceDiscipline(TorchFunctionMode):
    """Records each tensor factory called from groupfel's code without ``device=``, and each
    ``torch.load`` without ``map_location``, as ``file:line``."""

    def __init__(self):
        super().__init__()
        self.found: set[str] = set()

    def _caller(self, depth: int) -> str | None:
        frame = sys._getframe(depth)
        path = frame.f_code.co_filename
        return f"{Path(path).relative_to(ROOT)}:{frame.f_lineno}" if path.startswith(OURS) else None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in FACTORIES and kwargs.get("device") is None and (where := self._caller(2)):
            self.found.add(f"{where} torch.{func.__name__} without device=")
        return func(*args, **kwargs)

    def __enter__(self):
        self._load = torch.load

        def load(*args, **kwargs):
            if kwargs.get("map_location") is None and (where := self._caller(2)):
                self.found.add(f"{where} torch.load without map_location=")
            return self._load(*args, **kwargs)
        torch.load = load
        return super().__enter__()

    def __exit__(self, *exc):
        torch.load = self._load
        return super().__exit__(*exc)


def run_twice(d: dict, tmp_path: Path, device: str = "cpu", resume: bool = True):
    """A run, and (``resume``) the same run killed after round 1 and resumed, on ``device``."""
    d["train"]["device"] = device
    config = parse_config(d)
    world = build_world(config)
    full = run_arm(world, plan_arm(world, 0), tmp_path / "full")
    if not resume:
        return full, full

    class Killed(Exception):
        pass

    def kill(t, cost, acc):
        if t == 1:
            raise Killed
    world = build_world(config)
    with pytest.raises(Killed):
        run_arm(world, plan_arm(world, 0), tmp_path / "killed", kill)
    world = build_world(config)
    return full, run_arm(world, plan_arm(world, 0), tmp_path / "killed")


def configs(tiny: dict) -> list[tuple[str, dict]]:
    """A tiny run per shipped algorithm and mode, and per per-group grouping policy; with dropout,
    the batched engine, and momentum kept across rounds where the algorithm has it."""
    out = []
    for name in algorithms.names():
        cls = algorithms.resolve(name)
        for mode in cls.modes:
            d = _base(tiny, mode)
            d["train"]["algorithm"] = name
            if name in ("fedavg", "fedprox", "scaffold") and mode == "global":   # momentum kept across rounds
                d["train"].update(momentum=0.5, client_state="persistent")
            out.append((f"{name}-{mode}", d))
    d = _base(tiny, "global")   # Adam's moments and step counts kept across rounds, dropped with the rate
    d["train"].update(optimizer="adam", lr=0.01, weight_decay=1e-4, client_state="per-rate", lr_decay=0.5,
                      lr_decay_every=2)
    out.append(("fedavg-global-adam", d))
    for policy, params in (("hcct", {"alpha": 1.0}), ("hcct-e", {"alpha": 1.0}), ("ifca", {"n_clusters": 2}),
                           ("fedcollab", {}), ("fesem", {"n_clusters": 2}), ("fedclar", {}),
                           ("fedcluster", {}), ("kmeans", {"n_clusters": 2}), ("local", {})):
        d = _base(tiny, "per-group")
        d["arms"] = [{"name": policy, "grouping": {"policy": policy, **params}}]
        out.append((f"fedavg-per-group-{policy}", d))
    return out


def _base(tiny: dict, mode: str) -> dict:
    d = copy.deepcopy(tiny)
    d["train"].update(rounds=2, engine="batched", workers=1)
    d["faults"] = {"dropout": 0.2}
    d["arms"] = [d["arms"][1]]
    if mode == "per-group":
        d["mode"] = "per-group"
        d["topology"] = {"edges": 1, "clients_per_edge": 6}
        d["data"]["test_fraction"] = 0.2
        d["arms"] = [{"name": "rg", "grouping": {"policy": "rg", "min_group_size": 3}}]
    return d


def _cases():
    from conftest import TINY

    return configs(TINY)


CASES = _cases()


# the cases whose state a resume must restore onto the device (client tables, clusters, groups)
RESUMED = ("scaffold-global", "fedavg-global-adam", "ditto-per-group", "fedavg-per-group-hcct", "fedavg-per-group-ifca")


@pytest.mark.parametrize("name,d", CASES, ids=[c[0] for c in CASES])
def test_every_tensor_names_its_device(name, d, tmp_path):
    with DeviceDiscipline() as discipline:
        full, resumed = run_twice(d, tmp_path, resume=name in RESUMED)
    assert not discipline.found, "\n".join(sorted(discipline.found))
    pd.testing.assert_frame_equal(full, resumed, check_exact=True)
    assert np.isfinite(full["loss"]).all()


def test_the_discipline_catches_a_factory_without_device(tmp_path):
    """The check itself: a groupfel module that makes a tensor without naming its device is caught."""
    from groupfel.emulator import compute

    with DeviceDiscipline() as discipline:
        exec(compile("import torch\ntorch.zeros(3)\n", compute.__file__, "exec"), {})
    assert any("torch.zeros without device" in f for f in discipline.found)


@pytest.mark.parametrize("text,version", [
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 01:44:30 UTC 2024\n"
     "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n", "550.54.14"),
    ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.14  Release Build  "
     "(dvs-builder@U16-I3-B03-4-3)  Thu Feb 22 01:25:25 UTC 2024\nGCC version:  gcc version 12.3.0 (Ubuntu)\n",
     "550.54.14"),
    ("NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  560.35.03  Release Build  "
     "(buildd@lcy02-amd64-1.example.com)  Fri Aug 16 21:21:48 UTC 2024\n", "560.35.03"),
    ("NVRM version: NVIDIA UNIX aarch64 Kernel Module  535.129.03  Thu Oct 19 18:42:24 UTC 2023\n", "535.129.03"),
    ("NVRM version: NVIDIA UNIX Open Kernel Module  570.86.15  Release Build\n", "570.86.15"),
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  390.157  Wed Oct 12 09:19:07 UTC 2022\n", "390.157"),
    ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64 595.71.05", "595.71.05"),
    ("GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n", None),   # no NVRM line: no version
])
def test_the_driver_version_is_read_from_any_nvrm_line(text, version):
    from groupfel.emulator.devices import driver_version

    assert driver_version(text) == version
