"""The polyhedral model of a TC function (its "scop"): domains, accesses, the original schedule.

Input: a checked `ir.Function`. Output: a `Scop` of isl objects, all in one isl context owned by
the scop (isl options are per context, so every later phase that sets options works on
``scop.ctx``). Naming follows docs/architecture.md:

* size names are isl parameters; the context is ``fn.context`` (with ``sizes`` given, each
  parameter is also fixed to its value: a specialised scop);
* statement ``k`` is ``S{k}`` over ``Statement.index_names``; a ``!`` statement also has
  ``S{k}_init`` over its lhs indices, ordered just before ``S{k}``;
* arrays are named after tensors (scalars are 0-d arrays ``alpha[]``).

Accesses: each `ir.Read` with affine indices is an exact read (of the statement instances where
it is evaluated: a read in an arm of ``c ? x : y`` only where the affine part of ``c`` says so); an index that is not
quasi-affine (a gather) reads, for that tensor dimension, anywhere in the tensor's extent (a
may-read). A reduction's update reads and writes the accumulator ``lhs(lhs indices)``; the init
writes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import islpy as isl

from .. import ir
from ..affine import domain_guard, guarded_reads, to_isl
from ..errors import CallError

__all__ = ["Scop", "StatementInfo", "build_scop", "format_scop", "maps_of", "sets_of", "union_all"]


@dataclass(frozen=True)
class StatementInfo:
    """One isl statement: ``S{index}`` or ``S{index}_init``, iterating over ``dims``."""

    name: str
    index: int
    is_init: bool
    dims: tuple[str, ...]


@dataclass(frozen=True, eq=False)
class Scop:
    """The polyhedral model of ``fn`` (isl objects share ``ctx``)."""

    fn: ir.Function
    ctx: isl.Context
    params: tuple[str, ...]
    sizes: Mapping[str, int] | None
    context: isl.Set
    domain: isl.UnionSet
    reads: isl.UnionMap          # exact reads (affine indices, accumulator reads)
    may_reads: isl.UnionMap      # gathers: may read anywhere along a non-affine dimension
    writes: isl.UnionMap         # every write is exact
    schedule: isl.Schedule       # program order: a sequence of statements, loops in index order
    statements: Mapping[str, StatementInfo]
    domains: Mapping[str, isl.Set]   # per statement (kept even when empty for these sizes)

    @property
    def all_reads(self) -> isl.UnionMap:
        return self.reads.union(self.may_reads)

    def statement(self, name: str) -> ir.Statement:
        return self.fn.statements[self.statements[name].index]


def build_scop(fn: ir.Function, sizes: Mapping[str, int] | None = None,
               ctx: isl.Context | None = None, guards: bool = True) -> Scop:
    """Build the scop of ``fn``; with ``sizes``, every parameter given is fixed to its value.

    ``ctx`` lets a specialised scop share the context of isl objects built before (the
    `specialize` pass); by default the scop gets a fresh context. A statement's domain is its
    box, less the instances `affine.domain_guard` skips unless ``guards`` is False (the
    scheduler's view: `poly.scheduler.compute_schedule`).
    """
    ctx = ctx or isl.Context()
    params = tuple(fn.sizes)
    builder = _Builder(fn, ctx, params)
    context = builder.context(sizes)
    if sizes and context.is_empty():
        given = ", ".join(f"{k}={v}" for k, v in sizes.items())
        raise CallError(f"sizes {given} do not satisfy the constraints of {fn.name}: "
                        f"{fn.context}")
    infos: dict[str, StatementInfo] = {}
    domains: list[isl.Set] = []
    # the access maps, united once at the end (a running union copies the growing one)
    reads: list[isl.UnionMap] = []
    may_reads: list[isl.UnionMap] = []
    writes: list[isl.UnionMap] = []
    for k, stmt in enumerate(fn.statements):
        lhs_ranges = tuple(stmt.range_of(n) for n in stmt.lhs)
        if stmt.init:
            name = f"S{k}_init"
            dom = builder.box(name, lhs_ranges).intersect_params(context)
            infos[name] = StatementInfo(name, k, True, stmt.lhs)
            domains.append(dom)
            writes.append(builder.accumulator(name, stmt.lhs, stmt).intersect_domain(dom))
        name = f"S{k}"
        dom = builder.box(name, stmt.ranges).intersect_params(context)
        skip = domain_guard(stmt)
        if skip is not None and guards:  # instances where the guard fails change nothing
            dom = dom.intersect(builder.guard(name, stmt.index_names, skip[0])).coalesce()
        infos[name] = StatementInfo(name, k, False, stmt.index_names)
        domains.append(dom)
        acc = builder.accumulator(name, stmt.index_names, stmt).intersect_domain(dom)
        writes.append(acc)
        if stmt.reduction is not None:
            reads.append(acc)
        for read, guard in guarded_reads(stmt.rhs):
            exact, maybe = builder.access(name, stmt.index_names, read)
            where = dom if guard is None else dom.intersect(
                builder.guard(name, stmt.index_names, guard))
            if exact is not None:
                reads.append(isl.UnionMap.from_map(exact.intersect_domain(where)))
            if maybe is not None:
                may_reads.append(isl.UnionMap.from_map(maybe.intersect_domain(where)))
    empty = builder.empty_map()
    domain = union_all([isl.UnionSet.from_set(dom) for dom in domains], empty.domain())
    schedule = _program_order(ctx, domain, [infos[n] for n in infos], domains)
    return Scop(fn, ctx, params, None if sizes is None else MappingProxyType(dict(sizes)),
                context, domain, union_all(reads, empty).coalesce(),
                union_all(may_reads, empty).coalesce(), union_all(writes, empty).coalesce(),
                schedule, MappingProxyType(infos),
                MappingProxyType(dict(zip(infos, domains, strict=True))))


class _Builder:
    """Helpers turning IR pieces into isl objects over one parameter space."""

    def __init__(self, fn: ir.Function, ctx: isl.Context, params: tuple[str, ...]):
        self.fn = fn
        self.ctx = ctx
        self.params = params
        self.prefix = f"[{', '.join(params)}] -> " if params else ""
        self.param_space = isl.Set.read_from_str(ctx, f"{self.prefix}{{ : }}").get_space()

    def align(self, obj):
        return obj.align_params(self.param_space)

    def empty_map(self) -> isl.UnionMap:
        return isl.UnionMap.empty(self.param_space)

    def context(self, sizes: Mapping[str, int] | None) -> isl.Set:
        ctx_set = self.align(isl.Set.read_from_str(self.ctx, self.fn.context))
        for name, value in (sizes or {}).items():
            if name in self.params:
                fixed = isl.Set.read_from_str(self.ctx, f"{self.prefix}{{ : {name} = {int(value)} }}")
                ctx_set = ctx_set.intersect(fixed)
        return ctx_set

    def size(self, expr: ir.SizeExpr, on: isl.Set) -> isl.PwAff:
        """``expr`` as a piecewise affine function on the space of ``on``."""
        pa = self.align(expr.pw_aff(self.ctx))
        n = on.dim(isl.dim_type.set)
        pa = pa.insert_dims(isl.dim_type.in_, 0, n)
        pa = pa.set_tuple_id(isl.dim_type.in_, on.get_tuple_id())
        for d in range(n):
            pa = pa.set_dim_id(isl.dim_type.in_, d, on.get_dim_id(isl.dim_type.set, d))
        return pa

    def guard(self, name: str, dims: tuple[str, ...], condition: str) -> isl.Set:
        """``{ name[dims] : condition }``: where a read under a ``?:`` guard happens."""
        text = f"{self.prefix}{{ {name}[{', '.join(dims)}] : {condition} }}"
        return self.align(isl.Set.read_from_str(self.ctx, text))

    def box(self, name: str, ranges: tuple[ir.IndexRange, ...]) -> isl.Set:
        dims = ", ".join(r.name for r in ranges)
        universe = self.align(isl.Set.read_from_str(self.ctx, f"{self.prefix}{{ {name}[{dims}] }}"))
        box = universe
        ls = isl.LocalSpace.from_space(universe.get_space())
        for d, rng in enumerate(ranges):
            var = isl.PwAff.var_on_domain(ls, isl.dim_type.set, d)
            box = box.intersect(var.ge_set(self.size(rng.lo, universe)))
            box = box.intersect(var.lt_set(self.size(rng.hi, universe)))
        return box.coalesce()

    def _map(self, stmt_name: str, dims: tuple[str, ...], array: str, exprs: list[str],
             cond: str = "") -> isl.Map:
        text = (f"{self.prefix}{{ {stmt_name}[{', '.join(dims)}] -> "
                f"{array}[{', '.join(f'({e})' for e in exprs)}]{cond} }}")
        return self.align(isl.Map.read_from_str(self.ctx, text))

    def accumulator(self, stmt_name: str, dims: tuple[str, ...], stmt: ir.Statement) -> isl.UnionMap:
        return isl.UnionMap.from_map(self._map(stmt_name, dims, stmt.tensor, list(stmt.lhs)))

    def access(self, stmt_name: str, dims: tuple[str, ...], read: ir.Read):
        """(exact, may) access maps of ``read``: one is None; gathers are may-reads."""
        exprs = [to_isl(e) for e in read.indices]
        if all(e is not None for e in exprs):
            return self._map(stmt_name, dims, read.tensor, exprs), None
        return None, self._gather_map(stmt_name, dims, read.tensor, exprs,
                                      self.fn.tensor(read.tensor))

    def _gather_map(self, stmt_name, dims, array, exprs, tensor: ir.Tensor) -> isl.Map:
        outs = [f"_o{d}" for d in range(len(exprs))]
        eqs = [f"{o} = ({e})" for o, e in zip(outs, exprs, strict=True) if e is not None]
        text = (f"{self.prefix}{{ {stmt_name}[{', '.join(dims)}] -> {array}[{', '.join(outs)}]"
                f"{' : ' + ' and '.join(eqs) if eqs else ''} }}")
        m = self.align(isl.Map.read_from_str(self.ctx, text))
        extent = self.align(isl.Set.read_from_str(
            self.ctx, f"{self.prefix}{{ {array}[{', '.join(outs)}] }}"))
        ls = isl.LocalSpace.from_space(extent.get_space())
        for d, e in enumerate(exprs):
            if e is None:
                var = isl.PwAff.var_on_domain(ls, isl.dim_type.set, d)
                extent = extent.intersect(var.nonneg_set())
                extent = extent.intersect(var.lt_set(self.size(tensor.shape[d], extent)))
        return m.intersect_range(extent)


def _program_order(ctx: isl.Context, domain: isl.UnionSet, infos: list[StatementInfo],
                   domains: list[isl.Set]) -> isl.Schedule:
    """The original schedule: statements in sequence, each in its own loops in index order.

    The sequence node is made once with every filter (chaining ``Schedule.sequence`` copies
    the growing tree at each step: quadratic in the number of statements)."""
    bands = []
    for info in infos:
        if info.dims:
            parts = ", ".join(f"{{ {info.name}[{', '.join(info.dims)}] -> [({d})] }}" for d in info.dims)
            bands.append(isl.MultiUnionPwAff.read_from_str(ctx, f"[{parts}]"))
        else:
            bands.append(None)
    root = isl.Schedule.from_domain(domain).get_root()
    if len(infos) <= 1:
        node = root.child(0)
        if bands and bands[0] is not None:
            node = node.insert_partial_schedule(bands[0])
        return node.get_schedule()
    filters = isl.UnionSetList.alloc(ctx, len(domains))
    for dom in domains:
        filters = filters.add(isl.UnionSet.from_set(dom).universe())  # as Schedule.sequence
    node = root.child(0).insert_sequence(filters)
    for k, band in enumerate(bands):
        if band is not None:
            node = node.child(k).child(0).insert_partial_schedule(band).parent().parent()
    return node.get_schedule()


def format_scop(scop: Scop) -> str:
    """The ``--stage scop`` text: parameters, context, then per statement domain and accesses."""
    lines = [f"params: [{', '.join(scop.params)}]", f"context: {scop.context}"]
    if scop.sizes is not None:
        lines.append("sizes: " + ", ".join(f"{k}={v}" for k, v in scop.sizes.items()))
    for name in scop.statements:
        sd = scop.domains[name]
        lines.append(f"{name}:")
        lines.append(f"  domain: {sd.gist_params(scop.context)}")
        for label, umap in (("read", scop.reads), ("may-read", scop.may_reads),
                            ("write", scop.writes)):
            for m in maps_of(umap.intersect_domain(isl.UnionSet.from_set(sd))):
                lines.append(f"  {label}: {m.gist_domain(sd)}")
    return "\n".join(lines)


def union_all(parts: list, empty):
    """The union of ``parts`` (union maps or union sets; ``empty`` if there are none),
    pairwise: a running union copies the growing one each time (quadratic in the parts)."""
    while len(parts) > 1:
        parts = [parts[i].union(parts[i + 1]) if i + 1 < len(parts) else parts[i]
                 for i in range(0, len(parts), 2)]
    return parts[0] if parts else empty


def sets_of(uset: isl.UnionSet) -> list[isl.Set]:
    """The sets of a union set (one per space)."""
    out: list[isl.Set] = []
    uset.foreach_set(out.append)
    return out


def maps_of(umap: isl.UnionMap) -> list[isl.Map]:
    """The maps of a union map (one per pair of spaces), sorted by their text."""
    out: list[isl.Map] = []
    umap.foreach_map(out.append)
    return sorted(out, key=str)
