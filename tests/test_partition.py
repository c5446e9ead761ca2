"""Data scenarios: sample counts, label shares, rotations, permutations, local splits, determinism."""
import numpy as np
import pytest

from groupfel.emulator.config import parse_config
from groupfel.errors import InputError
from groupfel.emulator.world import place_data
from groupfel.topologies import load_dataset
from groupfel.topologies.partition import (apply_client_types, client_sizes, dirichlet_partition, fedcollab_types,
                                  rotate_images, shards_partition, split_local, weighted_partition)

LABELS = np.repeat(np.arange(10), 300)


def test_size_distributions_stay_in_range_and_are_deterministic():
    for kind in ("normal", "uniform", "half-normal"):
        a = client_sizes(4000, 20, 200, 110, 45, np.random.default_rng(1), kind)
        assert a.min() >= 20 and a.max() <= 200
        assert np.array_equal(a, client_sizes(4000, 20, 200, 110, 45, np.random.default_rng(1), kind))
    uniform = client_sizes(4000, 20, 200, 0, 0, np.random.default_rng(1), "uniform")
    assert set(np.unique(uniform)) == set(range(20, 201))          # randint(20, 201): both ends reachable
    half = client_sizes(20000, 1, 10**6, 120, 0, np.random.default_rng(1), "half-normal")
    assert half.mean() == pytest.approx(120, rel=0.03)               # H(1) scaled to its mean
    assert np.median(half) == pytest.approx(120 * 0.6745 / np.sqrt(2 / np.pi), rel=0.05)


def test_dirichlet_floor_counts_follow_the_authors_code():
    sizes = np.array([50, 120, 7])
    exact = dirichlet_partition(LABELS, sizes, 0.5, 10, np.random.default_rng(4))
    floored = dirichlet_partition(LABELS, sizes, 0.5, 10, np.random.default_rng(4), floor=True)
    assert [len(p) for p in exact] == [50, 120, 7]
    q = np.random.default_rng(4)
    [q.permutation(np.flatnonzero(LABELS == c)) for c in range(10)]            # the pools, as drawn inside
    for p, n in zip(floored, sizes):
        expected = np.floor(q.dirichlet(np.full(10, 0.5)) * n).astype(int)
        assert np.bincount(LABELS[p], minlength=10).tolist() == expected.tolist() and 1 <= len(p) <= n
    allidx = np.concatenate(floored)
    assert len(np.unique(allidx)) == len(allidx)


def test_shards_give_single_label_blocks_of_equal_size():
    sizes = np.array([100, 250, 75, 575])
    parts = shards_partition(LABELS, sizes, 20, 10, np.random.default_rng(0))
    shard = 1000 // 20
    per_client = [len(p) // shard for p in parts]
    assert sum(per_client) == 20 and min(per_client) >= 1
    assert per_client == [3, 5, 2, 10]   # 1 + share of the 16 left (2.6, 5, 2.2, 10.2), largest remainder
    allidx = np.concatenate(parts)
    assert len(np.unique(allidx)) == len(allidx)  # no sample twice
    for p in parts:
        counts = np.bincount(LABELS[p], minlength=10)
        assert np.all(counts % shard == 0)        # whole single-label shards
    assert np.bincount(LABELS[allidx], minlength=10).tolist() == [100] * 10   # classes dealt evenly
    again = shards_partition(LABELS, sizes, 20, 10, np.random.default_rng(0))
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))


def test_weighted_partition_gives_exact_label_counts():
    w = np.array([[3, 1, 0, 0, 0, 0, 0, 0, 0, 0], [1] * 10], dtype=float)
    parts = weighted_partition(LABELS, np.array([40, 25]), w, 10, np.random.default_rng(0))
    assert np.bincount(LABELS[parts[0]], minlength=10).tolist() == [30, 10] + [0] * 8
    assert np.bincount(LABELS[parts[1]], minlength=10).tolist() == [3] * 5 + [2] * 5   # largest remainder
    assert not set(parts[0]) & set(parts[1])
    with pytest.raises(InputError, match="class 0"):
        weighted_partition(LABELS, np.array([500]), w[:1], 10, np.random.default_rng(0))


def test_fedcollab_default_types():
    lab = fedcollab_types("label-shift", 20, 10, 1000, 100)
    assert [t["clients"] for t in lab] == [5] * 4 and [t["samples"] for t in lab] == [1000, 1000, 100, 100]
    w = np.array([t["label_weights"] for t in lab])
    assert (w[:2, 5:] == 0).all() and (w[2:, :5] == 0).all()       # types 0-1 and 2-3 share no label
    assert w[0, 0] == w[1, 4] == 3 and w[0, 4] == w[1, 0] == 1
    assert [t["rotation"] for t in fedcollab_types("feature-shift", 20, 10, 1, 1)] == [25, -25, 155, -155]
    perms = [np.array(t["permutation"]) for t in fedcollab_types("concept-shift", 20, 10, 1, 1)]
    aligned = [[int((p == q).sum()) for q in perms] for p in perms]
    assert aligned == [[10, 7, 0, 0], [7, 10, 0, 0], [0, 0, 10, 7], [0, 0, 7, 10]]   # FedCollab Fig. 4's levels


