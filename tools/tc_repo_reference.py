"""A second, independent reference for the TC repository programs (`tc_repo_programs.py`):
each statement evaluated in float64 with numpy broadcasting over its whole index box (lhs
indices first, then reduction indices), reads by numpy advanced indexing (affine and gathered
indices alike), then reduced over the reduction axes. It shares no code with
`tcmlir.reference` (the interpreter it checks) and handles only float outputs and the common
built-ins; `broadcast_reference` returns None for anything else.
"""

from __future__ import annotations

import numpy as np

from tcmlir import ir

_CALLS = {"exp": np.exp, "log": np.log, "sqrt": np.sqrt, "tanh": np.tanh, "fabs": np.abs,
          "abs": np.abs, "rsqrt": lambda x: 1 / np.sqrt(x), "fmax": np.fmax, "fmin": np.fmin,
          "max": np.maximum, "min": np.minimum, "sigmoid": lambda x: 1 / (1 + np.exp(-x))}
_COMPARE = {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal,
            "==": np.equal, "!=": np.not_equal}
_REDUCE = {ir.Reduction.ADD: (np.sum, 0.0), ir.Reduction.MUL: (np.prod, 1.0),
           ir.Reduction.MIN: (np.min, np.inf), ir.Reduction.MAX: (np.max, -np.inf)}


class _Unsupported(Exception):
    pass


def _c_div(a, b):
    if np.issubdtype(np.result_type(a, b), np.integer):
        return np.trunc(np.true_divide(a, b)).astype(np.int64)
    return np.true_divide(a, b)


def _c_mod(a, b):
    if np.issubdtype(np.result_type(a, b), np.integer):
        return a - b * _c_div(a, b)
    return np.fmod(a, b)


_ARITH = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": _c_div, "%": _c_mod,
          "floordiv": np.floor_divide, "floormod": np.remainder}


class _Statement:
    def __init__(self, arrays, sizes, grid):
        self.arrays, self.sizes, self.grid = arrays, sizes, grid

    def eval(self, e: ir.Expr):
        match e:
            case ir.Const(value=v):
                return np.float64(v) if isinstance(v, float) else np.int64(v)
            case ir.Index(name=n):
                return self.grid[n]
            case ir.Size(name=n):
                return np.int64(self.sizes[n])
            case ir.Read(tensor=t, indices=idx):
                arr = self.arrays[t]
                if not idx:
                    return arr[()]
                where = tuple(np.clip(np.asarray(self.eval(x)).astype(np.int64), 0,
                                      max(0, arr.shape[d] - 1)) for d, x in enumerate(idx))
                return arr[where]  # (clipped: an untaken ?: arm may point outside)
            case ir.Unary(op="-", operand=x):
                return -self.eval(x)
            case ir.Unary(op="!", operand=x):
                return np.logical_not(self.eval(x))
            case ir.Binary(op="&&", lhs=a, rhs=b):
                return np.logical_and(self.eval(a), self.eval(b))
            case ir.Binary(op="||", lhs=a, rhs=b):
                return np.logical_or(self.eval(a), self.eval(b))
            case ir.Binary(op=op, lhs=a, rhs=b) if op in _COMPARE:
                return _COMPARE[op](self.eval(a), self.eval(b))
            case ir.Binary(op=op, lhs=a, rhs=b) if op in _ARITH:
                return _ARITH[op](self.eval(a), self.eval(b))
            case ir.Select(cond=c, then=t, orelse=f):
                return np.where(self.eval(c), self.eval(t), self.eval(f))
            case ir.Cast(operand=x, dtype=t) if t.is_float:
                return np.asarray(self.eval(x), np.float64)
            case ir.Call(func=f, args=args) if f in _CALLS:
                with np.errstate(all="ignore"):
                    return _CALLS[f](*[np.asarray(self.eval(a), np.float64) for a in args])
        raise _Unsupported(type(e).__name__)


def broadcast_reference(fn_ir: ir.Function, inputs, sizes: dict[str, int]):
    """The outputs of ``fn_ir`` on ``inputs`` at ``sizes``, or None when it has an integer
    output or temporary, a built-in outside the common ones, or a repeated lhs index."""
    tensors = (*fn_ir.outputs, *fn_ir.temporaries)
    if any(not t.dtype.is_float for t in tensors):
        return None
    arrays = {t.name: np.asarray(x, np.float64) if t.dtype.is_float else np.asarray(x)
              for t, x in zip(fn_ir.inputs, inputs, strict=True)}
    for t in tensors:
        arrays[t.name] = np.zeros(tuple(max(0, e.evaluate(sizes)) for e in t.shape))
    try:
        for st in fn_ir.statements:
            _statement(st, arrays, sizes)
    except (_Unsupported, IndexError):
        return None
    return tuple(arrays[t.name] for t in fn_ir.outputs)


def _statement(st: ir.Statement, arrays, sizes) -> None:
    if len(set(st.lhs)) != len(st.lhs):
        raise _Unsupported("repeated lhs index")
    bounds = {r.name: (r.lo.evaluate(sizes), r.hi.evaluate(sizes)) for r in st.ranges}
    names = [*st.lhs, *[n for n in bounds if n not in st.lhs]]
    grid = {}
    for axis, n in enumerate(names):
        lo, hi = bounds[n]
        shape = [1] * len(names)
        shape[axis] = max(0, hi - lo)
        grid[n] = np.arange(lo, max(lo, hi), dtype=np.int64).reshape(shape)
    full = tuple(max(0, bounds[n][1] - bounds[n][0]) for n in names)
    value = np.broadcast_to(np.asarray(_Statement(arrays, sizes, grid).eval(st.rhs), np.float64),
                            full)
    out = arrays[st.tensor]
    box = np.ix_(*[np.arange(*bounds[n]) for n in st.lhs]) if st.lhs else ()
    if st.reduction is None:
        out[box] = value
        return
    reduce, identity = _REDUCE[st.reduction]
    axes = tuple(range(len(st.lhs), len(names)))
    value = reduce(value, axis=axes, initial=identity) if axes else value
    current = np.full(value.shape, identity) if st.init else out[box]
    out[box] = reduce(np.stack([np.broadcast_to(current, value.shape), value]), axis=0)
