"""``groupfel reproduce``: run a paper's table or figure (:mod:`groupfel.experiments.reproduce`) or
render the reproductions README from the committed results (:mod:`groupfel.experiments.readme_render`)."""
from __future__ import annotations

from groupfel.errors import InputError

from . import flags, reproduce


def _cmd_reproduce(args) -> int:
    if args.render:
        from . import readme_render   # pandas: only when rendering

        print(readme_render.write())
        return 0
    if args.list or not args.name:
        if not args.list:
            raise InputError(f"reproduce: give NAME or --list; names: {', '.join(reproduce.names())}")
        print(reproduce.list_table())
        return 0
    overrides = reproduce.parse_overrides(args.set)
    if args.device is not None:
        from groupfel.emulator.devices import check

        overrides["train.device"] = check(args.device, "--device")
    from .track import from_args

    return reproduce.run(args.name, quick=args.quick, backend=args.backend, jobs=args.jobs, output=args.output,
                         data_path=args.data_path, progress=not args.quiet, overrides=overrides,
                         stack=args.stack, track=from_args(args))


def add_reproduce_parser(sub) -> None:
    p = sub.add_parser("reproduce", help="reproduce a paper's table or figure, ours beside the paper's numbers")
    p.add_argument("name", nargs="?", metavar="NAME", help="a reproduction (see --list)")
    p.add_argument("--list", action="store_true", help="list every reproduction: paper, table/figure, data")
    p.add_argument("--quick", action="store_true", help="scaled down to minutes on 2 cores (not the paper's setting)")
    p.add_argument("--backend", default="local", choices=["local", "ray"], help="where the runs go (default local)")
    p.add_argument("--jobs", type=flags.JOBS, help="parallel runs (default: one per core)")
    p.add_argument("--output", metavar="DIR", help="default results/reproductions/NAME[-quick]")
    p.add_argument("--data-path", metavar="DIR",
                   help="the paper's dataset (CIFAR-10 / Speech Commands directory) instead of the stand-in")
    p.add_argument("--set", action="append", metavar="PATH=VALUE",
                   help="change a setting of every run (e.g. train.model=mlp where the paper's model is "
                        "too slow); repeatable; NOTES.txt and the output list each change")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    from .backends import add_device_argument, add_stack_argument

    add_device_argument(p)
    add_stack_argument(p)
    from .track import add_track_arguments

    add_track_arguments(p)
    p.add_argument("--render", action="store_true",
                   help="rewrite experiments/reproductions/README.md from its template and the committed results")
    p.set_defaults(func=_cmd_reproduce)
