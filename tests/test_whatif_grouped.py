"""groupfel whatif with a real grouping policy: on a label matrix or on Dirichlet(α) edges."""

import numpy as np
import pandas as pd
import pytest

from groupfel.cost_models import get_profile
from groupfel.experiments.cli import main


def test_label_matrix_every_group_sampled_matches_eq5_by_hand(tmp_path):
    # 2 edges × 4 clients; rg with MinGS 2 makes 2 groups of 2 per edge; participation 1 samples all 4.
    counts = [[3, 1], [2, 2], [0, 5], [4, 0], [1, 1], [6, 2], [2, 3], [1, 0]]
    rows = ["a,b,edge"] + [f"{x},{y},{e}" for (x, y), e in zip(counts, [0, 0, 0, 0, 1, 1, 1, 1])]
    (tmp_path / "labels.csv").write_text("\n".join(rows) + "\n")
    assert main(["whatif", "--policy", "rg", "--label-matrix", str(tmp_path / "labels.csv"), "--min-group-size", "2",
                 "--participation", "1", "--rounds", "3", "--group-rounds", "2", "--local-epochs", "3",
                 "--jobs", "1", "--out", str(tmp_path / "w")]) == 0
    row = pd.read_csv(tmp_path / "w" / "whatif.csv").iloc[0]
    prof = get_profile("raspberry-pi-4/cifar10-resnet")
    H, O = prof.training["sgd"], prof.group_overhead["secagg"]
    n = np.array(counts).sum(axis=1)
    K, E = 2, 3
    assert row["groups"] == 4 and row["groups_per_round"] == 4 and row["size_min"] == row["size_max"] == 2
    assert row["training_per_round"] == pytest.approx(K * E * sum(H(x) for x in n), rel=1e-12)   # Eq. 5
    assert row["operations_per_round"] == pytest.approx(K * 8 * O(2), rel=1e-12)
    assert row["total_per_round_std"] == pytest.approx(0, abs=1e-9)


def test_covg_on_dirichlet_edges_against_min_group_size(tmp_path, capsys):
    assert main(["whatif", "--policy", "covg", "--alpha", "0.1", "--clients", "2000", "--clients-per-edge", "500",
                 "--min-group-size", "3,5,10", "--max-cov", "0.5", "--rounds", "50", "--sampling", "esrcov",
                 "--jobs", "2", "--out", str(tmp_path / "w")]) == 0
    df = pd.read_csv(tmp_path / "w" / "whatif.csv")
    assert list(df["min_group_size"]) == [3, 5, 10]
    assert (df["size_min"] >= df["min_group_size"]).all()
    assert (df["size_max"] > df["min_group_size"]).any()          # CoVG's sizes spread above MinGS
    assert (df["clients_grouped"] == 2000).all()                   # the merge rule loses nobody
    # bigger groups: fewer of them, dearer group operations per client (quadratic O_g)
    assert df["groups"].is_monotonic_decreasing and df["operations_share"].is_monotonic_increasing
    assert (tmp_path / "w" / "whatif.png").stat().st_size > 5000
    assert "covg grouped 2000 clients on 4 edges" in capsys.readouterr().out


def test_grouped_whatif_is_the_same_on_one_or_two_processes(tmp_path):
    args = ["whatif", "--policy", "covg", "--alpha", "0.5", "--clients", "600", "--clients-per-edge", "200",
            "--rounds", "20"]
    assert main([*args, "--jobs", "1", "--out", str(tmp_path / "a")]) == 0
    assert main([*args, "--jobs", "2", "--out", str(tmp_path / "b")]) == 0
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "a" / "whatif.csv"), pd.read_csv(tmp_path / "b" / "whatif.csv"))


def test_grouped_whatif_bad_input(tmp_path, capsys):
    assert main(["whatif", "--alpha", "0.1"]) == 2
    assert "add --policy" in capsys.readouterr().err
    assert main(["whatif", "--policy", "covg", "--alpha", "0.1", "--clients", "1000", "--clients-per-edge", "100",
                 "--min-group-size", "200", "--out", str(tmp_path / "w")]) == 2
    assert "--min-group-size: 200 exceeds the 100 clients" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()


# --- moved from test_trust3.py (what a new user hits with bad or odd input) ---------------------------


def test_whatif_refuses_a_negative_curve_and_an_impossible_memory(tmp_path, capsys):
    prof = tmp_path / "neg.csv"
    prof.write_text("device,task,operation,method,a,b,c\nlab,t,group_overhead,secagg,-0.5,-1,-2\n"
                    "lab,t,training,sgd,0.1,0\n")
    assert main(["whatif", "--profile", "lab/t/secagg", "--profiles-file", str(prof), "--out", str(tmp_path / "w")]) == 2
    assert "curve lab/t/secagg is -6 s at group size 2" in capsys.readouterr().err
    assert main(["whatif", "--clients", "10000000000", "--out", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err
    assert "GiB" in err and "lower --clients" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "w").exists()


def test_whatif_refuses_a_curve_that_overflows_over_its_group_sizes(tmp_path, capsys):
    """1e306 s·s⁻² per client: finite at 13 (1.7e308), inf from 14 on. Before: a table of infs."""
    prof = tmp_path / "p.csv"
    prof.write_text("device,task,operation,method,a,b,c\nlab,t,group_overhead,secagg,1e306,0,1\n"
                    "lab,t,training,sgd,0.1,0\n")
    assert main(["whatif", "--profile", "lab/t/secagg", "--profiles-file", str(prof), "--group-sizes", "2..50",
                 "--clients", "100", "--out", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("groupfel: error: --profile: curve lab/t/secagg overflows a float (inf s) at group size 14, which "
                   "this what-if uses; a cost must be finite: fix the curve's coefficients or lower the group sizes")
    assert not (tmp_path / "w").exists()
