"""Which kernel groups a GPU mapping pass transforms: its ``only`` and ``skip`` statement sets.

A program of several kernels can map each kernel its own way (`MappingOptions.kernels`,
`tcmlir.kernel_mapping`): the pipeline then runs the mapping passes (``tile``,
``map-to-blocks``, ``register-tile``, ``map-to-threads``, ``map-reduction``, ``unroll``,
``promote-shared``, ``promote-private``) once per per-kernel mapping with ``only=k,...``
(the statement numbers of that kernel's group) and once with ``skip=`` every per-kernel
statement for the shared options. A subtree is selected by its statements' numbers (``S3``
and ``S3_init`` are statement 3; copy statements of promotion live in extension nodes and do
not count): with ``only``, when all of them are in ``only``; with ``skip``, unless all of
them are in ``skip``. Neither given: every subtree (a program of one mapping).
"""

from __future__ import annotations

import re

import islpy as isl

from .scop import sets_of

__all__ = ["describe_selection", "selects", "statement_numbers"]

_STATEMENT = re.compile(r"^S(\d+)(?:_init)?$")


def statement_numbers(node: isl.ScheduleNode) -> frozenset[int]:
    """The numbers ``k`` of the statements ``S{k}`` / ``S{k}_init`` below ``node``."""
    out = set()
    for s in sets_of(node.get_domain()):
        m = _STATEMENT.match(s.get_tuple_name() or "")
        if m:
            out.add(int(m.group(1)))
    return frozenset(out)


def selects(node: isl.ScheduleNode, only: tuple[int, ...], skip: tuple[int, ...]) -> bool:
    """Whether a pass with these ``only`` / ``skip`` options transforms the subtree at
    ``node`` (see the module docstring)."""
    if not only and not skip:
        return True
    numbers = statement_numbers(node)
    if only and not numbers <= set(only):
        return False
    return not (skip and numbers <= set(skip))


def describe_selection(only: tuple[int, ...], skip: tuple[int, ...]) -> str:
    """``only`` / ``skip`` in words, for messages."""
    if only:
        return "statements " + ",".join(f"S{k}" for k in only)
    if skip:
        return "statements other than " + ",".join(f"S{k}" for k in skip)
    return "every statement"
