"""A user's profile with a shipped profile's name replaces only the curves it has (layering)."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from conftest import one_arm

from groupfel.cost_models import get_profile, read_profiles, shipped_profiles
from groupfel.emulator.config import parse_config
from groupfel.errors import InputError
from groupfel.emulator.world import build_world
from groupfel.experiments.cli import main
from groupfel.experiments.runner import run_experiment

# secagg seconds = 0.1·s² + 0.2·s + 0.3 exactly, measured on "the user's" Raspberry Pi 4
MEASURED = "operation,group_size,seconds,device\n" + "".join(
    f"secagg,{s},{0.1 * s * s + 0.2 * s + 0.3:.6f},raspberry-pi-4\n" for s in range(2, 9))


def _calibrate(tmp_path, capsys, task="cifar10-resnet"):
    (tmp_path / "m.csv").write_text(MEASURED)
    assert main(["calibrate", str(tmp_path / "m.csv"), "--out", str(tmp_path / "cal"), "--task", task]) == 0
    capsys.readouterr()
    return tmp_path / "cal" / "profile.csv"


def test_user_curves_replace_shipped_curves_of_the_same_name(tmp_path, capsys):
    profile = _calibrate(tmp_path, capsys)
    user = read_profiles(profile)["raspberry-pi-4/cifar10-resnet"]
    assert sorted(user.group_overhead) == ["secagg"] and not user.training
    shipped = shipped_profiles()["raspberry-pi-4/cifar10-resnet"]
    layered = get_profile("raspberry-pi-4/cifar10-resnet", read_profiles(profile))
    assert float(layered.group_overhead["secagg"](10)) == pytest.approx(0.1 * 100 + 0.2 * 10 + 0.3, rel=1e-6)
    assert layered.training == shipped.training                                  # kept
    assert layered.group_overhead["backdoor-distance"] is shipped.group_overhead["backdoor-distance"]


def test_a_calibrated_secagg_only_profile_runs(tiny_dict, tmp_path, capsys):
    profile = _calibrate(tmp_path, capsys)
    tiny_dict["cost"]["profiles_file"] = str(profile)
    tiny_dict["train"]["rounds"] = 1
    tiny_dict["arms"] = [tiny_dict["arms"][1]]
    run_experiment(parse_config(tiny_dict), tmp_path / "run", progress=False)
    ledger = pd.read_parquet(tmp_path / "run" / "rg-random" / "ledger.parquet")
    sec = ledger[ledger.component == "secagg"]
    s = sec.groupby(["group", "group_round"])["client"].transform("size").to_numpy(dtype=float)
    assert len(sec) and sec["amount"].to_numpy() == pytest.approx(0.1 * s * s + 0.2 * s + 0.3, rel=1e-6)  # user's
    train = ledger[ledger.component == "training"]
    h = shipped_profiles()["raspberry-pi-4/cifar10-resnet"].training["sgd"]
    n = build_world(parse_config(tiny_dict)).topology.n_samples
    expected = tiny_dict["train"]["local_epochs"] * np.array([float(h(n[c])) for c in train["client"]])
    assert len(train) and train["amount"].to_numpy() == pytest.approx(expected)       # the shipped curve


def test_a_profile_lacking_a_curve_says_how_to_layer(tiny_dict, tmp_path, capsys):
    profile = _calibrate(tmp_path, capsys, task="measured")
    tiny_dict["cost"].update(profiles_file=str(profile), task="measured")
    with pytest.raises(InputError) as exc:
        run_experiment(parse_config(tiny_dict), tmp_path / "run", progress=False)
    msg = str(exc.value)
    assert "no training curve 'sgd'" in msg and "calibrate --task cifar10-resnet" in msg and "\n" not in msg


def test_two_rows_for_one_curve_are_refused_naming_both(tmp_path):
    """Before: the second row silently replaced the first."""
    path = tmp_path / "p.csv"
    path.write_bytes(b"\xef\xbb\xbfdevice,task,operation,method,a,b,c\r\n"
                     b"lab,t,group_overhead,secagg,0.01,0.1,0.5\r\nlab,t,training,sgd,0.1,0\r\n"
                     b"lab,t,group_overhead,secagg,0.02,0.1,0.5\r\n")
    with pytest.raises(InputError, match=r"rows 1 \(line 2\) and 3 \(line 4\) both give the curve "
                                         r"device/task/operation/method lab/t/group_overhead/secagg; keep one"):
        read_profiles(path)


def test_non_finite_coefficients_and_overflowing_curves_are_refused(tiny_dict, tmp_path):
    path = tmp_path / "p.csv"
    path.write_text("device,task,operation,method,a,b,c\nlab,t,group_overhead,secagg,inf,0,1\n")
    with pytest.raises(InputError, match=r"p.csv row 1: column 'a' must be a finite number, got 'inf'"):
        read_profiles(path)
    # 1e306 s² per client at group size 1 is finite; at the run's group size 12 it overflows
    path.write_text("device,task,operation,method,a,b,c\n"
                    "raspberry-pi-4,cifar10-resnet,group_overhead,secagg,1e307,0,1\n")
    tiny_dict["cost"]["profiles_file"] = str(path)
    tiny_dict["arms"] = tiny_dict["arms"][1:]
    with pytest.raises(InputError, match=r"cost: curve raspberry-pi-4/cifar10-resnet/secagg overflows a float "
                                         r"\(inf s\) at group size 5, which this run uses"):
        run_experiment(parse_config(tiny_dict), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


# --- moved from test_trust3.py (what a new user hits with bad or odd input) ---------------------------


def test_negative_curve_where_the_run_uses_it_is_refused_before_work(tiny_dict, tmp_path):
    prof = tmp_path / "neg.csv"
    prof.write_text("device,task,operation,method,a,b,c\n"
                    "raspberry-pi-4,cifar10-resnet,group_overhead,secagg,-0.5,-1,-2\n")
    tiny_dict["cost"]["profiles_file"] = str(prof)
    with pytest.raises(InputError, match=r"curve raspberry-pi-4/cifar10-resnet/secagg is -3\.5 s at group size 1"):
        run_experiment(parse_config(one_arm(tiny_dict, rounds=1)), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_toml_profile_with_negative_measured_points_is_refused(tiny_dict, tmp_path):
    prof = tmp_path / "p.toml"
    prof.write_text('[[curves]]\ndevice = "raspberry-pi-4"\ntask = "cifar10-resnet"\noperation = "training"\n'
                    'method = "sgd"\npoints = [[5, -1.0], [40, 2.0]]\n')
    tiny_dict["cost"]["profiles_file"] = str(prof)
    with pytest.raises(InputError, match=r"raspberry-pi-4/cifar10-resnet/sgd is -?[0-9.e-]+ s at samples"):
        run_experiment(parse_config(one_arm(tiny_dict, rounds=1)), tmp_path / "run", progress=False)


def test_shipped_backdoor_fit_stays_clamped_with_a_manifest_warning(tiny_dict, tmp_path):
    tiny_dict["cost"]["group_operations"] = ["secagg", "backdoor-distance"]
    with pytest.warns(UserWarning, match="shipped curve .*backdoor-distance is -0.05969 s at group size 1"):
        run_experiment(parse_config(one_arm(tiny_dict, rounds=1)), tmp_path / "run", progress=False)
    manifest = json.loads((tmp_path / "run" / "rg-random" / "manifest.json").read_text())
    assert any("backdoor-distance" in w and "charged as 0" in w for w in manifest["warnings"])
