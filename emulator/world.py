"""config -> world: dataset, topology with data placement, cost model and training engine.

The world is shared by every arm of a run, so arms compare on the same data, topology and costs.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import torch

from groupfel.cost_models import CostModel
from groupfel.cost_models.power import PowerModel, build_power, build_server_power, read_power
from groupfel.topologies import (DATASETS, Dataset, Link, Topology, assign_devices, build_topology, client_sizes,
                        dirichlet_partition, label_matrix, load_dataset)
from groupfel.topologies.partition import (apply_client_types, authors_label_shift, authors_shards_partition,
                                           fedcollab_types, shards_partition, split_local, weighted_partition)

from .config import SHIFTS, RunConfig, parts
from groupfel.errors import InputError
from .algorithms import Algorithm, FedAvg, algorithms, make_algorithm
from .network import EdgeNetwork, build_network
from .devices import resolve as resolve_device
from .eq5 import build_cost_model
from .stacked import Kernels
from .stacking import Stacks
from .training import ENGINES, TorchEngine
from . import rng as streams


@dataclass
class World:
    config: RunConfig
    dataset: Dataset
    topology: Topology
    cost: CostModel
    engine: TorchEngine
    local_test: list[np.ndarray] = field(default_factory=list)  # per client, indices into dataset.x_train
    plugins: list[dict] = field(default_factory=list)   # the manifest's record of each plug-in the config names
    cost_warnings: list[str] = field(default_factory=list)      # shipped curves clamped at 0 (manifest)
    algorithm: Algorithm = field(default_factory=FedAvg)          # the training algorithm (train.algorithm)
    network: EdgeNetwork | None = None     # the shared-edge model (topology.edge_access_mbps, ...); None: off
    power: PowerModel | None = None        # watts per device and state (cost.energy); None: no energy


@dataclass(frozen=True)
class Placement:
    """Where the data sits: the dataset (with any per-client rotated or relabelled copies appended
    to its training arrays), each client's training and local test indices into it, and the
    topology built on the training indices."""

    dataset: Dataset
    topology: Topology
    local_test: list[np.ndarray]
    client_type: np.ndarray   # index into the scenario's client types; -1 without types


def _client_types(config: RunConfig, dataset: Dataset, n_clients: int) -> list[dict]:
    d = config.data
    types = [t.model_dump() for t in d.types] if d.types is not None else \
        fedcollab_types(d.partition, n_clients, dataset.num_classes, d.max_samples, d.min_samples)
    total = sum(t["clients"] for t in types)
    if total != n_clients:
        raise InputError(f"data.types: the types have {total} clients but the topology has {n_clients}; "
                         f"make the types' clients add up to the topology's")
    m = dataset.num_classes
    for i, t in enumerate(types):
        w, perm = t.get("label_weights"), t.get("permutation")
        if w is not None and (len(w) != m or min(w) < 0 or sum(w) <= 0):
            raise InputError(f"data.types[{i}].label_weights: give {m} non-negative weights (one per class of "
                             f"{dataset.name}) with a positive sum")
        if perm is not None and sorted(perm) != list(range(m)):
            raise InputError(f"data.types[{i}].permutation: must list each label 0..{m - 1} exactly once")
        if t.get("domain") is not None:
            t["domain"] = _domain_index(dataset, t["domain"], f"data.types[{i}].domain")
    return types


def _domain_index(dataset: Dataset, domain: int | str, where: str) -> int:
    names = list(dataset.domains)
    if dataset.domain_train is None or not names:
        raise InputError(f"{where}: {dataset.name} has no domains; use a multi-domain dataset (digit-domains) "
                         f"or remove domain")
    if isinstance(domain, str) and domain in names:
        return names.index(domain)
    if isinstance(domain, int) and 0 <= domain < len(names):
        return domain
    raise InputError(f"{where}: {domain!r} is not a domain of {dataset.name}; choose one of {names} "
                     f"(or an index 0..{len(names) - 1})")


def _domain_partition(dataset: Dataset, sizes: np.ndarray, weights: np.ndarray, domain: np.ndarray,
                      rng: np.random.Generator) -> list[np.ndarray]:
    """Each client's samples drawn from its domain only (HCCT's Digit task): the clients of one
    domain share that domain's samples, without replacement, as :func:`weighted_partition` deals them."""
    parts: list[np.ndarray] = [np.empty(0, dtype=int)] * len(sizes)
    for k in np.unique(domain):
        pool = np.flatnonzero(dataset.domain_train == k)
        mine = np.flatnonzero(domain == k)
        try:
            drawn = weighted_partition(dataset.y_train[pool], sizes[mine], weights[mine], dataset.num_classes, rng)
        except InputError as exc:
            raise InputError(f"data.types: domain {dataset.domains[k]!r} ({len(pool)} training samples): "
                             f"{str(exc).removeprefix('data: ')}") from None
        for i, p in zip(mine, drawn):
            parts[i] = pool[p]
    return parts


