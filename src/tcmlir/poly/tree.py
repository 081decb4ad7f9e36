"""Small helpers to navigate isl schedule trees (positions, outermost and innermost bands, marks).

A node is addressed by its *path*: the child positions from the root. isl schedule nodes are
values: a transformation returns a new node, and ``node.get_schedule()`` the new tree; paths of
nodes outside the transformed subtree stay valid, which the passes rely on.
"""

from __future__ import annotations

from collections.abc import Callable

import islpy as isl

__all__ = ["bands", "leaf_band_paths", "mark_name", "node_at", "outermost_band_paths", "path_of",
           "tile_band"]

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


def tile_band(node: isl.ScheduleNode, sizes: tuple[int, ...]) -> isl.ScheduleNode:
    """Tile band ``node`` by ``sizes`` (per member; 0, and members past the end, untiled: kept
    whole in the tile band, no point member); a band that is not permutable is left alone when
    it has more than one tiled member. Returns the tile band node (the `tile` pass)."""
    n = node.band_n_member()
    per_member = [sizes[m] if m < len(sizes) else 0 for m in range(n)]
    if not any(per_member):
        return node
    if sum(1 for s in per_member if s) > 1 and not node.band_get_permutable():
        return node
    ctx = node.get_ctx()
    ctx.set_tile_scale_tile_loops(0)
    ctx.set_tile_shift_point_loops(1)
    mv = isl.MultiVal.zero(node.band_get_space())
    for m, s in enumerate(per_member):
        mv = mv.set_at(m, isl.Val.int_from_si(ctx, s or 1))
    node = node.band_tile(mv)
    untiled = [m for m, s in enumerate(per_member) if not s]
    if untiled:
        node = _drop_members(node.child(0), untiled).parent()
    return node


def _drop_members(point: isl.ScheduleNode, members: list[int]) -> isl.ScheduleNode:
    """Remove ``members`` (all zero after a size-1 tiling) from point band ``point``."""
    mupa = point.band_get_partial_schedule()
    coincident = [point.band_member_get_coincident(m) for m in range(point.band_n_member())]
    permutable = point.band_get_permutable()
    for m in sorted(members, reverse=True):
        mupa = mupa.drop_dims(isl.dim_type.out, m, 1)
        del coincident[m]
    point = point.delete()
    if not coincident:
        return point
    point = point.insert_partial_schedule(mupa)
    point = point.band_set_permutable(permutable)
    for m, c in enumerate(coincident):
        point = point.band_member_set_coincident(m, c)
    return point
