"""Promotion of tensor footprints to shared memory and registers, computed with isl.

The promotion passes (`passes/promote_shared.py`, `passes/promote_private.py`) decide *what*
to promote; this module holds the isl machinery they share and the record the code generator
reads (`Promotion`):

* a **footprint** of tensor ``T`` at a schedule node ``N``: the map from the prefix schedule
  at ``N`` (the values of the loops above it, with the block/thread parameters) to the elements
  of ``T`` accessed by the instances below ``N`` (`footprint`);
* its **box**: per tensor dimension a lower bound ``lo_d(prefix)`` (isl ``dim_min``), a stride
  ``s_d`` (isl stride detection) and a constant extent: the element ``a`` lives in the buffer at
  ``(a_d - lo_d) / s_d`` (`Box`);
* a **buffer**: the box stored in shared memory (padded innermost storage dimension against bank
  conflicts) or in registers (private to one thread);
* **copy statements** ``cpin_<buf>[p..., a...]`` / ``cpout_<buf>[p..., a...]`` over exactly
  the footprint (never outside the tensor), and **barriers** ``sync_<k>_<i>[p...]``, grafted
  into the schedule tree as isl extension nodes, so the tree still prints in isl syntax and
  re-parses.

isl cannot compute the schedule map of a tree with extension nodes, so the state keeps the tree
as it was before the first graft in ``CompileState.base_schedule``: legality and the coverage of
the original statements are proved on it (the grafts change no original statement's schedule),
and each graft is proved on its own here (`prove_in_box`, `prove_copy_mapping`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import islpy as isl

from .. import ir
from ..affine import guarded_reads, to_isl
from ..dtypes import DType
from .gpu_mapping import THREAD_PARAMS
from .scop import maps_of, sets_of

__all__ = [
    "COPY_STMT", "SYNC_STMT", "Box", "Buffer", "Promotion", "access_map", "compute_box", "copy_band", "copy_extension", "copy_parts", "footprint",
    "graft", "local_index", "prefix_pma", "prove_copy_mapping", "prove_in_box",
    "statement_accesses", "sync_extension", "thread_copy_filter",
]

# cpvin/cpvnext: `Buffer.copy_lanes` elements at once from a leader (poly/vector_copy.py)
COPY_STMT = re.compile(r"^cp(in|out|init|next|vin|vnext)_(\w+)$")
# barriers (sync), cp.async group commits (commit) and wait-for-the-older-group + barrier (wait)
SYNC_STMT = re.compile(r"^(sync|commit|wait)_\d+_\d+$")
_STMT = re.compile(r"^S(\d+)(_init)?$")


@dataclass(frozen=True)
class Box:
    """Per tensor dimension: lower bound (a function of the prefix), stride and extent."""

    lo: tuple[isl.PwAff, ...]       # on the prefix space
    stride: tuple[int, ...]
    extent: tuple[int, ...]         # number of buffer slots along each dimension
    # per dimension (or ()): None, or (S, V) when the offsets ``a - lo`` are groups of V
    # adjacent values S apart (an interleaved register tile): slot ``floor(d/S)*V + d mod S``
    groups: tuple[tuple[int, int] | None, ...] = ()

    @property
    def volume(self) -> int:
        v = 1
        for e in self.extent:
            v *= e
        return v


@dataclass(frozen=True, eq=False)
class Buffer:
    """A promoted footprint: ``space`` is ``"shared"`` or ``"private"``.

    ``order`` is the storage order of the tensor's dimensions (last = innermost) and
    ``storage`` the extent of each storage dimension (the innermost one padded); ``scope`` the
    instances of original statements whose accesses to ``tensor`` go to the buffer; ``prefix``
    maps them (and the copy statements) to the prefix schedule at the promotion node.
    """

    name: str
    tensor: str
    space: str
    kernel: int
    box: Box
    order: tuple[int, ...]
    storage: tuple[int, ...]
    scope: isl.UnionSet
    prefix: isl.UnionMap
    n_prefix: int
    copy_in: bool
    copy_out: bool
    fill: int | None = None   # statement whose initialisation fills the buffer (promote-private)
    stages: int = 1           # 2: double-buffered over the last prefix dimension (cp.async)
    copy_lanes: int = 1       # elements a cpvin/cpvnext copy moves at once (poly/vector_copy)
    copy_scatter: bool = False  # ... read at once, stored one by one (a transposed buffer)

    @property
    def stage_slots(self) -> int:
        n = 1
        for e in self.storage:
            n *= e
        return n

    @property
    def slots(self) -> int:
        return self.stage_slots * self.stages

    def flat_offset(self, local: list) -> object:
        """Element offset of buffer coordinates ``local`` (with the stage first when
        ``stages > 1``) as plain ints; the code generator builds the same sum in LLVM."""
        stage = local[0] if self.stages > 1 else 0
        rest = local[1:] if self.stages > 1 else local
        return stage * self.stage_slots + sum(v * s for v, s in zip(rest, self.strides(), strict=True))

    def strides(self) -> tuple[int, ...]:
        """Element stride of each *tensor* dimension's local index in the flat buffer."""
        out = [0] * len(self.order)
        step = 1
        for pos in reversed(range(len(self.order))):
            out[self.order[pos]] = step
            step *= self.storage[pos]
        return tuple(out)


