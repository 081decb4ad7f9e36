"""Host groups that are the same code on other tensors share one body function.

A definition of n independent outputs ``O_k(i) = A(i)`` is n host groups (`lower`), each a
loop that LLVM optimises and compiles on its own: about 15 ms of LLVM per group, 30 s for a
thousand, though the groups differ only in the pointers they are given. `group_key` names
what a group's code depends on (its isl AST with the statements numbered in order of
appearance, those statements with their tensors numbered in the group's order, and those
tensors' types, shapes and roles); `lower.Lowerer.group` emits the body of the first group of
each key, and every later group of the key is only its wrapper (the host ABI: its tensors'
pointers loaded from the buffer array) calling that body, which is then not inlined.

Groups with gathers are not shared: their bounds-check codes name the statement and the
tensor (`lower.GatherSite`). Neither are groups of a promoted schedule (their accesses are
redirected through AST annotations the key does not see).
"""

from __future__ import annotations

import re

import islpy as isl

from .. import ir as tc

__all__ = ["group_key"]

_CALL = re.compile(r"\bS(\d+)(_init)?\(")
_TENSOR = re.compile(r"tensor='(\w+)'")


def group_key(fn: tc.Function, node: isl.AstNode, tensors: tuple[str, ...]) -> tuple:
    """What the code of the group ``node`` (taking ``tensors``, `ast_groups.group_tensors`)
    depends on, with statement numbers and tensor names replaced by their positions: two
    groups of equal keys compile to the same body function."""
    order: dict[int, int] = {}

    def number(m: re.Match) -> str:
        k = order.setdefault(int(m.group(1)), len(order))
        return f"S#{k}{m.group(2) or ''}("

    loops = _CALL.sub(number, node.to_C_str())
    position = {t: i for i, t in enumerate(tensors)}
    statements = tuple(_TENSOR.sub(lambda m: f"tensor=#{position[m.group(1)]}",
                                   repr(fn.statements[k])) for k in order)
    kinds = tuple((t.dtype, t.shape, t.role) for t in map(fn.tensor, tensors))
    return loops, statements, kinds
