"""Exact work counts of a TC function from its polyhedral model: instances, operations, bytes.

The profiler's ideal work, counted rather than sampled (`tcmlir.profile`):

* **instances** of a statement: the number of points of its isl domain;
* **operations** per instance, read off the IR expression (`op_counts`), times the instances;
* **minimal DRAM bytes**: the distinct elements a scope (the whole call, or one kernel) must
  read from memory — the images of its read relations on the domain, restricted to the reads
  that no write of the same scope feeds (isl's dataflow analysis: reads without a source) —
  and the distinct elements it must leave in memory (the images of its writes to outputs, and
  to tensors a later scope reads), times the element size.

How points are counted (this isl build has no barvinok, so no ``isl_set_card``): a set whose
disjoint pieces (`isl.Set.make_disjoint`) are each equal to their bounding box (isl proves
the equality, parametrically) is counted *symbolically* as the sum over pieces of the product
of the box extents, an `isl.PwQPolynomial` in the size parameters — statement domains are
boxes by construction, and footprints of affine accesses on boxes (matmul, convolution
windows, shifted stencils, unions of overlapping boxes) almost always are. Any other set is
counted exactly at the call's sizes only (``isl_set_count_val`` on the set with every size
fixed); its `Count` has no symbolic form. A gather reads "anywhere along" its data-dependent
dimension (a may-read, see `poly.scop`): its footprint is bounded by the smaller of that
may-footprint and the number of reading instances, and marked inexact.

Operation classes (``OP_CLASSES``): ``fma`` (a float ``a*b + c`` or ``c ± a*b``, and the update
``acc += a*b`` of a ``+=`` reduction), ``add`` (float ``+ -``, reduction ``+=`` updates),
``mul``, ``div``, ``minmax`` (float min/max, ``fmax``/``fmin``, ``min=``/``max=`` updates),
``special`` (other math built-ins: exp, log, tanh, rsqrt, ...), ``compare`` and ``select``
(float comparisons, ``?:``), ``convert`` (casts), ``int`` (integer and boolean arithmetic on
values; index arithmetic inside tensor subscripts is address computation and not counted).
``flops = 2·fma + add + mul + div + minmax + special`` — so matmul M×N×K counts 2·M·N·K.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import islpy as isl

from .. import ir
from ..poly.scop import Scop, build_scop, maps_of, sets_of

__all__ = ["FLOP_WEIGHTS", "OP_CLASSES", "Count", "TensorTraffic", "WorkCounts", "count_points",
           "count_work", "distinct_writes", "evaluate", "op_counts"]

OP_CLASSES = ("fma", "add", "mul", "div", "minmax", "special", "compare", "select", "convert",
              "int")
FLOP_WEIGHTS = {"fma": 2, "add": 1, "mul": 1, "div": 1, "minmax": 1, "special": 1}
_MINMAX_CALLS = ("fmax", "fmin")
_FREE_CALLS = ("fabs", "copysign")  # sign-bit operations: no arithmetic


# ---------------------------------------------------------------- operations per instance


def op_counts(stmt: ir.Statement) -> Counter[str]:
    """Operations one instance of ``stmt``'s update performs (its ``!`` init performs none)."""
    ops: Counter[str] = Counter()
    rhs = stmt.rhs
    if stmt.reduction is None:
        _count(rhs, ops)
        return ops
    is_float = rhs.dtype.is_float
    if not is_float:
        _count(rhs, ops)
        ops["int"] += 1
    elif stmt.reduction is ir.Reduction.ADD and _is_mul(rhs):
        _count(rhs.lhs, ops)  # type: ignore[union-attr]
        _count(rhs.rhs, ops)  # type: ignore[union-attr]
        ops["fma"] += 1
    else:
        _count(rhs, ops)
        ops[{ir.Reduction.ADD: "add", ir.Reduction.MUL: "mul"}.get(stmt.reduction, "minmax")] += 1
    return ops


def _is_mul(e: ir.Expr) -> bool:
    return isinstance(e, ir.Binary) and e.op == "*" and e.dtype.is_float


