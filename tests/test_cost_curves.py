"""Curve forms and the hand-written profile formats (CSV with comments, TOML)."""
import warnings

import numpy as np
import pytest

from groupfel.cost_models import (CostModel, ExtrapolationWarning, MeasuredCurve, PiecewiseLinear, Polynomial, get_curve,
                         read_profiles)
from groupfel.errors import InputError


def test_piecewise_interpolates_and_extends_end_segments():
    f = PiecewiseLinear([2, 4, 8], [1.0, 2.0, 6.0])
    np.testing.assert_allclose(f([2, 3, 6, 8]), [1.0, 1.5, 4.0, 6.0])
    np.testing.assert_allclose(f([10, 0]), [8.0, 0.0])


def test_measured_curve_warns_only_far_outside():
    fit = Polynomial((1.0, 0.0, 0.0))
    f = MeasuredCurve([2, 4, 6], [4.0, 16.0, 36.0], fit)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert f(3) == pytest.approx(10.0)      # interpolated
        assert f(7) == pytest.approx(49.0)      # near: fitted, silent
    with pytest.warns(ExtrapolationWarning, match="far outside"):
        assert f(20) == pytest.approx(400.0)


def test_csv_with_comment_lines(tmp_path):
    p = tmp_path / "p.csv"
    p.write_text("# measured on my laptop\ndevice,task,operation,method,a,b,c\n"
                 "laptop,t,group_overhead,secagg,1,2,3\n# trailing note\nlaptop,t,training,sgd,0.5,1,\n")
    prof = read_profiles(p)["laptop/t"]
    assert prof.group_overhead["secagg"](2) == pytest.approx(4 + 4 + 3)
    assert prof.training["sgd"](10) == pytest.approx(6.0)


def test_toml_profile_all_forms(tmp_path):
    p = tmp_path / "p.toml"
    p.write_text("""
[[curves]]
device = "phone"
task = "t"
operation = "group_overhead"
method = "secagg"
units = "ms"
coefficients = [10, 0, 500]

[[curves]]
device = "phone"
task = "t"
operation = "group_overhead"
method = "backdoor"
points = [[2, 1.0], [4, 2.0], [8, 6.0]]

[[curves]]
device = "phone"
task = "t"
operation = "training"
method = "sgd"
points = [[10, 1.0], [20, 2.0], [40, 4.0]]
extrapolate = "linear"
""")
    prof = read_profiles(p)["phone/t"]
    assert prof.group_overhead["secagg"](10) == pytest.approx(1.5)
    assert prof.group_overhead["backdoor"](6) == pytest.approx(4.0)
    assert prof.training["sgd"](30) == pytest.approx(3.0)
    with pytest.warns(ExtrapolationWarning):
        assert prof.training["sgd"](1000) == pytest.approx(100.0)
    cm = CostModel({"phone": prof}, "sgd", ("secagg", "backdoor"))
    charges = cm.group_round(["phone", "phone"], np.array([10, 20]), 2)
    np.testing.assert_allclose(charges["training"], [2.0, 4.0])


@pytest.mark.parametrize("body, match", [
    ('[[curves]]\ndevice="d"\ntask="t"\noperation="training"\nmethod="sgd"\n', "exactly one of coefficients"),
    ('[[curves]]\ndevice="d"\ntask="t"\noperation="training"\nmethod="sgd"\ncoefficients=[1,2]\ncolour=1\n',
     "colour: unknown key"),
    ('[[curves]]\ndevice="d"\ntask="t"\noperation="train"\nmethod="sgd"\ncoefficients=[1,2]\n', "operation"),
    ('[[curves]]\ndevice="d"\ntask="t"\noperation="training"\nmethod="sgd"\npoints=[[1,2],[1,3]]\n', "distinct"),
    ('device = "d"\n', "expected only"),
])
def test_toml_profile_errors_are_one_line(tmp_path, body, match):
    p = tmp_path / "bad.toml"
    p.write_text(body)
    with pytest.raises(InputError, match=match) as exc:
        read_profiles(p)
    assert "\n" not in str(exc.value)


def test_get_curve_addresses_device_task_method():
    prof, kind, curve = get_curve("raspberry-pi-4/cifar10-resnet/secagg")
    assert kind == "group_overhead" and curve(10) == pytest.approx(0.01629675 * 100 - 0.2373668 + 0.55442565)
    with pytest.raises(InputError, match="no curve"):
        get_curve("raspberry-pi-4/cifar10-resnet/nope")
