"""From a schedule tree to an isl AST (the loops the code generators lower), and its C-like text.

The AST is built with the scop's context as the build context, so loops carry no guards for
facts the sizes already imply (``N >= 1``, or the fixed values of a specialised scop). User
nodes are calls ``S{k}(e0, e1, ...)`` with one argument per statement dimension; marks of the
tree (``parallel``, ``kernel``, ...) become mark nodes, printed as comments. Bands that take
one value per outer point are first moved below the sequence under them
(`sink_single_point_bands`: the same loops, at a cost linear in the statements). In GPU
kernels, the bands isl would unroll that run only the program's statements (register tiles,
unrolled strips) stay loops under an ``unroll`` mark when their trip counts are constant, for
LLVM to unroll (`poly.llvm_unroll`); at sizes the tiles do not divide, the partial tiles go
under an ``unroll-partial`` mark beside the full ones (`poly.partial_tiles`).
"""

from __future__ import annotations

import islpy as isl

from ..log import timed
from .ast_annotation import annotation_of
from .state import CompileState

__all__ = ["annotation_of", "build_ast", "format_loops"]


def build_ast(state: CompileState) -> isl.AstNode:
    """The isl AST of ``state.schedule`` (the original program order if none was computed).

    Built once per (schedule, promotion) of a state: a second call (the kernel's ``loops``
    text after code generation, the simulator, the profiler) returns the same AST. isl objects
    are values, so the identity of the two inputs says whether they changed."""
    schedule = state.schedule if state.schedule is not None else state.scop.schedule
    promotion = getattr(state, "promotion", None)
    memo = state.__dict__.get("_ast_memo")
    if memo is not None and memo[0] is schedule and memo[1] is promotion and memo[2] is state.fn:
        return memo[3]
    with timed("isl AST"):
        ast = _build(state, schedule, promotion)
    state.__dict__["_ast_memo"] = (schedule, promotion, state.fn, ast)
    return ast


def _build(state: CompileState, schedule: isl.Schedule, promotion) -> isl.AstNode:
    from .gpu_mapping import build_context
    from .llvm_unroll import UNROLL_MARK, for_llvm, irregular_unroll_marks
    from .partial_tiles import split_partial

    schedule = sink_single_point_bands(schedule)
    # A GPU-mapped tree has block/thread parameters: their ranges join the context.
    context = build_context(schedule, state.scop.context)
    keep: frozenset[tuple[int, ...]] = frozenset()
    ranks = {t.name: len(t.shape) for t in state.fn.tensors}
    while True:  # bands LLVM unrolls instead of isl, those isl must unroll left out
        as_loops, changed = for_llvm(schedule, ranks, keep)
        if not changed:
            return _build_from(context, schedule, state.fn, promotion)
        # partial tiles (sizes the tiles do not divide) apart from the full ones, LLVM unrolls
        # both (`poly.partial_tiles`); a mark still irregular goes back to isl
        as_loops = split_partial(as_loops, UNROLL_MARK) or as_loops
        ast = _build_from(context, as_loops, state.fn, promotion)
        bad = irregular_unroll_marks(ast)
        if not bad:
            return ast
        keep |= bad


def _build_from(context: isl.Set, schedule: isl.Schedule, fn, promotion) -> isl.AstNode:
    build = isl.AstBuild.from_context(context)
    if promotion is None or not promotion.buffers:
        return build.node_from_schedule(schedule)
    return _annotated(build, schedule, fn, promotion)


def _annotated(build: isl.AstBuild, schedule: isl.Schedule, fn, promotion) -> isl.AstNode:
    """The AST with each user node annotated with its buffer accesses (`poly.promotion`): an
    isl id whose user object the code generator reads (`annotation_of`)."""
    from .node_accesses import annotate_user_node

    failures: list[BaseException] = []
    ctx = schedule.get_ctx()
    memo: dict = {}  # what depends only on a statement and a buffer (`annotate_user_node`)

    def at_each_domain(node: isl.AstNode, b: isl.AstBuild) -> isl.AstNode:
        try:
            with timed("access expressions"):
                payload = annotate_user_node(promotion, fn, node, b, memo)
        except Exception as exc:  # noqa: BLE001 - isl would swallow it: re-raised below
            failures.append(exc)
            return node
        if payload is None:
            return node
        return node.set_annotation(isl.Id("promoted", user=payload, context=ctx))

    build, _keep = build.set_at_each_domain(at_each_domain)
    ast = build.node_from_schedule(schedule)
    if failures:
        raise failures[0]
    return ast


def sink_single_point_bands(schedule: isl.Schedule) -> isl.Schedule:
    """``schedule`` with every band that takes a single value per outer point (a loop isl
    generates as no loop at all, such as a band of thread indices fixed by a thread filter
    ``i = _tx``) and whose child is a sequence or set (below filters, if any), moved into each
    child of that sequence or set.

    The same instances run in the same order, and isl generates the same code: for a band of
    n statements over a sequence whose loop is degenerate, isl generates each statement apart
    and walks the whole sequence for each, quadratic in n with a large constant (200 statements
    ``O(i) = A(i)`` mapped to threads: 33 s; after this rewrite 0.1 s).
    """
    def visit(node: isl.ScheduleNode) -> isl.ScheduleNode:
        if node.get_type() != isl.schedule_node_type.band or node.n_children() != 1:
            return node
        kid, depth = node.child(0), 0
        while kid.get_type() == isl.schedule_node_type.filter and kid.n_children() == 1:
            kid, depth = kid.child(0), depth + 1
        if kid.get_type() not in (isl.schedule_node_type.sequence, isl.schedule_node_type.set):
            return node
        if kid.n_children() < 2 or not _single_point(node):
            return node
        partial = node.band_get_partial_schedule()
        coincident = [node.band_member_get_coincident(m) for m in range(node.band_n_member())]
        permutable = node.band_get_permutable()
        seq = node.delete()
        for _ in range(depth):
            seq = seq.child(0)
        for i in range(seq.n_children()):
            leaf = seq.child(i)  # a filter
            part = partial.intersect_domain(leaf.filter_get_filter())
            band = leaf.child(0).insert_partial_schedule(part).band_set_permutable(permutable)
            for m, flag in enumerate(coincident):
                band = band.band_member_set_coincident(m, flag)
            seq = band.parent().parent()
        for _ in range(depth):
            seq = seq.parent()
        return seq

    return schedule.map_schedule_node_bottom_up(visit)


def _single_point(band: isl.ScheduleNode) -> bool:
    """Whether ``band`` takes one value per point of the outer schedule (and parameters),
    over all the statement instances that reach it together; with the AST options at their
    defaults (a member asked to unroll, separate or isolate is left alone) and no extension
    node above it."""
    for m in range(band.band_n_member()):
        if band.band_member_get_ast_loop_type(m) != isl.ast_loop_type.default:
            return False
    extension = isl.schedule_node_type.extension
    if any(band.ancestor(k).get_type() == extension for k in range(1, band.get_tree_depth() + 1)):
        return False  # (isl has no prefix schedule below the copies promotion adds)
    if not band.band_get_ast_build_options().is_empty():
        return False
    prefix = band.get_prefix_schedule_union_map().intersect_domain(band.get_domain())
    here = band.band_get_partial_schedule_union_map()
    return prefix.reverse().apply_range(here).is_single_valued()


def format_loops(ast: isl.AstNode) -> str:
    """C-like text of ``ast`` (isl's C printer; marks appear as ``// name`` comments)."""
    return ast.to_C_str().rstrip() + "\n"
