"""Commands that train nothing do not import torch (start-up time: benchmarks/startup.py)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from groupfel.emulator.ledger import CostLedger

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import json, sys
from groupfel.experiments.cli import main
# fig6's full grid (300 clients, MinGS 2..20 by 2) takes minutes of FedCollab; a small edge and the two
# ends of the sweep run the same code (every policy, the plot), so the same imports.
from groupfel.experiments import grouping_studies
grouping_studies.fig6.__defaults__ = (40, (2, 20), 0)
heavy = {}
for argv in json.loads(sys.argv[1]):
    rc = main(argv)
    assert rc == 0, (argv, rc)
    heavy[argv[0] + (" " + argv[1] if argv[0] == "study" else "")] = sorted(
        m for m in ("torch", "mlflow", "tensorboard") if m in sys.modules)
print(json.dumps(heavy))
"""


@pytest.mark.slow
def test_commands_that_train_nothing_do_not_import_torch(tmp_path):
    rng = np.random.default_rng(0)
    pd.DataFrame(rng.integers(0, 20, size=(30, 4)), columns=list("abcd")).to_csv(tmp_path / "l.csv", index=False)
    (tmp_path / "m.csv").write_text("operation,group_size,seconds\nsecagg,2,1.0\nsecagg,3,2.1\nsecagg,4,3.9\n"
                                    "secagg,5,6.2\n")
    arm = tmp_path / "run" / "a"
    arm.mkdir(parents=True)
    pd.DataFrame({"arm": "a", "round": [0, 1], "cost": [0.0, 5.0], "accuracy": [0.1, 0.5]}).to_csv(
        arm / "results.csv", index=False)
    led = CostLedger()
    led.charge(round=0, edge=0, group=0, group_round=0, clients=np.array([0, 1]), devices=["pi", "pi"],
               component="training", amounts=np.array([1.0, 2.0]), start=np.zeros(2), end=np.array([1.0, 2.0]))
    led.frame().to_parquet(arm / "ledger.parquet", index=False)
    out = str(tmp_path / "o")
    commands = [["group", "--policy", "covg", "--label-matrix", str(tmp_path / "l.csv"), "--min-group-size", "3"],
                ["whatif", "--group-sizes", "2..5", "--clients", "100", "--rounds", "2", "--out", out],
                ["calibrate", str(tmp_path / "m.csv"), "--out", out],
                ["plot", str(tmp_path / "run"), "--out", str(tmp_path / "p.png")],
                ["timeline", str(arm), "--round", "1", "--out", str(tmp_path / "t.png")],
                ["study", "fig5", "--max-clients", "100", "--out", out],
                ["study", "fig6", "--out", out], ["study", "fig7", "--out", out]]
    proc = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(commands)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    imported = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(imported) == len(commands)
    assert not any(imported.values()), imported


def test_the_parser_imports_neither_pandas_pydantic_nor_numpy_nor_a_tracker():
    """``groupfel --help`` builds the whole parser: before, it imported pandas (groupfel.experiments.report),
    pydantic (groupfel.experiments.sweep) and numpy (the group command's policy list): 0.66 s; now 0.07 s
    (median of 7, benchmarks/startup.py, the same 2-core machine)."""
    code = ("import sys; from groupfel.experiments.cli import build_parser; build_parser(); "
            "print(sorted(m for m in ('pandas', 'pydantic', 'numpy', 'torch', 'matplotlib', 'mlflow', 'tensorboard') "
            "if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


# --- moved from test_trust3.py (what a new user hits with bad or odd input) ---------------------------


def test_building_the_parser_imports_neither_torch_scipy_nor_matplotlib():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    code = ("import sys, json\nfrom groupfel.experiments.cli import build_parser\nbuild_parser()\n"
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'scipy', 'matplotlib', 'mlflow', "
            "'tensorboard'})))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, env={"PYTHONPATH": str(root)},
                          capture_output=True, text=True, check=True)
    assert json.loads(proc.stdout) == []
