"""Eq. 5's cost model of a run, built without torch: from the config, and the training curve and
group operations that the training algorithm declares or that a finished arm's manifest records
(what the report and the tracker read)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from groupfel.cost_models import CostModel, get_profile, read_profiles

from .config import RunConfig

if TYPE_CHECKING:
    from .algorithms import Algorithm


def build_cost_model(config: RunConfig, algorithm: Algorithm | None = None,
                     declared: dict | None = None) -> CostModel:
    """Eq. 5's cost model: the devices' curves, with the training curve and group operations the
    config names, else the ones the training algorithm declares. ``declared`` is an arm's
    manifest's ``cost_model`` (the curve and operations its run resolved), read instead of the
    algorithm, which the report would have to import with torch."""
    c = config.cost
    extra = read_profiles(c.profiles_file) if c.profiles_file else None
    profiles = {dev: get_profile(f"{dev}/{c.task}", extra) for dev in config.topology.devices}
    if declared is not None:
        return CostModel(profiles, declared["training"], tuple(declared["operations"]),
                         config.faults.recovery_multiple)
    if algorithm is None:   # a shipped algorithm's declarations; never import a plug-in here (the report)
        from .algorithms import FedAvg, algorithms, make_algorithm

        t = config.train
        algorithm = make_algorithm(t.algorithm, t.algorithm_params, t.mu) if t.algorithm in algorithms else FedAvg()
    training = c.training
    if training is None:   # the algorithm's own curve where every profile measured one
        curve = algorithm.training_curve
        training = curve if all(curve in p.training for p in profiles.values()) else "sgd"
    operations = c.group_operations
    if operations is None:
        operations = list(algorithm.group_operations)
    return CostModel(profiles, training, tuple(operations), config.faults.recovery_multiple)


def cost_record(cost: CostModel) -> dict:
    """What an arm's manifest records of its cost model (``cost_model``), for ``declared``."""
    return {"training": cost.training_method, "operations": list(cost.operations)}
