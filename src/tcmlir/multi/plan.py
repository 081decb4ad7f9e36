"""The split of one call across devices, computed with isl: chunks, footprints, bytes to move.

Place: `tcmlir.api.TCFunction.plan` / ``fn(..., devices=[...])`` → `make_plan` (here, no GPU
needed) → `multi.execute` (the launches). Each part of a split is an ordinary call of the same
TC function at the chunk's size — a sub-problem — so its kernel is the single-device kernel of
that signature (compiled, cached and tuned like any other; see `multi.tune`).

The split dimension is the schedule dimension ``f: S_k[...] -> [lhs_k[0]]`` that every
statement shares: the leading index of the tensor it writes. Why the leading one: a chunk of it
makes every tensor it indexes a contiguous slab of rows, so a part receives one copy per tensor
(no packing) and an input already on the part's device is used in place (a pointer into it).

    full problem, devices [0, 1]               part 0 (device 0)       part 1 (device 1)
    C(m, n) +=! A(m, k) * B(k, n)              M' = 50                  M' = 50
    m in [0, 100)  --cut f's range-->          A[0:50, :], B, C[0:50]   A[50:100, :], B, C[50:100]

How a split is proved legal, each step with isl (any failure keeps the call on one device and
`SplitPlan.reason` says why):

1. every statement writes a tensor of rank >= 1, and ``f`` as an outer band member carries no
   dependence (`poly.legality.member_is_parallel` on RAW, WAR, WAW and reduction dependences):
   no value crosses from one chunk to another;
2. each tensor depends on the chunk through its leading dimension only (the access relations
   composed with ``f``): it is *sliced* (rows ``[lo, hi)`` per part), or not at all:
   *replicated* (every part gets all of it);
3. per chunk, the exact footprint of each tensor is the access relations applied to the
   chunk's sub-domain; an input's slab is the rows of its footprint; the sub-problem's sizes
   are bound from the slabs' shapes as a call would bind them;
4. the sub-problem's scop, shifted back by the chunk's offsets (statements by the chunk's
   start on ``f``, each tensor by its slab's first row), equals the chunk: the same instances
   and the same accesses (reads, may-reads, writes), so the sub-call computes exactly the
   chunk's outputs. Values that would change (the split index, or a size whose value differs,
   used as a number in an expression) are refused first;
5. output slabs of different parts do not overlap (each output row has one writer).

Inputs that live on a part's device are not moved; `Part.bytes_in` counts the bytes of the slabs
a part must receive (host arrays, or arrays on another device), `Part.bytes_out` those it sends
to the output device.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import islpy as isl

from .. import ir
from ..binding import bind_sizes
from ..call_args import as_devices
from ..errors import CallError
from ..poly.deps import compute_dependences
from ..poly.legality import member_is_parallel
from ..poly.scop import Scop, build_scop, maps_of, sets_of

__all__ = ["Part", "SplitPlan", "make_plan", "received_bytes"]

HOST = None  # the location of a host (numpy) input


@dataclass(frozen=True)
class Part:
    """One device's share of a call: an ordinary call at ``sizes`` on rows ``slabs``."""

    device: int
    chunk: tuple[int, int]                    # [lo, hi) of the split dimension ((0, 0): unsplit)
    domain: str                               # isl union set: the statement instances it runs
    footprints: Mapping[str, str]             # input read / output written, isl set text
    slabs: Mapping[str, tuple[int, int]]      # rows [lo, hi) of dim 0, inputs and outputs
    sizes: Mapping[str, int]                  # the sub-problem's size values
    bytes_in: int                             # bytes of input slabs this device must receive
    bytes_out: int                            # bytes of output slabs sent to the output device

    def shape(self, tensor: ir.Tensor) -> tuple[int, ...]:
        """``tensor``'s shape in this part's sub-call."""
        return tuple(e.evaluate(dict(self.sizes)) for e in tensor.shape)


