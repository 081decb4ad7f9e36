"""The `map-mixed` pass: a program of row statements and column reductions as one or a few kernels.

A layernorm with a scale and a shift has a gradient that mixes two shapes: statements over
rows (``mean(n)``, ``var(n)``, ``var_grad(n)``, ``X_grad(n, d)``: every one starts with the row
index ``n``) and *column reductions* that reduce over the rows (``G_grad(d) +=! O_grad(n, d) *
...``, ``Bt_grad(d) +=! O_grad(n, d)``). Neither `map-rows` nor `map-columns` takes the whole
program. This pass splits it (`split_statements`) and maps it in one of two ways:

* **fused** (``fuse``, the default; `row_partials.build_fused`): one row kernel, built as
  `map-rows` builds it (a block per row, phases in program order, barriers between them, the
  per-row temporaries in shared memory), in which each column reduction is one more phase: every
  thread keeps a register per column it meets and folds them atomically after its rows, after
  a small kernel that writes the identities. ``X`` and ``O_grad`` are read from DRAM once — the
  minimal traffic. Taken with the most threads per row (at most those of the row statements'
  kernel, at least 32) that divide the columns into at most `map_rows.UNROLL_STRIDES` strides,
  when the column reductions have one lhs index and reduce over exactly the rows, and when no
  row statement reads a column result;
* else **kernels**: one row kernel with every row statement (`map-rows`' tree) and one
  **column kernel** per group of column reductions (`column_groups`: same rows and columns, no
  dependence between them), built as `map_columns.build_columns` builds it (a thread per
  column, coalesced reads, the rows split over ``blockIdx.y``, one register per thread and
  reduction folded atomically). The row kernel first when no row statement reads what a column
  reduction writes (the gradient: the column reductions read ``mean(n)`` and ``var(n)``, which
  the row kernel then writes to global memory, N values each, and recompute ``c(n, d) = X(n, d)
  - mean(n)`` from ``X``, as `inline-temporaries` put it there: reading ``X`` again costs one
  pass over it, writing and reading ``c`` would cost two), the column kernels first when no
  column reduction reads what a row statement writes, a `PipelineError` when dependences run
  both ways::

    sequence
      filter { row statements }
        kernel grid=G,1,1 block=B,1,1            the map-rows tree (`passes/map_rows.py`)
          ...  mark "rows threads=B local=..."
      filter { S<k>_init; S<j>_init }            per group of column reductions, in order:
        kernel grid=GI,1,1 block=B',1,1           their identities
      filter { S<k>; S<j> }
        kernel grid=GX,GY,1 block=B',1,1         the map-columns tree (`passes/map_columns.py`)
          ...  mark "accumulate S<k>,S<j> atomic"   one loop over the rows for the group

Checks (`mixed_problem` gives the structural ones without sizes): at least one statement of
each kind; a *column reduction* is a statement that alone would be a column program
(`map_columns.column_problem`) and does not read its own lhs tensor; the other statements form
a row program (`map_rows.row_program_problem`) whose row members carry no dependence; some order
of the row kernel and the column kernels keeps every conflict between them in program order.
The pass manager then proves the tree legal and the mapping exact, like for every pass.
Requires a schedule (it is replaced); run it instead of map-rows for such programs (the cuda
default options do: `gpu_defaults.mixed_defaults`, ``MappingOptions.mixed_rows``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import islpy as isl

from .. import ir as tc
from ..errors import PipelineError
from ..gpu_device import SM_COUNT
from ..poly.gpu_mapping import BLOCK_PARAMS, THREAD_PARAMS, with_params
from ..poly.scop import sets_of
from ..poly.state import CompileState
from .base import Pass, register
from .map_columns import _extent, build_columns, column_problem
from .map_rows import _build, local_tensors, row_extents, row_program_problem, row_rank
from .row_partials import build_fused, fusable

__all__ = ["MapMixed", "column_groups", "mixed_problem", "split_statements"]


def _only(fn: tc.Function, ks: tuple[int, ...]) -> tc.Function:
    """``fn`` with only the statements ``ks`` (tensors unchanged)."""
    return dataclasses.replace(fn, statements=tuple(fn.statements[k] for k in ks))


def _reads_own_lhs(st: tc.Statement) -> bool:
    return any(isinstance(x, tc.Read) and x.tensor == st.tensor for x in tc.walk(st.rhs))


def split_statements(fn: tc.Function) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(row statements, column reductions) of ``fn``, as statement numbers in program order."""
    columns = tuple(k for k, st in enumerate(fn.statements)
                    if column_problem(_only(fn, (k,))) is None and not _reads_own_lhs(st))
    rows = tuple(k for k in range(len(fn.statements)) if k not in columns)
    return rows, columns


