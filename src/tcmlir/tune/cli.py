"""The ``tcmlir tune`` and ``tcmlir cache`` commands (registered by `tcmlir.cli`).

    tcmlir tune FILE --name E --sizes M=..,N=.. [--target cpu|cuda] [--generations G]
                [--population P] [--seed S] [--devices 0,1] [--cache PATH] [--no-progress]
                [--backend local|ray] [--ray-address ADDRESS]
    tcmlir cache ls|show KEY|stats|export FILE|import FILE|prune|clear [--path P]  (`cache.cli`)

``tune`` prints the best options' JSON, and on stderr their median time against the default
options' (what a call without options uses, re-measured beside the finalists: the best is never
slower than it) and the naive options'. ``--target cuda`` fails at
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
    from ..cli_args import add_definition_args, positive_int

    tune = sub.add_parser("tune", help="autotune a TC definition's mapping options",
                          description="Search the mapping options of a TC definition with the "
                                      "genetic tuner (every candidate checked against the "
                                      "reference), store the best in the cache and print it "
                                      "as JSON.")
    add_definition_args(tune, targets=("auto", "cuda", "cpu"), sizes_required=True, what="tune",
                        sizes_help="the value of every size (required: options are tuned per "
                                   "size), e.g. M=512,K=512,N=512")
    tune.add_argument("--generations", type=positive_int, default=None, metavar="G",
                      help="generations of the genetic search (default: TunerConfig's, 2)")
    tune.add_argument("--population", type=positive_int, default=None, metavar="P",
                      help="candidates per generation (default: TunerConfig's, 10)")
    tune.add_argument("--seed", type=int, default=None, metavar="S",
                      help="seed of the search (default: TunerConfig's)")
    tune.add_argument("--devices", default=None, metavar="0,1",
                      help="GPU ordinals to tune on, one worker each (cuda only)")
    tune.add_argument("--cache", default=None, metavar="PATH",
                      help="cache database (default: TCMLIR_CACHE_DIR or the user cache dir)")
    tune.add_argument("--no-progress", action="store_true", help="no progress bar")
    tune.add_argument("--backend", default="local", choices=["local", "ray"],
                      help="where candidates run: this machine's worker processes, or a Ray "
                           "cluster (pip install 'tcmlir[ray]')")
    tune.add_argument("--ray-address", default=None,
                      help="the Ray cluster to join (default: RAY_ADDRESS, else a local one)")
    tune.set_defaults(func=_cmd_tune)

    from ..cache.cli import add_cache_command

    add_cache_command(sub)


def _cmd_tune(args: argparse.Namespace) -> int:
    from .. import api
    from ..cli_inputs import load_definition, random_inputs
    from ..interrupt import stop_on_interrupt
    from ..options import MappingOptions
    from .autotune import open_cache, tune
    from .config import TunerConfig

    fn, sizes = load_definition(args)
    missing = [s for s in fn.ir.sizes if s not in sizes]
    if missing:
        raise TCError(f"--sizes: {fn.entry} has the sizes {', '.join(fn.ir.sizes)}; "
                      f"give a value for {', '.join(missing)}")
    from ..cli_args import parse_devices

    devices = parse_devices(args.devices)
    fields = {k: v for k, v in (("generations", args.generations),
                                ("population", args.population), ("seed", args.seed)) if v is not None}
    config = TunerConfig(**fields, devices=devices, backend=args.backend,
                         address=args.ray_address)
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
    # the side-by-side re-measurement of the finalists and the default decided: its figures
    final = {e.options.to_json(): e for e in result.final if e.ok}
    for what, opts in compared:
        ev = final.get(opts.to_json()) or result.evaluated.get(opts.to_json())
        if ev is None:
            line += f", {what} not measured"
        elif not ev.ok:
            line += f", {what} failed ({ev.error})"
        else:
            line += f", {what} {ev.time_s * 1e3:.4f} ms ({ev.time_s / best.time_s:.2f}x)"
    if final:
        line += (f"; the finalists and the default re-measured side by side ({best.runs} "
                 f"samples each, best's spread {(best.spread_s or 0) * 1e3:.4f} ms)")
    line += (f"; {len(result.evaluated)} candidates in {result.generations_run} generation(s)"
             f"{' (interrupted)' if result.interrupted else ''}, checked against the "
             f"{result.reference}, {result.stats.get('wrong', 0)} rejected as wrong, "
             f"{result.stats.get('pruned', 0)} pruned by the cost model without compiling; "
             f"stored in {store.path}")
    print(line, file=sys.stderr)
    return 0
