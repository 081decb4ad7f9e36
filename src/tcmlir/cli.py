"""The ``tcmlir`` command: run a TC file (the README's main job), tune it, manage the cache.

    tcmlir --version
    tcmlir run FILE [--name E] [--sizes M=512,N=512] [--target auto|cuda|cpu|numpy] [--check]
               [--options FILE_OR_JSON | --from-cache [DB]] [--repeat R] [--seed S]
    tcmlir tune FILE --name E --sizes ... [--generations G --population P]
    tcmlir cache ls|show KEY|stats|export FILE|import FILE|prune|clear
    tcmlir examples
    tcmlir profile FILE --name E --sizes ... [--options ...] [--plot roofline.png] [--json]

FILE may also name a shipped example (``tcmlir run matmul``; ``tcmlir examples`` lists them).
User mistakes print a located message and exit with status 2, never a traceback; a file that
cannot be read is reported the same way by every command (`file_error`); Ctrl-C exits 130.
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
from .errors import TCError

__all__ = ["build_parser", "file_error", "gather_index_bounds", "load_definition", "main",
           "parse_sizes", "random_inputs", "read_source", "shipped_examples"]

DEFAULT_SIZE = 128
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for Ctrl-C


def parse_sizes(text: str | None) -> dict[str, int]:
    """``M=512,N=64`` → {"M": 512, "N": 64}; TCError on malformed text or a name given twice."""
    sizes: dict[str, int] = {}
    if not text:
        return sizes
    for item in text.split(","):
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name.isidentifier() or not value.lstrip("-").isdigit():
            raise TCError(f"--sizes: expected NAME=INTEGER items separated by commas, got {item!r}")
        if int(value) < 1:
            raise TCError(f"--sizes: {name} must be at least 1, got {value}")
        if name in sizes:
            raise TCError(f"--sizes: {name} is given twice ({name}={sizes[name]} and "
                          f"{name}={value}); give each size once")
        sizes[name] = int(value)
    return sizes


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def gather_index_bounds(fn_ir: ir.Function, sizes: dict[str, int]) -> dict[str, int]:
    """For each integer input read inside an index of another tensor (a gather, ``E(idx(i))``),
    the exclusive upper bound that keeps random values in range: the smallest extent among the
    dimensions it indexes at these sizes, capped by what its dtype holds."""
    ints = {t.name: t for t in fn_ir.inputs if t.dtype.is_int}
    bounds: dict[str, int] = {}
    for st in fn_ir.statements:
        for e in ir.walk(st.rhs):
            if not isinstance(e, ir.Read):
                continue
            outer = fn_ir.tensor(e.tensor)
            for dim, index in enumerate(e.indices):
                extent = max(1, outer.shape[dim].evaluate(sizes))
                for inner in ir.walk(index):
                    if isinstance(inner, ir.Read) and inner.tensor in ints:
                        cap = int(np.iinfo(ints[inner.tensor].dtype.numpy).max) + 1
                        bounds[inner.tensor] = min(bounds.get(inner.tensor, cap), extent)
    return bounds


def random_inputs(fn_ir: ir.Function, sizes: dict[str, int], seed: int = 0) -> list[np.ndarray]:
    """Random inputs for a checked function at the given sizes (ints small, floats in [-1, 1))."""
    rng = np.random.default_rng(seed)
    index_bounds = gather_index_bounds(fn_ir, sizes)
    arrays = []
    for t in fn_ir.inputs:
        shape = tuple(e.evaluate(sizes) for e in t.shape)
        if t.dtype.is_float:
            arrays.append(rng.uniform(-1, 1, size=shape).astype(t.dtype.numpy))
        elif t.dtype.value == "bool":
            arrays.append(rng.integers(0, 2, size=shape).astype(bool))
        else:
            high = index_bounds.get(t.name, 8)  # gather indices in range, other ints small
            arrays.append(rng.integers(0, high, size=shape).astype(t.dtype.numpy))
    return arrays


def file_error(path: str | Path, exc: OSError | UnicodeDecodeError) -> TCError:
    """The one message every command gives for a file it cannot read."""
    if isinstance(exc, FileNotFoundError):
        why = "no such file"
    elif isinstance(exc, IsADirectoryError):
        why = "is a directory, not a file"
    elif isinstance(exc, PermissionError):
        why = "permission denied"
    elif isinstance(exc, UnicodeDecodeError):
        why = "not a UTF-8 text file"
    else:
        why = exc.strerror or str(exc)
    return TCError(f"tcmlir: error: {path}: {why}")


def shipped_examples() -> dict[str, Path]:
    """The example TC files installed with tcmlir (``tcmlir.examples``), by name."""
    from importlib.resources import files

    try:
        folder = files("tcmlir.examples")
    except ModuleNotFoundError:  # an install from before examples/ became a package
        return {}
    return {Path(f.name).stem: Path(str(f)) for f in sorted(folder.iterdir(), key=lambda f: f.name)
            if f.name.endswith(".tc")}


def read_source(path: str) -> tuple[str, str]:
    """The text of a TC file and the name to report it under. A bare name that is no file here
    but names a shipped example (``matmul`` or ``matmul.tc``) reads that example (and says so
    on stderr); anything unreadable is a `file_error`."""
    p = Path(path)
    if not p.exists() and p.parent == Path("."):
        example = shipped_examples().get(p.name.removesuffix(".tc"))
        if example is not None:
            print(f"note: {path} is not a file here; using the shipped example {example}",
                  file=sys.stderr)
            p = example
    return read_source_file(str(p)), str(p)


def load_definition(args: argparse.Namespace) -> tuple[Any, dict[str, int]]:
    """The definition ``args.name`` of ``args.file`` (for ``args.target``) and the ``--sizes``
    given, checked against its size names; TCError for unknown ones."""
    from . import api

    text, filename = read_source(args.file)
    fn = api.define(text, args.name, target=args.target, filename=filename)
    sizes = parse_sizes(args.sizes)
    unknown = sorted(set(sizes) - set(fn.ir.sizes))
    if unknown:
        raise TCError(f"--sizes: {fn.entry} has no size named {', '.join(unknown)} "
                      f"(its sizes: {', '.join(fn.ir.sizes) or 'none'})")
    return fn, sizes


def _run_options(args: argparse.Namespace, fn: Any, inputs: Sequence[Any]) -> tuple[Any, str]:
    """The options ``--options`` / ``--from-cache`` ask for (None: the default ones) and how to
    describe them."""
    from .options import MappingOptions

    if args.options is not None:
        inline = args.options.lstrip().startswith("{")
        text = args.options if inline else read_source_file(args.options)
        try:
            options = MappingOptions.from_json(text)
        except TCError as exc:
            raise TCError(f"--options{'' if inline else ' ' + args.options}: {exc}") from None
        return options, "given with --options" if inline else f"from {args.options}"
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


def read_source_file(path: str) -> str:
    """The text of any file named on the command line (a `file_error` if unreadable)."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise file_error(path, exc) from None