def test_rotations_and_permutations_apply_per_client_type():
    rng = np.random.default_rng(0)
    x = rng.random((6, 1, 5, 5)).astype(np.float32)
    y = np.array([0, 1, 2, 0, 1, 2])
    types = [{"rotation": 90.0}, {"permutation": [2, 0, 1]}, {"rotation": 0.0}]
    parts = [[np.array([0, 1]), np.array([2, 3]), np.array([4])], [np.array([5]), np.array([]), np.array([])]]
    client_type = np.array([0, 1, 2])
    x2, y2, (train, test) = apply_client_types(x, y, [[p.astype(int) for p in q] for q in parts], client_type, types)
    assert np.allclose(x2[train[0]], np.rot90(x[[0, 1]], 1, axes=(-2, -1)), atol=1e-6)   # counter-clockwise
    assert np.allclose(x2[test[0]], np.rot90(x[[5]], 1, axes=(-2, -1)), atol=1e-6)
    assert y2[train[1]].tolist() == [1, 2] and np.array_equal(x2[train[1]], x[[2, 3]])  # labels 2, 0 -> 1, 2
    assert train[2].tolist() == [4]                  # an identity type keeps the original sample
    assert np.array_equal(x2[:6], x) and np.array_equal(y2[:6], y)
    assert np.allclose(rotate_images(x, 360.0), x, atol=1e-5)


def test_local_splits_are_disjoint_from_training_data():
    parts = [np.arange(0, 50), np.arange(50, 53), np.arange(53, 55)]
    train, test = split_local(parts, 0.2, np.random.default_rng(0))
    assert [len(t) for t in test] == [10, 1, 1] and [len(t) for t in train] == [40, 2, 1]
    for p, a, b in zip(parts, train, test):
        assert not set(a) & set(b) and sorted(np.concatenate([a, b])) == sorted(p)
    assert [len(t) for t in split_local(parts, 0.0, np.random.default_rng(0))[1]] == [0, 0, 0]


def _config(tiny_dict, **data):
    tiny_dict["mode"] = "per-group"
    tiny_dict["topology"] = {"edges": 2, "clients_per_edge": 4}
    tiny_dict["data"].update(data)
    return parse_config(tiny_dict)


@pytest.mark.parametrize("partition", ["dirichlet", "shards", "label-shift", "feature-shift", "concept-shift"])
def test_every_scenario_places_disjoint_train_and_test_data_deterministically(tiny_dict, partition):
    extra = {"n_shards": 16} if partition == "shards" else {}
    cfg = _config(tiny_dict, partition=partition, min_samples=20, max_samples=40, test_fraction=0.25, **extra)
    data = load_dataset("digits")
    a, b = place_data(cfg, data), place_data(cfg, data)
    topo = a.topology
    for i in range(topo.n_clients):
        tr, te = topo.client_samples[i], a.local_test[i]
        assert len(te) == round(0.25 * (len(tr) + len(te))) and not set(tr) & set(te)
        assert np.array_equal(tr, b.topology.client_samples[i]) and np.array_equal(te, b.local_test[i])
    everything = np.concatenate(topo.client_samples + a.local_test)
    assert len(np.unique(everything)) == len(everything)           # no sample held twice
    assert np.array_equal(topo.label_counts, b.topology.label_counts)
    assert np.array_equal(a.dataset.x_train, b.dataset.x_train)
    if partition in ("label-shift", "feature-shift", "concept-shift"):
        assert a.client_type.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
        assert topo.n_samples.tolist()[:4] == [30] * 4 and topo.n_samples.tolist()[4:] == [15] * 4  # large, small
    if partition == "label-shift":
        assert (topo.label_counts[:4, 5:] == 0).all() and (topo.label_counts[4:, :5] == 0).all()
    if partition == "concept-shift":   # type 2's clients hold label c+5 where the image shows c
        data_y = data.y_train
        for i in (4, 5):
            idx = topo.client_samples[i]
            originals = [np.flatnonzero((data.x_train == a.dataset.x_train[j]).all(axis=(1, 2, 3)))[0] for j in idx]
            assert a.dataset.y_train[idx].tolist() == [(data_y[o] + 5) % 10 for o in originals]


