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
    """The isl AST of ``state.schedule`` (the original program order if none was computed)."""
    from .gpu_mapping import build_context

    schedule = state.schedule if state.schedule is not None else state.scop.schedule
    # A GPU-mapped tree has block/thread parameters: their ranges join the context.
    build = isl.AstBuild.from_context(build_context(schedule, state.scop.context))
    promotion = getattr(state, "promotion", None)
    if promotion is None or not promotion.buffers:
        return build.node_from_schedule(schedule)
    return _annotated(build, schedule, state.fn, promotion)


def _annotated(build: isl.AstBuild, schedule: isl.Schedule, fn, promotion) -> isl.AstNode:
    """The AST with each user node annotated with its buffer accesses (`poly.promotion`): an
    isl id whose user object the code generator reads (`annotation_of`)."""
    from .promotion import annotate_user_node

    failures: list[BaseException] = []
    ctx = schedule.get_ctx()

    def at_each_domain(node: isl.AstNode, b: isl.AstBuild) -> isl.AstNode:
        try:
            payload = annotate_user_node(promotion, fn, node, b)
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
