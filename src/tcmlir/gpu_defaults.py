"""The cuda defaults for bandwidth-bound programs: which untuned calls get `map-rows`, and the
mapping of 1-D elementwise programs (`elementwise_defaults`, at the end).

`MappingOptions.default_for(fn, "cuda")` asks `reduction_defaults(cls, fn)` first. A *row program*
(`passes.map_rows.row_program_problem` is None: every statement starts with the same row
indices) that is bandwidth-bound — every tensor read either carries all of the statement's row
indices or none of them and no reduction index (a per-row operand, or a small vector such as
a bias), or none of them and only indices of a read that carries them all (``G(d)`` beside
``X(n, d)`` in a reduction over ``d``: a vector reused by every row); a matmul's ``A(i, k)`` carries only some of ``C(i, j)``'s rows and is refused; a tensor
the program writes is read only at the row's own indices, so rows are independent; a read that
involves a reduction index has one as its last index, so a row is reduced along contiguous
memory — a pooling window or a column reduction is refused) — and
that has at least one reduction gets one kernel, a block of `ROW_THREADS` threads per row,
and `SM_COUNT` × `BLOCKS_PER_SM` blocks that stride over the rows (more, up to 32 per SM, when
short rows get fewer threads per block) (softmax, layernorm, row
sums, normalisations). Everything else keeps the naive options.

`SM_COUNT` is the H200's (132): the defaults are chosen without a device (the options are
part of the compile-cache key, so they must not depend on which GPU happens to be visible);
on a device with other SM counts the grid-stride loop stays correct and the tuner searches
the grid. A full reduction into a scalar (``s +=! A(i)``, 32/64-bit types) gets the same
options: `map-rows` then spreads it over every block, which fold their totals atomically
(`passes/map_full_reduction.py`; float sums are not bitwise deterministic run to run); so does
a column reduction (``S(d) +=! X(n, d)``: a thread per column, the reduced dimension split
over ``blockIdx.y``, atomic folds; `passes/map_columns.py`). A program that mixes row
statements and column reductions (a layernorm's gradient with scale and shift) whose row
statements are such a row program gets `mixed_defaults`: one row kernel that also accumulates
the column reductions in registers across its rows (`passes/row_partials.py`), else a row
kernel and a column kernel per group of column reductions (`passes/map_mixed.py`).
"""

from __future__ import annotations

from typing import Any

from . import ir as tc
from .gpu_device import SM_COUNT  # NVIDIA H200 (sm_90); re-exported

__all__ = ["BLOCKS_PER_SM", "ELEMENTWISE_BLOCKS", "ELEMENTWISE_THREADS", "ELEMENTWISE_TILE", "FULL_THREADS",
           "MIN_ROW_THREADS", "MIXED_THREADS", "ROW_THREADS", "ROW_VALUES_PER_THREAD", "SM_COUNT",
           "VECTOR_BYTES", "elementwise_defaults", "is_bandwidth_bound_rows", "mixed_defaults",
           "reduction_defaults", "row_threads"]

ROW_THREADS = 512       # threads per row: 16 warps; 4 blocks (2048 threads) per SM
BLOCKS_PER_SM = 2048 // ROW_THREADS
# with the sizes known, the threads per row give each thread this many row elements
# (`row_threads`), but no fewer threads than one warp
ROW_VALUES_PER_THREAD = 64
MIN_ROW_THREADS = 32
# threads per row of a program mixing rows and column reductions: its row kernel keeps a
# register per column stride for each column reduction, and row kernels get 32 registers
# (codegen.nvptx launch bounds); 1024 threads halve the strides (layernorm gradient
# 16384x4096, 128-bit accesses: ptxas keeps a 128-byte stack frame per thread at 1024, 264 at 512)
MIXED_THREADS = 1024
# threads per block of a full reduction (s +=! A(i)): measured on the H200 (2^28 float32),
# blocks of 1024 threads read at 84% of the copy ceiling, blocks of 512 at 65%
FULL_THREADS = 1024
# bytes each thread reads and writes at once along a row or an elementwise tile (128-bit
# accesses; `MappingOptions.vector_access`)
VECTOR_BYTES = 16


