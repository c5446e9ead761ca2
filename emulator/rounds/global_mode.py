"""Global mode (Group-FEL Alg. 1): the cloud samples groups, each sampled group runs K group rounds
from the global model x_t, and the cloud aggregates their models into x_{t+1} with the arm's
aggregation rule (Line 15, Eq. 4 / Eq. 39) through the training algorithm's hooks. The global
model is evaluated on the held-out test set."""
from __future__ import annotations

import numpy as np
import torch

from groupfel.cost_models import TRAINING
from groupfel.errors import DivergenceError

from ..arm import (ArmPlan, RoundStrategy, aggregation_weights, budget_error, energy_budget_error, input_warnings,
                   new_federation, norm_growth, online_groups, sample_groups)
from ..compute import run_group_rounds
from ..federation import Federation, Group
from ..ledger import CostLedger
from ..membership import GroupingResult, charge_client_work, cluster_groups, clusters_global_model, form_groups
from ..world import World
from .common import ArmTraining, local_spec, start_round_state

# A global model whose norm grows this much in one round has diverged (Sec. 5.3).
DIVERGENCE_GROWTH = 100.0
# A model that learned and then lost it has collapsed (Sec. 5.3's unbiased aggregation can do this
# without a norm jump): over the last COLLAPSE_EVALS evaluations in a row, either the accuracy is
# back at chance (≤ 1/num_classes + CHANCE_MARGIN) after an earlier one reached 1/num_classes +
# LEARNED_MARGIN, or the test loss is ≥ LOSS_BLOWUP × the best earlier loss and worse than a
# uniform guess (ln num_classes). Several evaluations, so one noisy evaluation is not a collapse.
COLLAPSE_EVALS = 3
CHANCE_MARGIN = 0.05
LEARNED_MARGIN = 0.2
LOSS_BLOWUP = 3.0
class GlobalRounds(RoundStrategy):
    """Global mode: one model, aggregated by the cloud from the sampled groups."""

    mode = "global"

    @classmethod
    def check(cls, world: World, plan: ArmPlan, where: str) -> None:
        """Refuse a budget below the first round's exact cost, before anything runs. The first
        round is known before training when grouping needs none: group, sample and price it as
        the run will. (Where grouping trains, the driver makes the same check once the groups exist.)"""
        tc = world.config.train
        if tc.budget is None and tc.energy_budget is None or plan.grouping.needs_gradients \
                or plan.grouping.needs_distances:
            return
        grouping = form_groups(world, plan.grouping, 0)
        fed = new_federation(world, Federation.environment(), CostLedger())
        if fed.await_online(np.concatenate([g.clients for g in grouping.groups])) is not None:
            return      # nobody ever online: the run stops before its first round, saying so
        pool = online_groups(fed, grouping.groups)    # as the run samples: the groups online then
        _, _, chosen = sample_groups(world, plan, [grouping.groups[i] for i in pool], 0)
        groups = [grouping.groups[pool[g]] for g in chosen]
        first = fed.round_cost(0, groups) if tc.budget is not None else 0.0
        if tc.budget is not None and first > tc.budget:
            raise budget_error(tc.budget, first, f"arm {plan.arm.name!r}")
        joules = fed.round_energy(0, groups) if tc.energy_budget is not None else 0.0
        if tc.energy_budget is not None and joules > tc.energy_budget:
            raise energy_budget_error(tc.energy_budget, joules, f"arm {plan.arm.name!r}")

    def start(self, fresh: bool) -> None:
        world, plan, state = self.world, self.plan, self.state
        if fresh:
            state.weights = world.engine.initial_weights(world.config.seed)
        self.training = ArmTraining(world, state, fresh, state.weights)
        self.every = plan.arm.regroup_every
        self.cluster_round = plan.grouping.cluster_round if plan.regroup == "cluster" else None
        every, clar = self.every, self.cluster_round
        epoch = (state.t // every) * every if every else 0
        if state.grouping is not None and state.grouping_epoch == epoch:   # a resume: the grouping in use
            grouping = GroupingResult.from_summary(world, state.grouping)
        elif clar is not None and state.t > clar:                            # a resume past it: its clusters
            epoch = clar
            grouping = GroupingResult(cluster_groups(world, plan.grouping, None, clar, self.arm_dir)[0], 0, 0)
        else:
            grouping = form_groups(world, plan.grouping, epoch, state.weights)
            state.grouping, state.grouping_epoch = grouping.summary(), epoch
        self._use(grouping)
        self.epoch, self.ran, self.present = epoch, [], 0
        n_groups0 = state.initial_grouping["n_groups"] if state.initial_grouping else len(grouping.groups)
        state.warnings = input_warnings(world, plan, n_groups0)
        if fresh:   # results' round 0: the initial model, before anything is charged
            state.initial_grouping = grouping.summary()
            self.evaluate()
        if epoch == state.t:        # a fresh start, or a resume just before a regrouping
            charge_client_work(state.ledger, self.env, world.topology, state.t, grouping.probe)

    def _use(self, grouping: GroupingResult) -> None:
        self.grouping = grouping
        self.n_total = float(sum(g.total_samples for g in grouping.groups))

    def before_round(self, t: int) -> None:
        every, state = self.every, self.state
        if not ((every and t > 0 and t % every == 0 and t != self.epoch) or t == self.cluster_round):
            return
        self.epoch = t
        world, policy = self.world, self.plan.grouping
        if t == self.cluster_round:
            groups, work, starts = cluster_groups(world, policy, state.weights, t, self.arm_dir)
            grouping = GroupingResult(groups, 0, 0, work)
            # every cluster starts from x_t, or from its members' mean probed model
            state.cluster_models = state.weights.repeat(len(groups), 1) if starts is None else starts
        else:
            grouping = form_groups(world, policy, t, state.weights)       # Sec. 5.2
        state.grouping, state.grouping_epoch = grouping.summary(), t
        charge_client_work(state.ledger, self.env, world.topology, t, grouping.probe)
        self._use(grouping)

    def members(self) -> np.ndarray:
        return np.concatenate([g.clients for g in self.grouping.groups])

    def select(self, t: int) -> list[Group]:
        groups = self.grouping.groups
        pool = online_groups(self.fed, groups)       # availability: only groups with a member online now
        everyone = len(pool) == len(groups)
        S, self.log_p, self.picked = sample_groups(self.world, self.plan, groups if everyone else
                                                   [groups[i] for i in pool], t)
        self.chosen = self.picked if everyone else pool[self.picked]
        self.pool_total = self.n_total if everyone else float(sum(groups[i].total_samples for i in pool))
        self.state.groups_per_round = self.S = S
        return [groups[g] for g in self.chosen]

    def train(self, t: int) -> None:
        from groupfel.policies import inclusion_log_probabilities

        world, plan, state, chosen = self.world, self.plan, self.state, self.chosen
        groups = self.grouping.groups
        log_pi = inclusion_log_probabilities(self.log_p, self.S)
        weights = aggregation_weights(plan, np.array([groups[g].total_samples for g in chosen]),
                                      log_pi[self.picked], self.pool_total)
        sampled = {int(g): groups[g] for g in chosen}
        members = np.concatenate([g.clients for g in sampled.values()])
        algorithm, alg_state = self.training.algorithm, self.training.state
        scratch = algorithm.begin_round(alg_state, list(sampled), members)
        clustered = state.cluster_models is not None   # after a "cluster" regroup: each cluster its own model
        starts = {g: state.cluster_models[g] if clustered else state.weights for g in sampled}
        offline = self.fed.offline(t, list(sampled.items()))   # availability: the round's clock decides
        self.present = len(members) - len(self.fed.absent(t))
        start_round_state(world, state, t)
        models = run_group_rounds(world.engine, starts, sampled, t, local_spec(world, t, offline), algorithm, alg_state,
                                  scratch, state.momentum)                         # compute, then time:
        self.fed.run_round(t, list(sampled.items()))
        self.training.charge_scoring(state.ledger, self.env, t)
        x = algorithm.aggregate_cloud(alg_state, scratch, weights, [models[int(g)] for g in chosen], members,
                                      world.topology.n_samples)               # Line 15 / Eq. 4 / Eq. 39
        if clustered:
            x = clusters_global_model(state.cluster_models, models, groups)
        self.training.save(state)
        growth = float(torch.linalg.vector_norm(x) / torch.linalg.vector_norm(state.weights))
        if not (np.isfinite(growth) and growth < DIVERGENCE_GROWTH):
            raise DivergenceError(
                f"round {t + 1}: the global model's norm {norm_growth(growth)} in one round under "
                f"{plan.aggregation.name} aggregation with {plan.sampling.name} sampling (largest weight "
                f"{weights.max():.3g}, sum {weights.sum():.3g}); use aggregation = \"stabilized\" (Eq. 39), a "
                f"flatter sampling policy, or a lower train.lr")
        state.weights, self.ran = x, chosen

    def evaluate(self, final: bool = False) -> float:
        world, plan, state = self.world, self.plan, self.state
        sampled = self.ran if state.t > 0 else []
        acc, loss = world.engine.evaluate(state.weights)
        if not np.isfinite(loss):
            raise DivergenceError(f"round {state.t}: test loss is {loss} under {plan.aggregation.name} aggregation "
                                  f"with {plan.sampling.name} sampling; lower train.lr or use aggregation = "
                                  f"\"stabilized\"")
        led, groups = state.ledger, self.grouping.groups
        training = led.by_component.get(TRAINING, 0.0)
        state.rows.append({
            "arm": plan.arm.name, "seed": world.config.seed,
            "round": state.t, "cost": led.total, "training_cost": training,
            "overhead_cost": led.total - training, **led.energy_row(),
            "sim_time_s": state.sim_time,
            "round_time_s": state.round_time, "accuracy": acc, "loss": loss,
            "groups_sampled": len(sampled),
            "clients_sampled": self.present if len(sampled) else 0,   # online at the round's start
            "avg_sampled_cov": float(np.mean([groups[g].cov for g in sampled])) if len(sampled) else np.nan})
        collapse = collapsed(state.rows, world.dataset.num_classes)
        if collapse:
            raise DivergenceError(
                f"round {state.t}: the model collapsed: {collapse}, under {plan.aggregation.name} aggregation with "
                f"{plan.sampling.name} sampling of {plan.grouping.name} groups; use aggregation = \"stabilized\" "
                f"(Eq. 39) or \"biased\", a flatter sampling policy, or a lower train.lr")
        return acc

    def manifest(self) -> dict:
        plan, state, every = self.plan, self.state, self.every
        return {"aggregation": plan.aggregation.description, "grouping_policy": plan.grouping.name,
                "sampling_policy": plan.sampling.name, "groups_per_round": state.groups_per_round,
                "warnings": state.warnings, "grouping": state.initial_grouping,
                "regroupings": (state.t - 1) // every if every and state.t else 0}


def collapsed(rows: list[dict], num_classes: int) -> str | None:
    """What collapsed, if the last ``COLLAPSE_EVALS`` evaluations show a collapse (see the constants)."""
    if len(rows) <= COLLAPSE_EVALS:
        return None
    before, recent = rows[:-COLLAPSE_EVALS], rows[-COLLAPSE_EVALS:]
    chance = 1.0 / num_classes
    best_acc = max(r["accuracy"] for r in before)
    if best_acc >= chance + LEARNED_MARGIN and all(r["accuracy"] <= chance + CHANCE_MARGIN for r in recent):
        accs = ", ".join(f"{r['accuracy']:.3f}" for r in recent)
        return (f"accuracy {accs} in the last {COLLAPSE_EVALS} "
                f"evaluations is back at chance ({chance:.3f}) after reaching {best_acc:.3f}")
    best_loss = min(r["loss"] for r in before)
    floor = max(LOSS_BLOWUP * best_loss, float(np.log(num_classes)))
    if all(r["loss"] >= floor for r in recent):
        losses = ", ".join(f"{r['loss']:.3g}" for r in recent)
        return (f"test loss {losses} in the last {COLLAPSE_EVALS} "
                f"evaluations is over {LOSS_BLOWUP:g}x its best ({best_loss:.3g}) and worse than a uniform guess")
    return None
