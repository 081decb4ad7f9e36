"""From a schedule tree to an isl AST (the loops the code generators lower), and its C-like text.

The AST is built with the scop's context as the build context, so loops carry no guards for
facts the sizes already imply (``N >= 1``, or the fixed values of a specialised scop). User
nodes are calls ``S{k}(e0, e1, ...)`` with one argument per statement dimension; marks of the
tree (``parallel``, ``kernel``, ...) become mark nodes, printed as comments.
"""

from __future__ import annotations

import islpy as isl

from .state import CompileState

__all__ = ["build_ast", "format_loops"]


def build_ast(state: CompileState) -> isl.AstNode:
    """The isl AST of ``state.schedule`` (the original program order if none was computed)."""
    from .gpu_mapping import build_context

    schedule = state.schedule if state.schedule is not None else state.scop.schedule
    # A GPU-mapped tree has block/thread parameters: their ranges join the context.
    build = isl.AstBuild.from_context(build_context(schedule, state.scop.context))
    return build.node_from_schedule(schedule)


def format_loops(ast: isl.AstNode) -> str:
    """C-like text of ``ast`` (isl's C printer; marks appear as ``// name`` comments)."""
    return ast.to_C_str().rstrip() + "\n"