def _reads(e: tc.Expr) -> list[tc.Read]:
    return [x for x in tc.walk(e) if isinstance(x, tc.Read)]


def is_bandwidth_bound_rows(fn: tc.Function) -> bool:
    """True for a row program (after `map_rows.rows_first`) with a reduction whose reads have
    no reuse across rows."""
    from .passes.map_rows import row_program_problem, row_rank, rows_first

    fn = rows_first(fn)
    if row_program_problem(fn) is not None:
        return False
    if not any(st.reduction is not None and st.reduction_indices for st in fn.statements):
        return False
    r = row_rank(fn)
    # where each written tensor keeps its row indices (``d(n, c, h, w)``, rows ``c``: 1)
    written = {st.tensor: [st.lhs.index(x) for x in st.index_names[:r]] for st in fn.statements}
    def used_by(rd: tc.Read) -> set[str]:
        return {x.name for i in rd.indices for x in tc.walk(i) if isinstance(x, tc.Index)}

    for st in fn.statements:
        rows = st.index_names[:r]
        reduced = set(st.reduction_indices)
        # indices of the reads that carry the whole row: a read of no row index within them
        # (``G(d)`` beside ``X(n, d)``) reads at most as much per row as they do
        along = set().union(*(u for u in map(used_by, _reads(st.rhs)) if set(rows) <= u))
        for rd in _reads(st.rhs):
            if rd.tensor in written:  # only at the row's own elements: rows stay independent
                at = written[rd.tensor]
                lead = [rd.indices[p] for p in at if p < len(rd.indices)]
                if len(lead) < r or any(not isinstance(i, tc.Index) or i.name != n
                                        for i, n in zip(lead, rows, strict=True)):
                    return False
                continue
            used = {x.name for i in rd.indices for x in tc.walk(i) if isinstance(x, tc.Index)}
            if used & reduced:  # the row is reduced along contiguous memory (not a pooling window)
                last = rd.indices[-1]
                if not isinstance(last, tc.Index) or last.name not in reduced:
                    return False
            # a read within the indices of a whole-row read and of no reduced index (``G(d)``
            # beside ``X(n, d)``, a group norm's ``Gm(g, c)`` beside ``d(n, g, c, s)``): a
            # per-row or shared operand, read no more per row than the row itself
            if set(rows) <= used or (used <= along and not (used & set(rows) and used & reduced)):
                continue
            if used & set(rows) or used & reduced:
                return False
    return True


def row_threads(fn: tc.Function, sizes: Any = None) -> int:
    """Threads per row of a row program's kernel: the power of two that gives each thread
    `ROW_VALUES_PER_THREAD` of the widest statement's row elements (a quarter as many for
    64-bit types), between `MIN_ROW_THREADS`
    and `ROW_THREADS`; `ROW_THREADS` when the sizes are not known. Measured on the H200
    (softmax and layernorm 32768x4096, fp32): 512 threads of 8 values 0.35-0.38 ms, 256 of 16
    0.30, 128 of 32 0.30, 64 of 64 0.29 ms (87% of the copy ceiling): a thread that holds more
    of the row has more 128-bit loads in flight and the block's combines are shorter. A
    program with one statement over the row's elements (a row sum: no row held across
    barriers) keeps `ROW_THREADS`: 0.124 ms (103%) with 512 threads, 0.133 ms with 64."""
    from .passes.map_rows import row_rank, rows_first

    fn = rows_first(fn)
    r = row_rank(fn)
    if sum(len(st.ranges) > r for st in fn.statements) <= 1:
        return ROW_THREADS  # one pass over the row (a row sum) streams: 512 threads read at 97-103%
    width = 0
    for st in fn.statements:
        extent = 1
        for rng in st.ranges[r:]:
            try:
                extent *= max(0, rng.hi.evaluate(sizes) - rng.lo.evaluate(sizes))
            except Exception:  # noqa: BLE001 - a size not given: no sized choice
                return ROW_THREADS
        width = max(width, extent)
    # 64-bit values: a quarter (softmax in float64 at 32 values per thread took 255 registers
    # and spilled; 16 fit); half types compute in float32
    wide = max(t.dtype.itemsize for t in fn.tensors) > 4
    per_thread = ROW_VALUES_PER_THREAD // 4 if wide else ROW_VALUES_PER_THREAD
    threads = MIN_ROW_THREADS
    while threads < ROW_THREADS and threads * per_thread < width:
        threads *= 2
    return threads