@dataclass(frozen=True)
class SplitPlan:
    """How a call runs on ``devices``: ``parts`` (one per chunk), or one part and a ``reason``."""

    entry: str
    devices: tuple[int, ...]
    sizes: Mapping[str, int]
    output_device: int
    parts: tuple[Part, ...]
    split: str                                # the split dimension, in words
    reason: str | None = None                 # why the call is not split (None: it is)
    sliced: frozenset[str] = field(default_factory=frozenset)   # tensors cut into row slabs
    locations: Mapping[str, Any] = field(default_factory=dict)  # input -> device, None (host), shards
    covered: Mapping[str, bool] = field(default_factory=dict)   # output -> slabs cover all rows

    @property
    def is_split(self) -> bool:
        return self.reason is None

    @property
    def bytes_in(self) -> int:
        return sum(p.bytes_in for p in self.parts)

    def __str__(self) -> str:
        sizes = ", ".join(f"{k}={v}" for k, v in self.sizes.items())
        lines = [f"plan for {self.entry} on devices {list(self.devices)} ({sizes}), "
                 f"outputs on device {self.output_device}"]
        if self.reason is not None:
            lines.append(f"  not split: {self.reason}")
        else:
            lines.append(f"  split: {self.split}")
        for k, p in enumerate(self.parts):
            sub = ", ".join(f"{n}={v}" for n, v in p.sizes.items())
            what = (f"chunk [{p.chunk[0]}, {p.chunk[1]})" if self.is_split else "the whole call")
            lines.append(f"  part {k} on device {p.device}: {what}, sizes {sub}; "
                         f"{p.bytes_in} bytes in, {p.bytes_out} bytes out")
            lines.append(f"    domain: {p.domain}")
            for name, fp in p.footprints.items():
                lo, hi = p.slabs.get(name, (0, 0))
                how = f"rows [{lo}, {hi})" if name in self.sliced else "whole"
                lines.append(f"    {name}: {how} {fp}")
        return "\n".join(lines)


class _NoSplit(Exception):
    """Why a split is refused (becomes `SplitPlan.reason`)."""


def make_plan(fn: ir.Function, sizes: Mapping[str, int], devices: Sequence[int],
              locations: Mapping[str, Any] | None = None,
              output_device: int | None = None) -> SplitPlan:
    """The split of a call of ``fn`` at ``sizes`` over ``devices`` (see the module docstring).

    ``locations``: the device ordinal of each input (None: a host array; or the
    ``(device, first row, end row)`` of each shard of a `multi.shards.Sharded`), for the bytes
    to move; ``output_device`` defaults to ``devices[0]``.
    """
    devices = _check_devices(devices)
    locations = dict(locations or {t.name: HOST for t in fn.inputs})
    out_dev = devices[0] if output_device is None else int(output_device)
    sizes = {n: int(sizes[n]) for n in fn.sizes if n in sizes}
    scop = build_scop(fn, sizes)
    try:
        if len(devices) == 1:
            raise _NoSplit("one device")
        split, parts, sliced, covered = _split(fn, scop, sizes, devices, locations, out_dev)
        return SplitPlan(fn.name, devices, sizes, out_dev, parts, split, None, sliced,
                         locations, covered)
    except _NoSplit as why:
        part = _whole(fn, scop, sizes, devices[0], locations, out_dev)
        return SplitPlan(fn.name, devices, sizes, out_dev, (part,), "", str(why),
                         frozenset(), locations, {t.name: True for t in fn.outputs})


def _check_devices(devices: Sequence[int]) -> tuple[int, ...]:
    out = as_devices(devices)
    if out is None:
        raise CallError("devices= must be a non-empty list of CUDA device ordinals, got None")
    return out


# ---------------------------------------------------------------- isl helpers


def _fixed(obj):
    """``obj`` without parameters (every parameter of a specialised scop is fixed)."""
    return obj.project_out_all_params().coalesce()


def _tensor_sets(uset: isl.UnionSet) -> dict[str, isl.Set]:
    return {s.get_tuple_name(): s for s in sets_of(uset)}


def _split_map(fn: ir.Function, scop: Scop) -> tuple[isl.UnionMap, dict[str, int]]:
    """``f``: each statement instance to its lhs's leading index; and that index's position."""
    pieces, position = [], {}
    for name, info in scop.statements.items():
        stmt = fn.statements[info.index]
        if not stmt.lhs:
            raise _NoSplit(f"statement {info.index + 1} writes the scalar {stmt.tensor}: it has "
                           "no leading dimension to split")
        position[name] = info.dims.index(stmt.lhs[0])
        pieces.append(f"{name}[{', '.join(info.dims)}] -> [{stmt.lhs[0]}]")
    prefix = f"[{', '.join(scop.params)}] -> " if scop.params else ""
    text = f"{prefix}{{ {'; '.join(pieces)} }}"
    f = isl.UnionMap.read_from_str(scop.ctx, text).intersect_domain(scop.domain)
    return f, position


