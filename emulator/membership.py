"""Who is in which group: the first grouping of an arm, regrouping, and the client work a
grouping policy needs (charged as training with group and group_round −1).

Each edge groups its own clients (Alg. 1, Lines 2-3) with the arm's grouping policy; what the
policy is given follows its declarations (:class:`groupfel.policies.GroupingPolicy`): label counts always,
the gradients of a probe epoch (``needs_gradients``, HCCT) or the distances of the clients'
discriminators (``needs_distances``, FedCollab Alg. 1). A policy whose ``regroup`` kind is
``"cluster"`` (FedCLAR) clusters the clients' one-epoch updates at its ``cluster_round``
(:func:`cluster_clients`).

FedCLAR in global mode (Presotto et al. 2022; the Group-FEL paper's personalised baseline,
Sec. 7): the clusters become the groups Group-FEL samples from for the rest of the run (with the
arm's sampling: the Group-FEL paper runs every baseline "with uniform group sampling", Sec. 6.3);
they are saved in the arm directory (``clusters.json``) so a resumed run keeps them. From the
clustering round on, **each cluster keeps and trains its own model** (FedCLAR's specialised
cluster models): every cluster starts from the global model x_t of that round (with
``cluster_start = "probed"``, from its members' mean probed model), and a sampled
cluster's K group rounds start from its own model. What is reported: Group-FEL includes FedCLAR
"to show that personalized FL is not suitable for training a good global model" (Sec. 6) and
reports that "the accuracy of FedCLAR drops after clustering" (Sec. 6.3): the accuracy of a
*global* model on the held-out test set. The authors' code (Jiyao17/fl-grouping,
``FedCLAR_cluster_epoch``) evaluates ``self.model``, the aggregate of every cluster's model
weighted by the clusters' samples. We do the same (:func:`clusters_global_model`): no drop is
forced; it appears only if the clusters' models specialise apart. Where the code and the paper
differ we follow the paper: the code trains every cluster every round after clustering (and
charges only the sampled ones), we train the sampled clusters, as the paper's uniform group
sampling says. The code drops clients left unclustered (``merge = "authors"`` does too; our
default clustering keeps every client) and has a final local-fine-tuning phase
(``FedCLAR_tl_epoch``) that the paper does not mention and that the authors' figure runs set past
their last round; we have none.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from groupfel.cost_models import TRAINING
from groupfel.policies import EdgeView, GroupingPolicy
from groupfel.policies.cov import cov_of_counts

from .discriminator import DiscriminatorSpec, discriminator_distances, discriminator_features
from groupfel.errors import InputError
from .federation import Group
from .io import atomic_write, write_json
from .ledger import CostLedger
from .models import model_layers, trainable_mask
from .rng import key, rng
from .world import World

CLUSTERS = "clusters.json"
CLUSTER_STARTS = "cluster-starts.pt"   # with cluster_start = "probed": each cluster's start model
Work = list[tuple[int, np.ndarray, np.ndarray]]   # (edge, clients, Eq. 5 charge of each)


@dataclass
class GroupingResult:
    """The groups of every edge, what the leftover rule did, and the client work forming them took."""

    groups: list[Group]
    dropped: int
    leftover_clients: int
    # (edge, clients, cost of each) of client work a policy needs: HCCT probe, FedCollab discriminators
    probe: list[tuple[int, np.ndarray, np.ndarray]] = field(default_factory=list)
    # (edge, clients, their distance matrix): what a policy with needs_distances was given (FedCollab)
    distances: list[tuple[int, np.ndarray, np.ndarray]] = field(default_factory=list)

    @property
    def probe_cost(self) -> float:
        return float(sum(amounts.sum() for _, _, amounts in self.probe))

    @classmethod
    def from_summary(cls, world: World, summary: dict) -> "GroupingResult":
        """The grouping a checkpoint stored (its probe was already charged)."""
        groups = [Group(g["edge"], np.array(g["clients"], dtype=np.int64),
                        world.topology.n_samples[np.array(g["clients"], dtype=np.int64)], g["cov"])
                  for g in summary["groups"]]
        return cls(groups, summary["clients_dropped"], summary["clients_touched_by_leftover_rule"])

    def summary(self) -> dict:
        sizes = np.array([g.size for g in self.groups])
        covs = np.array([g.cov for g in self.groups])
        return {"n_groups": len(self.groups), "size_min": int(sizes.min()), "size_max": int(sizes.max()),
                "size_mean": float(sizes.mean()), "cov_mean": float(covs.mean()),
                "clients_dropped": self.dropped, "clients_touched_by_leftover_rule": self.leftover_clients,
                "gradient_probe_training_cost": self.probe_cost,
                "groups": [{"edge": g.edge, "clients": g.clients.tolist(), "size": g.size,
                            "samples": g.total_samples, "cov": g.cov} for g in self.groups],
                **({"distances": [{"edge": j, "clients": c.tolist(), "matrix": D.tolist()} for j, c, D in self.distances]}
                   if self.distances else {})}


DISTANCES = "distances.csv"


def write_distances(arm_dir: Path, distances: list[dict] | None) -> None:
    """``distances.csv``: the distance matrix each edge's grouping policy was given at the first
    grouping (FedCollab's discriminator estimates), one row per ordered pair of an edge's clients
    (edge, client_i, client_j, distance; clients by their global index)."""
    if not distances:
        return
    rows = ["edge,client_i,client_j,distance"]
    for d in distances:
        clients, D = d["clients"], d["matrix"]
        rows += [f"{d['edge']},{a},{b},{D[i][k]!r}" for i, a in enumerate(clients) for k, b in enumerate(clients)]
    atomic_write(Path(arm_dir) / DISTANCES, lambda p: p.write_text("\n".join(rows) + "\n"))


def _probe_gradients(world: World, members: np.ndarray, edge: int, epoch: int, start: torch.Tensor) -> np.ndarray:
    """Gradients for HCCT (HCCT Alg. 1): one local epoch of every client from the current global
    model ``start``; gradient ≈ start − trained. Each (re)grouping epoch draws fresh batches, so a
    re-clustering sees new gradients, as HCCT's periodic re-clustering does."""
    gen = rng(world.config.seed, "probe", epoch, edge)
    seeds = [int(s) for s in gen.integers(2**31, size=len(members))]
    trained = world.engine.train(start, [int(c) for c in members], 1, seeds)
    return (start[None, :] - trained).cpu().numpy().astype(np.float64)


def form_groups(world: World, policy: GroupingPolicy, epoch: int, weights: torch.Tensor | None = None) -> GroupingResult:
    """Each edge groups its own clients (Alg. 1, Lines 2-3); groups never cross edges.

    A policy with ``needs_gradients`` (HCCT) gets each client's gradient from a probe epoch from
    the global model ``weights`` (default: the initial model); one
    with ``needs_distances`` (FedCollab, discriminator distances) gets the distances of the clients'
    discriminators (FedCollab Alg. 1). :func:`run_arm` charges that client work to the ledger as
    training (group and group_round -1).
    """
    topo, groups, dropped, touched, probe, distances = world.topology, [], 0, 0, [], []
    norm = policy.normalization
    for j in range(topo.n_edges):
        members = topo.clients_of(j)
        labels = topo.label_counts[members]
        view = EdgeView(labels)
        devices = [topo.client_device[c] for c in members]
        if policy.needs_gradients:
            if weights is None:
                weights = world.engine.initial_weights(world.config.seed)
            view = EdgeView(labels, _probe_gradients(world, members, j, epoch, weights), model_layers(world.engine),
                            trainable=trainable_mask(world.engine))
            probe.append(probe_work(world, j, members, 1))
        if policy.needs_distances:
            spec = DiscriminatorSpec(rounds=policy.discriminator_rounds, selection=policy.discriminator_selection,
                                     eval_every=policy.discriminator_eval_every,
                                     early_stop=policy.discriminator_early_stop, lr=policy.discriminator_lr,
                                     local_steps=policy.discriminator_local_steps,
                                     batch_size=policy.discriminator_batch_size, split=policy.discriminator_split,
                                     hidden=policy.discriminator_hidden)
            features = discriminator_features(world.dataset.x_train, world.dataset.y_train, world.dataset.num_classes)
            D, m, ran = discriminator_distances(features, [topo.client_samples[c] for c in members],
                                                key(world.config.world_rng_seed, "discriminators", epoch, j), spec,
                                                world.dataset.y_train)
            view = EdgeView(labels, distances=D)
            distances.append((j, members, D))
            # Each client trains |edge| − 1 discriminators: the rounds its pairs ran × local_steps
            # passes over m_i samples, priced by its training curve scaled by discriminator / model parameters.
            scale = ran * spec.local_steps * spec.n_params(features.shape[1]) / world.engine.n_params
            probe.append((j, members, scale * world.cost.training_cost(devices, m, 1)))
        gen = rng(world.config.seed, "grouping", epoch, j)
        local_groups, left_out, touched_here = grouping_of_edge(policy, view, gen, j)
        dropped += len(left_out)
        touched += touched_here
        for local in local_groups:
            clients = members[np.sort(local)]
            groups.append(Group(j, clients, topo.n_samples[clients],
                                float(cov_of_counts(topo.label_counts[clients].sum(axis=0), norm))))
    return GroupingResult(groups, dropped, touched, probe, distances)


def grouping_of_edge(policy: GroupingPolicy, view: EdgeView, gen: np.random.Generator, edge: int | None = None,
                     where: str = "grouping.policy") -> tuple[list[np.ndarray], np.ndarray, int]:
    """``policy.group`` on one edge, checked at the seam (:func:`groupfel.emulator.contracts.check_grouping`):
    the groups (row indices), the clients left out and the clients the leftover rule touched."""
    from .contracts import calling, check_grouping, spec_of

    spec = spec_of(policy)
    with calling(where, spec, "group()"):
        result = policy.group(view, gen)
    groups = getattr(result, "groups", None)
    if groups is None:
        raise InputError(f"{where}: {spec!r} breaks the grouping contract: group() must return a "
                         f"groupfel.policies.EdgeGrouping; got {type(result).__name__}")
    out, missing = check_grouping(groups, getattr(result, "dropped", None), view.n_clients, where, spec,
                                  policy.leaves_clients_out, edge)
    return out, missing, int(getattr(result, "leftover_clients", 0))


def charge_client_work(ledger: CostLedger, env, topology, t: int,
                       work: list[tuple[int, np.ndarray, np.ndarray]]) -> None:
    """Client work outside group rounds (HCCT's gradient probe, FedCollab's discriminators,
    IFCA's loss evaluations) is training: charge it (group -1) and let the clients run it in
    parallel on the simulated clock."""
    for j, members, amounts in work:
        ledger.charge(round=t, edge=j, group=-1, group_round=-1, clients=members,
                      devices=[topology.client_device[c] for c in members], component=TRAINING,
                      amounts=amounts, start=np.full(len(members), env.now), end=env.now + amounts)
        if ledger.power is not None:   # the work's seconds at training power (no radio, no idle)
            ledger.charge_energy(round=t, edge=j, group=-1, group_round=-1, clients=members,
                                 devices=[topology.client_device[c] for c in members], state="training",
                                 seconds=amounts, x=topology.n_samples[members], at=float(env.now))
    if work:
        env.run(until=env.now + max(float(a.max()) for _, _, a in work))


def cluster_clients(world: World, policy: GroupingPolicy, clients: np.ndarray, starts: torch.Tensor,
                    t: int) -> tuple[list[tuple[int, np.ndarray]], Work, list[torch.Tensor]]:
    """Cluster ``clients`` (each starting from its row of ``starts``) edge by edge; returns the
    clusters as (edge, clients), the probe work to charge, and each cluster's mean probed model
    (where a policy's ``cluster_start = "probed"`` starts the cluster from it)."""
    topo = world.topology
    clusters, work, means = [], [], []
    columns = last_layer(world) if policy.cluster_input == "last-layer" else None
    for j in range(topo.n_edges):
        rows = np.flatnonzero(topo.client_edge[clients] == j)
        if not len(rows):
            continue
        members = clients[rows]
        epochs = policy.probe_epochs
        probed = probe_models(world, members, starts[rows], t, j, epochs)
        given = probed[:, columns] if columns is not None else starts[rows] - probed
        from .contracts import calling, check_grouping, spec_of

        with calling("grouping.policy", spec_of(policy), "cluster()"):
            found = policy.cluster(given.cpu().numpy().astype(np.float64))
        found, _ = check_grouping(found, None, len(members), "grouping.policy", spec_of(policy), True, j)
        clusters += [(j, members[c]) for c in found]
        means += [probed[c].mean(dim=0) for c in found]
        work.append(probe_work(world, j, members, epochs))
    if not clusters:   # nothing would train from here on
        if getattr(policy, "similarity", None) is not None:
            raise InputError(f"grouping.similarity: no two clients of any edge reached {policy.similarity} at "
                             f"round {t}, so the clustering left every client out; lower it")
        raise InputError(f"grouping.policy: its clustering at round {t} left every client of every edge out")
    return clusters, work, means


def last_layer(world: World) -> slice:
    """The columns of the model's last layer that does not normalise (a classifier's weight and bias)."""
    layers = [layer for layer in model_layers(world.engine) or () if not layer.norm]
    if not layers:
        raise InputError("grouping: cluster_input = 'last-layer' needs a model with parameters; "
                         "this engine has none")
    return layers[-1].columns


def probe_models(world: World, members: np.ndarray, starts: torch.Tensor, t: int, edge: int,
                 epochs: int = 1) -> torch.Tensor:
    """Each client of ``members`` (one edge) trained ``epochs`` epochs alone from its row of
    ``starts``, with the batch seeds of the ``update-probe`` stream of (t, edge)."""
    seeds = rng(world.config.seed, "update-probe", t, edge).integers(2**31, size=len(members))
    return torch.stack([world.engine.train(start, [int(c)], epochs, [int(s)])[0]
                        for start, c, s in zip(starts, members, seeds)])


def probe_work(world: World, edge: int, members: np.ndarray, epochs: int) -> tuple[int, np.ndarray, np.ndarray]:
    """The Eq. 5 training charge of a probe of ``epochs`` epochs by every client of ``members``."""
    topo = world.topology
    devices = [topo.client_device[c] for c in members]
    return edge, members, world.cost.training_cost(devices, topo.n_samples[members], epochs)


def cluster_groups(world: World, policy: GroupingPolicy, weights: torch.Tensor | None, t: int,
                   arm_dir: Path) -> tuple[list[Group], Work, torch.Tensor | None]:
    """The groups after clustering in global mode (every client probes from the global model
    ``weights``), computed once and then read back from ``arm_dir`` (``weights`` None: a resumed
    run past the clustering round, which must find them there), and the clusters' start models
    where the policy's ``cluster_start`` is ``"probed"`` (None: each starts from ``weights``)."""
    path, starts_path = Path(arm_dir) / CLUSTERS, Path(arm_dir) / CLUSTER_STARTS
    topo = world.topology
    probed = policy.cluster_start == "probed" and weights is not None
    starts = None
    if path.exists():
        from .runfiles import load_json

        blob = load_json(path)
        clusters = [(c["edge"], np.array(c["clients"], dtype=int)) for c in blob["clusters"]]
        work = [(w["edge"], np.array(w["clients"], dtype=int), np.array(w["amounts"])) for w in blob["probe"]]
        if probed:   # resumed before the clustering round's checkpoint: the starts as saved
            starts = torch.load(starts_path, weights_only=True, map_location=weights.device)
    else:
        if weights is None:
            raise FileNotFoundError(f"{path}: the clusters of this resumed run are missing")
        clients = np.arange(topo.n_clients)
        clusters, work, means = cluster_clients(world, policy, clients, weights.expand(len(clients), -1), t)
        if probed:   # saved before the clusters, so that clusters.json never stands without them
            starts = torch.stack(means)
            atomic_write(starts_path, lambda p: torch.save(starts.cpu(), p))
        write_json(path, {"round": t,
                          "clusters": [{"edge": j, "clients": c.tolist()} for j, c in clusters],
                          "probe": [{"edge": j, "clients": m.tolist(), "amounts": a.tolist()} for j, m, a in work]})
    groups = [Group(j, c, topo.n_samples[c], float(cov_of_counts(topo.label_counts[c].sum(axis=0), "std")))
              for j, c in clusters]
    return groups, work, starts


def clusters_global_model(cluster_models: torch.Tensor, trained: dict[int, torch.Tensor],
                         clusters: list[Group]) -> torch.Tensor:
    """Store the sampled clusters' ``trained`` models in ``cluster_models`` (one row per
    cluster, updated in place) and return the global model FedCLAR is evaluated with:
    Σ_g (n_g/n) x_g over every cluster (see the module docstring)."""
    for g, x in trained.items():
        cluster_models[g] = x
    n = torch.as_tensor([c.total_samples for c in clusters], dtype=torch.float64)
    return ((n / n.sum()) @ cluster_models.double()).to(cluster_models.dtype)