def reduction_defaults(cls: Any, fn: Any, sizes: Any = None) -> Any:
    """The default cuda options (of class ``cls``, `MappingOptions`) for ``fn`` (an
    `ir.Function`) when it is a bandwidth-bound row program (see the module docstring), else
    None; ``sizes`` (the call's) choose the threads per row (`row_threads`)."""
    from .passes.map_columns import column_problem
    from .passes.map_full_reduction import full_reduction_problem

    if not isinstance(fn, tc.Function) or not fn.statements:
        return None
    full = full_reduction_problem(fn) is None
    if not full and column_problem(fn) is not None and not is_bandwidth_bound_rows(fn):
        return None
    # the grid is a cap: map-rows takes fewer blocks for few rows, and as many as the SMs
    # hold (up to 32 each) when short rows get small blocks
    if full:
        threads = FULL_THREADS
    elif column_problem(fn) is None:
        threads = ROW_THREADS
    else:
        threads = row_threads(fn, sizes) if sizes else ROW_THREADS
    return cls(fusion="max", row_block=threads, grid=(SM_COUNT * 32,),
                          vector_bytes=VECTOR_BYTES)


def mixed_defaults(cls: Any, fn: Any) -> Any:
    """The default cuda options (of class ``cls``) for ``fn`` (an `ir.Function`) when it mixes row
    statements and column reductions (`passes.map_mixed.mixed_problem` is None) and its row
    statements alone are a bandwidth-bound row program: `map-mixed`, one row kernel of
    `MIXED_THREADS` threads per row that also accumulates the column reductions where it can
    (``mixed_rows="fused"``), else a row kernel and column kernels; else None."""
    import dataclasses

    from .passes.map_mixed import mixed_problem, split_statements

    if not isinstance(fn, tc.Function) or mixed_problem(fn) is not None:
        return None
    rows, _ = split_statements(fn)
    if not is_bandwidth_bound_rows(dataclasses.replace(fn, statements=tuple(fn.statements[k] for k in rows))):
        return None
    return cls(fusion="max", row_block=MIXED_THREADS, grid=(SM_COUNT * 32,),
                          mixed_rows="fused", vector_bytes=VECTOR_BYTES)


# elements per block and grid-stride step of a 1-D elementwise kernel, threads per block (each
# takes 16 elements, as 4 vectors of 4), blocks striding over the tiles. Measured on the H200
# (the chain of the benchmark, 2^28 float32, 128-bit accesses): 2048 elements and 8 blocks per
# SM 0.575-0.586 ms, 4096 elements and 4 blocks per SM 0.564-0.565 ms (90% of the copy ceiling)
ELEMENTWISE_TILE = 4096
ELEMENTWISE_THREADS = 256
ELEMENTWISE_BLOCKS = SM_COUNT * 4


def elementwise_defaults(cls: Any, fn: Any) -> Any:
    """Options for a 1-D elementwise program (every statement has one index and no
    reduction: an activation chain), else None: fused into one kernel, `ELEMENTWISE_TILE`
    elements per block, `ELEMENTWISE_THREADS` threads reading consecutive elements (coalesced),
    `ELEMENTWISE_BLOCKS` blocks striding over the tiles (the naive options give each block
    32 threads); ``cls`` is `MappingOptions`."""
    statements = fn.statements
    if not statements or any(len(s.index_names) != 1 or s.reduction is not None
                             for s in statements):
        return None
    return cls(fusion="max", tile_sizes=(ELEMENTWISE_TILE,),
                          block=(ELEMENTWISE_THREADS,), grid=(ELEMENTWISE_BLOCKS,),
                          vector_bytes=VECTOR_BYTES)
