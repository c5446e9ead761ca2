"""Output paths are checked before any work starts (exit 2, one line, nothing written), result
files respect the umask, and the CLI's small user-facing promises (--version, resume hint, help)."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from groupfel.errors import InputError
from groupfel.emulator.io import atomic_write, check_writable
from groupfel.experiments.cli import build_parser, main

RESULTS = "arm,round,cost,accuracy\na,0,0.0,0.1\na,1,5.0,0.5\n"
MEASUREMENTS = "operation,group_size,seconds\nsecagg,2,1.0\nsecagg,3,2.1\nsecagg,4,3.9\nsecagg,5,6.2\n"
TINY_TOML = """name = "t"
[data]
min_samples = 8
max_samples = 20
[topology]
edges = 1
clients_per_edge = 6
[train]
model = "mlp"
rounds = 1
[[arms]]
name = "a"
grouping = { policy = "rg", min_group_size = 3 }
sampling = { policy = "random", groups_per_round = 1 }
"""


def _forbid(monkeypatch, target: str) -> None:
    """Fail the test if the command starts its work (``target``) before checking its output."""
    def work(*a, **k):
        raise AssertionError(f"{target} ran before the output path was checked")
    monkeypatch.setattr(target, work)


def _commands(tmp: Path, out: str, file_out: str) -> dict[str, list[str]]:
    (tmp / "run").mkdir(exist_ok=True)
    (tmp / "run" / "results.csv").write_text(RESULTS)
    (tmp / "m.csv").write_text(MEASUREMENTS)
    (tmp / "c.toml").write_text(TINY_TOML)
    return {
        "run": ["run", str(tmp / "c.toml"), "--output", out, "--quiet"],
        "whatif": ["whatif", "--group-sizes", "2..4", "--clients", "100", "--out", out],
        "calibrate": ["calibrate", str(tmp / "m.csv"), "--out", out],
        "measure": ["measure", "secagg", "--sizes", "2", "--repeats", "1", "--params", "10", "--out", file_out],
        "study": ["study", "fig7", "--out", out],
        "plot": ["plot", str(tmp / "run"), "--out", file_out],
    }


WORK = {"run": "groupfel.experiments.runner.run_experiment", "calibrate": "groupfel.cost_models.calibrate.calibrate",
        "measure": "groupfel.cost_models.measure.measure", "whatif": "groupfel.cost_models.whatif.sweep",
        "study": "groupfel.experiments.grouping_studies.fig7", "plot": "groupfel.experiments.plots.plot_curves"}


@pytest.mark.parametrize("command", sorted(WORK))
@pytest.mark.parametrize("case", ["parent-is-a-file", "file-where-dir-expected"])
def test_unwritable_output_is_refused_before_work(tmp_path, capsys, monkeypatch, command, case):
    blocker = tmp_path / "blocker"
    blocker.write_text("not a directory\n")
    if case == "parent-is-a-file":
        out = file_out = str(blocker / "sub" / "x")
    else:   # a file where a directory is expected; a directory where a file is expected
        out, file_out = str(blocker), str(tmp_path / "run")
    argv = _commands(tmp_path, out, file_out)[command]
    _forbid(monkeypatch, WORK[command])
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert (out if command not in ("measure", "plot") else file_out) in err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before   # nothing written
    assert blocker.read_text() == "not a directory\n"


def test_check_writable_sees_unwritable_directories(tmp_path, monkeypatch):
    """A read-only mount (or a directory without write permission) fails os.access even for root."""
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == tmp_path else real(p, mode))
    with pytest.raises(InputError, match="not writable"):
        check_writable(tmp_path / "new" / "deeper", "dir", "--out")
    with pytest.raises(InputError, match="not writable"):
        check_writable(tmp_path / "f.csv", "file", "--out")
    assert check_writable(tmp_path.parent / "elsewhere.csv", "file", "--out") == tmp_path.parent / "elsewhere.csv"


@pytest.mark.parametrize("mask,mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_result_files_respect_the_umask(tmp_path, mask, mode):
    old = os.umask(mask)
    try:
        atomic_write(tmp_path / "r.csv", lambda p: p.write_text("x\n"))
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "r.csv").stat().st_mode) == mode


@pytest.mark.parametrize("value", ["50", "0"])
def test_study_fig5_small_max_clients_is_a_clear_error(tmp_path, capsys, value):
    code = main(["study", "fig5", "--max-clients", value, "--out", str(tmp_path / "s")])
    err = capsys.readouterr().err
    assert code == 2 and "--max-clients" in err and "from 100 to" in err
    assert not (tmp_path / "s").exists()


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("groupfel ") and len(out.split()) >= 2


def test_interrupt_names_the_real_run_dir(tmp_path, capsys, monkeypatch):
    (tmp_path / "c.toml").write_text(TINY_TOML)

    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr("groupfel.experiments.runner.run_experiment", interrupted)
    run_dir = tmp_path / "my run"
    assert main(["run", str(tmp_path / "c.toml"), "--output", str(run_dir), "--quiet"]) == 130
    err = capsys.readouterr().err
    assert "RUN_DIR" not in err and f"groupfel run --resume '{run_dir}'" in err


def test_help_prints_each_default_once():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, p in sub.choices.items():
        text = p.format_help()
        assert "(default: None)" not in text, name
        for line in text.splitlines():
            assert line.count("default") <= 1, (name, line)
    group_help = " ".join(sub.choices["group"].format_help().split())
    assert "hcct, hcct-e group on client gradients" in group_help and "groupfel run" in group_help


def test_label_matrix_directory_is_named_as_such(tmp_path, capsys):
    assert main(["group", "--policy", "rg", "--label-matrix", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "is a directory" in err and "no such file" not in err and err.count("\n") == 1


def test_measure_suggests_the_installed_command(tmp_path, capsys):
    out = tmp_path / "m.csv"
    assert main(["measure", "secagg", "--sizes", "2", "--repeats", "1", "--params", "8", "--out", str(out)]) == 0
    assert f"fit it with: groupfel calibrate {out}" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("study", ["fig5", "fig6", "fig7"])
def test_study_figures_show_all_their_text(tmp_path, monkeypatch, study):
    """Nothing is cut off at the figure's edge, and fig7 explains its label colours."""
    import matplotlib.pyplot as plt

    from groupfel.experiments import grouping_studies

    figures = []
    real_save = grouping_studies._save

    def save(fig, path, *a, **k):
        real_save(fig, path, *a, **k)
        figures.append(fig)
    monkeypatch.setattr(grouping_studies, "_save", save)
    monkeypatch.setattr(plt, "close", lambda fig=None: None)
    # fig6 on a small edge and the two ends of its MinGS sweep: the same title, labels and legend as the
    # full grid (300 clients, 2..20 by 2), which takes minutes of FedCollab.
    kwargs = {"fig5": {"max_clients": 100}, "fig6": {"n_clients": 40, "sizes": (2, 20)}}.get(study, {})
    getattr(grouping_studies, study)(tmp_path, **kwargs)
    fig = figures[0]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    box = fig.bbox
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]
    texts = [t for ax in fig.axes for t in (ax.xaxis.label, ax.yaxis.label, ax.title)]
    texts += [t for leg in legends for t in (*leg.get_texts(), leg.get_title())]
    texts = [t for t in texts if t.get_visible() and t.get_text().strip()]
    for t in texts:
        ext = t.get_window_extent(renderer)
        assert ext.x0 >= box.x0 - 1 and ext.x1 <= box.x1 + 1 and ext.y0 >= box.y0 - 1 and ext.y1 <= box.y1 + 1, \
            t.get_text()
    if study == "fig7":
        assert fig.legends and [t.get_text() for t in fig.legends[0].get_texts()] == [str(i) for i in range(10)]
    plt.close("all")
