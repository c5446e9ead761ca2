"""Data per client as the HCCT authors' code deals it: the CIFAR-10 shards of utils/sampling.py
(``imbalanced``) and the Digit clients tested on their domain's whole test set
(utils/digit_utils.py, ``prepare_digit_data``)."""
import copy

import numpy as np
import pytest

from groupfel.emulator.config import check_modes, parse_config
from groupfel.emulator.world import place_data
from groupfel.errors import InputError
from groupfel.topologies import load_dataset
from groupfel.topologies.partition import authors_shards_partition

LABELS = np.repeat(np.arange(10), 300)[np.random.default_rng(7).permutation(3000)]


def test_authors_shards_deal_the_whole_set_in_label_sorted_shards():
    parts = authors_shards_partition(LABELS, 10, 100, None, np.random.default_rng(3))
    held = np.concatenate(parts)
    assert len(np.unique(held)) == len(held)                          # no sample twice
    sizes = np.array([len(p) for p in parts])
    assert (sizes % 30 == 0).all() and sizes.min() >= 30              # whole shards of 3000 / 100, at least one
    # floor(h_i / Σh · 100) shards, at least one: what rng draws first, as the authors' halfnorm.rvs
    h = np.abs(np.random.default_rng(3).standard_normal(10))
    assert (sizes // 30).tolist() == np.maximum(np.floor(h / h.sum() * 100), 1).astype(int).tolist()
    assert 90 <= sizes.sum() // 30 <= 100                            # nearly every sample dealt
    for p in parts:   # a shard of label-sorted samples: one label each (300 a label = 10 whole shards)
        shards = np.sort(LABELS[p]).reshape(-1, 30)
        assert (shards == shards[:, :1]).all()


def test_shard_samples_cuts_shards_from_the_first_samples_only():
    parts = authors_shards_partition(LABELS, 10, 100, 20, np.random.default_rng(3))
    held = np.concatenate(parts)
    assert held.max() < 2000 and all(len(p) % 20 == 0 for p in parts)
    with pytest.raises(InputError, match=r"^data\.shard_samples: 100 shards of 40 samples need 4000"):
        authors_shards_partition(LABELS, 10, 100, 40, np.random.default_rng(3))
    with pytest.raises(InputError, match=r"^data\.n_shards: 5 shards cannot give each of the 10 clients"):
        authors_shards_partition(LABELS, 10, 5, None, np.random.default_rng(3))


def _config(tiny_dict, **data):
    tiny_dict["mode"] = "per-group"
    tiny_dict["topology"] = {"edges": 1, "clients_per_edge": 4}
    tiny_dict["data"].update(data)
    return check_modes(tiny_dict, parse_config(tiny_dict))


def test_the_train_ratio_is_taken_over_the_authors_share(tiny_dict):
    data = load_dataset("digits")
    base = copy.deepcopy(tiny_dict)
    cfg = _config(tiny_dict, partition="shards", shards_deal="authors", sizes="half-normal", n_shards=20,
                  test_fraction=0.8)
    placed = place_data(cfg, data)
    held = [len(a) + len(b) for a, b in zip(placed.topology.client_samples, placed.local_test)]
    assert sum(held) >= 0.75 * len(data.y_train)                      # the whole set, not Table 3's mean
    for n, test in zip(held, placed.local_test):
        assert len(test) == round(0.8 * n)
    default = place_data(_config(base, partition="shards", n_shards=20, test_fraction=0.8), data)
    assert sum(len(a) + len(b) for a, b in zip(default.topology.client_samples, default.local_test)) < sum(held)


def test_bad_authors_options_are_one_line_errors(tiny_dict):
    base = copy.deepcopy(tiny_dict)
    with pytest.raises(ValueError, match="shards_deal: \"authors\" deals half-normal shares"):
        _config(copy.deepcopy(base), partition="shards", shards_deal="authors")
    with pytest.raises(InputError, match=r"data\.shard_samples: only used with data\.shards_deal = \"authors\""):
        _config(copy.deepcopy(base), partition="shards", shard_samples=500)
    with pytest.raises(InputError, match=r"data\.shards_deal: only used with data\.partition = \"shards\""):
        _config(copy.deepcopy(base), shards_deal="authors", sizes="half-normal")
    with pytest.raises(ValueError, match="local_test: \"domain\" needs client types with a domain"):
        _config(copy.deepcopy(base), local_test="domain")
    with pytest.raises(ValueError, match="remove test_fraction and test_samples"):
        _config(copy.deepcopy(base), partition="feature-shift", local_test="domain", test_fraction=0.2,
                types=[{"clients": 4, "domain": 0}])
    with pytest.raises(ValueError, match="shards_deal"):
        _config(copy.deepcopy(base), partition="shards", shards_deal="theirs")


def test_domain_local_test_is_the_domains_whole_test_set(tiny_dict):
    domains = load_dataset("digit-domains")
    cfg = _config(tiny_dict, dataset="digit-domains", partition="feature-shift", local_test="domain",
                  types=[{"clients": 2, "domain": "sklearn", "samples": 185},
                         {"clients": 2, "domain": "mnist", "samples": 185}])
    placed = place_data(cfg, domains)
    assert placed.topology.n_samples.tolist() == [185] * 4               # every sample trains: no split
    for i, k in enumerate([0, 0, 1, 1]):
        test = placed.local_test[i]
        assert len(test) == int((domains.domain_test == k).sum())       # the domain's whole test set
        x = placed.dataset.x_train[test]
        assert np.array_equal(x, domains.x_test[domains.domain_test == k])
        assert np.array_equal(placed.dataset.y_train[test], domains.y_test[domains.domain_test == k])
        assert set(placed.dataset.domain_train[placed.topology.client_samples[i]].tolist()) == {k}
    assert np.array_equal(placed.local_test[0], placed.local_test[1])   # one set, shared by the domain's clients
