"""The round strategies of the arm driver, one module per mode (:mod:`groupfel.emulator.driver`).

**Global mode** (Group-FEL Alg. 1): the cloud samples groups, each sampled group runs K group
rounds from the global model x_t, and the cloud aggregates their models into x_{t+1} with the
arm's aggregation rule (Line 15, Eq. 4 / Eq. 39) through the training algorithm's hooks. The
global model is evaluated on the held-out test set.

**Per-group mode** (cross-silo; HCCT Alg. 1, FedCollab's training stage): every group keeps its
own model and there is no cloud aggregation across groups. Each round every group (or the groups
an arm's ``sampling`` picks) runs K group rounds from its own model, through the same
:class:`~groupfel.emulator.federation.Federation` processes, so Eq. 5 is charged to the same ledger and
simulated time is the same model. Each client is evaluated on its own local test split with the
model of its group; a row reports the mean, std, min and max of the clients' local test error
(HCCT Table 5) and IPR and RSD (FedCollab Eqs. 11-12) against independent local training, which
the run trains once per seed and caches in the run directory (``local-reference-seed<seed>.pt``).

Membership follows the grouping policy's declared ``regroup`` kind
(:class:`groupfel.policies.GroupingPolicy`), never its name:

* ``"interval"``: the groups of :meth:`~groupfel.policies.GroupingPolicy.group`; global mode forms them
  again every ``regroup_every`` rounds (Sec. 5.2).
* ``"cluster"`` (FedCLAR): at the policy's ``cluster_round`` every client trains one probe epoch
  from its current model and each edge clusters the updates (:meth:`cluster`); every cluster then
  keeps and trains its own model (:mod:`groupfel.emulator.membership`).
* ``"every-round"`` (IFCA; per-group mode): ``n_clusters`` models per edge, each from its own
  initialisation (all from the initial model where the policy's ``init`` is ``"shared"``); before every round each client evaluates every model of its edge on its
  training data and joins the one :meth:`assign` picks (charged as a third of a training pass
  per model, :data:`FORWARD_FRACTION`).
* ``"merge"`` (HCCT Alg. 1; per-group mode): at t = 0 every client is its own group; at the
  start of every epoch t ≥ 1 :meth:`repartition` (Alg. 2) re-partitions the clients on their
  gradients (HCCT: from singletons, or merging the current groups with ``restart = "merge"``).
  Those gradients are the ones the clients uploaded while training (each
  client's last update, start − trained model, over the round's lr): Alg. 1 partitions at epoch
  t on g_i^t, which a client only has once it has trained, so we use its latest upload, the
  previous epoch's, and charge nothing (HCCT Sec. 5.1: the partition "does not incur any
  additional cost for clients"). A client with no upload yet (its group was not sampled, or it
  dropped out every time) runs a probe epoch from its current model instead, which *is* charged.
* ``"split"`` (CFL / FedCluster; per-group mode): before every round t ≥ 1, each group whose
  members all trained in round t − 1 gives their updates of that round (trained − start model,
  what they uploaded; nothing extra is charged) to :meth:`split`; each part keeps a copy of the
  group's model.
* ``"nearest"`` (FeSEM; per-group mode): ``n_clusters`` centre models per edge. Before round 0
  every client trains one charged probe epoch from the initial model, its first local model;
  :meth:`initial_centers` may seed the centres with some clients' probe models (else each centre
  has its own initialisation, as IFCA's). Before every round each client joins the centre
  :meth:`assign` picks from the L2 distances between its latest local model (its model after
  the last group round it trained in) and its edge's centres; training then makes each centre
  its members' average (the M-step). The distances are the edge server's work, not charged.

The work clients do for membership (probes, loss evaluations) is charged as training with group
and group_round −1.
"""
from .global_mode import GlobalRounds
from .per_group import PerGroupRounds

STRATEGIES = {"global": GlobalRounds, "per-group": PerGroupRounds}
