"""What the commands that run a definition share: read it from a file (``--name``,
``--sizes``, the file's ``# sizes:`` lines) and make random inputs of its sizes.

`tcmlir run`, `tcmlir tune` (`tune.cli`) and `tcmlir profile` (`profile.cli`) read a definition
through here; `cli` (the command and its parser) imports the subcommands, never the reverse.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from typing import Any

import numpy as np

from . import ir
from .cli_args import parse_sizes, read_source, sizes_line
from .errors import TCError

__all__ = ["complete_sizes", "definition_and_inputs", "file_sizes", "gather_index_bounds",
           "load_definition", "random_inputs"]

_SIZES_LINE = re.compile(r"^\s*#\s*sizes(?:\s+(\w+))?\s*:\s*(\S+)\s*$", re.M)


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
    """Random inputs for a checked function at the given sizes (ints small, gather indices in
    range, floats in [-1, 1)), made directly in each input's dtype. A `CallError` before anything is allocated when the
    inputs, outputs and temporaries would not fit in the host memory available."""
    from .binding import check_host_memory

    shapes = [tuple(e.evaluate(sizes) for e in t.shape) for t in fn_ir.inputs]
    check_host_memory(fn_ir, sizes, [(f"input {t.name}", math.prod(s) * t.dtype.itemsize)
                                     for s, t in zip(shapes, fn_ir.inputs, strict=True)])
    rng = np.random.default_rng(seed)
    index_bounds = gather_index_bounds(fn_ir, sizes)
    return [_random_array(rng, t.dtype, shape, index_bounds.get(t.name, 8))
            for t, shape in zip(fn_ir.inputs, shapes, strict=True)]


def _random_array(rng: np.random.Generator, dtype, shape: tuple[int, ...], high: int
                  ) -> np.ndarray:
    """Floats in [-1, 1), bools, integers in [0, high) (gather indices in range)."""
    if dtype.value == "bool":
        return rng.integers(0, 2, size=shape, dtype=np.bool_)
    if not dtype.is_float:
        return rng.integers(0, high, size=shape, dtype=dtype.numpy)
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


def load_definition(args: argparse.Namespace) -> tuple[Any, dict[str, int]]:
    """The definition ``args.name`` of ``args.file`` (for ``args.target``) and the ``--sizes``
    given, checked against its size names; TCError for unknown ones."""
    from . import api

    text, filename = read_source(args.file)
    fn = api.define(text, args.name, target=args.target or "auto", filename=filename)
    sizes = parse_sizes(args.sizes)
    unknown = sorted(set(sizes) - set(fn.ir.sizes))
    if unknown:
        raise TCError(f"--sizes: {fn.entry} has no size named {', '.join(unknown)} "
                      f"(its sizes: {', '.join(fn.ir.sizes) or 'none'})")
    return fn, sizes


def file_sizes(text: str, entry: str) -> dict[str, int]:
    """Sizes a TC file suggests for ``entry`` in comment lines ``# sizes: M=256,N=256`` (every
    def) or ``# sizes conv2d: N=8,...`` (one def), as the shipped examples carry them."""
    found: dict[str, int] = {}
    for name, values in _SIZES_LINE.findall(text):
        if not name or name == entry:
            found.update(parse_sizes(values))
    return found


def complete_sizes(fn: Any, sizes: dict[str, int], command: str, file: str) -> dict[str, int]:
    """``sizes`` completed from the file's ``# sizes:`` lines; a TCError naming every size still
    missing, with an example ``--sizes`` line (nothing is guessed)."""
    suggested = file_sizes(fn.source.text, fn.entry)
    taken = [k for k in fn.ir.sizes if k not in sizes and k in suggested]
    full = {k: sizes.get(k, suggested.get(k)) for k in fn.ir.sizes}
    missing = [k for k, v in full.items() if v is None]
    if missing:
        example = {k: (v if v is not None else 64) for k, v in full.items()}
        several = len(re.findall(r"^\s*def\s", fn.source.text, re.M)) > 1
        name = f" --name {fn.entry}" if several else ""
        raise TCError(f"--sizes: {fn.entry} needs a value for {', '.join(missing)} "
                      f"(its sizes: {', '.join(fn.ir.sizes)}); for example: tcmlir {command} "
                      f"{file}{name} --sizes {sizes_line(example)}")
    if taken:
        print(f"note: sizes {sizes_line({k: full[k] for k in taken})} from the file's "
              "`# sizes:` line", file=sys.stderr)
    return full


def definition_and_inputs(args: argparse.Namespace, command: str = "run"
                          ) -> tuple[Any, dict[str, int], list[Any]]:
    """The definition named by ``args``, its sizes (``--sizes``, then the file's ``# sizes:``
    lines; a TCError naming any still missing) and random inputs of those sizes (``args.seed``)."""
    fn, sizes = load_definition(args)
    sizes = complete_sizes(fn, sizes, command, args.file)
    return fn, sizes, random_inputs(fn.ir, sizes, seed=args.seed)
