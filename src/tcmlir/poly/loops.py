"""From a schedule tree to an isl AST (the loops the code generators lower), and its C-like text.

The AST is built with the scop's context as the build context, so loops carry no guards for
facts the sizes already imply (``N >= 1``, or the fixed values of a specialised scop). User
nodes are calls ``S{k}(e0, e1, ...)`` with one argument per statement dimension; marks of the
tree (``parallel``, ``kernel``, ...) become mark nodes, printed as comments.
"""

from __future__ import annotations

import islpy as isl

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
    ast = _build(state, schedule, promotion)
    state.__dict__["_ast_memo"] = (schedule, promotion, state.fn, ast)
    return ast


def _build(state: CompileState, schedule: isl.Schedule, promotion) -> isl.AstNode:
    from .gpu_mapping import build_context

    # A GPU-mapped tree has block/thread parameters: their ranges join the context.
    build = isl.AstBuild.from_context(build_context(schedule, state.scop.context))
    if promotion is None or not promotion.buffers:
        return build.node_from_schedule(schedule)
    return _annotated(build, schedule, state.fn, promotion)


def _annotated(build: isl.AstBuild, schedule: isl.Schedule, fn, promotion) -> isl.AstNode:
    """The AST with each user node annotated with its buffer accesses (`poly.promotion`): an
    isl id whose user object the code generator reads (`annotation_of`)."""
    from .promotion import annotate_user_node

    failures: list[BaseException] = []
    ctx = schedule.get_ctx()
    memo: dict = {}  # what depends only on a statement and a buffer (`annotate_user_node`)

    def at_each_domain(node: isl.AstNode, b: isl.AstBuild) -> isl.AstNode:
        try:
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


def annotation_of(node: isl.AstNode):
    """The payload `build_ast` attached to a user node, or None."""
    try:
        ann = node.get_annotation()
    except isl.Error:
        return None
    return ann.user if ann is not None else None


def format_loops(ast: isl.AstNode) -> str:
    """C-like text of ``ast`` (isl's C printer; marks appear as ``// name`` comments)."""
    return ast.to_C_str().rstrip() + "\n"