def mixed_problem(fn: tc.Function) -> str | None:
    """Why ``fn`` is not a program `map-mixed` splits (structurally, without sizes), or None."""
    rows, columns = split_statements(fn)
    if not columns:
        return "no statement is a column reduction"
    if not rows:
        return "no statement is a row statement"
    problem = row_program_problem(_only(fn, rows))
    if problem is not None:
        return f"the statements other than the column reductions are not a row program: {problem}"
    if len(_orders(fn, rows, columns)) == 0:
        return ("row statements and column reductions depend on each other both ways (a row "
                "statement uses a column result that itself uses a row result)")
    return None


def _touches(st: tc.Statement) -> tuple[set[str], set[str]]:
    """(written, read) tensors of ``st`` (reads inside index expressions included)."""
    return {st.tensor}, {x.tensor for x in tc.walk(st.rhs) if isinstance(x, tc.Read)}


def _orders(fn: tc.Function, rows: tuple[int, ...], columns: tuple[int, ...]) -> set[str]:
    """Which of "rows first", "columns first" keep every conflict of the program in program
    order: two statements conflict when one writes a tensor the other reads or writes (a
    superset of isl's dependences, so the order isl later finds is one of these)."""
    before, after = False, False  # some column reduction must run before / after a row statement
    for a in rows:
        wa, ra = _touches(fn.statements[a])
        for b in columns:
            wb, rb = _touches(fn.statements[b])
            if wa & (wb | rb) or ra & wb:
                before |= b < a
                after |= b > a
    return {name for name, bad in (("rows first", before), ("columns first", after)) if not bad}


def _domain_of(domain: isl.UnionSet, ks: tuple[int, ...]) -> isl.UnionSet:
    names = {f"S{k}" for k in ks} | {f"S{k}_init" for k in ks}
    out = isl.UnionSet.empty(domain.get_space())
    for s in sets_of(domain):
        if s.get_tuple_name() in names:
            out = out.union(isl.UnionSet.from_set(s))
    return out


def _depends(validity: isl.UnionMap, src: isl.UnionSet, dst: isl.UnionSet) -> bool:
    """Some instance of ``dst`` depends on one of ``src``."""
    return not validity.intersect_domain(src).intersect_range(dst).is_empty()


def _same_shape(a: tc.Statement, b: tc.Statement) -> bool:
    """Column reductions one kernel can run: the same lhs rank and every range equal."""
    return (len(a.lhs) == len(b.lhs) and len(a.ranges) == len(b.ranges)
            and all((x.lo, x.hi) == (y.lo, y.hi) for x, y in zip(a.ranges, b.ranges, strict=True)))


