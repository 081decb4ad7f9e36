"""Shard axes: the ways one call can be cut across ranks that each run the whole program locally.

Place: `tcmlir.torch.dtensor` asks `shard_axes(fn)` which iteration axes a TC function can be
sharded along, then `prove_axis(...)` at the call's global shapes and number of ranks, and
offers DTensor the proven ones as sharding strategies. No torch here; isl does the proofs.

An *axis* links iteration indices of statements and dimensions of tensors: index ``i`` of a
statement and dimension ``d`` of a tensor are joined when the statement accesses the tensor
with exactly ``i`` at position ``d`` (``A(i, k)`` joins ``i`` and ``A``'s dimension 0). The
connected classes are the candidate axes:

    C(m, n) +=! A(m, k) * B(k, n)      axes {m, A.0, C.0}, {n, B.1, C.1}, {k, A.1, B.0}

Along an axis each rank holds a chunk (``torch.chunk``'s cut) of every tensor dimension on the
axis and the whole of every other tensor, and runs the TC function on its local tensors. That is
right when (checked here, the symbolic part once per function, the rest per shapes):

1. every statement runs along the axis (one index of it on the axis), and no tensor has two
   dimensions on it;
2. every access to a tensor on the axis uses the axis index itself at that dimension, and no
   access to another tensor uses the axis index (``A(i + 1)`` in ``O(i) = A(i) + A(i + 1)``
   reads a neighbour's chunk: refused, DTensor then gathers);
3. a statement whose axis index is not on its left-hand side is a reduction over the axis: it
   must be an initialising ``+=!``, ``*=!``, ``max=!`` or ``min=!`` into an output that no
   other statement writes or reads; that output is then a *partial* result (sum, product, max,
   min of the ranks' values). Other statements write tensors sharded along the axis;
4. no dependence (isl dataflow: RAW, WAR, WAW) joins different chunks, except the reduction
   dependences of the statements in 3;
5. per rank, the local call (sizes bound from the local shapes) shifted back by the chunk's
   offsets is exactly the chunk of the global call: the same statement instances, reads,
   may-reads and writes (isl equality, as in `multi.plan` step 4), and its outputs have the
   local shapes DTensor expects. Values that would change (the axis index, or a size that
   shrinks, used as a number) are refused first.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import islpy as isl

from .. import ir
from ..binding import bind_sizes
from ..errors import CallError
from ..poly.deps import compute_dependences
from ..poly.scop import Scop, build_scop, maps_of

__all__ = ["PARTIAL_OPS", "ShardAxis", "chunk_bounds", "prove_axis", "shard_axes"]

# TC reduction -> the name of the matching reduce op of torch (DTensor's Partial)
PARTIAL_OPS = {ir.Reduction.ADD: "sum", ir.Reduction.MUL: "product",
               ir.Reduction.MAX: "max", ir.Reduction.MIN: "min"}


@dataclass(frozen=True)
class ShardAxis:
    """A candidate axis: ``dims`` (tensor -> its dimension on the axis; other tensors are
    replicated), ``index`` (statement number -> its index on the axis), ``partial`` (output ->
    reduce op, for outputs reduced over the axis); ``reason`` is None when the symbolic checks
    (1-4 of the module docstring) pass, else why the axis is refused."""

    dims: Mapping[str, int]
    index: Mapping[int, str]
    partial: Mapping[str, str]
    reason: str | None

    def __str__(self) -> str:
        where = ", ".join(f"{t}.{d}" for t, d in self.dims.items())
        return f"axis ({where})"


def _affine_indices(expr: ir.Expr) -> set[str]:
    """Index names in ``expr`` outside nested reads (a gather's subscripts are its own read)."""
    if isinstance(expr, ir.Index):
        return {expr.name}
    if isinstance(expr, ir.Read):
        return set()
    return set().union(*(_affine_indices(c) for c in ir.children(expr)))


def _value_sizes(expr: ir.Expr) -> set[str]:
    """Size names used as numbers in ``expr`` (outside subscripts)."""
    if isinstance(expr, ir.Size):
        return {expr.name}
    if isinstance(expr, ir.Read):
        return set()
    return set().union(*(_value_sizes(c) for c in ir.children(expr)))


def _reads(expr: ir.Expr) -> list[ir.Read]:
    return [e for e in ir.walk(expr) if isinstance(e, ir.Read)]


def _components(fn: ir.Function) -> list[tuple[set, set]]:
    """Union-find of (statement, index) and (tensor, dim) nodes joined by plain accesses."""
    parent: dict = {}

    def find(x):
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for k, st in enumerate(fn.statements):
        for i in st.index_names:
            find(("s", k, i))
        for d, i in enumerate(st.lhs):
            parent[find(("s", k, i))] = find(("t", st.tensor, d))
        for read in _reads(st.rhs):
            for d, e in enumerate(read.indices):
                if isinstance(e, ir.Index) and e.name in st.index_names:
                    parent[find(("s", k, e.name))] = find(("t", read.tensor, d))
    groups: dict = {}
    for node in list(parent):
        groups.setdefault(find(node), []).append(node)
    out = []
    for nodes in groups.values():
        stmts = {(k, i) for kind, k, i in nodes if kind == "s"}
        dims = {(t, d) for kind, t, d in nodes if kind == "t"}
        if stmts and dims:
            out.append((stmts, dims))
    out.sort(key=lambda sd: sorted(sd[1]))
    return out


@functools.lru_cache(maxsize=256)
def shard_axes(fn: ir.Function) -> tuple[ShardAxis, ...]:
    """Every candidate axis of ``fn``, with the symbolic checks done (see the module doc)."""
    return tuple(_check_symbolic(fn, stmts, dims) for stmts, dims in _components(fn))


def _check_symbolic(fn: ir.Function, stmts: set, dims_set: set) -> ShardAxis:
    dims: dict[str, int] = {}
    index: dict[int, str] = {}
    partial: dict[str, str] = {}

    def refuse(why: str) -> ShardAxis:
        return ShardAxis(dims, index, partial, why)

    for t, d in sorted(dims_set):
        if t in dims:
            return refuse(f"{t} has dimensions {dims[t]} and {d} on the axis")
        dims[t] = d
    for k, i in sorted(stmts):
        if k in index:
            return refuse(f"statement {k + 1} has indices {index[k]} and {i} on the axis")
        index[k] = i
    for k, st in enumerate(fn.statements):
        if k not in index:
            return refuse(f"statement {k + 1} ({st.tensor}) does not run along the axis")
    outputs = {t.name for t in fn.outputs}
    for k, st in enumerate(fn.statements):
        s = index[k]
        for read in _reads(st.rhs):
            d = dims.get(read.tensor)
            for pos, e in enumerate(read.indices):
                plain = isinstance(e, ir.Index) and e.name == s
                if pos == d and not plain:
                    return refuse(f"statement {k + 1} reads {read.tensor} at a position other "
                                  f"than the axis index {s} along its dimension {d} (a "
                                  "neighbour's chunk)")
                if pos != d and s in _affine_indices(e):
                    return refuse(f"statement {k + 1} reads {read.tensor} with the axis index "
                                  f"{s} in dimension {pos}, which is not on the axis")
        if s in st.lhs:
            continue
        if st.reduction is None or not st.init:
            return refuse(f"statement {k + 1} reduces over the axis index {s} without an "
                          "initialising reduction (+=!, *=!, max=!, min=!)")
        if st.tensor not in outputs:
            return refuse(f"statement {k + 1} reduces over the axis into the temporary "
                          f"{st.tensor}, which later statements would read before the ranks' "
                          "partial values are combined")
        for j, other in enumerate(fn.statements):
            if j != k and (other.tensor == st.tensor or
                           any(r.tensor == st.tensor for r in _reads(other.rhs))):
                return refuse(f"the reduction over the axis into {st.tensor} (statement "
                              f"{k + 1}) is written or read by statement {j + 1}")
        if any(r.tensor == st.tensor for r in _reads(st.rhs)):
            return refuse(f"statement {k + 1} reads its own output {st.tensor}")
        partial[st.tensor] = PARTIAL_OPS[st.reduction]
    return ShardAxis(dims, index, partial, None)


def chunk_bounds(extent: int, ranks: int) -> list[tuple[int, int]]:
    """``torch.chunk``'s cut of ``range(extent)`` into ``ranks`` (DTensor's `Shard`): chunks of
    ceil(extent / ranks), the last ones shorter or empty."""
    size = -(-extent // ranks) if extent else 0
    return [(min(r * size, extent), min((r + 1) * size, extent)) for r in range(ranks)]


def _fixed(obj):
    return obj.project_out_all_params().coalesce()


def _union_map(ctx: isl.Context, pieces: Sequence[str]) -> isl.UnionMap:
    if not pieces:
        return isl.UnionMap.read_from_str(ctx, "{ }")
    return isl.UnionMap.read_from_str(ctx, f"{{ {'; '.join(pieces)} }}")


def _on_axis(scop: Scop, axis: ShardAxis) -> dict[str, int]:
    """Statement name -> position of its axis index, for the instances that run along it."""
    out = {}
    for name, info in scop.statements.items():
        s = axis.index[info.index]
        if s in info.dims:   # an init statement of a reduction over the axis does not
            out[name] = info.dims.index(s)
    return out


def _shift(name: str, rank: int, pos: int | None, by: int) -> str:
    dims = [f"d{k}" for k in range(rank)]
    moved = [f"d{k} - ({by})" if k == pos else f"d{k}" for k in range(rank)]
    return f"{name}[{', '.join(dims)}] -> {name}[{', '.join(moved)}]"


def prove_axis(fn: ir.Function, axis: ShardAxis, shapes: Sequence[tuple[int, ...]],
               ranks: int) -> str | None:
    """None if ``fn`` called on ``shapes`` (the global input shapes) and sharded along
    ``axis`` over ``ranks`` computes, rank by rank, exactly its chunk (checks 4-5); else why not."""
    if axis.reason is not None:
        return axis.reason
    try:
        sizes = bind_sizes(fn, shapes)
    except CallError as exc:
        return str(exc)
    scop = build_scop(fn, sizes)
    extents = {t: tensor.shape[d].evaluate(sizes) for tensor in fn.tensors
               for t, d in axis.dims.items() if tensor.name == t}
    if len(set(extents.values())) != 1:
        return ("the tensors on the axis have different extents along it ("
                + ", ".join(f"{t}: {n}" for t, n in extents.items()) + ")")
    (extent,) = set(extents.values())
    on_axis = _on_axis(scop, axis)
    for name, pos in on_axis.items():
        dom = scop.domains[name].intersect_params(scop.context)
        dom = _fixed(dom)
        if dom.is_empty():
            continue
        lo, hi = dom.dim_min_val(pos).to_python(), dom.dim_max_val(pos).to_python() + 1
        if (lo, hi) != (0, extent):
            return (f"statement {name} runs its axis index over [{lo}, {hi}), not the "
                    f"tensors' extent [0, {extent})")
    chunks = chunk_bounds(extent, ranks)
    if any(hi <= lo for lo, hi in chunks):
        return f"an extent of {extent} leaves a rank of {ranks} without a chunk"
    why = _check_dependences(scop, axis, on_axis)
    if why:
        return why
    for lo, hi in chunks:
        why = _check_chunk(fn, scop, axis, on_axis, sizes, shapes, lo, hi)
        if why:
            return f"chunk [{lo}, {hi}): {why}"
    return None


def _axis_map(scop: Scop, on_axis: Mapping[str, int]) -> isl.UnionMap:
    pieces = [f"{n}[{', '.join(scop.statements[n].dims)}] -> [{scop.statements[n].dims[p]}]"
              for n, p in on_axis.items()]
    return _fixed(_union_map(scop.ctx, pieces).intersect_domain(_fixed(scop.domain)))


def _check_dependences(scop: Scop, axis: ShardAxis, on_axis: Mapping[str, int]) -> str | None:
    deps = _fixed(compute_dependences(scop).validity)
    reducing = [n for n, info in scop.statements.items()
                if scop.statement(n).tensor in axis.partial]
    if reducing:
        group = isl.UnionSet.read_from_str(
            scop.ctx, "{ " + "; ".join(f"{n}[{', '.join(scop.statements[n].dims)}]"
                                       for n in reducing) + " }")
        inside = isl.UnionMap.from_domain_and_range(group, group)
        deps = deps.subtract(_fixed(inside))
    f = _axis_map(scop, on_axis)
    crossing = deps.subtract(f.apply_range(f.reverse()))
    if crossing.is_empty():
        return None
    example = maps_of(crossing.coalesce())
    return ("a dependence joins different chunks of the axis"
            + (f": {example[0]}" if example else ""))


def _check_chunk(fn, scop, axis, on_axis, sizes, shapes, lo, hi) -> str | None:
    local = [tuple(hi - lo if axis.dims.get(t.name) == d else n for d, n in enumerate(shape))
             for t, shape in zip(fn.inputs, shapes, strict=True)]
    try:
        sub_sizes = bind_sizes(fn, local)
        sub = build_scop(fn, sub_sizes, ctx=scop.ctx)
    except CallError as exc:
        return f"the local shapes are not a call of {fn.name}: {exc}"
    changed = {n for n in sizes if sizes[n] != sub_sizes[n]}
    for k, st in enumerate(fn.statements):
        if axis.index[k] in _affine_indices(st.rhs):
            return (f"statement {k + 1} uses the axis index {axis.index[k]} as a value: a "
                    "rank would compute with shifted values")
        used = _value_sizes(st.rhs) & changed
        if used:
            return (f"statement {k + 1} uses the size {sorted(used)[0]} as a value, which the "
                    "local call has another value for")
    for t in fn.outputs:
        want = tuple(hi - lo if axis.dims.get(t.name) == d else e.evaluate(sizes)
                     for d, e in enumerate(t.shape))
        got = tuple(e.evaluate(sub_sizes) for e in t.shape)
        if got != want:
            return f"the local call makes {t.name} of shape {got}, its chunk is {want}"
    ctx = scop.ctx
    dom = _fixed(scop.domain)
    chunk = isl.UnionSet.read_from_str(ctx, f"{{ [s] : {lo} <= s < {hi} }}")
    f = _axis_map(scop, on_axis)
    off_axis = dom.subtract(f.domain())
    dom = dom.intersect(f.intersect_range(chunk).domain()).union(off_axis).coalesce()
    stmt_shift = _union_map(ctx, [_shift(n, len(info.dims), on_axis.get(n), lo)
                                  for n, info in scop.statements.items()])
    tensor_shift = _union_map(ctx, [_shift(t.name, t.rank, axis.dims.get(t.name), lo)
                                    for t in fn.tensors])
    if not dom.apply(stmt_shift).is_equal(_fixed(sub.domain)):
        return "the local call runs other statement instances than the chunk"
    for kind in ("reads", "may_reads", "writes"):
        mine = _fixed(getattr(scop, kind)).intersect_domain(dom)
        mine = mine.apply_domain(stmt_shift).apply_range(tensor_shift).coalesce()
        if not mine.is_equal(_fixed(getattr(sub, kind))):
            return (f"the local call's {kind.replace('_', '-')} differ from the chunk's "
                    "shifted by its offsets")
    return None