@dataclass(frozen=True, eq=False)
class Promotion:
    """Every buffer of a compiled function, in the order they were made."""

    buffers: tuple[Buffer, ...] = field(default_factory=tuple)

    def buffer(self, name: str) -> Buffer:
        for b in self.buffers:
            if b.name == name:
                return b
        raise KeyError(name)

    def with_buffers(self, more: list[Buffer]) -> Promotion:
        return Promotion((*self.buffers, *more))


# ---------------------------------------------------------------- accesses


def access_map(stmt_name: str, dims: tuple[str, ...], tensor: str, indices: tuple[ir.Expr, ...],
               params: isl.Space) -> isl.Map | None:
    """``{ S[dims] -> tensor[indices] }`` (aligned to ``params``); None for a gather."""
    exprs = [to_isl(e) for e in indices]
    if any(e is None for e in exprs):
        return None
    names = [params.get_dim_name(isl.dim_type.param, i) for i in range(params.dim(isl.dim_type.param))]
    text = (f"[{', '.join(names)}] -> {{ {stmt_name}[{', '.join(dims)}] -> "
            f"{tensor}[{', '.join(f'({e})' for e in exprs)}] }}")
    return isl.Map.read_from_str(params.get_ctx(), text).align_params(params)


def statement_accesses(fn: ir.Function, stmt_name: str) -> list[tuple[object, str, tuple[ir.Expr, ...]]]:
    """(key, tensor, index expressions) of every access of an isl statement: the key is the
    `ir.Read` for reads of the right-hand side and ``"lhs"`` for the accumulator/written
    element. Reads nested in gather indices are included (their tensors are never promoted)."""
    m = _STMT.match(stmt_name)
    assert m, stmt_name
    st = fn.statements[int(m.group(1))]
    lhs = tuple(ir.Index(n, DType.INT32) for n in st.lhs)
    out: list[tuple[object, str, tuple[ir.Expr, ...]]] = [("lhs", st.tensor, lhs)]
    if m.group(2) is None:
        for e in ir.walk(st.rhs):
            if isinstance(e, ir.Read):
                out.append((e, e.tensor, e.indices))
    return out


def footprint(prefix: isl.UnionMap, accesses: isl.UnionMap, tensor: str) -> isl.Map | None:
    """The map prefix -> elements of ``tensor`` accessed (None: nothing accessed)."""
    fp = prefix.reverse().apply_range(accesses)
    found = [m for m in maps_of(fp) if m.get_tuple_name(isl.dim_type.out) == tensor]
    if not found:
        return None
    assert len(found) == 1
    return found[0].coalesce()


