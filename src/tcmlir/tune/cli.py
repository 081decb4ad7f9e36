"""The ``tcmlir tune`` and ``tcmlir cache`` commands (registered by `tcmlir.cli`).

    tcmlir tune FILE --name E --sizes M=..,N=.. [--target cpu|cuda] [--generations G]
                [--population P] [--seed S] [--devices 0,1] [--cache PATH] [--no-progress]
    tcmlir cache ls|show KEY|stats|export FILE|import FILE|prune|clear [--path P]  (`cache.cli`)

``tune`` prints the best options' JSON, and on stderr their median time against the default
options' (what a call without options uses) and the naive options'. ``--target cuda`` fails at
once when no GPU is usable.
Mistakes raise `TCError`, which `tcmlir.cli.main` prints and turns into exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..errors import TCError

__all__ = ["add_commands"]


def add_commands(sub: Any) -> None:
    """Register ``tune`` and ``cache`` on the ``tcmlir`` subparsers ``sub``."""
    from ..cli import positive_int

    tune = sub.add_parser("tune", help="autotune a TC definition's mapping options")
    tune.add_argument("file")
    tune.add_argument("--name", default=None, help="the def to tune (optional with one def)")
    tune.add_argument("--sizes", required=True, help="size values, e.g. M=512,N=512,K=512")
    tune.add_argument("--target", default="auto", choices=["auto", "cuda", "cpu"])
    tune.add_argument("--generations", type=positive_int, default=None)
    tune.add_argument("--population", type=positive_int, default=None)
    tune.add_argument("--seed", type=int, default=None)
    tune.add_argument("--devices", default=None, help="GPU ordinals, e.g. 0,1 (cuda only)")
    tune.add_argument("--cache", default=None,
                      help="cache database (default: TCMLIR_CACHE_DIR or the user cache dir)")
    tune.add_argument("--no-progress", action="store_true", help="no progress bar")
    tune.set_defaults(func=_cmd_tune)

    from ..cache.cli import add_cache_command

    add_cache_command(sub)


def _cmd_tune(args: argparse.Namespace) -> int:
    from .. import api
    from ..cli import load_definition, random_inputs
    from ..interrupt import stop_on_interrupt
    from ..options import MappingOptions
    from .autotune import open_cache, tune
    from .config import TunerConfig

    fn, sizes = load_definition(args)
    missing = [s for s in fn.ir.sizes if s not in sizes]
    if missing:
        raise TCError(f"--sizes: {fn.entry} has the sizes {', '.join(fn.ir.sizes)}; "
                      f"give a value for {', '.join(missing)}")
    devices = None
    if args.devices:
        try:
            devices = tuple(int(d) for d in args.devices.split(","))
        except ValueError:
            raise TCError(f"--devices: expected GPU ordinals like 0,1, got {args.devices!r}") from None
    fields = {k: v for k, v in (("generations", args.generations),
                                ("population", args.population), ("seed", args.seed)) if v is not None}
    config = TunerConfig(**fields, devices=devices)
    inputs = random_inputs(fn.ir, sizes)
    target = api.resolve_target(args.target)
    with stop_on_interrupt():  # Ctrl-C from here on stops the tuning with the best so far
        store = open_cache(args.cache if args.cache else True)
        result = tune(fn, inputs, config=config, cache=store, target=target,
                      progress=not args.no_progress)
    best = result.best
    print(best.options.to_json())
    line = f"{fn.entry} on {target}: best {best.time_s * 1e3:.4f} ms"
    # the figure that matters: against what a call without options runs; naive for reference
    default, naive = MappingOptions.default_for(fn.ir, target, sizes), MappingOptions.naive()
    compared = ([("default options", default), ("naive", naive)] if default != naive
                else [("default (naive) options", default)])
    for what, opts in compared:
        ev = result.evaluated.get(opts.to_json())
        if ev is None:
            line += f", {what} not measured"
        elif not ev.ok:
            line += f", {what} failed ({ev.error})"
        else:
            line += f", {what} {ev.time_s * 1e3:.4f} ms ({ev.time_s / best.time_s:.2f}x)"
    line += (f"; {len(result.evaluated)} candidates in {result.generations_run} generation(s)"
             f"{' (interrupted)' if result.interrupted else ''}, checked against the "
             f"{result.reference}, {result.stats.get('wrong', 0)} rejected as wrong; "
             f"stored in {store.path}")
    print(line, file=sys.stderr)
    return 0
