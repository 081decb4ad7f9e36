"""Schedule-tree passes of tcmlir: one pass per file, a registry, a pipeline parser, a manager.

    from tcmlir.passes import PassManager, parse_pipeline
    from tcmlir.poly.state import CompileState
    state = PassManager(parse_pipeline("schedule{fusion=max},tile{sizes=32,32}")).run(
        CompileState.initial(fn))

Passes (see each file): ``schedule{fusion=max|preserve3coincident|min,skew=false,
positive-orthant=true}``, ``tile{sizes=...}``, ``specialize{N=...}``, ``verify``,
``mark-parallel`` and ``vectorize`` (host), ``map-to-blocks{grid=...}``,
``map-to-threads{block=...}`` and ``map-reduction{threads=...}`` (GPU), ``inline-temporaries``
and ``map-rows{threads=...,grid=...}`` (GPU: a row program as one kernel), ``merge-updates``
and ``map-mixed{threads=...,grid=...}`` (GPU: row statements and column reductions as a row
kernel and column kernels), ``unroll{factor=4}``, ``split-k{ways=4}`` (a long reduction cut
into chunks on different blocks, then folded; before ``schedule``).
A researcher adds a pass by adding a file here (a frozen dataclass with ``@register``, see
`base.py`) and importing it below.

How mappings are recorded in the tree, so that it prints in isl syntax and re-parses with
``isl.Schedule.read_from_str(ctx, str(schedule))``: as isl *mark* nodes, filters and parameters.

* ``parallel`` above a band of one member that the host backend may split over threads
  (``mark-parallel``; proved against every dependence, reductions included), and
  ``parallel-end`` right below it, so a degenerate (dropped) loop is never mistaken for it;
* ``kernel grid=GX,GY,GZ block=BX,BY,BZ`` above each subtree that becomes one GPU launch; the
  block and thread indices are the tree parameters ``_bx _by _bz _tx _ty _tz``, and filters
  below the mark pin band members to them (``v mod B = _tx``), which gives strided loops
  (`tcmlir.poly.gpu_mapping`, where the coverage proof lives too);
* ``reduction S<k> threads=B`` above the band whose member is split over ``B`` threads and
  combined per block (warp shuffles, shared memory) by the NVPTX backend (``map-reduction``);
* ``rows threads=B local=t1,t2`` above the grid-strided row loop of a row kernel (``map-rows``):
  the NVPTX backend puts a block barrier after each phase of the row body and keeps the
  ``local`` temporaries in shared memory; ``reduction S<k> threads=B atomic`` (blocks fold
  their totals atomically: full reductions) and ``accumulate S<k> atomic`` (each thread folds
  its own total: column reductions), also from ``map-rows``;
* ``map-mixed{threads=...,grid=...,fuse=true}``: a program of row statements and column
  reductions (a layernorm's gradient with scale and shift) as one row kernel in which each
  column reduction is a phase under ``accumulate S<k> over-rows atomic`` (a register per
  column across the block's rows, folded atomically after the row loop), or (``fuse=false``,
  or when that is not possible) as a row kernel and column kernels, ``accumulate S<k>,S<j>
  atomic`` for column reductions over the same rows.

Backends read marks with `tcmlir.poly.tree.mark_name`; the isl AST builder prints them as
comments and hands them to the code generator as mark nodes.
"""

from __future__ import annotations

from . import (  # noqa: F401  (registration)
    host_contraction,
    inline_temporaries,
    map_mixed,
    map_mma,
    map_reductions,
    map_rows,
    map_to_blocks,
    map_to_threads,
    mark_parallel,
    merge_updates,
    pad_operands,
    promote_private,
    promote_shared,
    register_tile,
    schedule,
    specialize,
    split_k,
    tile,
    unroll,
    vectorize,
    verify,
)
from .base import PASSES, Pass, format_pass, register
from .manager import PassManager
from .pipeline import parse_pipeline

__all__ = ["PASSES", "Pass", "PassManager", "format_pass", "parse_pipeline", "register"]
