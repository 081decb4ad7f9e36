"""The ``tcmlir`` command: run, tune, profile and dump TC definitions; manage the cache.

    tcmlir run FILE [--name E] [--sizes M=512,...] [--target T] [--check] [--options O]
    tcmlir tune FILE [--name E] --sizes ... [--target T] [--generations G] [--population P]
    tcmlir profile FILE [--name E] [--sizes ...] [--target T] [--options O] [--json]
    tcmlir dump FILE [--name E] [--sizes ...] [--target T] [--stage S] [--options O]
    tcmlir cache ls|show KEY|stats|export FILE|import FILE|prune|clear [--path P]
    tcmlir examples

Argument handling is shared (`tcmlir.cli_args`): FILE is a file, ``-`` or a shipped example's
name; ``--options`` a preset, JSON or a file. Errors print ``tcmlir: error: ...``; exit status
0 done, 1 a ``--check`` mismatch, 2 a user error (never a traceback), 130 interrupted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import ir
from .cli_args import (
    EXIT_CHECK,
    EXIT_OK,
    PRESETS,
    CommandParser,
    add_definition_args,
    file_error,
    parse_options,
    parse_sizes,
    positive_int,
    read_source,
    read_source_file,
    run_command,
    shipped_examples,
)
from .cli_inputs import (
    complete_sizes,
    definition_and_inputs,
    file_sizes,
    gather_index_bounds,
    load_definition,
    random_inputs,
)
from .errors import TCError

__all__ = ["build_parser", "complete_sizes", "definition_and_inputs", "file_error", "file_sizes",
           "gather_index_bounds", "load_definition", "main", "parse_sizes", "positive_int",
           "random_inputs", "read_source", "read_source_file", "reference_outputs",
           "shipped_examples"]

#: Statement instances above which `run --check` announces the reference's cost and shows
#: its progress: some 10 s of the numpy interpreter, which ran 1-2.5·10^8 instances a second of
#: matmul and convolution on a 2-core host (`REFERENCE_RATE`, the low end, for the estimate).
CHECK_NOTICE_INSTANCES = 10**9
REFERENCE_RATE = 10**8


def _run_options(args: argparse.Namespace, fn: Any, inputs: Sequence[Any]) -> tuple[Any, str]:
    """The options ``--options`` / ``--from-cache`` ask for (None: the default ones) and how to
    describe them."""
    from .options import MappingOptions

    if args.options is not None:
        options = parse_options(args.options)
        inline = args.options.lstrip().startswith("{")
        return options, ("given with --options" if inline else f"the preset {args.options}"
                         if args.options in PRESETS else f"from {args.options}")
    if args.from_cache is None:
        return None, "default"
    from .tune.autotune import open_cache

    if args.from_cache is not True and not Path(args.from_cache).is_file():
        raise file_error(args.from_cache, FileNotFoundError())
    store = open_cache(args.from_cache)
    record = store.lookup_record(fn, *inputs, exact=True)
    how = "tuned for these sizes"
    if record is None:
        record = store.lookup_record(fn, *inputs, exact=False)
        how = "tuned for the nearest size"
    if record is None:
        sizes = ",".join(f"{k}={v}" for k, v in fn.size_values(*inputs).items())
        raise TCError(f"--from-cache: no tuned options for {fn.entry} in {store.path}; tune "
                      f"them first: tcmlir tune {args.file} --name {fn.entry} --sizes {sizes}")
    tuned_at = ",".join(f"{k}={v}" for k, v in record.sizes.items())
    return (MappingOptions.from_json(record.options_json),
            f"{how} ({tuned_at}, {record.time_s * 1e3:.4f} ms when tuned) from {store.path}")


def _to_host(x: Any) -> np.ndarray:
    if hasattr(x, "get"):
        x = x.get()
    if type(x).__module__.split(".")[0] == "torch":
        x = x.cpu().numpy()
    return np.asarray(x)


def _cmd_run(args: argparse.Namespace) -> int:
    from . import api

    fn, sizes, inputs = definition_and_inputs(args)
    target = api.resolve_target(args.target)
    if args.check and target == "numpy":
        print("note: --check compares with the numpy reference interpreter, which is what "
              "--target numpy runs: there is nothing to check", file=sys.stderr)
    instances = ir.instance_count(fn.ir, sizes)
    long_check = args.check and target != "numpy" and instances > CHECK_NOTICE_INSTANCES
    if long_check:
        print(f"note: --check runs the numpy reference interpreter over {instances:.3g} "
              f"statement instances, about {_duration(instances / REFERENCE_RATE)} "
              "(smaller --sizes check faster)", file=sys.stderr)
    options, described = _run_options(args, fn, inputs)
    t0 = time.perf_counter()
    kernel = fn.compile(*inputs, options=options, target=target)
    compile_s = time.perf_counter() - t0
    times = []
    result = None
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        result = kernel.launch(*inputs)
        times.append(time.perf_counter() - t0)
    outs = result if isinstance(result, tuple) else (result,)
    print(f"{fn.entry} on {_describe_target(target)}: sizes "
          f"{', '.join(f'{k}={v}' for k, v in sizes.items())}")
    print(f"  options: {described}: {kernel.options.to_json()}")
    print(f"  compile {compile_s * 1e3:.1f} ms, run median {statistics.median(times) * 1e3:.3f} ms "
          f"over {len(times)} run(s)")
    for t, o in zip(fn.ir.outputs, outs, strict=True):
        host = _to_host(o)
        print(f"  output {t.name}: shape {host.shape} dtype {host.dtype} "
              f"checksum {float(np.sum(host.astype(np.float64))):.6g}")
    if not args.check or target == "numpy":
        return 0
    refs = reference_outputs(fn.ir, inputs, sizes, progress=long_check, total=instances)
    worst = max((_relative_error(_to_host(o), np.asarray(r)) for o, r in zip(outs, refs,
                                                                              strict=True)),
                default=0.0)
    ok = worst <= 1e-4
    print(f"  check against the numpy reference: max relative error {worst:.2e} "
          f"{'OK' if ok else 'MISMATCH'}")
    return EXIT_OK if ok else EXIT_CHECK


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} minutes"


def reference_outputs(fn_ir: ir.Function, inputs: Sequence[np.ndarray], sizes: dict[str, int],
                      *, progress: bool = False, total: int = 0) -> list[np.ndarray]:
    """The reference interpreter's outputs on host ``inputs``, with a tqdm bar over ``total``
    statement instances when ``progress``."""
    from .reference import run

    arrays = {t.name: np.asarray(x) for t, x in zip(fn_ir.inputs, inputs, strict=True)}
    if not progress:
        return list(run(fn_ir, arrays, sizes).values())
    from tqdm.auto import tqdm

    with tqdm(total=total, desc="reference check", unit=" instances", unit_scale=True,
              file=sys.stderr) as bar:
        return list(run(fn_ir, arrays, sizes, progress=bar.update).values())


def _relative_error(out: np.ndarray, ref: np.ndarray) -> float:
    """Max error relative to the reference's magnitude (at least 1); inf for a shape
    mismatch or a non-finite value where the reference has another."""
    o64, r64 = out.astype(np.float64), ref.astype(np.float64)
    if o64.shape != r64.shape:
        return float("inf")
    finite = np.isfinite(r64)
    # a non-finite value must be the same one (NaN where NaN): else the error is inf
    same = (o64 == r64) | (np.isnan(o64) & np.isnan(r64))
    if not np.all(same[~finite]) or not np.all(np.isfinite(o64[finite])):
        return float("inf")
    if not finite.any():
        return 0.0
    scale = max(1.0, float(np.max(np.abs(r64[finite]))))
    return float(np.max(np.abs(o64[finite] - r64[finite]))) / scale


def _describe_target(target: str) -> str:
    if target == "cuda":
        from .runtime.cuda import get_runtime

        dev = get_runtime().device(0)
        return f"cuda ({dev.name}, {dev.arch})"
    if target == "cpu":
        from .runtime.host_arch import host_arch

        return f"cpu ({host_arch()}, LLVM JIT)"
    return "numpy (reference interpreter)"


def _cmd_examples(args: argparse.Namespace) -> int:
    from .lang import parse

    examples = shipped_examples()
    if not examples:
        raise TCError("tcmlir examples: none are installed (an old or broken install: "
                      "reinstall tcmlir, e.g. pip install -e . in a checkout)")
    print(f"# {len(examples)} examples in {next(iter(examples.values())).parent}")
    for name, path in examples.items():
        text = path.read_text(encoding="utf-8")
        defs = ", ".join(d.name.name for d in parse(text, str(path)).defs)
        first = next((ln.lstrip("# ").strip() for ln in text.splitlines()
                      if ln.startswith("#")), "")
        print(f"{name}\t{defs}\t{first.split('. ')[0].removesuffix('.')}")
    shown = "matmul" if "matmul" in examples else next(iter(examples))
    print(f"# run one from any directory: tcmlir run {shown} --check "
          f"(--name E picks the def of a file with several)")
    return 0


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    from . import __version__

    parts = []
    for dist in ("llvmlite", "islpy", "numpy"):
        try:
            parts.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            parts.append(f"{dist} missing")
    return f"tcmlir {__version__} ({', '.join(parts)}, Python {sys.version.split()[0]})"


EPILOG = """\
FILE is a .tc file, '-' (stdin) or the name of a shipped example (tcmlir run matmul --check).
--options takes a preset (naive, pointwise, mlp, convolution, group_convolution), a JSON
object, or a file holding one. `tcmlir COMMAND --help` describes every option.

