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
import os
from typing import Any

from ..errors import TCError

__all__ = ["add_profile_command", "parse_options"]

_PRESETS = ("naive", "pointwise", "mlp", "convolution", "group_convolution")


def add_profile_command(sub: Any) -> None:
    p = sub.add_parser("profile", help="profile a call: time, exact work, roofline, advice")
    p.add_argument("file")
    p.add_argument("--name", default=None, help="the def to profile (optional with one def)")
    p.add_argument("--sizes", default=None, help="size values, e.g. M=512,N=512,K=512")
    p.add_argument("--target", default="auto", choices=["auto", "cuda", "cpu", "numpy"])
    p.add_argument("--options", default=None,
                   help=f"a preset ({', '.join(_PRESETS)}), MappingOptions JSON, or a JSON file")
    p.add_argument("--runs", type=int, default=20, help="timed runs (medians reported)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", default=None, metavar="PNG", help="write the roofline picture here")
    p.add_argument("--json", action="store_true", help="print the profile as JSON")
    p.add_argument("--devices", default=None, metavar="0,1",
                   help="profile the call split across these GPU ordinals (tcmlir.multi): "
                        "each part's copies in and out and its kernels")
    p.add_argument("--ncu", action="store_true",
                   help="also run under Nsight Compute (ncu) and merge its DRAM bytes and "
                        "achieved occupancy (cuda)")
    p.set_defaults(func=_cmd_profile)


def parse_options(text: str | None) -> Any:
    """``--options``: None, a preset name, MappingOptions JSON, or a file of it."""
    from ..errors import OptionsError
    from ..options import MappingOptions

    if not text:
        return None
    if text in _PRESETS:
        return getattr(MappingOptions, text)()
    if os.path.isfile(text):
        with open(text, encoding="utf-8") as f:
            text = f.read()
    try:
        return MappingOptions.from_json(text)
    except (OptionsError, ValueError, TypeError) as exc:
        raise TCError(f"--options: expected a preset ({', '.join(_PRESETS)}), MappingOptions "
                      f"JSON or a file of it; {exc}") from None


def _parse_devices(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        devices = tuple(int(d) for d in text.split(","))
    except ValueError:
        devices = ()
    if not devices or min(devices) < 0:
        raise TCError(f"--devices: expected GPU ordinals like 0,1, got {text!r}")
    return devices


def _cmd_profile(args: argparse.Namespace) -> int:
    from ..cli import definition_and_inputs

    if args.ncu and args.options:
        raise TCError("--ncu runs the call again through `tcmlir run`, which takes the default "
                      "options: use --ncu without --options")
    devices = _parse_devices(args.devices)
    if args.ncu and devices is not None:
        raise TCError("--ncu runs the call again through `tcmlir run`, on one device: use "
                      "--ncu without --devices")
    fn, _sizes, inputs = definition_and_inputs(args)
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