def _check_parallel(scop: Scop, f: isl.UnionMap) -> None:
    deps = compute_dependences(scop).validity
    schedule = isl.Schedule.from_domain(scop.domain).insert_partial_schedule(
        isl.MultiUnionPwAff.from_union_map(f))
    band = schedule.get_root().child(0)
    if member_is_parallel(band, 0, deps):
        return
    crossing = maps_of(_fixed(deps.subtract(f.apply_range(f.reverse()))))
    example = f": {crossing[0]}" if crossing else ""
    raise _NoSplit("a dependence crosses the leading index of the statements' outputs "
                   f"(values flow between chunks){example}")


def _classify(fn: ir.Function, scop: Scop, f: isl.UnionMap) -> frozenset[str]:
    """The tensors sliced by the split (leading dimension only); the others are replicated."""
    by_value = f.reverse()  # [s] -> instances

    def dims(rank: int) -> str:
        return ", ".join(f"d{k}" for k in range(rank))

    accesses = scop.all_reads.union(scop.writes)
    sliced = set()
    for tensor in fn.tensors:
        if tensor.rank == 0:
            continue
        rel = _fixed(by_value.apply_range(accesses)).intersect_range(
            isl.UnionSet.read_from_str(scop.ctx, f"{{ {tensor.name}[{dims(tensor.rank)}] }}"))
        maps = maps_of(rel)
        if not maps:
            continue
        m = maps[0]
        if m.is_equal(isl.Map.from_domain_and_range(m.domain(), m.range())):
            continue  # every chunk touches the same elements: replicated
        rest = m.project_out(isl.dim_type.out, 0, 1)
        if not rest.is_equal(isl.Map.from_domain_and_range(rest.domain(), rest.range())):
            raise _NoSplit(f"{tensor.name} is indexed by the split index outside its leading "
                           "dimension: a part's share of it would not be a contiguous slab")
        sliced.add(tensor.name)
    return frozenset(sliced)


def _rows(s: isl.Set) -> tuple[int, int]:
    return int(s.dim_min_val(0).to_python()), int(s.dim_max_val(0).to_python()) + 1


def _shift_map(name: str, rank: int, pos: int, by: int) -> str:
    dims = [f"d{k}" for k in range(rank)]
    moved = [f"d{k} - ({by})" if k == pos else f"d{k}" for k in range(rank)]
    return f"{name}[{', '.join(dims)}] -> {name}[{', '.join(moved)}]"


def _union_map(ctx: isl.Context, pieces: Sequence[str]) -> isl.UnionMap:
    if not pieces:
        return isl.UnionMap.read_from_str(ctx, "{ }")
    return isl.UnionMap.read_from_str(ctx, f"{{ {'; '.join(pieces)} }}")


def _value_uses(expr: ir.Expr):
    """The `ir.Index` / `ir.Size` nodes used as numbers (not inside a subscript)."""
    if isinstance(expr, (ir.Index, ir.Size)):
        yield expr
    if isinstance(expr, ir.Read):
        return
    for child in ir.children(expr):
        yield from _value_uses(child)


# ---------------------------------------------------------------- the split