def _count(e: ir.Expr, ops: Counter[str]) -> None:
    match e:
        case ir.Read():
            # subscripts are address arithmetic; a gather's index tensor read is a read
            return
        case ir.Binary(op=op, lhs=a, rhs=b) if e.dtype.is_float:
            if op in ("+", "-") and (_is_mul(a) or _is_mul(b)):
                mul, other = (a, b) if _is_mul(a) else (b, a)
                _count(mul.lhs, ops)  # type: ignore[union-attr]
                _count(mul.rhs, ops)  # type: ignore[union-attr]
                _count(other, ops)
                ops["fma"] += 1
                return
            ops[{"+": "add", "-": "add", "*": "mul", "/": "div", "%": "special",
                 "min": "minmax", "max": "minmax"}.get(op, "int")] += 1
        case ir.Binary(op=op, lhs=a):
            ops["compare" if op in ir.COMPARISONS and a.dtype.is_float else "int"] += 1
        case ir.Unary(op="-") if e.dtype.is_float:
            pass  # a sign flip folds into its neighbour
        case ir.Unary():
            ops["int"] += 1
        case ir.Call(func=f):
            if f == "fma":
                ops["fma"] += 1
            elif f in _MINMAX_CALLS:
                ops["minmax"] += 1
            elif f not in _FREE_CALLS:
                ops["special"] += 1
        case ir.Select():
            ops["select"] += 1
        case ir.Cast(operand=x) if x.dtype != e.dtype:
            ops["convert"] += 1
    for child in ir.children(e):
        _count(child, ops)


def flops_of(ops: Mapping[str, int]) -> int:
    return sum(w * int(ops.get(k, 0)) for k, w in FLOP_WEIGHTS.items())


# ---------------------------------------------------------------- counting points


@dataclass(frozen=True)
class Count:
    """A number of points (or a weighted sum of them): ``value`` at the call's sizes, and the
    isl quasi-polynomial over the sizes that gives it (None: counted at these sizes only).
    ``exact`` is False for gather footprints, which are upper bounds."""

    value: int
    symbolic: isl.PwQPolynomial | None = field(default=None, compare=False, repr=False)
    exact: bool = True

    @property
    def formula(self) -> str | None:
        """The symbolic count as isl text (``[M, N, K] -> { (M * N * K) : ... }``), or None."""
        return None if self.symbolic is None else str(self.symbolic)

    def __add__(self, other: Count) -> Count:
        sym = (None if self.symbolic is None or other.symbolic is None
               else self.symbolic.add(other.symbolic))
        return Count(self.value + other.value, sym, self.exact and other.exact)

    def scale(self, k: int) -> Count:
        sym = None if self.symbolic is None else self.symbolic.scale_val(
            isl.Val.int_from_si(self.symbolic.get_ctx(), int(k)))
        return Count(self.value * int(k), sym, self.exact)


def _fixed(s: isl.Set, sizes: Mapping[str, int]) -> isl.Set:
    for i in range(s.dim(isl.dim_type.param)):
        name = s.get_dim_name(isl.dim_type.param, i)
        if name in sizes:
            s = s.fix_val(isl.dim_type.param, i, isl.Val.int_from_si(s.get_ctx(), int(sizes[name])))
    return s


def evaluate(poly: isl.PwQPolynomial, sizes: Mapping[str, int]) -> int:
    """The value of a quasi-polynomial over the size parameters at ``sizes``."""
    space = poly.get_domain_space()
    point = isl.Point.zero(space)
    for i in range(space.dim(isl.dim_type.param)):
        name = space.get_dim_name(isl.dim_type.param, i)
        point = point.set_coordinate_val(isl.dim_type.param, i,
                                         isl.Val.int_from_si(poly.get_ctx(), int(sizes[name])))
    val = poly.eval(point)
    assert val.is_int(), f"count {poly} is not an integer at {dict(sizes)}: {val}"
    return int(val.to_python())


def _box_polynomial(piece: isl.BasicSet) -> isl.PwQPolynomial | None:
    """Σ-free count of a box-shaped piece: the product of its extents (None if not a box)."""
    s = isl.Set.from_basic_set(piece)
    params = s.params()
    n = s.dim(isl.dim_type.set)
    if n == 0:
        return _constant_poly(params, 1)
    lo, hi = s.min_multi_pw_aff(), s.max_multi_pw_aff()
    box = (isl.Set.universe(s.get_space()).lower_bound_multi_pw_aff(lo)
           .upper_bound_multi_pw_aff(hi).intersect_params(params))
    if not box.is_equal(s):
        return None
    poly = None
    for d in range(n):
        ext = hi.get_at(d).sub(lo.get_at(d))
        one = isl.PwAff.val_on_domain(ext.domain(), isl.Val.one(s.get_ctx()))
        q = isl.PwQPolynomial.from_pw_aff(ext.add(one))
        poly = q if poly is None else poly.mul(q)
    return poly


