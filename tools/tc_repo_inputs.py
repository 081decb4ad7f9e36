"""Sizes, inputs and an independent reference for the TC repository programs
(tests/corpus/tc_repo.json; `tools/tc_repo_programs.py` runs them).

* `choose_sizes`: small distinct size values (3, 5, 7, 4, 6, ...) that the definition's context
  admits (every inferred extent at least 1, every precondition of range inference), chosen one
  size at a time with isl so that the remaining sizes always keep a solution.
* `make_inputs`: random floats (in [0.5, 1.5) when the program takes logarithms or roots, else in
  [-1, 1)), integer inputs below the extent they index when they are gather indices.
* `einsum_reference`: the outputs computed with ``numpy.einsum`` alone, for programs whose every
  statement is a product of reads at plain indices (contractions, transposes, copies, broadcasts);
  None for the others (they are checked as numpy == cpu).
"""

from __future__ import annotations

import re

import islpy as isl
import numpy as np

import tcmlir as tc
from tcmlir import ir
from tcmlir.cli_inputs import gather_index_bounds

PREFERRED = (3, 5, 7, 4, 6, 2, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 1, 18, 19, 20, 24, 32)
SIZE_SETS = {
    "small": PREFERRED,
    # sizes of 1 wherever the context allows them (degenerate bands, one-element reductions)
    "ones": (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 24, 32),
    # sizes past one tile or warp (33, 65) and odd ones, where the programs allow them
    "wide": (33, 17, 65, 9, 5, 3, 7, 2, 4, 6, 8, 10, 11, 12, 13, 1, 14, 15, 16, 18, 19, 20, 24, 32),
}
TINY = (2, 3, 1, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 24, 32)
POSITIVE = re.compile(r"\b(log\w*|sqrt|rsqrt|cbrt|pow\w*|lgamma|tgamma|acosh|asin|acos|atanh)\b")


def choose_sizes(fn_ir: ir.Function, preferred: tuple[int, ...] = PREFERRED
                 ) -> dict[str, int] | None:
    """Small sizes admitted by ``fn_ir.context``, distinct where it allows, taken in the order of
    ``preferred`` (``TINY``: the smallest, for the emulator); None when none up to 32 are."""
    ctx = isl.Context()
    space = isl.Set.read_from_str(ctx, fn_ir.context)
    names = [space.get_dim_name(isl.dim_type.param, i)
             for i in range(space.dim(isl.dim_type.param))]
    sizes: dict[str, int] = {}
    for name in fn_ir.sizes:
        if name not in names:
            sizes[name] = next(v for v in preferred if v not in sizes.values())
            continue
        pos = names.index(name)
        order = [v for v in preferred if v not in sizes.values()] + [
            v for v in preferred if v in sizes.values()]
        for value in order:
            fixed = space.fix_val(isl.dim_type.param, pos, isl.Val.int_from_si(ctx, value))
            if not fixed.is_empty():
                space, sizes[name] = fixed, value
                break
        else:
            return None
    return sizes


def admits(fn_ir: ir.Function, sizes: dict[str, int]) -> bool:
    """Whether the definition's context admits ``sizes``."""
    ctx = isl.Context()
    space = isl.Set.read_from_str(ctx, fn_ir.context)
    for pos in range(space.dim(isl.dim_type.param)):
        name = space.get_dim_name(isl.dim_type.param, pos)
        space = space.fix_val(isl.dim_type.param, pos, isl.Val.int_from_si(ctx, sizes[name]))
    return not space.is_empty()


_GATHER = re.compile(r"gathered index (-?\d+) in dimension (\d+) of tensor '(\w+)'")


def widen_for_gather(fn_ir: ir.Function, sizes: dict[str, int], message: str
                     ) -> dict[str, int] | None:
    """``sizes`` with the extent that an out-of-range gather (``message``, the reference
    interpreter's CallError) names grown to hold the index; None when that extent is not a
    size of its own or the context refuses the new value."""
    m = _GATHER.search(message)
    if m is None or int(m.group(1)) < 0:
        return None
    extent = fn_ir.tensor(m.group(3)).shape[int(m.group(2))]
    name = str(extent)
    if name not in sizes or int(m.group(1)) >= 64:
        return None
    wider = {**sizes, name: int(m.group(1)) + 1}
    return wider if admits(fn_ir, wider) else None