exit status: 0 done, 1 a --check mismatch, 2 a user error (tcmlir: error: ...), 130 interrupted.
"""


def build_parser() -> argparse.ArgumentParser:
    """The ``tcmlir`` argument parser with every subcommand."""
    parser = CommandParser(
        prog="tcmlir", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Compile tensor math written in Tensor Comprehension notation into GPU "
                    "and CPU kernels.")
    parser.add_argument("--version", action="version", version=_version(),
                        help="print the versions of tcmlir, llvmlite, islpy, numpy and Python")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser("run", help="compile a TC definition and run it on random inputs",
                         description="Compile a TC definition, run it on random inputs and "
                                     "print the options, times and output checksums.")
    add_definition_args(run, targets=("auto", "cuda", "cpu", "numpy"))
    run.add_argument("--repeat", type=positive_int, default=5, metavar="R",
                     help="timed runs, at least 1 (the median is printed; default 5)")
    run.add_argument("--seed", type=int, default=0, metavar="S",
                     help="seed of the random inputs (default 0)")
    run.add_argument("--check", action="store_true",
                     help="compare the outputs with the numpy reference interpreter (exit "
                          "status 1 when they differ)")
    chosen = run.add_mutually_exclusive_group()
    chosen.add_argument("--options", default=None, metavar="O",
                        help="mapping options: a preset (naive, pointwise, mlp, convolution, "
                             "group_convolution), a JSON object, or a file holding one (as "
                             "`tcmlir tune` prints); default: a call's default options")
    chosen.add_argument("--from-cache", nargs="?", const=True, default=None, metavar="DB",
                        help="run with the options tuned for these sizes (else the nearest "
                             "size) in the cache (default: the user's; or the database DB)")
    run.set_defaults(func=_cmd_run)
    from .tune.cli import add_commands

    add_commands(sub)
    from .profile.cli import add_profile_command

    add_profile_command(sub)
    from .dump import add_dump_command

    add_dump_command(sub)
    examples = sub.add_parser("examples", help="list the example TC files shipped with tcmlir",
                              description="List the example TC files shipped with tcmlir: "
                                          "each can be named instead of a FILE.")
    examples.set_defaults(func=_cmd_examples)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``tcmlir`` command on ``argv`` (default: ``sys.argv[1:]``); returns the exit
    status: 0 done, 1 a ``--check`` mismatch, 2 a user error, 130 interrupted."""
    return run_command(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
