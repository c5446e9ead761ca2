"""Cost subcommands: ``measure``, ``calibrate``, ``whatif`` and ``timeline``.

:func:`register` adds them to the main parser; each handler imports its work lazily so the
other subcommands start fast. :mod:`cost_models` computes (rows, text, figures); this layer
supplies the emulator's model and writes every file atomically.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from groupfel.errors import InputError
from groupfel.emulator.io import atomic_write, check_writable

from . import flags
from .flags import Number, parse_sizes

EDGE_CLIENTS = 10_000    # the what-if's one edge: every client a SimPy process in every round


def _number(v: float) -> str:
    """A table number: 4 significant digits, but whole thousands written out (10000, never
    1e+04 beside 9999)."""
    return f"{v:.0f}" if 1e4 <= abs(v) < 1e9 else f"{v:.4g}"


def write_text(path: Path, text: str) -> Path:
    """Write ``text`` as is (no newline translation) atomically: a kill leaves no half-written file."""
    atomic_write(Path(path), lambda p: p.write_text(text, newline=""))
    return Path(path)


def write_profile(fits, path: Path, task: str) -> Path:
    """The calibrated profile CSV (``cost.profiles_file``) of ``fits`` at ``path``."""
    from groupfel.cost_models.calibrate import profile_csv

    return write_text(path, profile_csv(fits, task))


def _cmd_measure(args) -> int:
    from groupfel.cost_models.energy_meter import open_meter
    from groupfel.cost_models.measure import INPUT_SHAPE, NUM_CLASSES, measure, measurements_csv
    from groupfel.emulator.models import build_model

    default = "16..256:16" if args.operation == "training" else "2..30"
    sizes = parse_sizes(args.sizes or default)
    out = check_writable(args.out or f"measurements-{args.operation}.csv", "file", "--out")
    meter, said = open_meter(args.power_log)
    rows, header = measure(args.operation, sizes, lambda: build_model(args.model, INPUT_SHAPE, NUM_CLASSES),
                           repeats=args.repeats, params=args.params, model=args.model, device=args.device,
                           threads=args.threads, server=args.server, meter=meter, clock=args.clock)
    out = write_text(out, measurements_csv(rows, header))
    by_size: dict[tuple[str, int], list[tuple[float, float | None]]] = {}
    for r in rows:
        watts = r.joules / r.energy_span_s if r.joules is not None else None
        by_size.setdefault((r.operation, r.group_size or r.n_samples), []).append((r.seconds, watts))
    x_name = "n_samples" if args.operation == "training" else "group_size"
    print(f"{'operation':<18}{x_name:>11}{'median s':>12}{'min s':>12}" + (f"{'mean W':>10}" if meter else ""))
    for (op, x), got in by_size.items():
        secs = sorted(s for s, _ in got)
        watts = [w for _, w in got if w is not None]
        print(f"{op:<18}{x:>11}{secs[len(secs) // 2]:>12.4g}{secs[0]:>12.4g}"
              + (f"{sum(watts) / len(watts):>10.4g}" if watts else ""))
    print(f"\nmachine: {header['cpu']}, {header['cores']} cores, torch {header['torch']}")
    print(said)
    print(f"wrote {out}; fit it with: groupfel calibrate {out}")
    return 0


def _cmd_calibrate(args) -> int:
    from groupfel.cost_models.calibrate import calibrate, plot_fit, read_measurements, report

    from .plots import save_png

    out = check_writable(args.out, "dir", "--out")
    fits = calibrate(read_measurements(args.measurements), args.weights)
    print(report(fits))
    profile = write_profile(fits, out / "profile.csv", args.task)
    plots = [save_png(plot_fit(f), out / f"fit-{f.device}-{f.method}.png") for f in fits]
    print(f"\nprofile: {profile}  (use it as cost.profiles_file with cost.task = \"{args.task}\" and "
          f"topology.devices naming {sorted({f.device for f in fits})}; where device/task name a shipped "
          f"profile, these curves replace its curves of the same name and it supplies the rest)")
    print("plots:   " + ", ".join(str(p) for p in plots))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    m = sub.add_parser("measure", help="time real group operations or training on this machine")
    m.add_argument("operation", choices=["secagg", "backdoor", "training"])
    m.add_argument("--sizes", type=flags.SIZES, help="group sizes (or sample counts for training): LO..HI[:STEP] or A,B,C "
                                   "(default 2..30; training 16..256:16)")
    m.add_argument("--repeats", type=Number(int, 1, 10**4), default=3, help="measurements per size (default 3)")
    m.add_argument("--params", type=Number(int, 1, 10**10), help="model parameters for secagg/backdoor (default: --model's)")
    m.add_argument("--model", default="cnn", choices=["cnn", "mlp"], help="model (groupfel.emulator.training.build_model)")
    m.add_argument("--threads", type=flags.JOBS, default=1, help="torch threads while timing (default 1: one core)")
    m.add_argument("--device", default="local", help="device name written to the CSV (default local)")
    m.add_argument("--server", action="store_true", help="secagg: time the aggregator's part alone (secagg-server "
                   "and secagg-server-recovery rows, an edge server's curves for topology.edge_profile)")
    m.add_argument("--clock", default="cpu", choices=["cpu", "wall"], help="secagg: time each party's CPU time "
                   "(default cpu: a loaded machine does not inflate it) or its wall-clock time (wall: a device whose "
                   "CPU is capped, by a cgroup quota or throttling, waits too)")
    m.add_argument("--power-log", metavar="LOG.csv", help="a power meter's log (columns timestamp in Unix seconds, "
                   "watts) covering this run: each call's energy is its integral (default: the machine's RAPL "
                   "counters where readable, else no energy)")
    m.add_argument("--out", metavar="FILE.csv", help="output (default measurements-OPERATION.csv)")
    m.set_defaults(func=_cmd_measure)

    c = sub.add_parser("calibrate", help="fit cost curves to measurements; write a profile and plots")
    c.add_argument("measurements", nargs="+", metavar="MEASUREMENTS.csv",
                   help="columns operation, group_size or n_samples, seconds [, method, device]")
    c.add_argument("--out", default="calibration", metavar="DIR", help="output directory (default calibration)")
    c.add_argument("--task", default="measured", help="task name of the written profile (default measured)")
    c.add_argument("--weights", default="auto", choices=["auto", "none", "relative"],
                   help="least-squares weights: none (constant noise), relative (noise proportional to the "
                        "time, weights 1/fitted²) or auto (default: relative where the residuals grow with the "
                        "fitted time, Spearman one-sided p < 0.05); the output says which and why")
    c.set_defaults(func=_cmd_calibrate)
    register_whatif(sub)
    register_timeline(sub)


def _whatif_curves(args):
    """(profile, O_g curve) named by --profile and --training."""
    from groupfel.cost_models import get_curve, read_profiles

    extra = read_profiles(args.profiles_file) if args.profiles_file else None
    prof, kind, overhead = get_curve(args.profile, extra)
    if kind != "group_overhead":
        raise InputError(f"--profile {args.profile!r}: name a group operation (e.g. .../secagg), not a training curve")
    if args.training not in prof.training:
        raise InputError(f"--training: {prof.name} has no training curve {args.training!r}; "
                         f"choose one of {sorted(prof.training)}")
    return prof, overhead


def _check_whatif_curves(args, prof, overhead, sizes, n_samples) -> None:
    """A what-if curve at or below zero where it is used is an error (it would be priced as 0);
    a shipped fit that dips below zero is priced as 0 there, with a warning."""
    import warnings

    import numpy as np

    from groupfel.cost_models import shipped_profiles
    from groupfel.cost_models.curves import first_nonpositive, require_finite

    shipped = shipped_profiles().get(prof.name)
    for flag, kind, method, curve, xs, unit in (
            ("--profile", "group_overhead", args.profile.rpartition("/")[2], overhead, np.unique(sizes), "group size"),
            ("--training", "training", args.training, prof.training[args.training], np.unique(n_samples), "samples")):
        require_finite(curve, xs, flag, f"{prof.name}/{method}", unit, "this what-if")
        bad = first_nonpositive(curve, xs)
        if bad is None:
            continue
        point = f"{prof.name}/{method} is {bad[1]:.4g} s at {unit} {bad[0]:g}"
        if shipped is not None and getattr(shipped, kind).get(method) is curve:
            warnings.warn(f"{flag}: the shipped curve {point} (its fit dips below zero there); priced as 0 there")
        else:
            raise InputError(f"{flag}: curve {point}, where this what-if uses it ({unit} {xs.min():g}..{xs.max():g}); "
                             f"a cost must be positive: fix the curve's coefficients or points")


# Group draws a what-if prices (rounds x groups, summed over its settings): 10^8 took 8 s on a loaded
# 2-core machine, so this bound keeps one under about half a minute there.
MAX_WHATIF_DRAWS = 3 * 10**8


def _check_work(rounds: int, groups: list[int], what: str) -> None:
    """Refuse a what-if whose rounds x groups (each round draws from every setting's groups) is
    beyond :data:`MAX_WHATIF_DRAWS`, before any work: like a run's size checks, one line with
    the estimate and what to lower."""
    draws = rounds * sum(groups)
    if draws > MAX_WHATIF_DRAWS:
        raise InputError(f"whatif: {rounds:,} rounds x {sum(groups):,} groups over {what} is about {draws:.2g} "
                         f"group draws, more than the {MAX_WHATIF_DRAWS:.0e} one what-if prices (minutes or "
                         f"more); lower the rounds or clients, or give fewer group sizes (e.g. LO..HI:STEP)")


def _check_memory(clients: int, per_client_bytes: int = 64) -> None:
    """Refuse a what-if whose per-client arrays do not fit in the memory available now."""
    need = clients * per_client_bytes
    try:
        with open("/proc/meminfo") as f:
            avail = next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return
    if need > avail:
        raise InputError(f"--clients {clients}: needs about {need / 2**30:.1f} GiB of memory "
                         f"({per_client_bytes} bytes a client) but {avail / 2**30:.1f} GiB is available; "
                         f"lower --clients to at most {avail // per_client_bytes:,}")


def _cmd_whatif(args) -> int:
    import time

    from groupfel.cost_models.whatif import Scenario, plot_makespan, plot_sweep, sweep

    out = check_writable(args.out, "dir", "--out")
    if args.policy or args.label_matrix or args.alpha:
        return _whatif_grouped(args)
    prof, overhead = _whatif_curves(args)
    sc = Scenario(clients=args.clients, samples_mean=args.samples_mean, rounds=args.rounds,
                  group_rounds=args.group_rounds, local_epochs=args.local_epochs,
                  groups_per_round=args.groups_per_round, participation=args.participation, seed=args.seed)
    group_sizes = parse_sizes(args.group_sizes, "--group-sizes", most=sc.clients,
                              bound=f"the {sc.clients:,} clients (--clients)")
    if _wants_makespan(args):
        _edge_clients(args, sc.clients)
    _check_memory(sc.clients)
    _check_work(sc.rounds, [sc.clients // s for s in group_sizes], f"{len(group_sizes)} group size(s)")
    _check_whatif_curves(args, prof, overhead, group_sizes + [s + 1 for s in group_sizes], sc.sample_counts())
    t0 = time.perf_counter()
    df = sweep(group_sizes, overhead, prof.training[args.training], sc)
    if _wants_makespan(args):
        df = _with_makespan(df, args, prof, overhead, sc)
    elapsed = time.perf_counter() - t0
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "whatif.csv", index=False)
    title = (f"{args.profile} + {args.training}; {sc.clients} clients, T={sc.rounds}, K={sc.group_rounds}, "
             f"E={sc.local_epochs}")
    cols = ["group_size", "groups_per_round", "clients_per_round", "training_per_round", "operations_per_round",
            "total_per_round", "operations_share"]
    if "makespan_s" in df:
        plot_makespan(df, out / "whatif.png", title + f"; one edge of {args.edge_clients} clients")
        cols = ["edge_groups", "edge_group_sizes", "access_mbps", "edge_cores", "makespan_s", "core_wait_s",
                "edge_cost", *[c for c in ("edge_energy_j", "edge_server_energy_j", "edge_total_energy_j", "carbon_g",
                                           "edge_total_carbon_g") if c in df],
                "group_size", "total_per_round"]
        print(f"one edge of {args.edge_clients} clients: the groups it forms (edge_groups of edge_group_sizes) "
              f"for each --group-sizes value (group_size: the smallest that forms them)")
    else:
        plot_sweep(df, out / "whatif.png", title)
    print(df[cols].to_string(index=False, float_format=_number))
    if "edge_energy_j" in df:
        print("edge_energy_j: joules of the edge's clients in one round, group-rounds accounting (sampled "
              "clients in their group rounds; whatif.csv's energy_accounting)"
              + ("; edge_server_energy_j: its server's (aggregation, secure aggregation, idle for the rest of "
                 "the round); edge_total_energy_j: both" if "edge_server_energy_j" in df else "")
              + (f"; carbon_g: grams CO2e at {df['carbon_intensity'].iloc[0]}" if "carbon_g" in df else ""))
    if "makespan_s" in df:
        for cap, part in df.groupby("access_mbps", dropna=False, sort=False):
            fast = part.loc[part["makespan_s"].idxmin()]
            at = "dedicated links" if cap != cap else f"access {cap:g} Mbit/s"
            print(f"\nshortest round at {at}: {int(fast.edge_groups)} groups of {fast.edge_group_sizes} "
                  f"({fast.makespan_s:.4g} s on an edge of {args.edge_clients} clients)")
    best = df.loc[df["total_per_round"].idxmin()]
    print(f"\ncheapest per round: group size {int(best.group_size)} ({best.total_per_round:.4g} device s/round)")
    print(f"swept {len(group_sizes)} group sizes × {sc.rounds} rounds × {sc.clients} clients in {elapsed:.2f} s")
    print(f"table: {out / 'whatif.csv'}\nplot:  {out / 'whatif.png'}")
    if getattr(args, "power_note", None):
        print(args.power_note)
    return 0


def _wants_makespan(args) -> bool:
    return getattr(args, "energy", False) or \
        any(getattr(args, k, None) is not None for k in ("access_mbps", "edge_cores", "edge_clients"))


EDGE_CLIENTS_DEFAULT = 60


def _edge_clients(args, clients: int) -> int:
    """The edge's clients (--edge-clients; default 60, or every client where there are fewer),
    never more than --clients: the edge's clients are drawn from them."""
    if args.edge_clients is None:
        args.edge_clients = min(EDGE_CLIENTS_DEFAULT, clients)
    elif args.edge_clients > clients:
        raise InputError(f"--edge-clients {args.edge_clients:,}: more than the {clients:,} clients (--clients) the "
                         f"edge's clients are drawn from; give at most {clients:,}, or raise --clients")
    return args.edge_clients


def _whatif_power(args, prof, n_samples, edge_clients: int, caps):
    """--energy: the --profile device's power per state (the shipped power profile and
    --profiles-file's [[power]] tables), checked where the what-if uses it."""
    import numpy as np

    from groupfel.cost_models.power import assumed_line, build_power, read_power

    extra = read_power(args.profiles_file) if args.profiles_file else None
    rates = np.array([args.client_mbps] + [c for c in caps if c is not None])
    uses = {prof.device: {"training": n_samples, "group_operation": np.arange(1, edge_clients + 1),
                          "transmit": rates, "receive": rates, "listen": np.zeros(1), "idle": np.zeros(1)}}
    try:
        model = build_power([prof.device], extra, uses, "--energy")
    except InputError as exc:
        raise InputError(str(exc).replace("cost.profiles_file", "--profiles-file")) from None
    args.power_note = assumed_line(model.assumed())
    return model.devices[prof.device]


def _with_makespan(df, args, prof, overhead, sc):
    """The round makespan of one edge of --edge-clients clients, cut into groups of each size, at
    each --access-mbps capacity and --edge-cores (the shared-edge model, groupfel.emulator.network)."""
    import numpy as np
    import pandas as pd

    from groupfel.emulator.network import edge_makespan

    caps = args.access_mbps or [None]
    m = _edge_clients(args, sc.clients)
    curves = {}
    if args.edge_profile:
        from groupfel.cost_models import get_profile, read_profiles

        edge = get_profile(args.edge_profile, read_profiles(args.profiles_file) if args.profiles_file else None)
        curves = {k: v for k, v in edge.group_overhead.items()
                  if k in ("aggregation", "secagg-server", "secagg-server-recovery")}
    n = sc.sample_counts()[:m]
    op = args.profile.rpartition("/")[2]
    power = _whatif_power(args, prof, n, m, caps) if getattr(args, "energy", False) else None
    server = None
    if getattr(args, "edge_power", None) and power is None:
        raise InputError("--edge-power: prices the edge server's joules beside its clients'; add --energy")
    if getattr(args, "carbon_intensity", None) is not None and power is None:
        raise InputError("--carbon-intensity: prices the joules in grams CO2e; add --energy")
    if getattr(args, "edge_power", None):
        from groupfel.cost_models.power import build_server_power, read_power

        server = build_server_power(args.edge_power, read_power(args.profiles_file) if args.profiles_file else None,
                                    np.arange(1, m + 1), "--edge-power")
    # the groups the edge actually forms: m // s groups, the remainder spread (sizes s..s+1); sizes
    # asked for that form the same groups (60 clients at 16 and at 20: 3 groups of 20) are one row
    formed: dict[tuple[int, ...], int] = {}
    for s in df["group_size"]:
        sizes = tuple(len(p) for p in np.array_split(np.arange(m), max(m // int(s), 1)))
        formed.setdefault(sizes, int(s))
    rows = []
    for cap in caps:
        for sizes, s in formed.items():
            r = edge_makespan(list(sizes), n, prof.training[args.training], overhead, group_rounds=sc.group_rounds,
                              local_epochs=sc.local_epochs, model_bytes=int(args.model_mb * 1e6),
                              client_mbps=args.client_mbps, latency_s=args.latency_s, access_mbps=cap,
                              cores=args.edge_cores, edge_curves=curves, secagg="secagg" in op, operation=op,
                              power=power, server_power=server, carbon_intensity=getattr(args, "carbon_intensity", None))
            lo, hi = min(sizes), max(sizes)
            rows.append({"group_size": s, "edge_groups": len(sizes),
                         "edge_group_sizes": f"{lo}" if lo == hi else f"{lo}-{hi}",
                         "access_mbps": np.nan if cap is None else cap, "edge_cores": args.edge_cores, **r})
    extra = pd.DataFrame(rows)
    return extra.merge(df, on="group_size", how="left")


class _PolicyGrouper:
    """One edge's groups by a grouping policy (picklable, for the what-if's process pool)."""

    def __init__(self, policy):
        self.policy = policy

    def __call__(self, counts, rng):
        from groupfel.policies import EdgeView

        return self.policy.group(EdgeView(counts), rng).groups


def _whatif_grouped(args) -> int:
    """What-if over the groups a grouping policy builds, on a label matrix or Dirichlet(α) edges,
    against MinGS, MaxCoV and α (every combination of the values given)."""
    import itertools
    import os
    import time

    import numpy as np
    import pandas as pd

    from groupfel.cost_models.whatif import Scenario, dirichlet_label_counts, form_groups, grouped_costs, plot_grouped
    from groupfel.policies import samplings
    from groupfel.policies.cov import cov_of_counts

    from .group_cli import make_policy, read_label_matrix

    if not args.policy:
        raise InputError("whatif: --label-matrix/--alpha group clients with a policy; add --policy (e.g. covg)")
    if args.label_matrix and args.alpha:
        raise InputError("whatif: give --label-matrix or --alpha (generated Dirichlet edges), not both")
    prof, overhead = _whatif_curves(args)
    sampling = samplings.make(args.sampling, None, "--sampling") if args.sampling != "random" else None
    min_sizes = parse_sizes(args.min_group_size, "--min-group-size") if args.min_group_size else [None]
    max_covs = args.max_cov or [None]
    alphas = args.alpha or [None]
    grouping_policies = [make_policy(args.policy, g, c) for g, c in itertools.product(min_sizes, max_covs)]
    if args.label_matrix:
        counts, edges, _ = read_label_matrix(args.label_matrix)
        clients = len(counts)
    else:
        if args.clients % args.clients_per_edge:
            raise InputError(f"--clients-per-edge: {args.clients_per_edge} must divide --clients {args.clients}")
        clients = args.clients
        _check_memory(clients, 64 + 8 * args.labels)
        edges = np.arange(clients) // args.clients_per_edge
    smallest = int(np.bincount(edges)[np.unique(edges)].min())
    for policy in grouping_policies:
        if policy.min_group_size > smallest:
            raise InputError(f"--min-group-size: {policy.min_group_size} exceeds the {smallest} clients of "
                             f"the smallest edge; lower it")
    sc = Scenario(clients=clients, samples_mean=args.samples_mean, rounds=args.rounds,
                  group_rounds=args.group_rounds, local_epochs=args.local_epochs,
                  groups_per_round=args.groups_per_round, participation=args.participation, seed=args.seed)
    _check_whatif_curves(args, prof, overhead, np.arange(1, int(np.bincount(edges).max()) + 1),
                         counts.sum(axis=1) if args.label_matrix else sc.sample_counts())
    settings = len(alphas) * len(grouping_policies)
    _check_work(sc.rounds, [clients // max(p.min_group_size, 1) for p in grouping_policies] * len(alphas),
                f"{settings} setting(s)")
    jobs = args.jobs or len(os.sched_getaffinity(0))
    norm = getattr(grouping_policies[0], "normalization", "std")
    rows, t0 = [], time.perf_counter()
    for alpha in alphas:
        if alpha is not None:
            counts = dirichlet_label_counts(clients, args.labels, alpha, sc.sample_counts(), args.seed)
        for policy in grouping_policies:
            groups = form_groups(counts, edges, _PolicyGrouper(policy), args.seed, jobs)
            row = grouped_costs(groups, counts, overhead, prof.training[args.training], sc,
                                sampling.log_masses if sampling else None,
                                lambda sums: cov_of_counts(sums, norm))
            rows.append({"alpha": alpha, "min_group_size": policy.min_group_size,
                         "max_cov": getattr(policy, "max_cov", None), **row})
    elapsed = time.perf_counter() - t0
    df = pd.DataFrame(rows).dropna(axis=1, how="all")
    varied = [a for a, v in (("min_group_size", min_sizes), ("max_cov", max_covs), ("alpha", alphas)) if len(v) > 1]
    out = check_writable(args.out, "dir", "--out")
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "whatif.csv", index=False)
    source = args.label_matrix or f"Dirichlet edges of {args.clients_per_edge}"
    title = (f"{args.policy} on {source}; {clients} clients, {args.profile} + {args.training}, "
             f"{args.sampling} sampling, T={sc.rounds}")
    plot_grouped(df, varied[0] if varied else "min_group_size", out / "whatif.png", title)
    cols = [c for c in ("alpha", "min_group_size", "max_cov", "groups", "size_min", "size_mean", "size_max",
                        "cov_mean", "groups_per_round", "training_per_round", "operations_per_round",
                        "total_per_round", "operations_share") if c in df]
    print(df[cols].to_string(index=False, float_format=_number))
    print(f"\n{args.policy} grouped {clients} clients on {len(np.unique(edges))} edges, {len(df)} setting(s), "
          f"and priced {sc.rounds} rounds each in {elapsed:.2f} s")
    print(f"table: {out / 'whatif.csv'}\nplot:  {out / 'whatif.png'}")
    return 0


def register_whatif(sub: argparse._SubParsersAction) -> None:
    w = sub.add_parser("whatif", help="Eq. 5 cost per global round across group sizes (no training)")
    w.add_argument("--group-sizes", type=flags.SIZES, default="2..40", help="LO..HI[:STEP] or A,B,C (default 2..40)")
    w.add_argument("--profile", default="raspberry-pi-4/cifar10-resnet/secagg",
                   help="device/task/operation curve for O_g (default raspberry-pi-4/cifar10-resnet/secagg)")
    w.add_argument("--profiles-file", help="extra profile file (CSV or TOML) to look --profile up in")
    w.add_argument("--training", default="sgd", help="training method of the profile for H (default sgd)")
    w.add_argument("--clients", type=Number(int, 1, 10**12), default=10_000,   # beyond memory: _check_memory
                   help="number of clients (default 10000)")
    w.add_argument("--samples-mean", type=Number(float, 1, 10**6), default=50.0, help="mean samples per client, Poisson (default 50)")
    w.add_argument("--rounds", type=flags.ROUNDS, default=100, help="global rounds T (default 100)")
    w.add_argument("--group-rounds", type=Number(int, 1, 10**4), default=5, help="K (default 5)")
    w.add_argument("--local-epochs", type=Number(int, 1, 10**4), default=2, help="E (default 2)")
    w.add_argument("--groups-per-round", type=Number(int, 1, 10**8), help="S (default: groups holding --participation of clients)")
    w.add_argument("--participation", type=Number(float, 0, 1, open_lo=True), default=0.1, help="share of clients per round when S is unset (default 0.1)")
    w.add_argument("--seed", type=flags.SEED, default=0, help="seed of the sample counts and draws (default 0)")
    w.add_argument("--out", default="whatif", metavar="DIR", help="output directory (default whatif)")
    m = w.add_argument_group("round makespan of one shared edge (adds makespan_s and edge_cost columns)")
    m.add_argument("--access-mbps", type=flags.Number(float, 1e-6, 1e9, "Mbit/s", many=True), help="the edge's shared access capacity in Mbit/s, or several: 8,50,200 "
                   "(default: dedicated client links)")
    m.add_argument("--edge-cores", type=Number(int, 1, 10**6), help="the edge server's cores (default: unlimited)")
    m.add_argument("--edge-clients", type=Number(int, 1, EDGE_CLIENTS),
                   help=f"clients of the edge, all in sampled groups (default 60, or --clients where fewer; at most "
                   f"{EDGE_CLIENTS:,})")
    m.add_argument("--energy", action="store_true", help="add the edge's round energy in joules (edge_energy_j and "
                   "energy_<state>_j columns): the --profile device's power per state, from the shipped power "
                   "profile and --profiles-file's [[power]] tables")
    m.add_argument("--edge-power", metavar="DEVICE", help="with --energy: the edge server's device in the power "
                   "profiles (shipped: raspberry-pi-4-edge), adding its joules (edge_server_energy_j) and the "
                   "edge's total with its clients' (edge_total_energy_j)")
    m.add_argument("--carbon-intensity", type=Number(float, 0, 1e4, "g/kWh"), metavar="G_PER_KWH",
                   help="with --energy: the grid's carbon intensity, adding grams CO2e (carbon_g for the clients; "
                   "with --edge-power edge_server_carbon_g and edge_total_carbon_g)")
    m.add_argument("--edge-profile", help="DEVICE/TASK profile with the edge's aggregation and secagg-server "
                   "curves (default: aggregation takes no time)")
    m.add_argument("--model-mb", type=Number(float, 1e-6, 10**6, "MB"), default=1.0, help="model size in MB (10^6 bytes; default 1)")
    m.add_argument("--client-mbps", type=flags.MBPS, default=20.0, help="each client's own link, Mbit/s (default 20)")
    m.add_argument("--latency-s", type=flags.LATENCY, default=0.02, help="each client's latency (default 0.02)")
    g = w.add_argument_group("with a grouping policy (instead of random groups of each --group-sizes)")
    g.add_argument("--policy", help="grouping policy that forms the groups: covg, rg, cdg, kldg, qcid, fedcollab")
    g.add_argument("--label-matrix", metavar="FILE.csv", help="clients × labels counts (optional 'edge' column)")
    g.add_argument("--alpha", type=Number(float, 1e-3, 1e6, many=True), help="generate Dirichlet(α) label counts instead: α values, e.g. 0.1,1")
    g.add_argument("--clients-per-edge", type=Number(int, 1, 10**8), default=1000, help="with --alpha (default 1000)")
    g.add_argument("--labels", type=Number(int, 2, 10**4), default=10, help="with --alpha: number of labels (default 10)")
    g.add_argument("--min-group-size", type=flags.SIZES, help="MinGS values: LO..HI[:STEP] or A,B,C (default: the policy's)")
    g.add_argument("--max-cov", type=Number(float, 0, 1e3, open_lo=True, many=True), help="MaxCoV values, e.g. 0.3,0.5,1 (covg; default: the policy's)")
    g.add_argument("--sampling", default="random", help="sampling policy drawing the groups (default random)")
    g.add_argument("--jobs", type=flags.JOBS, help="processes grouping the edges (default: one per core)")
    w.set_defaults(func=_cmd_whatif)


def whatif_values(**values):
    """The what-if's numbers given to the Python API, checked by the same types as its flags:
    one line naming the argument and its range."""
    parser = argparse.ArgumentParser()
    register_whatif(parser.add_subparsers())
    actions = {a.dest: a for a in parser._subparsers._group_actions[0].choices["whatif"]._actions}
    out = {}
    for name, v in values.items():
        kind = actions[name].type
        if v is None or not isinstance(kind, Number):
            out[name] = v
            continue
        text = ",".join(str(x) for x in v) if kind.many and isinstance(v, (list, tuple)) else str(v)
        try:
            out[name] = kind(text)
        except argparse.ArgumentTypeError as exc:
            raise InputError(f"{name}: {exc}") from None
    return out


def _cmd_timeline(args) -> int:
    from .plots import ACCOUNTING
    from .timeline import (battery_events, energy_accounting, energy_per_client, load_energy, load_network, load_round,
                           plot_timeline, site_energy, summary)

    arm_dir = Path(args.arm_dir)
    rows = load_round(arm_dir, args.round)
    out = check_writable(args.out or arm_dir / f"timeline-round{args.round}.png", "file", "--out")
    network = load_network(arm_dir, args.round)
    plot_timeline(rows, out, f"{arm_dir.name}: global round {args.round}", network)
    print(summary(rows).to_string(index=False, float_format=_number))
    print(f"\nround {args.round}: charged work spans {rows['start'].min():.4g}..{rows['end'].max():.4g} s "
          f"(simulated); Eq. 5 cost {rows['amount'].sum():.6g}")
    if network is not None and len(network):
        cores = network[network["kind"] == "core"]
        moved = network.groupby("kind")["bytes"].sum()
        print(f"transfers: {int(moved.get('download', 0)):,} bytes down, {int(moved.get('upload', 0)):,} up; "
              f"groups waited {float((cores['start'] - cores['queued']).sum()):.4g} s for edge cores")
    events = battery_events(arm_dir, args.round)
    if events:
        print("batteries: " + "; ".join(f"client {e['client']} {e['event']} at {e['time_s']:.6g} s" for e in events))
    energy = load_energy(arm_dir, args.round)
    if energy is None:
        print("energy: not measured (the run had no cost.energy)")
    else:
        per = energy_per_client(energy)
        acc = energy_accounting(arm_dir)
        print(f"\nenergy per client in round {args.round} (J; power × simulated seconds in each state; "
              f"{acc} accounting: {ACCOUNTING.get(acc, acc)}"
              f"{'; idle_between_j: idle outside its group rounds' if 'idle_between_j' in per else ''}):")
        print(per.to_string(index=False, float_format=_number))
        print(f"round {args.round}: {per['total_j'].sum():.6g} J over {len(per)} clients")
        sites = site_energy(arm_dir, args.round)
        if sites is not None and len(sites):
            print(f"\nedge servers and the cloud in round {args.round} (J, {acc} accounting; edge -1: the cloud):")
            print(sites.to_string(index=False, float_format=_number))
    print(f"plot: {out}")
    return 0


def register_timeline(sub: argparse._SubParsersAction) -> None:
    t = sub.add_parser("timeline", help="Gantt chart of one global round from RUN_DIR/ARM/ledger.parquet")
    t.add_argument("arm_dir", metavar="RUN_DIR/ARM")
    t.add_argument("--round", type=flags.ROUNDS, default=1, help="global round, numbered from 1 as in results.csv (default 1)")
    t.add_argument("--out", metavar="FILE.png", help="default RUN_DIR/ARM/timeline-roundN.png")
    t.set_defaults(func=_cmd_timeline)