def test_types_must_match_the_topology_and_classes(tiny_dict):
    data = load_dataset("digits")
    cfg = _config(tiny_dict, partition="feature-shift", types=[{"clients": 3, "rotation": 10.0}])
    with pytest.raises(InputError, match="data.types: the types have 3 clients but the topology has 8"):
        place_data(cfg, data)
    cfg = _config(tiny_dict, partition="concept-shift", types=[{"clients": 8, "permutation": [0, 1]}])
    with pytest.raises(InputError, match=r"data.types\[0\].permutation: must list each label 0..9"):
        place_data(cfg, data)


def test_test_samples_holds_out_the_same_count_on_every_client(tiny_dict):
    """FedCollab Table 4: 350 local test samples on large and small clients alike."""
    cfg = _config(tiny_dict, partition="label-shift", min_samples=12, max_samples=40, test_samples=9)
    placed = place_data(cfg, load_dataset("digits"))
    assert [len(t) for t in placed.local_test] == [9] * 8
    assert placed.topology.n_samples.tolist() == [31] * 4 + [3] * 4          # large 40 - 9, small 12 - 9
    with pytest.raises(InputError, match=r"^data\.test_samples = 12: a client holds only 12"):
        place_data(_config(tiny_dict, partition="label-shift", min_samples=12, max_samples=40, test_samples=12),
                   load_dataset("digits"))
    with pytest.raises(ValueError, match="test_samples or test_fraction, not both"):
        _config(tiny_dict, test_samples=5, test_fraction=0.2)


def test_authors_label_shift_deals_fedcollab_table_4():
    """The FedCollab authors' cluster4_0.25 with the stratified subsample clusterexp_2_5.0 and a
    1/7 holdout, on 7,000 samples a label (Fashion-MNIST's training and test sets together):
    large clients train on 300 + 3 × 600, small on 2 + 3 × 4, every client tests on 350 of its
    own labels, and no sample is dealt twice."""
    from groupfel.topologies.partition import authors_label_shift

    labels = np.repeat(np.arange(10), 7000)
    train, test = authors_label_shift(labels, 20, 10, 0.25, 5.0, 1 / 7, np.random.default_rng(0))
    counts = np.stack([np.bincount(labels[p], minlength=10) for p in train])
    assert counts[0].tolist() == [300, 600, 600, 600, 0, 0, 0, 0, 0, 0]
    assert counts[5].tolist() == [0, 600, 600, 600, 300, 0, 0, 0, 0, 0]
    assert counts[10].tolist() == [0, 0, 0, 0, 0, 2, 4, 4, 4, 0]
    assert counts[19].tolist() == [0, 0, 0, 0, 0, 0, 4, 4, 4, 2]
    assert (counts[:5] == counts[0]).all() and (counts[15:] == counts[19]).all()
    assert [len(t) for t in test] == [350] * 20
    assert np.bincount(labels[test[12]], minlength=10).tolist() == [0, 0, 0, 0, 0, 50, 100, 100, 100, 0]
    dealt = np.concatenate(train + test)
    assert len(np.unique(dealt)) == len(dealt)
    with pytest.raises(InputError, match="multiple of 4"):
        authors_label_shift(labels, 18, 10, 0.25, 5.0, 1 / 7, np.random.default_rng(0))


def test_authors_label_shift_in_a_world_and_the_settings_it_sets_itself(tiny_dict):
    from groupfel.emulator.config.parse import check_modes

    tiny_dict["mode"] = "per-group"
    tiny_dict["topology"] = {"edges": 1, "clients_per_edge": 8}
    tiny_dict["data"] = {"dataset": "digits", "partition": "label-shift", "label_shift_deal": "authors",
                         "subsample_decay": 1.0}
    data = {k: v for k, v in tiny_dict.items() if k != "arms"} | {"arms": [{"name": "a", "grouping": {"policy": "local"}}]}
    placed = place_data(check_modes(data, parse_config(data)), load_dataset("digits"))
    d = load_dataset("digits")
    assert len(placed.dataset.y_train) == len(d.y_train) + len(d.y_test)   # training and test sets dealt together
    sizes = placed.topology.n_samples
    assert (sizes[:4] > sizes[4:]).all() and (placed.topology.label_counts[:4, 5:] == 0).all()
    for train, test in zip(placed.topology.client_samples, placed.local_test):
        assert not set(train) & set(test)
    for key, value in (("min_samples", 30), ("test_samples", 10)):
        bad = {**data, "data": {**data["data"], key: value}}
        with pytest.raises(InputError, match=f"data.{key}: only used with data.label_shift_deal"):
            check_modes(bad, parse_config(bad))
    with pytest.raises(InputError, match="data.cluster_k: only used with"):
        bad = {**data, "data": {"dataset": "digits", "partition": "label-shift", "cluster_k": 0.5}}
        check_modes(bad, parse_config(bad))
