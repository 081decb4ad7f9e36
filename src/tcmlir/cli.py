"""The ``tcmlir`` command: run a TC file (the README's main job), tune it, manage the cache.

    tcmlir run FILE [--name E] [--sizes M=512,N=512] [--target auto|cuda|cpu|numpy] [--check]
    tcmlir tune FILE --name E --sizes ... [--generations G --population P]
    tcmlir cache ls|show|export|import|clear

User mistakes print a located message and exit with status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Sequence

import numpy as np

from .errors import TCError

__all__ = ["load_definition", "main", "parse_sizes", "random_inputs"]

DEFAULT_SIZE = 128


def parse_sizes(text: str | None) -> dict[str, int]:
    """``M=512,N=64`` → {"M": 512, "N": 64}; TCError on malformed text."""
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
        sizes[name] = int(value)
    return sizes


def random_inputs(fn_ir, sizes: dict[str, int], seed: int = 0) -> list[np.ndarray]:
    """Random inputs for a checked function at the given sizes (ints small, floats in [-1, 1)),
    made directly in each input's dtype. A `CallError` before anything is allocated when the
    inputs, outputs and temporaries would not fit in the host memory available."""
    from .binding import check_host_memory

    shapes = [tuple(e.evaluate(sizes) for e in t.shape) for t in fn_ir.inputs]
    check_host_memory(fn_ir, sizes, [(f"input {t.name}", math.prod(s) * t.dtype.itemsize)
                                     for s, t in zip(shapes, fn_ir.inputs, strict=True)])
    rng = np.random.default_rng(seed)
    return [_random_array(rng, t.dtype, shape) for t, shape in zip(fn_ir.inputs, shapes,
                                                                   strict=True)]


def _random_array(rng: np.random.Generator, dtype, shape: tuple[int, ...]) -> np.ndarray:
    if dtype.value == "bool":
        return rng.integers(0, 2, size=shape, dtype=np.bool_)
    if not dtype.is_float:
        return rng.integers(0, 8, size=shape, dtype=dtype.numpy)
    if dtype.numpy in (np.float32, np.float64):
        out = rng.random(size=shape, dtype=dtype.numpy)
        out *= 2
        out -= 1
        return out
    # float16/bfloat16: numpy draws only float32/64; convert a chunk at a time
    out = np.empty(shape, dtype=dtype.numpy)
    flat = out.reshape(-1)
    step = 1 << 20
    for lo in range(0, flat.size, step):
        chunk = rng.random(size=min(step, flat.size - lo), dtype=np.float32)
        flat[lo:lo + chunk.size] = chunk * 2 - 1
    return out


def load_definition(args: argparse.Namespace) -> tuple[object, dict[str, int]]:
    """The definition ``args.name`` of ``args.file`` (for ``args.target``) and the ``--sizes``
    given, checked against its size names; TCError for unknown ones."""
    from . import api

    with open(args.file, encoding="utf-8") as f:
        text = f.read()
    fn = api.define(text, args.name, target=args.target, filename=args.file)
    sizes = parse_sizes(args.sizes)
    unknown = sorted(set(sizes) - set(fn.ir.sizes))
    if unknown:
        raise TCError(f"--sizes: {fn.entry} has no size named {', '.join(unknown)} "
                      f"(its sizes: {', '.join(fn.ir.sizes) or 'none'})")
    return fn, sizes


def _cmd_run(args: argparse.Namespace) -> int:
    from . import api

    fn, sizes = load_definition(args)
    text = fn.source.text
    for name in fn.ir.sizes:
        if name not in sizes:
            sizes[name] = DEFAULT_SIZE
            print(f"note: size {name} not given, using {DEFAULT_SIZE}", file=sys.stderr)
    inputs = random_inputs(fn.ir, sizes, seed=args.seed)
    target = api.resolve_target(args.target)
    t0 = time.perf_counter()
    kernel = fn.compile(*inputs, target=target)
    compile_s = time.perf_counter() - t0
    times = []
    result = None
    for _ in range(max(1, args.repeat)):
        t0 = time.perf_counter()
        result = kernel.launch(*inputs)
        times.append(time.perf_counter() - t0)
    outs = result if isinstance(result, tuple) else (result,)
    where = _describe_target(target)
    print(f"{fn.entry} on {where}: sizes {', '.join(f'{k}={v}' for k, v in sizes.items())}")
    print(f"  compile {compile_s * 1e3:.1f} ms, run median {statistics.median(times) * 1e3:.3f} ms "
          f"over {len(times)} run(s)")
    for t, o in zip(fn.ir.outputs, outs, strict=True):
        host = np.asarray(o.get() if hasattr(o, "get") else o)
        print(f"  output {t.name}: shape {host.shape} dtype {host.dtype} "
              f"checksum {float(np.sum(host.astype(np.float64))):.6g}")
    if args.check and target != "numpy":
        ref_fn = api.define(text, args.name, target="numpy", filename=args.file)
        ref = ref_fn(*inputs)
        refs = ref if isinstance(ref, tuple) else (ref,)
        worst = 0.0
        for o, r in zip(outs, refs, strict=True):
            o64 = np.asarray(o.get() if hasattr(o, "get") else o, dtype=np.float64)
            r64 = np.asarray(r, dtype=np.float64)
            if o64.shape != r64.shape:
                worst = float("inf")
                continue
            finite = np.isfinite(r64)
            # a non-finite value must be the same one (NaN where NaN): else the error is inf
            same = (o64 == r64) | (np.isnan(o64) & np.isnan(r64))
            if not np.all(same[~finite]) or not np.all(np.isfinite(o64[finite])):
                worst = float("inf")
                continue
            if finite.any():
                scale = max(1.0, float(np.max(np.abs(r64[finite]))))
                worst = max(worst, float(np.max(np.abs(o64[finite] - r64[finite]))) / scale)
        ok = worst <= 1e-4
        print(f"  check against the numpy reference: max relative error {worst:.2e} "
              f"{'OK' if ok else 'MISMATCH'}")
        return 0 if ok else 1
    return 0


def _describe_target(target: str) -> str:
    if target == "cuda":
        from .runtime.cuda import get_runtime

        dev = get_runtime().device(0)
        return f"cuda ({dev.name}, {dev.arch})"
    if target == "cpu":
        from .runtime.host_arch import host_arch

        return f"cpu ({host_arch()}, LLVM JIT)"
    return "numpy (reference interpreter)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tcmlir", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="compile a TC definition and run it on random inputs")
    run.add_argument("file")
    run.add_argument("--name", default=None, help="the def to run (optional with one def)")
    run.add_argument("--sizes", default=None, help="size values, e.g. M=512,N=512,K=512")
    run.add_argument("--target", default="auto", choices=["auto", "cuda", "cpu", "numpy"])
    run.add_argument("--repeat", type=int, default=5, help="timed runs (median printed)")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--check", action="store_true",
                     help="compare with the numpy reference interpreter")
    run.set_defaults(func=_cmd_run)
    from .tune.cli import add_commands

    add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except TCError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"tcmlir: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
