"""Printing schedule trees so that they read well and re-parse: isl's block style.

isl prints a schedule tree (``str(schedule)``) in YAML *flow* style, the whole tree on one
line; `format_schedule` asks isl's own printer for the *block* style instead, the layout of
isl's documentation and of PPCG's dumps, one key per line and children indented::

    domain: "[N] -> { S1[i] : 0 <= i < N; S0[i] : 0 <= i < N }"
    child:
      sequence:
      - filter: "[N] -> { S0[i] }"
      - filter: "[N] -> { S1[i] }"

Sets and maps stay on one line each (isl's reader takes no line break inside a quoted set).

One repair makes every printed tree re-parse with ``isl.Schedule.read_from_str``: isl's printer
leaves out a leaf child, but its reader requires a child under a *mark* node (``read_mark`` in
isl_schedule_read.c says "expecting child"), so a tree ending in a mark (the CPU pipeline's
``parallel-end``) would print and not read back. Such a mark gets an explicit ``child: leaf``
(flow style: ``child: { leaf }``), which isl reads as the same tree.
tests/test_dump_pretty.py checks the round trip on the corpus for both targets.

This module sits below every layer that prints trees (the pass manager's ``--print-after-all``,
`Kernel.schedule`, ``python -m tcmlir.dump``) and imports nothing of tcmlir.
"""

from __future__ import annotations

import re

import islpy as isl

__all__ = ["format_schedule"]

STYLES = ("block", "flow")
_FLOW_CHILDLESS_MARK = re.compile(r'(mark: "[^"]*") }')


def format_schedule(schedule: isl.Schedule | str, ctx: isl.Context | None = None, *,
                    style: str = "block") -> str:
    """``schedule`` in isl's ``block`` (default) or ``flow`` style, re-parseable, without a
    trailing newline. A string (isl text of either style) is read first, with ``ctx`` (a fresh
    context if None)."""
    if style not in STYLES:
        raise ValueError(f"unknown schedule style {style!r}; choose one of {', '.join(STYLES)}")
    if isinstance(schedule, str):
        schedule = isl.Schedule.read_from_str(ctx or isl.Context(), schedule)
    if style == "flow":
        return _FLOW_CHILDLESS_MARK.sub(r"\1, child: { leaf } }", str(schedule))
    printer = isl.Printer.to_str(schedule.get_ctx())
    printer = printer.set_yaml_style(isl.yaml_style.BLOCK).print_schedule(schedule)
    return _add_mark_leaves(printer.get_str().rstrip("\n").split("\n"))


def _add_mark_leaves(lines: list[str]) -> str:
    """Block text with an explicit leaf child under every mark that has none."""
    out: list[str] = []
    for i, line in enumerate(lines):
        out.append(line)
        column = _key_column(line, "mark")
        if column is None:
            continue
        following = lines[i + 1] if i + 1 < len(lines) else ""
        if _key_column(following, "child") != column:
            out += [" " * column + "child:", " " * (column + 2) + "leaf"]
    return "\n".join(out)


def _key_column(line: str, key: str) -> int | None:
    """Where mapping key ``key`` starts on ``line`` (after indentation and a ``- `` item
    marker), or None when the line holds another key."""
    body = line.lstrip(" ")
    column = len(line) - len(body)
    if body.startswith("- "):
        body, column = body[2:], column + 2
    return column if body.startswith(f"{key}:") else None
