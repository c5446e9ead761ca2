"""Several stacked processes side by side (``--jobs N`` with ``--stack W``, how one GPU is fed
where one interpreter cannot keep up): the same numbers as one process running every stack."""
import pandas as pd
import pytest

from groupfel.emulator.config import parse_config
from groupfel.experiments.runner import run_experiment

from test_stacking import _study, _tables


@pytest.mark.slow
def test_two_stacked_processes_give_the_numbers_of_one(tiny_dict, tmp_path):
    raw = _study(tiny_dict)
    raw["train"]["stack"] = 2
    runs = {}
    for jobs in (1, 2):
        run_experiment(parse_config(raw), tmp_path / f"jobs{jobs}", jobs=jobs, progress=False)
        runs[jobs] = _tables(tmp_path / f"jobs{jobs}", raw)
    assert len(runs[1]) == 4 and runs[1].keys() == runs[2].keys()
    for key, (results, ledger) in runs[1].items():
        pd.testing.assert_frame_equal(results, runs[2][key][0], check_exact=True)
        pd.testing.assert_frame_equal(ledger, runs[2][key][1], check_exact=True)