def _domain_tests(dataset: Dataset, domain: np.ndarray) -> tuple[Dataset, list[np.ndarray]]:
    """``local_test = "domain"`` (the HCCT authors' prepare_digit_data): every client is tested on
    its domain's whole test set. The test images are appended to the training arrays (as the
    client types' copies are), so that each client's test indices point into them like a split's."""
    n = len(dataset.y_train)
    rows = [np.flatnonzero(dataset.domain_test == k) for k in range(len(dataset.domains))]
    order = np.concatenate(rows)
    start = n + np.cumsum([0] + [len(r) for r in rows])
    tests = [np.arange(start[k], start[k + 1]) for k in domain]
    return replace(dataset, x_train=np.concatenate([dataset.x_train, dataset.x_test[order]]),
                   y_train=np.concatenate([dataset.y_train, dataset.y_test[order]]),
                   domain_train=np.concatenate([dataset.domain_train, dataset.domain_test[order]])), tests


def place_data(config: RunConfig, dataset: Dataset) -> Placement:
    """Partition the training set over the clients (``[data]``), split each client's samples into
    training and local test (``test_fraction``), and build the topology on the training part."""
    d, tc = config.data, config.topology
    sizes_per_edge = tc.sizes
    n_clients = sum(sizes_per_edge)
    m = dataset.num_classes
    rng = streams.rng(config.world_rng_seed, "placement")
    mean = d.mean_samples if d.mean_samples is not None else (d.min_samples + d.max_samples) / 2
    std = d.std_samples if d.std_samples is not None else (d.max_samples - d.min_samples) / 4
    client_type = np.full(n_clients, -1)
    types: list[dict] = []
    authors_deal = d.partition == "label-shift" and d.label_shift_deal == "authors"
    if authors_deal:   # the authors deal the training and test sets together (their ConcatDataset)
        dataset = replace(dataset, x_train=np.concatenate([dataset.x_train, dataset.x_test]),
                          y_train=np.concatenate([dataset.y_train, dataset.y_test]),
                          domain_train=None if dataset.domain_train is None else
                          np.concatenate([dataset.domain_train, dataset.domain_test]))
        holdout = d.test_fraction if d.test_fraction is not None else 1 / 7
        parts, test = authors_label_shift(dataset.y_train, n_clients, m, d.cluster_k, d.subsample_decay, holdout, rng)
        client_type = np.repeat(np.arange(4), n_clients // 4)
    elif d.partition in SHIFTS:
        types = _client_types(config, dataset, n_clients)
        client_type = np.repeat(np.arange(len(types)), [t["clients"] for t in types])
        drawn = client_sizes(n_clients, d.min_samples, d.max_samples, mean, std, rng, d.sizes)
        fixed = np.array([types[k]["samples"] or 0 for k in client_type])
        sizes = np.where(fixed > 0, fixed, drawn)
        weights = np.stack([np.asarray(types[k]["label_weights"], dtype=float)
                            if types[k].get("label_weights") is not None else np.ones(m) for k in client_type])
        if types[0].get("domain") is not None:
            domain = np.array([types[k]["domain"] for k in client_type])
            parts = _domain_partition(dataset, sizes, weights, domain, rng)
        else:
            parts = weighted_partition(dataset.y_train, sizes, weights, m, rng)
    elif d.partition == "shards" and d.shards_deal == "authors":
        parts = authors_shards_partition(dataset.y_train, n_clients, d.n_shards, d.shard_samples, rng)
    else:
        sizes = client_sizes(n_clients, d.min_samples, d.max_samples, mean, std, rng, d.sizes)
        parts = (dirichlet_partition(dataset.y_train, sizes, d.alpha, m, rng, d.dirichlet_counts == "floor")
                 if d.partition == "dirichlet" else shards_partition(dataset.y_train, sizes, d.n_shards, m, rng))
    devices = assign_devices(n_clients, tc.devices, rng)
    if d.local_test == "domain":   # every sample trains; the domain's test set tests
        dataset, test = _domain_tests(dataset, domain)
        train = parts
    elif authors_deal:   # the test split was cut with the training split, by label
        train = parts
    else:
        train, test = split_local(parts, config.test_fraction, streams.rng(config.world_rng_seed, "local-split"),
                                  d.test_samples)
    x, y = dataset.x_train, dataset.y_train
    if types:
        before = [train, test]
        x, y, (train, test) = apply_client_types(x, y, [train, test], client_type, types)
        domain_train = dataset.domain_train
        if domain_train is not None and len(y) > len(domain_train):   # rotated copies keep their domain
            domain_train = np.concatenate([domain_train, np.empty(len(y) - len(domain_train), dtype=domain_train.dtype)])
            for old, new in zip(before, (train, test)):
                for o, n in zip(old, new):
                    domain_train[n] = domain_train[o]
        dataset = replace(dataset, x_train=x, y_train=y, domain_train=domain_train)
    labels = label_matrix(y, train, m)
    topology = build_topology(sizes_per_edge, devices, train, labels,
                              Link(tc.client_link.bandwidth_mbps, tc.client_link.latency_s, tc.client_link.burst_bytes),
                              Link(tc.edge_link.bandwidth_mbps, tc.edge_link.latency_s, tc.edge_link.burst_bytes))
    return Placement(dataset, topology, test, client_type)


def build_algorithm(config: RunConfig) -> Algorithm:
    t = config.train
    algorithm = make_algorithm(t.algorithm, t.algorithm_params, t.mu)
    if t.algorithm not in algorithms:   # a plug-in: its hooks' returns are checked where they enter
        from .contracts import check_algorithm

        check_algorithm(algorithm)
    return algorithm


def check_power_devices(config: RunConfig) -> list[str]:
    """cost.profiles_file's [[power]] tables against the run's devices (``cost.energy``): a table
    for a device the run does not have prices nothing. A name close to a device of the run that
    the file gives no power for is a misspelling (the run would price that device's shipped
    power), refused; another device is noted (one file may serve several configs)."""
    import difflib

    if not config.cost.energy or not config.cost.profiles_file:
        return []
    extra = read_power(config.cost.profiles_file)
    ours = sorted(config.topology.devices)
    notes = []
    for device, table in extra.items():
        if device in ours:
            continue
        where = next((pc.where for pc in table.states.values() if pc.where), str(config.cost.profiles_file))
        close = difflib.get_close_matches(str(device), [d for d in ours if d not in extra], n=1, cutoff=0.75)
        if close:
            raise InputError(f"{where}: device {device!r} is not a device of this run; did you mean {close[0]!r}? "
                             f"(topology.devices: {', '.join(ours)}; as written the run prices {close[0]!r} with "
                             f"its shipped power)")
        notes.append(f"{where}: device {device!r} is not a device of this run (topology.devices: {', '.join(ours)}); "
                     f"its power prices nothing")
    return notes


def build_power_model(config: RunConfig, topology: Topology, counts: np.ndarray,
                      network: EdgeNetwork | None) -> PowerModel | None:
    """The devices' power per state (``cost.energy``), each curve checked where this run uses it:
    training at the clients' sample counts, group operations at sizes 1..the largest edge, the
    radio at the clients' link rates."""
    if not config.cost.energy:
        return None
    extra = read_power(config.cost.profiles_file) if config.cost.profiles_file else None
    devices = np.array(topology.client_device)
    rates = network.clients.bandwidth_mbps if network is not None else \
        np.array([topology.client_link(c).bandwidth_mbps for c in range(topology.n_clients)])
    sizes = np.arange(1, max(config.topology.sizes) + 1)
    uses = {d: {"training": counts[devices == d], "group_operation": sizes, "transmit": rates[devices == d],
                "receive": rates[devices == d], "listen": np.zeros(1), "idle": np.zeros(1)} for d in set(devices.tolist())}
    model = build_power(sorted(config.topology.devices), extra, uses)
    c = config.cost
    sites = {}
    for key, device in (("cost.edge_power", c.edge_power), ("cost.cloud_power", c.cloud_power)):
        if device is not None:
            server = build_server_power(device, extra, sizes, key)
            sites[device] = replace(server, states={**(model.devices[device].states if device in model.devices
                                                       else {}), **server.states})
    carbon = None
    if c.carbon_intensity is not None or c.carbon_intensity_file is not None:
        from groupfel.cost_models.carbon import read_intensity

        carbon = read_intensity(c.carbon_intensity, c.carbon_intensity_file, c.carbon_start)
    return replace(model, devices={**model.devices, **sites}, accounting=c.energy_accounting, edge=c.edge_power,
                   cloud=c.cloud_power, edge_pue=c.edge_pue, cloud_pue=c.cloud_pue, carbon=carbon,
                   n_edges=topology.n_edges)


def build_engine(config: RunConfig, dataset: Dataset, topology: Topology, algorithm: Algorithm,
                 stacks: Stacks | None = None) -> TorchEngine:
    t = config.train
    kwargs = dict(momentum=t.momentum, weight_decay=t.weight_decay, mu=algorithm.proximal_mu, precision=t.precision,
                  optimizer=t.optimizer)
    kernels = Kernels(autotune=t.autotune, channels_last=t.channels_last)
    if stacks is not None:   # a run of a stack: its training goes to the stack's batcher
        return stacks.member(t.engine, dataset, topology.client_samples, t.model, t.lr, t.batch_size, t.device,
                             kernels=kernels, **kwargs)
    if t.engine != "sequential":
        kwargs.update(workers=t.workers, kernels=kernels)
    return ENGINES[t.engine](dataset, topology.client_samples, t.model, t.lr, t.batch_size, t.device, **kwargs)


def resolve_parts(config: RunConfig) -> list[dict]:
    """Import and check every plug-in the config names (one-line errors naming the field), before
    any work; what the manifest keeps of each (:func:`groupfel.policies.plugins.record`)."""
    from groupfel.policies import aggregations, groupings, plugins, samplings

    from .models import MODELS, model_builder

    out, seen = [], set()
    for where, kind, name in parts(config):
        if not isinstance(name, str) or (kind == "dataset" and name in DATASETS) or (kind == "model" and name in MODELS):
            continue
        registry = {"grouping": groupings, "sampling": samplings, "aggregation": aggregations,
                    "algorithm": algorithms}.get(kind)
        if registry is not None and name in registry:
            continue
        if kind == "dataset":
            obj = _dataset_loader(name)
        elif kind == "model":
            obj = model_builder(name, where)
        else:
            obj = registry.resolve(name, where)
        if (kind, name) not in seen:
            seen.add((kind, name))
            out.append(plugins.record(kind, name, where, obj))
    return out


def _dataset_loader(name: str):
    from groupfel.policies import plugins

    fn = plugins.load("dataset", name, "data.dataset", plugins.check_callable(("path",)))
    if fn is None:
        raise InputError(f"data.dataset: unknown dataset {name!r}; choose one of "
                         f"{list(DATASETS) + plugins.installed('dataset')} or give an import path \"module:function\"")
    return fn


def load_data(config: RunConfig) -> Dataset:
    """The config's dataset: a shipped one, or a plug-in's ``(path) -> groupfel.topologies.Dataset``."""
    d = config.data
    if d.dataset in DATASETS:
        return load_dataset(d.dataset, d.path, d.audio)
    from .contracts import calling, check_dataset

    with calling("data.dataset", d.dataset, "loader"):
        dataset = _dataset_loader(d.dataset)(d.path)
    if not isinstance(dataset, Dataset):
        raise InputError(f"data.dataset: {d.dataset!r} returned {type(dataset).__name__}, not a groupfel.topologies.Dataset")
    check_dataset(dataset, "data.dataset", d.dataset)
    return dataset


def check_model_plugin(config: RunConfig, dataset: Dataset) -> None:
    """A plug-in model's one forward pass of one sample at plan time: the output must be
    (1, num_classes). Torch's global random state is left as it was (the engine seeds its own)."""
    from .contracts import calling, check_model
    from .models import MODELS, model_builder

    name = config.train.model
    if name in MODELS:
        return
    with torch.random.fork_rng(devices=[]):
        with calling("train.model", name, "builder"):
            model = model_builder(name, "train.model")(tuple(dataset.input_shape), dataset.num_classes)
        if not isinstance(model, torch.nn.Module):
            raise InputError(f"train.model: {name!r} returned {type(model).__name__}, not a torch.nn.Module")
        check_model(model.eval(), dataset.x_train[:1], dataset.num_classes, "train.model", name)


def build_world(config: RunConfig, dataset: Dataset | None = None, stacks: Stacks | None = None) -> World:
    """``dataset``: the loaded ``config.data`` dataset, where the caller has it (a Ray task whose
    node lacks the files gets it from the driver); else it loads here. ``stacks``: the run trains in
    a stack of runs (:mod:`groupfel.emulator.stacking`)."""
    plugins = resolve_parts(config)   # a bad plug-in fails here, before anything loads
    algorithm = build_algorithm(config)
    cost = build_cost_model(config, algorithm)  # cheap checks first, before the data loads
    power_notes = check_power_devices(config)
    # the network's files (per-client links, traces) are read and checked before the data loads too
    network = build_network(config, sum(config.topology.sizes), algorithm, cost.operations, config.cost.profiles_file)
    placement = place_data(config, load_data(config) if dataset is None else dataset)
    dataset, topology = placement.dataset, placement.topology
    check_model_plugin(config, dataset)
    counts = np.array([len(s) for s in topology.client_samples])
    devices = np.array(topology.client_device)
    notes = cost.check_range(max(config.topology.sizes), {d: counts[devices == d] for d in set(devices)}) + power_notes
    power = build_power_model(config, topology, counts, network)
    t = config.train
    try:
        torch.empty(0, device=resolve_device(t.device))
    except (RuntimeError, AssertionError) as exc:
        raise InputError(f"train.device: {t.device!r} is not usable here ({str(exc).splitlines()[0]}); "
                         f"use \"cpu\"") from None
    if t.precision != "fp32" and not resolve_device(t.device).startswith("cuda"):
        raise InputError(f"train.precision: {t.precision!r} is a GPU's faster arithmetic and means nothing on "
                         f"{resolve_device(t.device)!r}; use precision = \"fp32\" (the default) or train on cuda")
    if t.autotune and not resolve_device(t.device).startswith("cuda"):
        raise InputError(f"train.autotune: cuDNN's autotuning needs a CUDA device, not {resolve_device(t.device)!r}; "
                         f"set autotune = false (the default) or train on cuda")
    return World(config, dataset, topology, cost, build_engine(config, dataset, topology, algorithm, stacks),
                 placement.local_test, plugins, notes, algorithm, network, power)
