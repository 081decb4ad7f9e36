"""The reference interpreter (``target="numpy"``): the oracle every compiled path is checked against.

`run(fn, inputs, sizes, outputs=None)` executes a checked `ir.Function` with vectorised numpy and
returns every output by name. Semantics are TC's:

* statements run in program order, each over its whole box (`Statement.ranges`); a box with an
  empty range does nothing (a ``!`` statement whose *reduction* range is empty still initialises);
* ``!`` first sets ``tensor[lhs box]`` to the reduction's identity; ``=`` overwrites; the
  reductions ``+ * min max`` combine the rhs over the reduction indices and then with the values
  already there;
* outputs that are not given start zero-filled (so a plain ``+=`` accumulates onto zeros);
  given ``outputs`` are written in place (they may hold garbage: ``=`` and ``!`` overwrite);
  temporaries are zero-filled and not returned;
* a statement's rhs reads see the tensors as they are when the statement starts (after its
  ``!`` initialisation): a statement reading the tensor it writes reads a snapshot (sema only
  lets it read the element each instance writes, so the order of instances never matters).

Evaluation: each index variable is an ``np.arange`` on its own axis of the statement's box, the
rhs tree is evaluated to an array broadcastable to the box, reduced over the reduction axes and
combined. Boxes larger than `CHUNK_ELEMENTS` are split into sub-boxes (along the first axes)
that run in order, so no intermediate exceeds that many elements.

Value semantics: arithmetic in each node's dtype, integers wrap; integer ``/`` and ``%``
truncate toward zero as in C, and **integer division or remainder by zero gives 0** (C leaves
it undefined); float ``%`` is ``fmod``; ``floordiv``/``floormod`` floor. Index expressions
(inside `Read.indices`) are computed in int64. Reads of float16/bfloat16 tensors give float32
values; stores round to the storage type. Every read is bounds-checked: an index outside its
tensor (a bad gather index, or sizes breaking the function's constraints) raises
`tcmlir.errors.CallError`. Float -> integer casts saturate (NaN gives 0), on every target.
``c ? x : y`` is lazy as in C and the compiled code: each arm is
evaluated (vectorised) only where it is taken, so a read in the other arm is neither checked nor
used. Built-ins: see `tcmlir.reference_builtins` (float64, rounded once).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping

import numpy as np

from . import ir
from .affine import to_isl
from .dtypes import DType
from .errors import CallError, CodegenError, format_located
from .reference_builtins import call_builtin, saturating_int

__all__ = ["CHUNK_ELEMENTS", "run"]

#: The largest number of box points evaluated at once (bounds every intermediate array).
CHUNK_ELEMENTS = 1 << 24

_I64 = np.dtype(np.int64)

Box = list[tuple[int, int]]


def run(
    fn: ir.Function,
    inputs: Mapping[str, np.ndarray],
    sizes: Mapping[str, int],
    outputs: Mapping[str, np.ndarray] | None = None,
    *,
    chunk_elements: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> dict[str, np.ndarray]:
    """Execute ``fn`` on ``inputs`` (validated by the caller; scalars as 0-d arrays).

    ``outputs`` given: written in place and returned; missing ones (or all, when None) are
    allocated zero-filled. ``chunk_elements`` overrides `CHUNK_ELEMENTS` (tests force small
    chunks with it). ``progress(n)`` is called after each chunk with the statement instances
    it evaluated (``tcmlir run --check`` shows a bar with it). Returns ``{output name: array}`` in signature order.
    """
    limit = max(1, chunk_elements if chunk_elements is not None else CHUNK_ELEMENTS)
    sizes = dict(sizes)
    given = dict(outputs or {})
    store: dict[str, np.ndarray] = {}
    for t in fn.inputs:
        store[t.name] = np.asarray(inputs[t.name])
    for t in fn.outputs + fn.temporaries:
        if t.role is ir.Role.OUTPUT and t.name in given:
            store[t.name] = given[t.name]
        else:
            shape = tuple(d.evaluate(sizes) for d in t.shape)
            store[t.name] = np.zeros(shape, dtype=t.dtype.numpy)
    with np.errstate(all="ignore"):
        for stmt in fn.statements:
            _Statement(fn, stmt, store, sizes, limit, progress).execute()
    return {t.name: store[t.name] for t in fn.outputs}


# ---------------------------------------------------------------- statements

_REDUCE = {
    ir.Reduction.ADD: np.add,
    ir.Reduction.MUL: np.multiply,
    ir.Reduction.MIN: np.minimum,
    ir.Reduction.MAX: np.maximum,
}


class _Statement:
    def __init__(self, fn: ir.Function, stmt: ir.Statement, store, sizes, limit: int,
                 progress: Callable[[int], None] | None = None):
        self.fn, self.stmt, self.store, self.sizes, self.limit = fn, stmt, store, sizes, limit
        self.progress = progress
        self.tensor = fn.tensor(stmt.tensor)
        self.target = store[stmt.tensor]

    def _range(self, name: str) -> tuple[int, int]:
        r = self.stmt.range_of(name)
        return r.lo.evaluate(self.sizes), r.hi.evaluate(self.sizes)

    def execute(self) -> None:
        stmt = self.stmt
        if len(set(stmt.lhs)) != len(stmt.lhs):
            raise CodegenError(f"the numpy reference cannot write '{stmt.tensor}' with a "
                               f"repeated index ({', '.join(stmt.lhs)})")
        lhs_box = [self._range(n) for n in stmt.lhs]
        red_names = stmt.reduction_indices
        red_box = [self._range(n) for n in red_names]
        if any(hi <= lo for lo, hi in lhs_box):
            return
        for d, (lo, hi) in enumerate(lhs_box):
            extent = self.target.shape[d]
            if lo < 0 or hi > extent:
                raise CallError(
                    f"statement writing '{stmt.tensor}' covers [{lo}, {hi}) in dimension {d}, "
                    f"outside its extent {extent} (do the sizes satisfy {self.fn.context}?)"
                )
        view = self.target[(*(slice(lo, hi) for lo, hi in lhs_box), Ellipsis)]
        comp = self.tensor.dtype.compute.numpy
        if stmt.init and stmt.reduction is not None:
            view[...] = np.asarray(stmt.reduction.identity(self.tensor.dtype.compute), dtype=comp)
        if any(hi <= lo for lo, hi in red_box):
            return
        if stmt.reduction is None and red_box:
            # `=` with extra indices: the last iteration of the sequential loops wins
            red_box = [(hi - 1, hi) for _, hi in red_box]
        reads_self = any(
            isinstance(e, ir.Read) and e.tensor == stmt.tensor for e in ir.walk(stmt.rhs)
        )
        arrays = dict(self.store)
        if reads_self and stmt.reduction is None:
            arrays[stmt.tensor] = self.target.copy()
        # reductions accumulate in the compute type and store (round) once at the end
        acc = None if stmt.reduction is None else view.astype(comp)
        names = list(stmt.lhs) + list(red_names)
        nl, nr = len(lhs_box), len(red_box)
        red_axes = tuple(range(nl, nl + nr))
        for box in _chunks(lhs_box + red_box, self.limit):
            env = {
                n: _axis(lo, hi, a, nl + nr)
                for a, (n, (lo, hi)) in enumerate(zip(names, box, strict=True))
            }
            value = _Eval(self.fn, arrays, self.sizes, env).value(stmt.rhs)
            value = np.asarray(value).astype(comp, copy=False)
            shape = tuple(hi - lo for lo, hi in box)
            value = np.broadcast_to(value, shape)
            offsets = zip(box[:nl], lhs_box, strict=True)
            where = (*(slice(lo - base, hi - base) for (lo, hi), (base, _) in offsets), ...)
            if acc is None:
                view[where] = value[(Ellipsis,) + (0,) * nr]
                if self.progress is not None:
                    self.progress(math.prod(shape))
                continue
            op = _REDUCE[stmt.reduction]
            reduced = op.reduce(value, axis=red_axes, dtype=comp) if nr else value
            op(acc[where], reduced, out=acc[where], dtype=comp)
            if self.progress is not None:
                self.progress(math.prod(shape))
        if acc is not None:
            view[...] = acc


def _axis(lo: int, hi: int, axis: int, ndim: int) -> np.ndarray:
    shape = [1] * ndim
    shape[axis] = hi - lo
    return np.arange(lo, hi, dtype=_I64).reshape(shape)


def _chunks(box: Box, limit: int) -> Iterator[Box]:
    """Split ``box`` into consecutive sub-boxes of at most ``limit`` points (when possible)."""
    total = math.prod(hi - lo for lo, hi in box)
    if total <= limit:
        yield box
        return
    axis = next(a for a, (lo, hi) in enumerate(box) if hi - lo > 1)
    lo, hi = box[axis]
    step = max(1, limit // (total // (hi - lo)))
    for start in range(lo, hi, step):
        sub = list(box)
        sub[axis] = (start, min(start + step, hi))
        yield from _chunks(sub, limit)


# ---------------------------------------------------------------- expressions


def _c_div(a: np.ndarray, b: np.ndarray, dt: np.dtype) -> np.ndarray:
    """C integer division (truncating); division by zero gives 0."""
    zero = b == 0
    bs = np.where(zero, 1, b).astype(dt)
    q = np.floor_divide(a, bs)
    r = a - q * bs
    q = q + ((r != 0) & ((a < 0) != (bs < 0))).astype(dt)
    return np.where(zero, 0, q).astype(dt)


def _c_mod(a: np.ndarray, b: np.ndarray, dt: np.dtype) -> np.ndarray:
    """C integer remainder (sign of the dividend); remainder by zero gives 0."""
    r = a - _c_div(a, b, dt) * b
    return np.where(b == 0, 0, r).astype(dt)


class _Eval:
    """Evaluates expression trees over one chunk of a statement's box."""

    def __init__(self, fn: ir.Function, arrays, sizes, env: dict[str, np.ndarray]):
        self.fn, self.arrays, self.sizes, self.env = fn, arrays, sizes, env
        # where the expression being evaluated is live: the arms of ``?:`` are evaluated
        # everywhere (vectorised) but only their taken points are checked and used
        self.mask: np.ndarray | None = None
        self.cache: dict[tuple[int, bool], tuple[ir.Expr, np.ndarray | None, np.ndarray]] = {}

    def value(self, e: ir.Expr) -> np.ndarray:
        """A value position: computed in the node's (compute) dtype."""
        return self.eval(e, index=False)

    def _dtype(self, t: DType, index: bool) -> np.dtype:
        if index and t.is_int:
            return _I64
        return t.compute.numpy

    def eval(self, e: ir.Expr, index: bool) -> np.ndarray:
        # lets are shared IR nodes (a DAG): evaluate each once per mask and position
        hit = self.cache.get((id(e), index))
        if hit is not None and hit[0] is e and hit[1] is self.mask:
            return hit[2]
        value = self._eval(e, index)
        self.cache[(id(e), index)] = (e, self.mask, value)
        return value

    def _eval(self, e: ir.Expr, index: bool) -> np.ndarray:
        dt = self._dtype(e.dtype, index)
        match e:
            case ir.Const(value=v):
                return np.asarray(v).astype(dt)
            case ir.Index(name=n):
                return self.env[n].astype(dt, copy=False)
            case ir.Size(name=n):
                return np.asarray(self.sizes[n]).astype(dt)
            case ir.Read():
                return self._read(e).astype(dt, copy=False)
            case ir.Unary(op=op, operand=x):
                v = self.eval(x, index)
                if op == "!":
                    return np.logical_not(v)
                return np.negative(v.astype(dt, copy=False)).astype(dt, copy=False)
            case ir.Binary():
                return self._binary(e, dt, index)
            case ir.Select(cond=c, then=t, orelse=f):
                cv = self.eval(c, index).astype(bool, copy=False)
                outer = self.mask
                try:
                    self.mask = cv if outer is None else np.logical_and(outer, cv)
                    tv = self.eval(t, index).astype(dt, copy=False)
                    nv = np.logical_not(cv)
                    self.mask = nv if outer is None else np.logical_and(outer, nv)
                    fv = self.eval(f, index).astype(dt, copy=False)
                finally:
                    self.mask = outer
                return np.where(cv, tv, fv)
            case ir.Cast(operand=x, dtype=t):
                v = self.eval(x, index)
                if t.compute is not t:  # a cast to a storage type rounds through it
                    v = v.astype(t.numpy)
                elif x.dtype.is_float and t.is_int and t is not DType.BOOL:
                    v = saturating_int(v, t.numpy)
                return v.astype(dt, copy=False)
            case ir.Call(func=f, args=args):
                vals = [self.eval(a, index) for a in args]
                return call_builtin(f, vals, dt, where=self._where(e))
        raise CodegenError(f"the numpy reference cannot evaluate IR node {e!r}")

    def _where(self, e: ir.Expr) -> str:
        if self.fn.source is None or e.span is None:
            return ""
        return "\n" + format_located(self.fn.source, e.span, "here")

    def _binary(self, e: ir.Binary, dt: np.dtype, index: bool) -> np.ndarray:
        op = e.op
        a = self.eval(e.lhs, index)
        b = self.eval(e.rhs, index)
        if op == "&&":
            return np.logical_and(a, b)
        if op == "||":
            return np.logical_or(a, b)
        if op in ir.COMPARISONS:
            ct = np.result_type(a.dtype, b.dtype)
            a, b = a.astype(ct, copy=False), b.astype(ct, copy=False)
            return _COMPARE[op](a, b)
        a, b = a.astype(dt, copy=False), b.astype(dt, copy=False)
        is_float = dt.kind == "f"
        if op == "/":
            r = np.divide(a, b) if is_float else _c_div(a, b, dt)
        elif op == "%":
            r = np.fmod(a, b) if is_float else _c_mod(a, b, dt)
        elif op == "floordiv":
            r = np.floor(a / b) if is_float else np.floor_divide(a, b)
        elif op == "floormod":
            r = np.remainder(a, b)
        else:
            r = _ARITH[op](a, b)
        return np.asarray(r).astype(dt, copy=False)

    def _read(self, e: ir.Read) -> np.ndarray:
        arr = self.arrays[e.tensor]
        if not e.indices:
            return arr
        idx = []
        values = [self.eval(x, index=True).astype(_I64, copy=False) for x in e.indices]
        live = None
        if self.mask is not None:  # only the points of the taken ?: arm are read
            shape = np.broadcast_shapes(self.mask.shape, *(v.shape for v in values))
            live = np.broadcast_to(self.mask, shape)
            if not live.any():
                return np.zeros(shape, dtype=arr.dtype)
            values = [np.where(live, np.broadcast_to(v, shape), 0) for v in values]
        for d, (x, v) in enumerate(zip(e.indices, values, strict=True)):
            extent = arr.shape[d]
            checked = v if live is None else v[live]
            lo, hi = checked.min(), checked.max()
            if lo < 0 or hi >= extent:
                bad = int(lo) if lo < 0 else int(hi)
                gather = any(isinstance(s, ir.Read) for s in ir.walk(x))
                checked_late = gather or to_isl(x) is None  # not proved at define
                what = "gathered index" if gather else "non-affine index" if checked_late \
                    else "index"
                raise CallError(
                    f"{what} {bad} in dimension {d} of tensor '{e.tensor}' is out of bounds "
                    f"(extent {extent})" + ("" if checked_late else
                                            f"; do the sizes satisfy {self.fn.context}?")
                )
            idx.append(v)
        return arr[tuple(idx)]


_COMPARE = {
    "<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal,
    "==": np.equal, "!=": np.not_equal,
}
_ARITH = {
    "+": np.add, "-": np.subtract, "*": np.multiply, "min": np.minimum, "max": np.maximum,
}
