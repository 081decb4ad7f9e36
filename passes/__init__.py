"""Schedule-tree passes of tcmlir: one pass per file, a registry, a pipeline parser, a manager.

    from tcmlir.passes import PassManager, parse_pipeline
    from tcmlir.poly.state import CompileState
    state = PassManager(parse_pipeline("schedule{fusion=max},tile{sizes=32,32}")).run(
        CompileState.initial(fn))

Passes (see each file): ``schedule{fusion=max|preserve3coincident|min,skew=false,
positive-orthant=true}``, ``tile{sizes=...}``, ``specialize{N=...}``, ``verify``,
``mark-parallel``, ``vectorize`` (CPU loop order), ``unroll{factor=4}``.

How mappings are recorded in the tree: as isl *mark* nodes, so a tree prints in isl syntax and
re-parses with ``isl.Schedule.read_from_str(ctx, str(schedule))`` unchanged. A mark's id is a
plain name, with the mapping's parameters as a bracketed suffix where it has some:

* ``parallel``: above a band whose first member the host backend may split over threads
  (``mark-parallel``; proved against every dependence, reductions included);
* ``kernel``: above the subtree that becomes one GPU kernel launch;
* ``blocks[256,256]``: above the tile band whose members map to ``blockIdx.x, .y, ...`` (the
  suffix is the grid extent per member, members beyond are looped over);
* ``threads[32,8]``: above the point band mapped to ``threadIdx.x, .y, ...`` (innermost
  coincident member to ``.x``);
* ``reduction[32]``: above a band whose reduction member is split over that many threads and
  finished with a warp/block combine.

Backends read marks with `tcmlir.poly.tree.mark_name`; the isl AST builder prints them as
comments and hands them to the code generator as mark nodes.
"""

from __future__ import annotations

from . import (  # noqa: F401  (registration)
    map_reductions,
    map_to_blocks,
    map_to_threads,
    mark_parallel,
    schedule,
    specialize,
    tile,
    unroll,
    vectorize,
    verify,
)
from .base import PASSES, Pass, format_pass, register
from .manager import PassManager
from .pipeline import parse_pipeline

__all__ = ["PASSES", "Pass", "PassManager", "format_pass", "parse_pipeline", "register"]
