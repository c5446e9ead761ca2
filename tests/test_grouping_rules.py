"""``table1/grouping_rules.py`` places Table 1's worlds as the runs do: on the authors' client
sizes its Alg. 2 rule forms, seed by seed, the groups the committed full-size runs formed, and its
committed CSV is what the script writes."""
from pathlib import Path

import pandas as pd
import pytest

from conftest import reproduction_script

FOLDER = Path(__file__).parent.parent / "experiments" / "reproductions" / "table1"


@pytest.fixture(scope="module")
def rows():
    return pd.DataFrame(reproduction_script("table1/grouping_rules.py").rows())


def test_the_script_writes_the_committed_csv(rows):
    committed = pd.read_csv(FOLDER / "grouping-rules" / "groups.csv")
    pd.testing.assert_frame_equal(rows.reset_index(drop=True), committed, check_dtype=False)


def test_alg2_on_the_authors_sizes_forms_the_committed_runs_groups(rows):
    ours = rows[(rows["rule"] == "ours") & (rows["data"] == "authors")]
    runs = pd.read_csv(FOLDER / "full" / "sweep-summary.csv")
    table = pd.read_csv(FOLDER / "full" / "table1.csv")
    for _, run in runs.iterrows():
        a, c = run["data.alpha"], run["arms.0.grouping.max_cov"]
        cell = ours[(ours["alpha"] == a) & (ours["max_cov"] == c)]
        assert cell["groups"].mean() == pytest.approx(run["groups"])
        for metric, column in (("cov", "cov_mean"), ("size_mean", "size_mean")):
            committed = table[(table["alpha"] == a) & (table["max_cov"] == c) & (table["metric"] == metric)]
            assert cell[column].mean() == pytest.approx(float(committed["ours"].iloc[0]), rel=1e-9)
    authors = rows[rows["rule"] == "authors"]
    assert (authors["clients_left_out"] > 0).all() and (rows[rows["rule"] == "ours"]["clients_left_out"] == 0).all()
