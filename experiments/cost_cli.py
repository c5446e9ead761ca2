"""Cost subcommands: ``measure``, ``calibrate``, ``whatif`` and ``timeline``.

:func:`register` adds them to the main parser; each handler imports its work lazily so the
other subcommands start fast.
"""
from __future__ import annotations

import argparse
from pathlib import Path


def _cmd_measure(args) -> int:
    from cost_models.measure import measure, parse_sizes, write_measurements

    default = "16..256:16" if args.operation == "training" else "2..30"
    sizes = parse_sizes(args.sizes or default)
    rows, header = measure(args.operation, sizes, repeats=args.repeats, params=args.params, model=args.model,
                           device=args.device, threads=args.threads)
    out = write_measurements(Path(args.out or f"measurements-{args.operation}.csv"), rows, header)
    by_size: dict[tuple[str, int], list[float]] = {}
    for r in rows:
        by_size.setdefault((r.operation, r.group_size or r.n_samples), []).append(r.seconds)
    x_name = "n_samples" if args.operation == "training" else "group_size"
    print(f"{'operation':<18}{x_name:>11}{'median s':>12}{'min s':>12}")
    for (op, x), secs in by_size.items():
        print(f"{op:<18}{x:>11}{sorted(secs)[len(secs) // 2]:>12.4g}{min(secs):>12.4g}")
    print(f"\nmachine: {header['cpu']}, {header['cores']} cores, torch {header['torch']}")
    print(f"wrote {out}; fit it with: python -m experiments.cli calibrate {out}")
    return 0


def _cmd_calibrate(args) -> int:
    from cost_models.calibrate import calibrate, plot_fit, read_measurements, report, write_profile

    fits = calibrate(read_measurements(args.measurements))
    out = Path(args.out)
    print(report(fits))
    profile = write_profile(fits, out / "profile.csv", args.task)
    plots = [plot_fit(f, out / f"fit-{f.device}-{f.method}.png") for f in fits]
    print(f"\nprofile: {profile}  (use it as cost.profiles_file with cost.task = \"{args.task}\" and "
          f"topology.devices naming {sorted({f.device for f in fits})})")
    print("plots:   " + ", ".join(str(p) for p in plots))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    m = sub.add_parser("measure", help="time real group operations or training on this machine")
    m.add_argument("operation", choices=["secagg", "backdoor", "training"])
    m.add_argument("--sizes", help="group sizes (or sample counts for training): LO..HI[:STEP] or A,B,C "
                                   "(default 2..30; training 16..256:16)")
    m.add_argument("--repeats", type=int, default=3, help="measurements per size (default 3)")
    m.add_argument("--params", type=int, help="model parameters for secagg/backdoor (default: --model's)")
    m.add_argument("--model", default="cnn", choices=["cnn", "mlp"], help="model (emulator.training.build_model)")
    m.add_argument("--threads", type=int, default=1, help="torch threads while timing (default 1: one core)")
    m.add_argument("--device", default="local", help="device name written to the CSV (default local)")
    m.add_argument("--out", metavar="FILE.csv", help="output (default measurements-OPERATION.csv)")
    m.set_defaults(func=_cmd_measure)

    c = sub.add_parser("calibrate", help="fit cost curves to measurements; write a profile and plots")
    c.add_argument("measurements", nargs="+", metavar="MEASUREMENTS.csv",
                   help="columns operation, group_size or n_samples, seconds [, method, device]")
    c.add_argument("--out", default="calibration", metavar="DIR", help="output directory (default calibration)")
    c.add_argument("--task", default="measured", help="task name of the written profile (default measured)")
    c.set_defaults(func=_cmd_calibrate)
