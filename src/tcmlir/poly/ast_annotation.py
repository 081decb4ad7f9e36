"""What `loops.build_ast` attaches to the user nodes of an isl AST, read back.

A leaf of the poly layer: `loops` (which attaches the payloads) and `llvm_unroll` (which reads
them to decide which loops of a partial tile index registers) both use it, without importing
each other in a circle.
"""

from __future__ import annotations

import islpy as isl

__all__ = ["annotation_of"]


def annotation_of(node: isl.AstNode):
    """The payload `build_ast` attached to a user node, or None."""
    try:
        ann = node.get_annotation()
    except isl.Error:
        return None
    return ann.user if ann is not None else None