def column_groups(fn: tc.Function, validity: isl.UnionMap, domain: isl.UnionSet,
                  columns: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The column reductions in kernels, in program order: a reduction joins the group before
    it when it has that group's shape and no dependence links it with a member (then one loop
    over the rows reads their operands once, each thread keeping one register per reduction)."""
    groups: list[tuple[int, ...]] = []
    for k in columns:
        if groups:
            last = groups[-1]
            mine, theirs = _domain_of(domain, (k,)), _domain_of(domain, last)
            if _same_shape(fn.statements[last[0]], fn.statements[k]) \
                    and not _depends(validity, theirs, mine) and not _depends(validity, mine, theirs):
                groups[-1] = (*last, k)
                continue
        groups.append((k,))
    return groups


@register
@dataclass(frozen=True)
class MapMixed(Pass):
    """Map a program of row statements and column reductions to one row kernel that also
    accumulates the column reductions (``fuse``, when `row_partials.build_fused` can), else to
    a row kernel and column kernels (see the module docstring): ``threads`` is the most
    threads per block (a power of two is taken, at most 1024), ``grid`` the most blocks of a
    kernel."""

    name = "map-mixed"
    requires_schedule = True
    threads: int = 512
    grid: int = 528
    fuse: bool = True
    vector_bytes: int = 0

    def __post_init__(self):
        if self.threads < 1 or self.grid < 1:
            raise ValueError("map-mixed: threads and grid must be >= 1")
        if self.vector_bytes not in (0, 1, 2, 4, 8, 16):
            raise ValueError("map-mixed: vector-bytes must be 0 (off) or a power of two <= 16")

    def run(self, state: CompileState) -> CompileState:
        fn = state.fn
        problem = mixed_problem(fn)
        if problem is not None:
            raise PipelineError(f"map-mixed: {fn.name} is not a mix of row statements and "
                                f"column reductions: {problem}")
        rows, columns = split_statements(fn)
        domain = with_params(isl.Schedule.from_domain(state.scop.domain),
                             BLOCK_PARAMS + THREAD_PARAMS).get_domain()
        row_domain = _domain_of(domain, rows)
        validity = state.deps.validity
        col_domain = _domain_of(domain, columns)
        if not _depends(validity, col_domain, row_domain):
            rows_first = True
        elif not _depends(validity, row_domain, col_domain):
            rows_first = False
        else:
            raise PipelineError(f"map-mixed: in {fn.name} row statements read what column "
                                "reductions write and the other way round: no order of the "
                                "row kernel and the column kernels is legal")
        row_tree, b = self._rows(state, row_domain, rows)
        if self.fuse and rows_first and row_tree is not None and fusable(fn, rows, columns):
            fused = self._fused(state, domain, rows, columns, b)
            if fused is not None:
                return dataclasses.replace(state, schedule=fused)
        parts = [row_tree]
        for group in column_groups(fn, validity, domain, columns):
            part = _domain_of(domain, group)
            if part.is_empty():  # the reductions run no instance at these sizes
                continue
            parts.append(build_columns(state, part, self.threads, self.grid, statements=group))
        if not rows_first:
            parts = parts[1:] + parts[:1]
        parts = [p for p in parts if p is not None]
        schedule = parts[0]
        for p in parts[1:]:
            schedule = schedule.sequence(p)
        return dataclasses.replace(state, schedule=schedule)

    def _fused(self, state: CompileState, domain: isl.UnionSet, rows: tuple[int, ...],
               columns: tuple[int, ...], b: int) -> isl.Schedule | None:
        """The one-kernel tree (`row_partials.build_fused`) with the most threads per row, at
        most ``b`` (what the row statements alone take) and at least 32, that divide the
        columns into at most `map_rows.UNROLL_STRIDES` strides (of ``lanes`` adjacent columns
        per thread with vector accesses); None when there is none."""
        fn = state.fn
        sub = _only(fn, rows)
        r = row_rank(sub)
        st = fn.statements[columns[0]]
        cols = state.sizes and _extent(st.range_of(st.lhs[-1]), state.sizes)
        count = state.sizes and _extent(sub.statements[0].ranges[r - 1], state.sizes)
        if not cols or not count:
            return None
        while b >= 32:
            if cols % b == 0:  # (the strides, with vector lanes or not: `row_partials`)
                grid = min(self.grid, SM_COUNT * min(32, 2048 // b), count)
                tree = build_fused(state, domain, rows, columns, r, b, grid, self.threads,
                                   self.vector_bytes)
                if tree is not None:
                    return tree
            b //= 2
        return None

    def _rows(self, state: CompileState, domain: isl.UnionSet,
              rows: tuple[int, ...]) -> tuple[isl.Schedule | None, int]:
        """The map-rows tree of the row statements (None when they run no instance) and its
        threads per block."""
        if domain.is_empty():
            return None, 1
        fn = state.fn
        sub = _only(fn, rows)
        r = row_rank(sub)
        extents = row_extents(sub, state.sizes)
        count = None if extents is None else math.prod(extents)
        b = 1
        while b * 2 <= min(self.threads, 1024):
            b *= 2
        # temporaries a column statement writes or reads are not local: they live in global
        # memory between the kernels (a column reduction ``T0(i) min=! Y(r, i)`` read by
        # another was kept in the row kernel's shared memory and got no buffer: the column
        # kernels wrote through a null pointer, an illegal address on the GPU)
        _, columns = split_statements(fn)
        shared = {fn.statements[k].tensor for k in columns} | {
            rd.tensor for k in columns for rd in tc.walk(fn.statements[k].rhs)
            if isinstance(rd, tc.Read)}
        local = tuple(t for t in local_tensors(fn) if t not in shared) if row_rank(fn) == r else ()
        while True:
            grid = min(self.grid, SM_COUNT * min(32, 2048 // b), count or self.grid)
            tree = _build(state, domain, r, b, max(1, grid), local, self.vector_bytes)
            if tree is not None or b == 1:
                break
            b //= 2
        if tree is None:
            raise PipelineError(f"map-mixed: the rows of {fn.name} are not independent, or a "
                                "phase depends on itself other than through its reduction")
        return tree, b