def _split(fn: ir.Function, scop: Scop, sizes: dict[str, int], devices: tuple[int, ...],
           locations: Mapping[str, Any], out_dev: int):
    f, position = _split_map(fn, scop)
    _check_parallel(scop, f)
    sliced = _classify(fn, scop, f)
    values = _fixed(f.range())
    if values.is_empty():
        raise _NoSplit("the program runs no statement instance at these sizes")
    (value_set,) = sets_of(values)
    lo, hi = _rows(value_set)
    count = min(len(devices), hi - lo)
    if count < 2:
        raise _NoSplit(f"the split dimension has {hi - lo} value(s): nothing to share")
    bounds = [lo + (hi - lo) * k // count for k in range(count + 1)]
    ctx = scop.ctx
    domain = _fixed(scop.domain)
    accesses = {"reads": _fixed(scop.reads), "may_reads": _fixed(scop.may_reads),
                "writes": _fixed(scop.writes)}
    every = accesses["reads"].union(accesses["may_reads"]).union(accesses["writes"])
    ff = _fixed(f)
    parts = []
    for k in range(count):
        c_lo, c_hi = bounds[k], bounds[k + 1]
        chunk = isl.UnionSet.read_from_str(ctx, f"{{ [s] : {c_lo} <= s < {c_hi} }}")
        dom = domain.intersect(ff.intersect_range(chunk).domain()).coalesce()
        parts.append(_part(fn, ctx, sizes, devices[k], (c_lo, c_hi), dom, accesses, every,
                           position, sliced, locations, out_dev))
    covered = _check_outputs(fn, parts, sizes)
    names = ", ".join(f"{n} -> {fn.statements[scop.statements[n].index].lhs[0]}"
                      for n in scop.statements)
    changed = sorted({n for p in parts for n, v in p.sizes.items() if v != sizes[n]})
    split = (f"leading index of every statement ({names}), range [{lo}, {hi}) cut in {count}; "
             f"size(s) {', '.join(changed) or '(none)'} shrink per part")
    return split, tuple(parts), sliced, covered


def _part(fn, ctx, sizes, device, chunk, dom, accesses, every, position, sliced, locations,
          out_dev) -> Part:
    c_lo = chunk[0]
    fp = _tensor_sets(every.intersect_domain(dom).range())
    slabs: dict[str, tuple[int, int]] = {}
    for t in fn.inputs:
        if t.rank == 0:
            continue
        full = (0, t.shape[0].evaluate(sizes))
        if t.name not in sliced:
            slabs[t.name] = full
        elif t.name not in fp or fp[t.name].is_empty():
            raise _NoSplit(f"chunk [{chunk[0]}, {chunk[1]}) reads no row of {t.name}")
        else:
            slabs[t.name] = _rows(fp[t.name])
    shapes = [() if t.rank == 0 else
              (slabs[t.name][1] - slabs[t.name][0],
               *(e.evaluate(sizes) for e in t.shape[1:])) for t in fn.inputs]
    try:
        sub_sizes = bind_sizes(fn, shapes)
    except CallError as exc:
        raise _NoSplit(f"the chunk [{chunk[0]}, {chunk[1]}) is not a call of {fn.name}: "
                       f"{exc}") from None
    _check_values(fn, sizes, sub_sizes)
    try:
        sub = build_scop(fn, sub_sizes, ctx=ctx)
    except CallError as exc:
        raise _NoSplit(f"the chunk's sizes are not valid for {fn.name}: {exc}") from None
    sub_every = _fixed(sub.all_reads.union(sub.writes))
    sub_fp = _tensor_sets(sub_every.range())
    shift = {}
    for t in fn.tensors:
        if t.rank == 0 or t.name not in sliced:
            shift[t.name] = 0
        elif t.role is ir.Role.INPUT:
            shift[t.name] = slabs[t.name][0]
        else:
            if t.name not in fp or t.name not in sub_fp:
                raise _NoSplit(f"chunk [{chunk[0]}, {chunk[1]}) touches no row of {t.name}")
            shift[t.name] = _rows(fp[t.name])[0] - _rows(sub_fp[t.name])[0]
    for t in fn.outputs:
        sub_rows = _rows(sub_fp[t.name]) if t.name in sub_fp else (0, 0)
        extent = t.shape[0].evaluate(sub_sizes)
        if sub_rows != (0, extent):
            raise _NoSplit(f"the sub-problem writes rows {list(sub_rows)} of output {t.name} "
                           f"of {extent}: a part's output would not be whole rows")
        slabs[t.name] = (shift[t.name], shift[t.name] + extent)
    _check_equivalent(fn, ctx, dom, accesses, sub, position, c_lo, shift, chunk)
    itemsize = {t.name: t.dtype.itemsize for t in fn.tensors}

    def row_bytes(t: ir.Tensor) -> int:
        return math.prod(e.evaluate(sizes) for e in t.shape[1:]) * itemsize[t.name]

    def rows(t: ir.Tensor) -> tuple[int, int]:
        return slabs[t.name] if t.rank else (0, 1)

    bytes_in = sum(received_bytes(rows(t), row_bytes(t), device, locations.get(t.name))
                   for t in fn.inputs)
    bytes_out = 0 if device == out_dev else sum(
        (rows(t)[1] - rows(t)[0]) * row_bytes(t) for t in fn.outputs)
    footprints = {t.name: str(fp[t.name]) if t.name in fp else "{ }"
                  for t in (*fn.inputs, *fn.outputs) if t.rank > 0}
    return Part(device, chunk, str(dom), footprints, slabs, sub_sizes, bytes_in, bytes_out)


def _check_values(fn: ir.Function, sizes: Mapping[str, int], sub: Mapping[str, int]) -> None:
    changed = {n for n in sizes if sizes[n] != sub[n]}
    for k, st in enumerate(fn.statements):
        for node in _value_uses(st.rhs):
            if isinstance(node, ir.Index) and st.lhs and node.name == st.lhs[0]:
                raise _NoSplit(f"statement {k + 1} uses the split index {node.name} as a value: "
                               "a part would compute with shifted values")
            if isinstance(node, ir.Size) and node.name in changed:
                raise _NoSplit(f"statement {k + 1} uses the size {node.name} as a value, and "
                               "a part's sub-problem has another value for it")


def _check_equivalent(fn, ctx, dom, accesses, sub: Scop, position, c_lo, shift, chunk) -> None:
    """isl proof that the sub-problem shifted back is exactly the chunk (see step 4)."""
    stmt_shift = _union_map(ctx, [_shift_map(n, len(sub.statements[n].dims), position[n], c_lo)
                                  for n in sub.statements])
    tensor_shift = _union_map(ctx, [_shift_map(t.name, t.rank, 0, shift[t.name])
                                    for t in fn.tensors])  # scalars: the identity
    here = f"chunk [{chunk[0]}, {chunk[1]})"
    if not dom.apply(stmt_shift).is_equal(_fixed(sub.domain)):
        raise _NoSplit(f"{here}: the sub-problem at the chunk's sizes runs other statement "
                       "instances than the chunk (the split dimension's range is not a "
                       "translate of the chunk's)")
    theirs = {"reads": sub.reads, "may_reads": sub.may_reads, "writes": sub.writes}
    for kind, umap in accesses.items():
        mine = umap.intersect_domain(dom).apply_domain(stmt_shift).apply_range(tensor_shift)
        if not mine.coalesce().is_equal(_fixed(theirs[kind])):
            raise _NoSplit(f"{here}: the sub-problem's {kind.replace('_', '-')} differ from "
                           "the chunk's shifted by its slabs")


def _check_outputs(fn: ir.Function, parts: Sequence[Part], sizes: Mapping[str, int]
                   ) -> dict[str, bool]:
    covered = {}
    for t in fn.outputs:
        rows = sorted(p.slabs[t.name] for p in parts)
        for (_, a_hi), (b_lo, b_hi) in itertools.pairwise(rows):
            if b_lo < a_hi:
                raise _NoSplit(f"two parts write rows [{b_lo}, {min(a_hi, b_hi)}) of output "
                               f"{t.name}")
        extent = t.shape[0].evaluate(sizes)
        covered[t.name] = sum(hi - lo for lo, hi in rows) == extent
    return covered


def _whole(fn: ir.Function, scop: Scop, sizes: Mapping[str, int], device: int,
           locations: Mapping[str, Any], out_dev: int) -> Part:
    """The one part of a call that is not split: every tensor whole."""
    dom = _fixed(scop.domain)
    every = _fixed(scop.all_reads.union(scop.writes))
    fp = _tensor_sets(every.range())
    slabs = {t.name: (0, t.shape[0].evaluate(sizes)) for t in (*fn.inputs, *fn.outputs)
             if t.rank > 0}

    def nbytes(t: ir.Tensor) -> int:
        return math.prod(e.evaluate(sizes) for e in t.shape) * t.dtype.itemsize

    def row_bytes(t: ir.Tensor) -> int:
        return math.prod(e.evaluate(sizes) for e in t.shape[1:]) * t.dtype.itemsize

    bytes_in = sum(received_bytes(slabs.get(t.name, (0, 1)), row_bytes(t), device,
                                  locations.get(t.name)) for t in fn.inputs)
    bytes_out = 0 if device == out_dev else sum(nbytes(t) for t in fn.outputs)
    footprints = {t.name: str(fp[t.name]) if t.name in fp else "{ }"
                  for t in (*fn.inputs, *fn.outputs) if t.rank > 0}
    return Part(device, (0, 0), str(dom), footprints, slabs, dict(sizes), bytes_in, bytes_out)


def received_bytes(rows: tuple[int, int], row_bytes: int, device: int, location: Any) -> int:
    """Bytes of rows ``[lo, hi)`` that ``device`` must receive from an input at ``location``:
    a device ordinal, None (the host), or `Sharded.locations`."""
    lo, hi = rows
    if location is None or isinstance(location, int):
        return 0 if location == device else (hi - lo) * row_bytes
    local = sum(max(0, min(hi, b) - max(lo, a)) for d, a, b in location if d == device)
    return ((hi - lo) - local) * row_bytes