def count_points(s: isl.Set | isl.UnionSet, sizes: Mapping[str, int],
                 context: isl.Set | None = None) -> Count:
    """The number of points of ``s`` at ``sizes``, symbolic where every piece is a box."""
    sets = sets_of(s) if isinstance(s, isl.UnionSet) else [s]
    total = Count(0, None)
    first = True
    for one in sets:
        c = _count_set(one, sizes, context)
        total = c if first else total + c
        first = False
    if first:
        return Count(0, _constant_poly(s.params(), 0))
    return total


def _constant_poly(params: isl.Set, value: int) -> isl.PwQPolynomial:
    """``value`` on the parameter set ``params`` (zero elsewhere)."""
    pa = isl.PwAff.val_on_domain(params, isl.Val.int_from_si(params.get_ctx(), value))
    return isl.PwQPolynomial.from_pw_aff(pa)


def _count_set(s: isl.Set, sizes: Mapping[str, int], context: isl.Set | None) -> Count:
    if context is not None:
        s = s.intersect_params(context.align_params(s.get_space().params()))
    if s.is_empty():
        return Count(0, _constant_poly(s.params(), 0))
    pieces = s.coalesce().make_disjoint().get_basic_sets()
    polys = [_box_polynomial(p) for p in pieces]
    if all(p is not None for p in polys):
        poly = functools.reduce(lambda a, b: a.add(b), polys)  # type: ignore[arg-type]
        if context is not None:
            poly = poly.gist_params(context.align_params(poly.get_space().params()))
        return Count(evaluate(poly, sizes), poly)
    # isl_set_count_val enumerates (cleverly: ~1 s for 10^8 points): only for the rare
    # footprints that are not unions of boxes
    return Count(int(_fixed(s, sizes).count_val().to_python()), None)


# ---------------------------------------------------------------- work of a scope


@dataclass(frozen=True)
class TensorTraffic:
    """Distinct elements of one tensor a scope reads from / leaves in memory."""

    tensor: str
    itemsize: int
    read: Count
    written: Count

    @property
    def bytes(self) -> int:
        return self.itemsize * (self.read.value + self.written.value)


@dataclass(frozen=True)
class WorkCounts:
    """The ideal work of a scope (the call, or one kernel) at the call's sizes."""

    statements: tuple[str, ...]
    instances: dict[str, Count]
    ops: dict[str, Count]
    traffic: tuple[TensorTraffic, ...]
    sizes: dict[str, int] = field(default_factory=dict)

    @property
    def flops(self) -> int:
        return sum(FLOP_WEIGHTS.get(k, 0) * c.value for k, c in self.ops.items())

    @property
    def flops_count(self) -> Count:
        total = Count(0, None)
        parts = [c.scale(FLOP_WEIGHTS[k]) for k, c in self.ops.items() if k in FLOP_WEIGHTS]
        for i, c in enumerate(parts):
            total = c if i == 0 else total + c
        return total

    @property
    def bytes(self) -> int:
        return sum(t.bytes for t in self.traffic)

    @property
    def bytes_read(self) -> int:
        return sum(t.itemsize * t.read.value for t in self.traffic)

    @property
    def bytes_written(self) -> int:
        return sum(t.itemsize * t.written.value for t in self.traffic)

    @property
    def exact(self) -> bool:
        return all(t.read.exact and t.written.exact for t in self.traffic)

    def op_values(self) -> dict[str, int]:
        return {k: c.value for k, c in self.ops.items() if c.value}

    def bytes_formula(self) -> str | None:
        """The symbolic byte count (isl text), or None where a footprint is not box-shaped."""
        total = None
        for t in self.traffic:
            for c in (t.read, t.written):
                if c.value and c.symbolic is None:
                    return None
                if c.symbolic is not None:
                    term = c.scale(t.itemsize).symbolic
                    total = term if total is None else total.add(term)
        return None if total is None else str(total.coalesce())


@functools.lru_cache(maxsize=64)
def _parametric_scop(fn: ir.Function) -> Scop:
    return build_scop(fn)


