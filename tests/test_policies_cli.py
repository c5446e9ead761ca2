"""``groupfel group`` on small CSVs, its errors, the grouping studies, and HCCT's gradient probe
inside the runner."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from groupfel.experiments.cli import main
from groupfel.policies.cov import cov_of_counts

CSV = "cat,dog,bird,edge\n5,0,1,0\n0,4,4,0\n3,3,3,0\n1,0,9,0\n2,2,0,1\n0,0,7,1\n9,1,1,1\n4,4,0,1\n"
COUNTS = np.array([[5, 0, 1], [0, 4, 4], [3, 3, 3], [1, 0, 9], [2, 2, 0], [0, 0, 7], [9, 1, 1], [4, 4, 0]])


def _run(capsys, *args):
    code = main(["group", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("policy", ["covg", "rg", "cdg", "kldg", "qcid", "fedcollab"])
def test_group_json_partitions_each_edge(tmp_path, capsys, policy):
    path = tmp_path / "labels.csv"
    path.write_text(CSV)
    code, out, _ = _run(capsys, "--policy", policy, "--label-matrix", str(path), "--min-group-size", "2",
                        "--format", "json")
    assert code == 0
    res = json.loads(out)
    clients = sorted(c for g in res["groups"] for c in g["clients"]) + res["summary"]["clients_dropped"]
    assert sorted(clients) == list(range(8))
    for g in res["groups"]:
        assert {0: {0, 1, 2, 3}, 1: {4, 5, 6, 7}}[g["edge"]] >= set(g["clients"])  # groups stay on their edge
        assert g["size"] == len(g["clients"]) >= 2
        assert g["label_counts"] == COUNTS[g["clients"]].sum(axis=0).tolist()
        assert g["cov"] == pytest.approx(float(cov_of_counts(COUNTS[g["clients"]].sum(axis=0))))
    s = res["summary"]
    assert s["n_groups"] == len(res["groups"]) and s["n_edges"] == 2
    assert s["cov_mean"] == pytest.approx(np.mean([g["cov"] for g in res["groups"]]))


def test_group_table_and_seed(tmp_path, capsys):
    path = tmp_path / "labels.csv"
    path.write_text("a,b\n" + "\n".join(f"{i % 5 + 1},{(7 * i) % 4}" for i in range(1, 21)) + "\n")
    code, out, _ = _run(capsys, "--policy", "covg", "--label-matrix", str(path), "--min-group-size", "3",
                        "--max-cov", "0.2", "--seed", "4")
    assert code == 0
    assert "mean CoV" in out and "cov" in out.splitlines()[0]
    _, again, _ = _run(capsys, "--policy", "covg", "--label-matrix", str(path), "--min-group-size", "3",
                       "--max-cov", "0.2", "--seed", "4")
    assert out == again


def test_set_passes_any_parameter_of_the_policy(tmp_path, capsys):
    """--set reaches the policy's other parameters: the authors' CoVG leaves out the clients of the
    groups it cannot complete; Alg. 2 (the default) trains every client."""
    path = tmp_path / "labels.csv"
    path.write_text("a,b,c\n" + "\n".join(f"{(5 * i) % 7},{(3 * i) % 5},{i % 2}" for i in range(1, 31)) + "\n")
    results = {}
    for extra in ([], ["--set", "grow=authors", "--set", "leftover=drop"]):
        code, out, _ = _run(capsys, "--policy", "covg", "--label-matrix", str(path), "--min-group-size", "4",
                            "--max-cov", "0.1", "--format", "json", *extra)
        assert code == 0
        results[bool(extra)] = json.loads(out)["summary"]
    assert results[False]["clients_dropped"] == [] and results[True]["clients_dropped"]
    assert results[True]["size_min"] >= 4


@pytest.mark.parametrize("content,needle", [
    ("a,b\n1,x\n", "'x'"),
    ("a,b\n1,-2\n", "'-2'"),
    ("a,b\n1,2.5\n", "'2.5'"),
    ("a,b\n1,2\n3\n", "row 2 column 'b' is ''"),
    ("a,b\n1,2\n0,0\n", "no samples"),
    ("a,b\n", "no client rows"),
    ("", "CSV"),
])
def test_bad_files_give_one_line_and_exit_2(tmp_path, capsys, content, needle):
    path = tmp_path / "bad.csv"
    path.write_text(content)
    code, out, err = _run(capsys, "--policy", "rg", "--label-matrix", str(path), "--min-group-size", "1")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and needle in err


def test_other_usage_errors(tmp_path, capsys):
    code, _, err = _run(capsys, "--policy", "rg", "--label-matrix", str(tmp_path / "missing.csv"))
    assert code == 2 and "no such file" in err
    path = tmp_path / "labels.csv"
    path.write_text(CSV)
    for args, needle in [(["--policy", "nope"], "unknown grouping policy"),
                         (["--policy", "hcct"], "gradients"),
                         (["--policy", "kldg", "--max-cov", "0.3"], "--max-cov"),
                         (["--policy", "covg", "--min-group-size", "0"], "--min-group-size"),
                         (["--policy", "rg", "--min-group-size", "9"], "--min-group-size"),
                         (["--policy", "covg", "--set", "grow=nope"], "--set grow"),
                         (["--policy", "covg", "--set", "nope=1"], "--set nope"),
                         (["--policy", "covg", "--set", "max_cov=1"], "--max-cov"),
                         (["--policy", "covg", "--set", "grow"], "KEY=VALUE")]:
        code, _, err = _run(capsys, *args, "--label-matrix", str(path))
        assert code == 2 and needle in err and err.count("\n") == 1, args


def test_studies_write_csv_and_png(tmp_path, capsys):
    assert main(["study", "fig7", "--out", str(tmp_path)]) == 0
    df = pd.read_csv(tmp_path / "fig7.csv")
    assert set(df.policy) == {"rg", "cdg", "kldg", "qcid", "covg", "fedcollab"}
    assert (df.groupby("policy")["count"].sum() == df.groupby("policy")["count"].sum().iloc[0]).all()
    assert main(["study", "fig5", "--out", str(tmp_path), "--max-clients", "100"]) == 0
    f5 = pd.read_csv(tmp_path / "fig5.csv")
    assert set(f5.clients) == {100} and f5.seconds.notna().all() and "covg-reference" in set(f5.policy)
    assert (tmp_path / "fig5.png").stat().st_size > 0 and (tmp_path / "fig7.png").stat().st_size > 0
    capsys.readouterr()


def test_runner_probes_gradients_for_hcct():
    from groupfel.emulator.config import RunConfig
    from groupfel.emulator.driver import plan_arm
    from groupfel.emulator.membership import form_groups
    from groupfel.emulator.world import build_world
    from groupfel.experiments.runner import default_config

    d = default_config().model_dump()
    d["topology"].update(edges=2, clients_per_edge=6)
    d["train"]["model"] = "mlp"
    d["arms"] = [d["arms"][0]]
    d["arms"][0]["grouping"] = {"policy": "hcct-e", "alpha": 10.0, "min_group_size": 2}
    world = build_world(RunConfig.model_validate(d))
    result = form_groups(world, plan_arm(world, 0).grouping, 0)
    clients = sorted(c for g in result.groups for c in g.clients.tolist())
    assert clients == list(range(12))
    assert all(g.size >= 2 for g in result.groups)
    assert all(len(set(world.topology.client_edge[g.clients].tolist())) == 1 for g in result.groups)
    assert result.probe_cost > 0 and result.summary()["gradient_probe_training_cost"] == result.probe_cost


def test_a_spreadsheet_label_matrix_reads_like_a_plain_one(tmp_path, capsys):
    """Before: the BOM made the first column '\\ufeffedge', so the edge column was read as a label."""
    rows = ["edge,a,b", *[f"{i % 2},{i % 5 + 1},{(7 * i) % 4}" for i in range(1, 21)]]
    plain, sheet = tmp_path / "plain.csv", tmp_path / "sheet.csv"
    plain.write_text("\n".join(rows) + "\n")
    sheet.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(rows).encode() + b"\r\n")
    outs = []
    for path in (plain, sheet):
        code, out, _ = _run(capsys, "--policy", "covg", "--label-matrix", str(path), "--min-group-size", "3",
                            "--seed", "4")
        assert code == 0
        outs.append(out)
    assert outs[0] == outs[1]


# --- moved from test_trust3.py (what a new user hits with bad or odd input) ---------------------------


def test_study_fig5_shows_progress(tmp_path, capsys):
    assert main(["study", "fig5", "--max-clients", "100", "--out", str(tmp_path / "s")]) == 0
    assert "fig5: timing groupings" in capsys.readouterr().err