def element_count(fn_ir: ir.Function, sizes: dict[str, int]) -> int:
    """Elements of every input, output and temporary at ``sizes``."""
    total = 0
    for t in fn_ir.tensors:
        n = 1
        for e in t.shape:
            n *= max(0, e.evaluate(sizes))
        total += n
    return total


def make_inputs(fn_ir: ir.Function, text: str, sizes: dict[str, int], seed: int = 0,
                int_high: int | None = None) -> list[np.ndarray]:
    """Random inputs at ``sizes``; ``int_high`` caps integer values (gather indices are kept
    below the smallest extent they index)."""
    rng = np.random.default_rng(seed)
    positive = POSITIVE.search(text) is not None
    bounds = gather_index_bounds(fn_ir, sizes)
    out = []
    for t in fn_ir.inputs:
        shape = tuple(e.evaluate(sizes) for e in t.shape)
        if t.dtype.value == "bool":
            out.append(rng.integers(0, 2, size=shape).astype(np.bool_))
        elif t.dtype.is_int:
            high = bounds.get(t.name, 8)
            high = max(1, min(high, int_high)) if int_high is not None else high
            out.append(rng.integers(0, high, size=shape).astype(t.dtype.numpy))
        else:
            lo, hi = (0.5, 1.5) if positive else (-1.0, 1.0)
            out.append(rng.uniform(lo, hi, size=shape).astype(t.dtype.numpy))
    return out


def _factors(e: ir.Expr) -> list[ir.Expr] | None:
    if isinstance(e, ir.Binary) and e.op == "*":
        left, right = _factors(e.lhs), _factors(e.rhs)
        return None if left is None or right is None else left + right
    if isinstance(e, ir.Read | ir.Const):
        return [e]
    return None


def einsum_reference(fn: tc.TCFunction, inputs: list[np.ndarray], sizes: dict[str, int]
                     ) -> tuple[np.ndarray, ...] | None:
    """The outputs by numpy.einsum, or None when a statement is not a product of reads at plain
    indices (or an index range is not the whole of every dimension it indexes)."""
    f = fn.ir
    arrays = {t.name: np.asarray(x, np.float64) for t, x in zip(f.inputs, inputs, strict=True)}
    if any(t.dtype.is_int or t.dtype.value == "bool" for t in (*f.inputs, *f.outputs)):
        return None
    for t in (*f.outputs, *f.temporaries):
        arrays[t.name] = np.zeros(tuple(e.evaluate(sizes) for e in t.shape))
    letters: dict[str, str] = {}
    for st in f.statements:
        factors = _factors(st.rhs)
        if factors is None or st.reduction not in (None, ir.Reduction.ADD):
            return None
        ranges = {r.name: (r.lo.evaluate(sizes), r.hi.evaluate(sizes)) for r in st.ranges}
        operands, subscripts, scale = [], [], 1.0
        for x in factors:
            if isinstance(x, ir.Const):
                scale *= float(x.value)
                continue
            if not all(isinstance(i, ir.Index) for i in x.indices):
                return None
            names = [i.name for i in x.indices]
            shape = arrays[x.tensor].shape
            if any(ranges.get(n) != (0, shape[d]) for d, n in enumerate(names)):
                return None
            operands.append(arrays[x.tensor])
            subscripts.append("".join(letters.setdefault(n, chr(97 + len(letters)))
                                      for n in names))
        out_shape = arrays[st.tensor].shape
        if len(set(st.lhs)) != len(st.lhs) or any(
                ranges.get(n) != (0, out_shape[d]) for d, n in enumerate(st.lhs)):
            return None
        if st.reduction is None and set(ranges) - set(st.lhs):
            return None
        for n, (lo, hi) in ranges.items():  # an index no factor reads: broadcast or repeat
            if letters.get(n) is None or letters[n] not in "".join(subscripts):
                operands.append(np.ones(hi - lo))
                subscripts.append(letters.setdefault(n, chr(97 + len(letters))))
        lhs = "".join(letters[n] for n in st.lhs)
        value = np.einsum(",".join(subscripts) + "->" + lhs, *operands) * scale
        if st.reduction is None or st.init:
            arrays[st.tensor] = np.broadcast_to(value, out_shape).copy()
        else:
            arrays[st.tensor] = arrays[st.tensor] + value
    return tuple(arrays[t.name] for t in f.outputs)
