"""HCCT-E's layer l* on the HCCT authors' Digit model (``digit-bn-cnn``, the state-dict vector),
chosen from the uploads the ``layer = "once"`` runs choose it from: every client's training of
epoch 0 (the authors' epoch-0 FedAvg, from the initial model), as `authors-model.full-hcct-e.sweep.toml`
runs it. Per seed, every layer's Eq. 19 ratio under each reading, the layer's pooled mean
gradient (the authors' ratio divides by it) and the layer each reading picks:

* ``before``: ``layer_ratio = "absolute"`` with normalisation modules as candidates (the
  committed runs before issue 65's change of default);
* ``absolute``: the default now (BatchNorm modules not candidates);
* ``authors``: ``layer_ratio = "authors"`` (main_cluster.py's expression; the sweep's reading).

One epoch per seed, through the driver's own run of the arm (so the uploads are the run's): the
checkpoint after epoch 0 holds them, and the run stops there.

    python experiments/reproductions/hcct-table4-digit/hcct_e_layers.py \
        experiments/reproductions/hcct-table4-digit/hcct-e-layers/hcct-e-layers.csv [seed ...]
"""
from __future__ import annotations

import csv
import sys
import tempfile
from pathlib import Path

import numpy as np

from groupfel import experiments
from groupfel.emulator.config import load_config
from groupfel.emulator.driver import CHECKPOINT, load_checkpoint, plan_arm, run_arm
from groupfel.emulator.models import model_layers, trainable_mask
from groupfel.emulator.world import build_world
from groupfel.policies.hcct import HCCTEGrouping, layer_ratios

READINGS = {"before": {"layer_ratio": "absolute", "norm_layers": True},
            "absolute": {"layer_ratio": "absolute"},
            "authors": {"layer_ratio": "authors"}}


def uploads(seed: int) -> tuple[np.ndarray, tuple, np.ndarray | None]:
    """Every client's epoch-0 upload (start − trained over the lr), the model's layers and mask."""
    cfg = load_config(Path(experiments.__file__).parent / "configs" / "hcct-digits.toml")
    train = cfg.train.model_copy(update={"model": "digit-bn-cnn", "eval_every": 1, "report_best": True,
                                         "workers": 1, "local_reference": False})
    grouping = {"policy": "hcct-e", "alpha": 100.0, "schedule": "alg1", "first": "global", "layer": "once",
                "layer_ratio": "authors", "gradient": "state"}
    arm = cfg.arms[0].model_copy(update={"name": "hcct-e", "grouping": grouping})
    cfg = cfg.model_copy(update={"seed": seed, "train": train, "arms": [arm]})
    world = build_world(cfg)

    class _Epoch0Done(Exception):
        pass

    def stop_after_epoch_0(t, cost, acc):
        if t == 1:   # evaluated and checkpointed after epoch 0's training
            raise _Epoch0Done

    with tempfile.TemporaryDirectory() as d:
        arm_dir = Path(d) / "hcct-e"
        try:
            run_arm(world, plan_arm(world, 0), arm_dir, on_round=stop_after_epoch_0)
        except _Epoch0Done:
            pass
        state = load_checkpoint(arm_dir / CHECKPOINT)
    return state.gradients.cpu().numpy().astype(np.float64), model_layers(world.engine), trainable_mask(world.engine)


def rows(seed: int) -> list[dict]:
    grads, layers, _ = uploads(seed)
    out = []
    for reading, params in READINGS.items():
        policy = HCCTEGrouping(alpha=100.0, gradient="state", **params)
        candidates = [layer for layer in layers if policy.norm_layers or not layer.norm]
        values = layer_ratios(grads, [layer.parts for layer in candidates], policy.layer_ratio)
        best = int(np.nanargmax(values))
        out += [{"seed": seed, "reading": reading, "layer": layer.name, "ratio": float(v),
                 "mean_gradient": float(grads[:, layer.columns].mean()), "chosen": i == best}
                for i, (layer, v) in enumerate(zip(candidates, values))]
        print(seed, reading, candidates[best].name, flush=True)
    return out


def main() -> None:
    path = Path(sys.argv[1])
    seeds = [int(s) for s in sys.argv[2:]] or list(range(5))
    done = list(csv.DictReader(path.open())) if path.exists() else []
    have = {int(r["seed"]) for r in done}
    path.parent.mkdir(parents=True, exist_ok=True)
    for seed in seeds:
        if seed in have:   # resumes: a seed already written is kept
            continue
        done += rows(seed)
        with path.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(done[0]))
            w.writeheader()
            w.writerows(done)


if __name__ == "__main__":
    main()
