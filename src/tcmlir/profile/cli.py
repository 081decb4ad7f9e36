"""``tcmlir profile FILE --name E --sizes ... [--options ...] [--devices 0,1] [--plot PNG] [--json]``.

Profiles one call of a TC definition on random inputs (the same ones ``tcmlir run`` makes) and
prints the profile's table and advice, or its ``to_dict()`` as JSON. ``--options`` takes a
preset name (naive, pointwise, mlp, convolution, group_convolution), MappingOptions JSON, or
the path of a file holding that JSON. ``--ncu`` (cuda, with ``ncu`` on the PATH) runs the call
again under Nsight Compute and merges its measured DRAM bytes and achieved occupancy.
``--devices 0,1`` profiles the call split across those GPUs (`split_profile`).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..errors import TCError

__all__ = ["add_profile_command"]

def add_profile_command(sub: Any) -> None:
    from ..cli_args import add_definition_args, positive_int

    p = sub.add_parser("profile", help="profile a call: time, exact work, roofline, advice",
                       description="Profile one call of a TC definition on random inputs: "
                                   "median times, exact work counted with isl, the roofline "
                                   "and advice.")
    add_definition_args(p, targets=("auto", "cuda", "cpu", "numpy"), what="profile")
    p.add_argument("--options", default=None, metavar="O",
                   help="mapping options: a preset (naive, pointwise, mlp, convolution, "
                        "group_convolution), a JSON object, or a file holding one")
    p.add_argument("--runs", type=positive_int, default=20, metavar="R",
                   help="timed runs (medians reported; default 20)")
    p.add_argument("--seed", type=int, default=0, metavar="S",
                   help="seed of the random inputs (default 0)")
    p.add_argument("--plot", default=None, metavar="PNG", help="write the roofline picture here")
    p.add_argument("--json", action="store_true", help="print the profile as JSON")
    p.add_argument("--devices", default=None, metavar="0,1",
                   help="profile the call split across these GPU ordinals (tcmlir.multi): "
                        "each part's copies in and out and its kernels")
    p.add_argument("--ncu", action="store_true",
                   help="also run under Nsight Compute (ncu) and merge its DRAM bytes and "
                        "achieved occupancy (cuda)")
    p.set_defaults(func=_cmd_profile)


def _cmd_profile(args: argparse.Namespace) -> int:
    from ..cli_inputs import definition_and_inputs

    if args.ncu and args.options:
        raise TCError("--ncu runs the call again through `tcmlir run`, which takes the default "
                      "options: use --ncu without --options")
    from ..cli_args import parse_devices

    devices = parse_devices(args.devices)
    if args.ncu and devices is not None:
        raise TCError("--ncu runs the call again through `tcmlir run`, on one device: use "
                      "--ncu without --devices")
    from ..cli_args import sizes_line

    fn, sizes, inputs = definition_and_inputs(args, "profile")
    args.sizes = sizes_line(sizes)  # what --ncu's `tcmlir run` gets: the completed sizes
    from ..cli_args import parse_options

    options = parse_options(args.options)
    prof = fn.profile(*inputs, options=options, runs=args.runs, devices=devices)
    if args.ncu:
        from .ncu import merge_ncu

        merge_ncu(prof, args)
    if args.plot:
        from .plot import plot_roofline

        plot_roofline(prof, args.plot)
    if args.json:
        print(json.dumps(prof.to_dict(), indent=1))
    else:
        print(prof)
        if args.plot:
            print(f"\nroofline written to {args.plot}")
    return 0
