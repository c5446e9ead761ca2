"""config -> world: dataset, topology with data placement, cost model and training engine.

The world is shared by every arm of a run, so arms compare on the same data, topology and costs.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from cost_models import CostModel, get_profile, read_profiles
from topologies import (Dataset, Link, Topology, assign_devices, build_topology, client_sizes,
                        dirichlet_partition, label_matrix, load_dataset)

from .config import RunConfig
from .errors import InputError
from .training import ENGINES, TorchEngine


@dataclass
class World:
    config: RunConfig
    dataset: Dataset
    topology: Topology
    cost: CostModel
    engine: TorchEngine


def build_topology_from_config(config: RunConfig, dataset: Dataset) -> Topology:
    d, tc = config.data, config.topology
    sizes_per_edge = tc.sizes
    n_clients = sum(sizes_per_edge)
    rng = np.random.default_rng((config.seed, 4))
    mean = d.mean_samples if d.mean_samples is not None else (d.min_samples + d.max_samples) / 2
    std = d.std_samples if d.std_samples is not None else (d.max_samples - d.min_samples) / 4
    sizes = client_sizes(n_clients, d.min_samples, d.max_samples, mean, std, rng)
    parts = dirichlet_partition(dataset.y_train, sizes, d.alpha, dataset.num_classes, rng)
    labels = label_matrix(dataset.y_train, parts, dataset.num_classes)
    devices = assign_devices(n_clients, tc.devices, rng)
    return build_topology(sizes_per_edge, devices, parts, labels,
                          Link(tc.client_link.bandwidth_mbps, tc.client_link.latency_s),
                          Link(tc.edge_link.bandwidth_mbps, tc.edge_link.latency_s))


def build_cost_model(config: RunConfig) -> CostModel:
    c = config.cost
    extra = read_profiles(c.profiles_file) if c.profiles_file else None
    profiles = {dev: get_profile(f"{dev}/{c.task}", extra) for dev in config.topology.devices}
    algorithm = config.train.algorithm
    training = c.training
    if training is None:   # the algorithm's own curve where every profile measured one
        training = algorithm if all(algorithm in p.training for p in profiles.values()) else "sgd"
    operations = c.group_operations
    if operations is None:  # SCAFFOLD's secure aggregation carries model + variates
        operations = ["scaffold-secagg" if algorithm == "scaffold" else "secagg"]
    return CostModel(profiles, training, tuple(operations), config.faults.recovery_multiple)


def build_engine(config: RunConfig, dataset: Dataset, topology: Topology) -> TorchEngine:
    t = config.train
    kwargs = dict(momentum=t.momentum, weight_decay=t.weight_decay, mu=t.mu)
    if t.engine != "sequential":
        kwargs["workers"] = t.workers
    return ENGINES[t.engine](dataset, topology.client_samples, t.model, t.lr, t.batch_size, t.device, **kwargs)


def build_world(config: RunConfig) -> World:
    cost = build_cost_model(config)  # cheap checks first, before the data loads
    dataset = load_dataset(config.data.dataset, config.data.path)
    topology = build_topology_from_config(config, dataset)
    t = config.train
    try:
        torch.empty(0, device=t.device)
    except (RuntimeError, AssertionError) as exc:
        raise InputError(f"train.device: {t.device!r} is not usable here ({str(exc).splitlines()[0]}); "
                         f"use \"cpu\"") from None
    return World(config, dataset, topology, cost, build_engine(config, dataset, topology))
