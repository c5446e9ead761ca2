"""``groupfel study fig5|fig6|fig7``: the grouping studies of :mod:`groupfel.experiments.grouping_studies`.

The parser lives here, apart from the studies, so that building it imports no plotting or pandas.
"""
from __future__ import annotations

from groupfel.emulator.io import check_writable

from . import flags

STUDIES = {"fig5": "grouping runtime", "fig6": "CoV vs overhead", "fig7": "group make-up"}


def _cmd_study(args) -> int:
    from . import grouping_studies

    out = check_writable(args.out, "dir", "--out")
    kwargs = {"seed": args.seed}
    if args.name == "fig5":
        kwargs["max_clients"] = args.max_clients
    df = getattr(grouping_studies, args.name)(out, **kwargs)
    print(df.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print(f"\nwrote {out / (args.name + '.csv')} and {out / (args.name + '.png')}")
    return 0


def add_study_parser(sub) -> None:
    p = sub.add_parser("study", help="grouping studies of the Group-FEL paper (Figs. 5-7): CSV + PNG")
    p.add_argument("name", choices=sorted(STUDIES), help=", ".join(f"{k} {v}" for k, v in STUDIES.items()))
    p.add_argument("--out", required=True, metavar="DIR", help="output directory")
    p.add_argument("--max-clients", type=flags.Number(int, 100, 10**4), default=10000,
                   help="fig5: largest edge size timed, of 100, 300, 1000, 3000, 10000 (default 10000)")
    p.add_argument("--seed", type=flags.SEED, default=0, help="default 0")
    p.set_defaults(func=_cmd_study)
