"""Small helpers to navigate isl schedule trees (positions, outermost and innermost bands, marks).

A node is addressed by its *path*: the child positions from the root. isl schedule nodes are
values: a transformation returns a new node, and ``node.get_schedule()`` the new tree; paths of
nodes outside the transformed subtree stay valid, which the passes rely on.
"""

from __future__ import annotations

from collections.abc import Callable

import islpy as isl

__all__ = ["bands", "leaf_band_paths", "mark_name", "node_at", "outermost_band_paths", "path_of"]

_BAND = isl.schedule_node_type.band
_MARK = isl.schedule_node_type.mark


def node_at(schedule: isl.Schedule, path: tuple[int, ...]) -> isl.ScheduleNode:
    node = schedule.get_root()
    for pos in path:
        node = node.child(pos)
    return node


def path_of(node: isl.ScheduleNode) -> tuple[int, ...]:
    path = []
    while node.has_parent():
        path.append(node.get_child_position())
        node = node.parent()
    return tuple(reversed(path))


def outermost_band_paths(schedule: isl.Schedule) -> list[tuple[int, ...]]:
    """Paths of the bands with no band above them (one per branch of sequences/sets)."""
    found: list[tuple[int, ...]] = []

    def walk(node: isl.ScheduleNode, path: tuple[int, ...]) -> None:
        if node.get_type() == _BAND:
            found.append(path)
            return
        for i in range(node.n_children()):
            walk(node.child(i), (*path, i))

    walk(schedule.get_root(), ())
    return found


def leaf_band_paths(schedule: isl.Schedule,
                    ignore: Callable[[isl.ScheduleNode], bool] | None = None) -> list[tuple[int, ...]]:
    """Paths of the bands with no band node in their subtree (the innermost bands); with
    ``ignore``, bands it accepts count as no band (and are not reported)."""
    found: list[tuple[int, ...]] = []

    def counts(n: isl.ScheduleNode) -> bool:
        return n.get_type() == _BAND and not (ignore is not None and ignore(n))

    def visit(node: isl.ScheduleNode) -> bool:
        if counts(node):
            inner: list[bool] = []

            def probe(n: isl.ScheduleNode) -> bool:
                if counts(n):
                    inner.append(True)
                    return False
                return True

            for i in range(node.n_children()):
                node.child(i).foreach_descendant_top_down(probe)
            if not inner:
                found.append(path_of(node))
        return True

    schedule.get_root().foreach_descendant_top_down(visit)
    return found


def bands(schedule: isl.Schedule) -> list[isl.ScheduleNode]:
    """Every band node, top-down."""
    found: list[isl.ScheduleNode] = []

    def visit(node: isl.ScheduleNode) -> bool:
        if node.get_type() == _BAND:
            found.append(node.copy())
        return True

    schedule.get_root().foreach_descendant_top_down(visit)
    return found


def mark_name(node: isl.ScheduleNode) -> str | None:
    """The id name of a mark node, else None."""
    if node.get_type() != _MARK:
        return None
    return node.mark_get_id().get_name()