def compute_box(fp: isl.Map, *, interleave: bool = False) -> Box | None:
    """The strided box of footprint ``fp`` (None: some extent is unbounded). With
    ``interleave``, a unit-stride dimension whose offsets from the lower bound are groups of
    adjacent values with gaps between them (`interleaved_groups`) is compressed."""
    n_in = fp.dim(isl.dim_type.in_)
    wrapped = fp.wrap()
    lo, stride, extent, groups = [], [], [], []
    for d in range(fp.dim(isl.dim_type.out)):
        low, high = fp.dim_min(d), fp.dim_max(d)
        try:
            # both bounds take integer values; isl may write their difference with a rational
            # denominator (a split-K fc tile under min fusion), which max_val refuses: floor
            # leaves an integer value alone
            span = high.sub(low).floor().max_val()
        except isl.Error:
            return None  # no box: the tensor is not promoted
        if not span.is_int():
            return None
        s = wrapped.get_stride_info(n_in + d).get_stride()
        s = max(1, int(s.to_python())) if s.is_int() else 1
        lo.append(low)
        stride.append(s)
        extent.append(int(span.to_python()) // s + 1)
        found = interleaved_groups(fp, d, low, extent[-1]) if interleave and s == 1 else None
        groups.append(found)
        if found is not None:
            extent[-1] = (extent[-1] - 1) // found[0] * found[1] + found[1]
    return Box(tuple(lo), tuple(stride), tuple(extent),
               tuple(groups) if any(g is not None for g in groups) else ())


def interleaved_groups(fp: isl.Map, d: int, low: isl.PwAff, extent: int) -> tuple[int, int] | None:
    """(S, V) when every offset ``a_d - low(p)`` of footprint ``fp`` (over every prefix and
    parameter value) lies in ``{g*S + v : 0 <= v < V}`` with ``V < S`` (groups of ``V``
    adjacent elements ``S`` apart, as `register-tile` interleaves them), else None. ``V`` is
    the first gap, ``S`` the first offset after it; the inclusion is proved by isl."""
    ctx = fp.get_ctx()
    one = fp.project_out(isl.dim_type.out, d + 1, fp.dim(isl.dim_type.out) - d - 1)
    one = one.project_out(isl.dim_type.out, 0, d).reset_tuple_id(isl.dim_type.out)
    low_map = isl.Map.from_pw_aff(low.neg())
    one, low_map = one.align_params(low_map.get_space()), low_map.align_params(one.get_space())
    offsets = one.sum(low_map.intersect_domain(one.domain())).range()
    offsets = offsets.project_out(isl.dim_type.param, 0, offsets.dim(isl.dim_type.param))
    window = isl.Set.read_from_str(ctx, f"{{ [d] : 0 <= d < {extent} }}")
    gaps = window.subtract(offsets)
    if gaps.is_empty():
        return None
    v = int(gaps.dim_min_val(0).to_python())
    after = offsets.intersect(isl.Set.read_from_str(ctx, f"{{ [d] : d >= {v} }}"))
    if v == 0 or after.is_empty():
        return None
    span = int(after.dim_min_val(0).to_python())
    pattern = isl.Set.read_from_str(
        ctx, f"{{ [d] : exists g : 0 <= g and 0 <= d - {span} g < {v} }}")
    if not offsets.is_subset(pattern):
        return None
    return span, v


def prefix_pma(prefix: isl.UnionMap, space_name: str) -> isl.PwMultiAff:
    """The prefix schedule of the statement named ``space_name`` as a function."""
    for m in maps_of(prefix):
        if m.get_tuple_name(isl.dim_type.in_) == space_name:
            return isl.PwMultiAff.from_map(m)
    raise KeyError(space_name)


def local_index(buf: Buffer, index: isl.PwMultiAff, pre: isl.PwMultiAff) -> isl.PwMultiAff:
    """Buffer coordinates ``(a_d - lo_d(prefix)) / s_d`` of the access ``index`` (a function
    from a statement's instances to the tensor), ``pre`` the prefix schedule of that statement."""
    ctx = index.get_ctx()
    dims = []
    for d in range(index.dim(isl.dim_type.out)):
        a = index.get_pw_aff(d)
        lo = buf.box.lo[d].pullback_pw_multi_aff(pre)
        lo = lo.align_params(a.get_space().params())
        a = a.align_params(lo.get_space().params())
        local = a.sub(lo)
        s = buf.box.stride[d]
        if s > 1:
            local = local.scale_down_val(isl.Val.int_from_si(ctx, s)).floor()
        group = buf.box.groups[d] if buf.box.groups else None
        if group is not None:  # groups of V adjacent slots, S apart: floor(d/S)*V + d mod S
            span, width = (isl.Val.int_from_si(ctx, x) for x in group)
            local = local.scale_down_val(span).floor().scale_val(width).add(local.mod_val(span))
        dims.append(local)
    if buf.stages > 1:  # the stage: the last prefix dimension (the sequential tile loop) mod 2
        stage = pre.get_pw_aff(buf.n_prefix - 1).mod_val(isl.Val.int_from_si(ctx, buf.stages))
        dims.insert(0, stage.align_params(dims[0].get_space().params()))
        dims = [d.align_params(dims[0].get_space().params()) for d in dims]
    out = isl.PwMultiAff.from_pw_aff(dims[0])
    for pa in dims[1:]:
        out = out.flat_range_product(isl.PwMultiAff.from_pw_aff(pa))
    return out.set_range_tuple_id(isl.Id(buf.name, context=ctx))


# ---------------------------------------------------------------- copy and sync statements


def copy_extension(fp: isl.Map, name: str) -> isl.Map:
    """The extension relation of a copy statement over exactly the footprint ``fp``."""
    return fp.domain_map().reverse().flatten_range().set_tuple_name(isl.dim_type.out, name)


def sync_extension(prefix_range: isl.Set, name: str) -> isl.Map:
    """``{ [p] -> name[p] }`` for every prefix value ``p`` of ``prefix_range``."""
    ident = isl.Map.identity(prefix_range.get_space().map_from_set()).intersect_domain(prefix_range)
    return ident.set_tuple_name(isl.dim_type.out, name)


def copy_parts(copy_space: isl.Space, n_prefix: int, rank: int, *, ahead: bool = False
               ) -> tuple[isl.MultiAff, isl.MultiAff]:
    """(copy[p, a] -> [p], copy[p, a] -> T[a]) projections of a copy statement; with ``ahead``
    (a ``cpnext`` copy, issued one tile early) the first is ``p`` plus one in its last
    dimension: the tile the element belongs to."""
    ls = isl.LocalSpace.from_space(copy_space)
    ma_p = isl.MultiAff.zero(_proj_space(copy_space, n_prefix))
    for i in range(n_prefix):
        aff = isl.Aff.var_on_domain(ls, isl.dim_type.set, i)
        if ahead and i == n_prefix - 1:
            aff = aff.add_constant_val(isl.Val.one(copy_space.get_ctx()))
        ma_p = ma_p.set_aff(i, aff)
    ma_a = isl.MultiAff.zero(_proj_space(copy_space, rank))
    for i in range(rank):
        ma_a = ma_a.set_aff(i, isl.Aff.var_on_domain(ls, isl.dim_type.set, n_prefix + i))
    return ma_p, ma_a


def _proj_space(domain: isl.Space, n_out: int) -> isl.Space:
    out = isl.Space.set_alloc(domain.get_ctx(), 0, n_out).align_params(domain)
    return domain.map_from_domain_and_range(out)


def copy_linear_index(copy_set: isl.Set, buf: Buffer, n_prefix: int, *, ahead: bool = False,
                      lanes: int = 1) -> isl.PwAff:
    """The row-major (tensor order) linear local index of a copy statement's element (with
    ``lanes`` > 1, divided by it and rounded down: the index of a vector copy's leader, which
    is distinct for distinct leaders of one tile)."""
    space = copy_set.get_space()
    ls = isl.LocalSpace.from_space(space)
    ma_p, _ = copy_parts(space, n_prefix, len(buf.box.extent), ahead=ahead)
    linear = None
    assert not buf.box.groups, f"{buf.name}: shared copies of an interleaved box"
    for d in range(len(buf.box.extent)):
        a = isl.PwAff.from_aff(isl.Aff.var_on_domain(ls, isl.dim_type.set, n_prefix + d))
        lo = buf.box.lo[d].pullback_multi_aff(ma_p).align_params(a.get_space().params())
        a = a.align_params(lo.get_space().params())
        local = a.sub(lo)
        if buf.box.stride[d] > 1:
            local = local.scale_down_val(isl.Val.int_from_si(space.get_ctx(), buf.box.stride[d])).floor()
        linear = local if linear is None else linear.scale_val(
            isl.Val.int_from_si(space.get_ctx(), buf.box.extent[d])).add(local)
    assert linear is not None
    if lanes > 1:
        linear = linear.scale_down_val(isl.Val.int_from_si(space.get_ctx(), lanes)).floor()
    return linear.intersect_domain(copy_set.align_params(linear.get_space().params()))


def copy_band(copy_set: isl.Set, buf: Buffer, n_prefix: int, *, ahead: bool = False,
              lanes: int = 1) -> isl.MultiUnionPwAff:
    """The one-member band of a shared copy: its linear local index. (A band over the element
    coordinates, under the modulo thread filter, made isl 2026.2's AST generator drop
    instances: ``{ B[r, c] : (128r + c - t) mod 256 = 0 }`` scheduled by ``[r, c]`` came out as
    one call per thread instead of four; the linear band gives the strided loop.)"""
    linear = copy_linear_index(copy_set, buf, n_prefix, ahead=ahead, lanes=lanes)
    return isl.MultiUnionPwAff.from_multi_pw_aff(isl.MultiPwAff.from_pw_aff(linear))


def thread_copy_filter(copy_set: isl.Set, buf: Buffer, n_prefix: int,
                       block: tuple[int, int, int], *, ahead: bool = False,
                       lanes: int = 1) -> isl.Set:
    """Instances of a shared copy statement that thread ``(_tx, _ty, _tz)`` runs: the linear
    local index (over ``lanes``, for vector copies) modulo the block's thread count equals the
    linear thread id, so consecutive threads copy consecutive elements (coalesced)."""
    space = copy_set.get_space()
    linear = copy_linear_index(copy_set, buf, n_prefix, ahead=ahead, lanes=lanes)
    total = block[0] * block[1] * block[2]
    ctx = space.get_ctx()
    tid = None
    step = 1
    for name, ext in zip(THREAD_PARAMS, block, strict=True):
        pos = linear.get_space().find_dim_by_name(isl.dim_type.param, name)
        if ext == 1 or pos < 0:
            step *= ext
            continue
        p = isl.PwAff.from_aff(isl.Aff.var_on_domain(
            isl.LocalSpace.from_space(linear.get_domain_space()), isl.dim_type.param, pos))
        p = p.scale_val(isl.Val.int_from_si(ctx, step))
        tid = p if tid is None else tid.add(p)
        step *= ext
    lhs = linear.mod_val(isl.Val.int_from_si(ctx, total))
    if tid is None:
        tid = isl.PwAff.zero_on_domain(isl.LocalSpace.from_space(linear.get_domain_space()))
    out = lhs.eq_set(tid).intersect(copy_set.align_params(lhs.get_space().params()))
    for name, ext in zip(THREAD_PARAMS, block, strict=True):  # the block's thread ranges
        pos = out.find_dim_by_name(isl.dim_type.param, name)
        if pos >= 0:
            out = out.lower_bound_val(isl.dim_type.param, pos, isl.Val.zero(ctx))
            out = out.upper_bound_val(isl.dim_type.param, pos, isl.Val.int_from_si(ctx, ext - 1))
    return out


def graft(node: isl.ScheduleNode, extension: isl.UnionMap, parts: list[tuple[isl.UnionSet, isl.UnionSet | None, isl.MultiUnionPwAff | None, bool]],
          *, before: bool) -> isl.ScheduleNode:
    """Graft, before (or after) ``node``, an extension introducing the statements of
    ``extension``; below it a sequence with one child per part: (statements, optional thread
    filter, optional band schedule, unroll the band). Returns ``node`` at its new position."""
    g = isl.ScheduleNode.from_extension(extension).child(0)
    filters = isl.UnionSetList.alloc(node.get_ctx(), len(parts))
    for stmts, _, _, _ in parts:
        filters = filters.add(stmts)
    many = len(parts) > 1
    if many:
        g = g.insert_sequence(filters)
    for i, (stmts, thread_filter, band, unroll) in enumerate(parts):
        child = g.child(i).child(0) if many else g.insert_filter(stmts).child(0)
        if thread_filter is not None:
            child = child.insert_filter(thread_filter).child(0)
        if band is not None:
            child = child.insert_partial_schedule(band)
            if unroll:
                for m in range(child.band_n_member()):
                    child = child.band_member_set_ast_loop_type(m, isl.ast_loop_type.unroll)
        g = child
        stop = isl.schedule_node_type.sequence if many else isl.schedule_node_type.extension
        while g.get_type() != stop:
            g = g.parent()
    g = g.get_schedule().get_root()
    return node.graft_before(g) if before else node.graft_after(g)


# ---------------------------------------------------------------- proofs


def prove_in_box(buf: Buffer, fn: ir.Function) -> None:
    """Prove with isl that every access of the original statements in ``buf.scope`` to the
    promoted tensor lands inside the buffer where the code makes it: each local coordinate in
    ``[0, extent)`` (the stage coordinate of a double-buffered buffer in ``[0, stages)``). A
    read in an arm of ``?:`` counts only where that arm is taken (TC's triangular
    ``(r_k >= m1 && r_k <= m2) ? L(m1, r_k) * U(r_k, m2) : 0``: the footprint, from the scop's
    guarded reads, holds only those elements). An AssertionError names the statement and the
    coordinate otherwise."""
    params = buf.scope.get_space().params()
    for inst in sets_of(buf.scope):
        name = inst.get_tuple_name()
        if not _STMT.match(name):
            continue
        pre = prefix_pma(buf.prefix, name)
        st = fn.statements[int(_STMT.match(name).group(1))]
        dims = st.lhs if name.endswith("_init") else st.index_names
        for tensor, indices, guard in _evaluated_accesses(fn, name):
            if tensor != buf.tensor:
                continue
            amap = access_map(name, tuple(dims), tensor, tuple(indices), params)
            if amap is None:
                raise AssertionError(f"buffer {buf.name}: {name} reads {tensor} through a gather")
            amap = amap.intersect_domain(inst.align_params(amap.get_space().params()))
            if guard is not None:  # a read in an arm of `?:`: only where that arm is taken
                where = isl.Set.read_from_str(
                    amap.get_ctx(), f"[{', '.join(_param_names(params))}] -> "
                                    f"{{ {name}[{', '.join(dims)}] : {guard} }}")
                amap = amap.intersect_domain(where.align_params(amap.get_space().params()))
            local = isl.Map.from_pw_multi_aff(local_index(buf, isl.PwMultiAff.from_map(amap), pre))
            rng = local.range()
            bounds = ([buf.stages] if buf.stages > 1 else []) + list(buf.box.extent)
            for d, extent in enumerate(bounds):
                inside = rng.lower_bound_val(isl.dim_type.set, d, isl.Val.zero(rng.get_ctx()))
                inside = inside.upper_bound_val(isl.dim_type.set, d,
                                                isl.Val.int_from_si(rng.get_ctx(), extent - 1))
                if not rng.subtract(inside).is_empty():
                    raise AssertionError(f"buffer {buf.name}: an access of {name} leaves the box "
                                         f"{bounds} along coordinate {d}: {rng.subtract(inside)}")


def _param_names(params: isl.Space) -> list[str]:
    return [params.get_dim_name(isl.dim_type.param, i) for i in range(params.dim(isl.dim_type.param))]


def _evaluated_accesses(fn: ir.Function, stmt_name: str
                        ) -> list[tuple[str, tuple[ir.Expr, ...], str | None]]:
    """(tensor, indices, guard) of every access of an isl statement: the written element, and
    each read with the isl condition under which the code evaluates it (None: always). The
    code generators evaluate only the taken arm of ``?:`` (`codegen.exprs` branches), and the
    scop's reads (hence the footprints) carry the same conditions (`affine.guarded_reads`)."""
    m = _STMT.match(stmt_name)
    assert m, stmt_name
    st = fn.statements[int(m.group(1))]
    out: list[tuple[str, tuple[ir.Expr, ...], str | None]] = [
        (st.tensor, tuple(ir.Index(n, DType.INT32) for n in st.lhs), None)]
    if m.group(2) is None:
        out.extend((r.tensor, r.indices, guard) for r, guard in guarded_reads(st.rhs))
    return out


def prove_copy_mapping(copy_set: isl.Set, mapped: isl.Set, params: tuple[str, ...]) -> None:
    """Each copy instance of ``copy_set`` runs on exactly one thread (``mapped`` is the copy set
    with the thread condition; the thread parameters range over the block)."""
    rel = isl.Map.from_domain(mapped)
    for p in params:
        pos = rel.find_dim_by_name(isl.dim_type.param, p)
        if pos >= 0:
            rel = rel.move_dims(isl.dim_type.out, rel.dim(isl.dim_type.out), isl.dim_type.param, pos, 1)
    dom = rel.domain()
    want = copy_set
    for p in params:
        pos = want.find_dim_by_name(isl.dim_type.param, p)
        if pos >= 0:
            want = want.project_out(isl.dim_type.param, pos, 1)
    want, dom = want.align_params(dom.get_space().params()), dom.align_params(want.get_space().params())
    if not dom.is_equal(want) or not rel.is_single_valued():
        raise AssertionError(f"copy mapping of {copy_set.get_tuple_name()} is not one thread per "
                             f"element: {mapped}")
