"""The ``groupfel`` command line."""
from __future__ import annotations

import argparse
import shlex
import sys
import warnings
from pathlib import Path

from groupfel.errors import DivergenceError, InputError, WorkerLostError
from groupfel.userfile import clip
from groupfel.emulator.io import check_writable

from . import cost_cli, flags, group_cli, study_cli, track


def _cmd_run(args) -> int:
    from . import api
    from .runner import config_from_run_dir, default_config, load_config, report_diverged

    if args.resume and args.config:
        raise InputError("run: give a CONFIG or --resume RUN_DIR, not both")
    if args.resume:
        config, run_dir = config_from_run_dir(Path(args.resume)), Path(args.resume)
        flag = "--resume"
    else:
        config = load_config(args.config) if args.config else default_config()
        run_dir = Path(args.output) if args.output else Path(config.output_dir) / config.name
        flag = "--output" if args.output else "config output_dir/name ="
    config = _with_seeds(config, args.seeds, args.max_seeds)
    if args.numerics is not None and args.numerics != config.train.numerics:
        config = config.model_copy(update={"train": config.train.model_copy(update={"numerics": args.numerics})})
    if args.device is not None:
        from groupfel.emulator.devices import check

        config = config.model_copy(update={"train": config.train.model_copy(
            update={"device": check(args.device, "--device")})})
    if args.stack:
        config = config.model_copy(update={"train": config.train.model_copy(update={"stack": args.stack})})
    from groupfel.emulator import numerics

    numerics.apply(config.train.numerics)    # before anything below loads torch
    check_writable(run_dir, "dir", flag)
    args.run_dir = run_dir   # for the resume hint if interrupted
    summary = api.run(config, run_dir, force=args.force, progress=not args.quiet, jobs=args.jobs,
                      backend=args.backend, address=args.address, gpus_per_task=args.gpus_per_task,
                      ship_data=args.ship_data, py_modules=tuple(args.py_module),
                      track=track.from_args(args)).summary
    if config.seeds is not None:
        print(seeds_printout(summary, config, run_dir))
        return report_diverged(run_dir)
    with_cols = ["arm", "groups", "group_size", "avg_cov", "rounds", "cost", "sim_time_s",
                 *(["energy_j"] if "energy_j" in summary else []), "final_acc", "acc_at_common_cost", "stop"]
    if "cost_to_target" in summary:
        with_cols.insert(-1, "cost_to_target")
    print(summary[with_cols].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if "cost_to_target" in summary:
        print(f"\ncost_to_target: Eq. 5 cost when test accuracy first reached {config.train.target_accuracy:g}")
    print(f"acc_at_common_cost: accuracy at cost {summary.attrs.get('common_cost'):.6g}, the smallest final cost of any arm")
    print(f"results: {run_dir}/  (summary.csv, <arm>/results.csv, <arm>/ledger.parquet)")
    print(f"plot:    {run_dir / 'accuracy_vs_cost.png'}")
    print(*_energy_lines(config, run_dir), sep="\n", end="\n" if config.cost.energy else "")
    from .runner import stop_messages

    print(*stop_messages(run_dir), sep="\n", end="\n" if stop_messages(run_dir) else "")
    return 0


def _energy_lines(config, run_dir: Path) -> list[str]:
    """The energy plot and the powers that are assumptions (a run with ``cost.energy``), else none."""
    if not config.cost.energy:
        return []
    from .runner import assumed_powers

    line = assumed_powers(run_dir)
    return [f"energy:  {run_dir / 'accuracy_vs_energy.png'} (energy_j: joules, {config.cost.energy_accounting} "
            f"accounting)", *([line] if line else [])]


def _with_seeds(config, seeds: str | int | None, max_seeds: int | None):
    """``config`` with ``--seeds`` (auto, or N: seeds 0 to N−1) and ``--max-seeds`` applied."""
    if seeds is None and max_seeds is None:
        return config
    if seeds is None and config.seeds != "auto":
        raise InputError(f"--max-seeds {max_seeds}: needs --seeds auto (or seeds = \"auto\" in the config)")
    if seeds is not None and seeds != "auto":   # N, bounded by its flag's type
        if max_seeds is not None:
            raise InputError(f"--max-seeds {max_seeds}: only with --seeds auto, not --seeds {seeds}")
        return config.model_copy(update={"seeds": list(range(seeds)), "max_seeds": None,
                                         "seed_batch": type(config).model_fields["seed_batch"].default})
    return config.model_copy(update={"seeds": "auto", "max_seeds": max_seeds if max_seeds is not None else
                                     config.max_seeds})


def seeds_printout(summary, config, run_dir: Path) -> str:
    """What ``groupfel run`` prints for a multi-seed config (the README shows the demo's)."""
    from .stats import conclusion, render_summary

    target = config.train.target_accuracy
    return "\n".join([
        render_summary(summary, target), "", conclusion(summary, target), "",
        "acc_at_common_cost: accuracy at the smallest final cost of any arm of the same seed",
        f"results: {run_dir}/  (summary.csv, runs.csv, seed-<s>/<arm>/results.csv, ledger.parquet)",
        f"plot:    {run_dir / 'accuracy_vs_cost.png'}", *_energy_lines(config, run_dir)])


def _cmd_plot(args) -> int:
    from .plots import AXES, load_results, plot_bands, plot_curves

    dirs = [Path(d) for d in args.run_dir]
    runs = {}
    for d in dirs:
        results = load_results(d)
        for flag, col in (("--x", args.x), ("--y", args.y)):
            if col not in results:
                raise InputError(f"plot {flag}: no column {col!r} in {d}; choose one of {sorted(AXES)} "
                                 f"or another results column")
        runs[d.name if list(dirs).count(d) == 1 else str(d)] = results
    out = check_writable(args.out or dirs[0] / f"{args.y}_vs_{args.x}.png", "file", "--out")
    monotone = all(df.groupby(["arm", "seed"])[args.x].apply(lambda v: v.is_monotonic_increasing).all()
                   for df in runs.values())
    if monotone:     # mean curve and band over seeds, on a common x grid
        plot_bands(runs, out, x=args.x, y=args.y, title=" vs ".join(runs))
    elif len(runs) == 1 and next(iter(runs.values()))["seed"].nunique() == 1:
        plot_curves(next(iter(runs.values())), out, x=args.x, y=args.y, title=dirs[0].name)
    else:
        raise InputError(f"plot --x {args.x}: bands over seeds need an x that grows along a run "
                         f"(cost, sim_time_s, round)")
    print(f"plot: {out}")
    return 0


def version() -> str:
    from importlib import metadata

    try:
        return metadata.version("groupfel")
    except metadata.PackageNotFoundError:   # run from a source tree that was never installed
        return "unknown (not installed; pip install -e .)"


class _Version(argparse.Action):
    """``--version``, resolved only when asked for (package metadata is slow to scan)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, help="print the version and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"groupfel {version()}")
        parser.exit()


class _Parser(argparse.ArgumentParser):
    """A parser whose help can list the installed plug-ins, read from entry-point metadata (never
    imported) only when the help is printed."""

    lists_plugins = False

    before_help = None   # a subcommand's help text computed only when printed (group: the policy names)

    def format_help(self) -> str:
        if self.before_help is not None:
            self.before_help(self)
        if self.lists_plugins:
            from groupfel.policies import plugins

            kinds = [f"{kind}: {', '.join(names)}" for kind in plugins.GROUPS if (names := plugins.installed(kind))]
            self.epilog = ("A config's dataset, model, grouping, sampling and aggregation also accept a plug-in's "
                           "import path \"module:attr\". "
                           + (f"Installed plug-ins: {'; '.join(kinds)}." if kinds else "No plug-ins installed."))
        return super().format_help()

    def error(self, message: str):
        """A usage error (a flag's value out of range included) as the CLI's one line, exit 2."""
        self.exit(2, f"groupfel: error: {self.prog.removeprefix('groupfel').strip() or 'groupfel'}: {message} "
                     f"(see {self.prog} --help)\n")


def _lazy(module: str, name: str):
    """A subcommand's function, imported when it runs: building the parser (``--help``, ``group``)
    must not import pandas or pydantic for the commands it does not run."""
    def run(args):
        from importlib import import_module

        return getattr(import_module(module, __package__), name)(args)
    return run


def _add_report_parser(sub) -> None:
    p = sub.add_parser("report", help="one self-contained HTML page for a run or sweep directory")
    p.add_argument("dir", metavar="DIR", help="a run, multi-seed run or sweep directory")
    p.add_argument("--out", metavar="FILE.html", help="default DIR/report.html")
    p.set_defaults(func=_lazy(".report", "_cmd_report"))


def _add_sweep_parser(sub) -> None:
    from .backends import add_backend_arguments

    p = sub.add_parser("sweep", help="run a sweep file: one multi-seed run per point of its axes")
    p.add_argument("sweep", metavar="SWEEP.toml")
    add_backend_arguments(p, "(point, seed, arm) runs")
    p.add_argument("--output", metavar="DIR", help="sweep directory (default <output_dir>/<name>)")
    p.add_argument("--force", action="store_true", help="replace points run with a different config")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    track.add_track_arguments(p)
    p.set_defaults(func=_lazy(".sweep", "_cmd_sweep"))


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="groupfel", description="Group-based hierarchical FL emulator "
                     "with cost accounting (Group-FEL).")
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run an experiment (the embedded default without CONFIG)")
    run.add_argument("config", nargs="?", help="experiment TOML (default: the embedded digits demo)")
    run.add_argument("--resume", metavar="RUN_DIR", help="continue a killed run from its directory")
    run.add_argument("--output", metavar="RUN_DIR", help="run directory (default: output_dir/name)")
    run.add_argument("--force", action="store_true", help="replace a run of a different config in RUN_DIR")
    run.add_argument("--quiet", action="store_true", help="no progress bars")
    run.add_argument("--numerics", choices=["portable", "native"],
                     help="CPU kernels: portable (pinned at AVX2: the same numbers on every x86-64 CPU with "
                          "AVX2) or native (the machine's fastest); default: the config's train.numerics (native; "
                          "the demo: portable)")
    run.add_argument("--seeds", metavar="auto|N", type=flags.AutoOr(flags.Number(int, 1, 10000, "seeds")), help="auto: add seeds 0, 1, 2, ... in batches until every "
                     "comparison is decided (higher, lower, equivalent) or --max-seeds; N: seeds 0 to N-1. "
                     "Finished seeds of the run directory are kept")
    run.add_argument("--max-seeds", type=flags.Number(int, 3, 10000, "seeds"), metavar="N", help="with --seeds auto: the most seeds to run "
                     "(default: the config's max_seeds, else 20)")
    from .backends import add_backend_arguments

    add_backend_arguments(run, "(seed, arm) runs of a config with seeds")
    track.add_track_arguments(run)
    run.set_defaults(func=_cmd_run)
    run.lists_plugins = True
    plot = sub.add_parser("plot", help="plot result columns of runs or sweeps, one line (and band over seeds) per arm")
    plot.add_argument("run_dir", metavar="DIR", nargs="+",
                      help="run, multi-seed run or sweep directories (several: overlaid in one figure)")
    plot.add_argument("--x", default="cost", help="x column: cost, sim_time_s, round, ... (default cost)")
    plot.add_argument("--y", default="accuracy", help="y column: accuracy, loss, ... (default accuracy)")
    plot.add_argument("--out", metavar="FILE.png", help="default RUN_DIR/<y>_vs_<x>.png")
    plot.set_defaults(func=_cmd_plot)
    from .reproduce_cli import add_reproduce_parser

    _add_sweep_parser(sub)
    _add_report_parser(sub)
    add_reproduce_parser(sub)
    group_cli.add_group_parser(sub)
    study_cli.add_study_parser(sub)
    cost_cli.register(sub)
    flags.require_text(parser)
    return parser


_shown: set[str] = set()


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """One line per warning, without source location, and each text once (a config warning
    concerns every arm, but the user needs to read it once)."""
    if str(message) not in _shown:
        _shown.add(str(message))
        print(f"groupfel: warning: {message}", file=sys.stderr)


def _disk_full(exc: OSError) -> str:
    """One line for a full disk: the file, the space left, and that a rerun resumes."""
    import shutil

    name = Path(exc.filename) if exc.filename else None
    where = name.parent if name is not None else Path.cwd()
    while not where.exists() and where != where.parent:
        where = where.parent
    free = shutil.disk_usage(where).free
    return (f"the disk is full: cannot write {name if name is not None else 'an output file'} ({free:,} bytes "
            f"free on {where}'s file system); free some space and rerun the same command: finished work is "
            f"kept and the run resumes from its last checkpoint")


def main(argv: list[str] | None = None) -> int:
    _shown.clear()
    warnings.showwarning = _show_warning
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:   # a usage error (its one line is printed) returns 2 like any input error
        if exc.code == 2:
            return 2
        raise
    try:
        return args.func(args)
    except BrokenPipeError:
        # stdout went to a reader that stopped (| head): quiet, as a shell tool is
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as exc:
        import errno

        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        print(f"groupfel: error: {_disk_full(exc)}", file=sys.stderr)
        return 1
    except InputError as exc:
        trace = getattr(exc, "trace", "")   # a plug-in's own exception: its traceback, then our one line
        if trace:
            print(trace.rstrip("\n"), file=sys.stderr)
        print(f"groupfel: error: {clip(str(exc))}", file=sys.stderr)   # a user's value never fills a screen
        return 2
    except DivergenceError as exc:
        print(f"groupfel: training diverged: {exc}", file=sys.stderr)
        return 1
    except WorkerLostError as exc:
        print(f"groupfel: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        run_dir = getattr(args, "run_dir", None)
        hint = f"; continue with 'groupfel run --resume {shlex.quote(str(run_dir))}'" if run_dir else ""
        print(f"groupfel: interrupted{hint}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
