"""HCCT-P when HCCT re-forms its groups (Alg. 1 line 15): a new group starts from the mean of
what its members bring. ``regroup = "group"`` (default): their old groups' models;
``regroup = "own"`` (the HCCT authors' main_cluster.py with personalize = 1, whose w_locals hold
the group's model with the member's own last layer): their own classifiers."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from groupfel.emulator.algorithms import algorithms
from groupfel.emulator.rounds.per_group import PerGroupRounds
from groupfel.emulator.world import build_world

from test_baselines_hcct import _bound, _pergroup


class _Fixed:
    """A grouping whose Alg. 2 returns a fixed partition of the edge's clients."""

    def __init__(self, parts):
        self.parts = parts

    def repartition(self, view, current):
        return [np.array(p) for p in self.parts]


def _merged(tiny_dict, regroup):
    world = build_world(_pergroup(tiny_dict, "fedper", {"swap": "evaluate", "regroup": regroup},
                                  {"policy": "hcct", "alpha": 1.0}))
    training, x0 = _bound(world)
    gen = torch.Generator().manual_seed(0)
    old = torch.randn(2, x0.numel(), generator=gen)                 # two old groups: {0, 1, 2}, {3, 4, 5}
    own = training.state.clients["own"]
    own.copy_(torch.randn(own.shape, generator=gen))                 # each client's own classifier
    n = world.topology.n_clients
    state = SimpleNamespace(models=old.clone(), model_edge=[0, 0], assign=np.array([0, 0, 0, 1, 1, 1]),
                            gradients=torch.zeros(n, x0.numel()), uploaded=np.ones(n, dtype=bool),
                            policy_memo={}, ledger=None)
    host = SimpleNamespace(world=world, state=state, training=training, env=SimpleNamespace(now=0.0),
                           plan=SimpleNamespace(grouping=_Fixed([[0, 3], [1, 2], [4, 5]])))
    PerGroupRounds._merge(host, 1)
    return world, training, old, own, state


@pytest.mark.parametrize("regroup", ["group", "own"])
def test_a_reformed_group_starts_from_what_its_members_bring(tiny_dict, regroup):
    world, training, old, own, state = _merged(tiny_dict, regroup)
    head = training.algorithm.head
    sizes = world.topology.n_samples
    assert state.assign.tolist() == [0, 1, 1, 0, 2, 2]
    for g, members in enumerate([[0, 3], [1, 2], [4, 5]]):
        w = torch.as_tensor(sizes[members] / sizes[members].sum(), dtype=old.dtype)
        body = w @ old[[0 if c < 3 else 1 for c in members]]
        want = body.clone()
        if regroup == "own":   # the members' own classifiers, each weighted by its samples
            want[head] = w @ own[members][:, head]
        elif len({c < 3 for c in members}) == 1:   # one old group: its model as it was
            want = old[0 if members[0] < 3 else 1]
        torch.testing.assert_close(state.models[g], want)


def test_own_differs_from_group_only_in_the_classifier(tiny_dict):
    _, training, _, _, a = _merged(tiny_dict, "group")
    _, _, _, _, b = _merged(tiny_dict, "own")
    head = training.algorithm.head
    torch.testing.assert_close(a.models[:, :head.start], b.models[:, :head.start])
    assert not torch.allclose(a.models[:, head], b.models[:, head])


def test_bad_regroup_is_refused():
    with pytest.raises(ValueError, match="regroup must be one of group, own"):
        algorithms.make("fedper", {"regroup": "mine"})