def _to_host(x: Any) -> np.ndarray:
    if hasattr(x, "get"):
        x = x.get()
    if type(x).__module__.split(".")[0] == "torch":
        x = x.cpu().numpy()
    return np.asarray(x)


def definition_and_inputs(args: argparse.Namespace) -> tuple[Any, dict[str, int], list[Any]]:
    """The definition named by ``args``, its sizes (``DEFAULT_SIZE`` for those not given, with
    a note) and random inputs of those sizes (``args.seed``)."""
    fn, sizes = load_definition(args)
    for name in fn.ir.sizes:
        if name not in sizes:
            sizes[name] = DEFAULT_SIZE
            print(f"note: size {name} not given, using {DEFAULT_SIZE}", file=sys.stderr)
    return fn, sizes, random_inputs(fn.ir, sizes, seed=args.seed)


def _cmd_run(args: argparse.Namespace) -> int:
    from . import api

    fn, sizes, inputs = definition_and_inputs(args)
    target = api.resolve_target(args.target)
    if args.check and target == "numpy":
        print("note: --check compares with the numpy reference interpreter, which is what "
              "--target numpy runs: there is nothing to check", file=sys.stderr)
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
    ref_fn = api.define(fn.source.text, args.name, target="numpy", filename=fn.source.name)
    ref = ref_fn(*inputs)
    refs = ref if isinstance(ref, tuple) else (ref,)
    worst = max((_relative_error(_to_host(o), np.asarray(r)) for o, r in zip(outs, refs,
                                                                              strict=True)),
                default=0.0)
    ok = worst <= 1e-4
    print(f"  check against the numpy reference: max relative error {worst:.2e} "
          f"{'OK' if ok else 'MISMATCH'}")
    return 0 if ok else 1


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


def build_parser() -> argparse.ArgumentParser:
    """The ``tcmlir`` argument parser with every subcommand."""
    parser = argparse.ArgumentParser(prog="tcmlir", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="compile a TC definition and run it on random inputs")
    run.add_argument("file", help="a .tc file, or the name of a shipped example")
    run.add_argument("--name", default=None, help="the def to run (optional with one def)")
    run.add_argument("--sizes", default=None, help="size values, e.g. M=512,N=512,K=512")
    run.add_argument("--target", default="auto", choices=["auto", "cuda", "cpu", "numpy"])
    run.add_argument("--repeat", type=positive_int, default=5,
                     help="timed runs, at least 1 (median printed)")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--check", action="store_true",
                     help="compare with the numpy reference interpreter")
    chosen = run.add_mutually_exclusive_group()
    chosen.add_argument("--options", default=None, metavar="FILE_OR_JSON",
                        help="mapping options: a JSON object, or a file holding one "
                             "(as `tcmlir tune` prints)")
    chosen.add_argument("--from-cache", nargs="?", const=True, default=None, metavar="DB",
                        help="run with the options tuned for these sizes (else the nearest "
                             "size) in the cache (default: the user's; or the database DB)")
    run.set_defaults(func=_cmd_run)
    from .tune.cli import add_commands

    add_commands(sub)
    examples = sub.add_parser("examples", help="list the example TC files shipped with tcmlir")
    examples.set_defaults(func=_cmd_examples)
    from .profile.cli import add_profile_command

    add_profile_command(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``tcmlir`` command on ``argv`` (default: ``sys.argv[1:]``); returns the exit
    status: 0 done, 1 a ``--check`` mismatch, 2 a user error, 130 interrupted."""
    from .log import setup_logging

    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help/--version (0) or a usage error (2): argparse printed it
        return int(exc.code or 0)
    try:
        setup_logging()
        return args.func(args)
    except TCError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(str(file_error(exc.filename or "?", exc)) if exc.filename
              else f"tcmlir: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("tcmlir: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