def count_work(fn: ir.Function, sizes: Mapping[str, int], statements: Iterable[str] | None = None,
               *, global_tensors: Iterable[str] | None = None,
               outside_reads: Iterable[str] = ()) -> WorkCounts:
    """The work of the statements ``statements`` (isl names, default all) of ``fn`` at ``sizes``.

    ``global_tensors``: the tensors that live in device/host memory (default: inputs and
    outputs, i.e. the ideal where temporaries stay on chip); ``outside_reads``: tensors that
    statements outside the scope read after it, so what the scope writes to them is traffic.
    """
    scop = _parametric_scop(fn)
    names = tuple(statements) if statements is not None else tuple(scop.statements)
    unknown = [n for n in names if n not in scop.statements]
    assert not unknown, f"no statements {unknown} in {fn.name}"
    context = scop.context
    domain = isl.UnionSet.empty(scop.domain.get_space())
    for n in names:
        domain = domain.union(isl.UnionSet.from_set(scop.domains[n]))
    instances = {n: count_points(scop.domains[n], sizes, context) for n in names}
    ops: dict[str, Count] = {}
    for n in names:
        info = scop.statements[n]
        if info.is_init:
            continue
        for k, per in op_counts(fn.statements[info.index]).items():
            part = instances[n].scale(per)
            ops[k] = ops[k] + part if k in ops else part
    if global_tensors is None:
        global_tensors = [t.name for t in fn.inputs + fn.outputs]
    keep = set(global_tensors)
    outputs = {t.name for t in fn.outputs} | set(outside_reads)
    live_in, may_live_in = _live_in_reads(scop, domain)
    writes = scop.writes.intersect_domain(domain)
    traffic = []
    for t in fn.tensors:
        if t.name not in keep:
            continue
        read = _footprint(live_in, t.name, sizes, context)
        gather = _gather_footprint(scop, may_live_in, t.name, sizes, context)
        if gather is not None:
            read = Count(read.value + gather.value, None, False)
        written = (_footprint(writes, t.name, sizes, context) if t.name in outputs
                   else Count(0, None))
        if read.value or written.value:
            traffic.append(TensorTraffic(t.name, t.dtype.itemsize, read, written))
    return WorkCounts(names, instances, ops, tuple(traffic), dict(sizes))


def distinct_writes(fn: ir.Function, statement: str, sizes: Mapping[str, int]) -> int:
    """How many distinct elements statement ``statement`` writes (e.g. a reduction's outputs)."""
    scop = _parametric_scop(fn)
    dom = isl.UnionSet.from_set(scop.domains[statement])
    return count_points(scop.writes.intersect_domain(dom).range(), sizes, scop.context).value


def _live_in_reads(scop: Scop, domain: isl.UnionSet) -> tuple[isl.UnionMap, isl.UnionMap]:
    """(exact, may) reads of the scope that no write of the scope feeds (isl dataflow)."""
    schedule = scop.schedule.intersect_domain(domain)
    writes = scop.writes.intersect_domain(domain)
    out = []
    for reads in (scop.reads, scop.may_reads):
        info = isl.UnionAccessInfo.from_sink(reads.intersect_domain(domain))
        info = info.set_must_source(writes).set_schedule(schedule)
        out.append(info.compute_flow().get_may_no_source())
    return out[0], out[1]


def _footprint(accesses: isl.UnionMap, tensor: str, sizes: Mapping[str, int],
               context: isl.Set) -> Count:
    image = None
    for m in maps_of(accesses):
        if m.get_tuple_name(isl.dim_type.out) == tensor:
            r = m.range()
            image = r if image is None else image.union(r)
    if image is None:
        return Count(0, None)
    return count_points(image, sizes, context)


def _gather_footprint(scop: Scop, may_reads: isl.UnionMap, tensor: str,
                      sizes: Mapping[str, int], context: isl.Set) -> Count | None:
    """Bound on the distinct elements a gather reads: min(may-footprint, reading instances)."""
    maps = [m for m in maps_of(may_reads) if m.get_tuple_name(isl.dim_type.out) == tensor]
    if not maps:
        return None
    footprint = _footprint(may_reads, tensor, sizes, context).value
    readers = sum(count_points(m.domain(), sizes, context).value for m in maps)
    return Count(min(footprint, readers), None, False)
