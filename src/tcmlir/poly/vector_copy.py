"""Vector shared-memory copies: which elements of a promoted tile one copy moves ``lanes`` at a time.

`passes/promote_shared.py` (option ``copy-bytes``) asks `copy_lanes` whether a buffer's copy
may move ``copy_bytes`` at once, and `split_footprint` cuts its footprint ``[p] -> T[a]``
into

* **leaders**: elements ``a`` whose last index is a multiple of ``lanes`` and whose
  ``lanes - 1`` right neighbours are in the footprint too: a ``cpvin_<buf>`` /
  ``cpvnext_<buf>`` statement copies ``a .. a + lanes - 1`` at once (one ``cp.async.cg ...
  16`` or one 128-bit load and store);
* **the rest** (a tile's ragged right edge, at sizes that are no multiple of ``lanes``):
  ordinary one-element ``cpin_<buf>`` / ``cpnext_<buf>`` statements.

The two parts cover the footprint exactly, each element once (proved with isl). With
``scatter`` (a tile the buffer stores transposed, like a matmul's A) a leader's elements are
read at once and stored one by one (`Buffer.copy_scatter`). A vector copy
is 16-byte aligned on both sides when the tensor's pointer is (the kernel's ``aligned``
tensors; the code generator copies element by element otherwise): the last dimension of the
tensor has a fixed extent that is a multiple of ``lanes`` (so every row starts aligned), the
leader's last index is a multiple of ``lanes``, and in the buffer (innermost storage dimension
= the tensor's last, a multiple of ``lanes`` slots) the leader's slot is a multiple of
``lanes``, which isl proves (`leaders_aligned`; a tile whose origin is not a multiple of
``lanes`` keeps one-element copies).
"""

from __future__ import annotations

from collections.abc import Mapping

import islpy as isl

from .. import ir
from .promotion import Buffer

__all__ = ["copy_lanes", "leaders_aligned", "split_footprint"]


def copy_lanes(buf: Buffer, tensor: ir.Tensor, copy_bytes: int, element_bytes: int,
               sizes: Mapping[str, int] | None, *, scatter: bool = False) -> tuple[int, bool]:
    """(lanes, whole): elements one copy of ``buf`` may read at once from the tensor (1:
    element by element) — the box is unit-stride along the tensor's last dimension, whose
    extent is fixed to a multiple of ``lanes`` —, and whether it also stores them at once:
    the buffer's innermost storage dimension is the tensor's last, with a multiple of
    ``lanes`` slots per row and per stage. Otherwise (a tile stored transposed, a row padded
    off the lanes) the lanes are ``scatter``-ed: one 16-byte load, one store per element; with
    ``scatter`` off such a buffer gets one-element copies."""
    lanes = copy_bytes // element_bytes if copy_bytes >= 2 * element_bytes else 1
    rank = len(buf.box.extent)
    if lanes == 1 or rank == 0 or buf.box.stride[-1] != 1 or buf.box.groups:
        return 1, False
    last = tensor.shape[-1]
    if sizes is None or any(p not in sizes for p in last.params):
        return 1, False  # a parametric row length: its alignment is unknown at compile time
    if last.evaluate(sizes) % lanes:
        return 1, False
    whole = (buf.order[-1] == rank - 1 and buf.storage[-1] % lanes == 0
             and buf.stage_slots % lanes == 0)
    return (lanes, whole) if whole or scatter else (1, False)


def _shift(fp: isl.Map, by: int) -> isl.Map:
    """``{ [p] -> T[a + by * e_last] : [p] -> T[a] in fp }``."""
    space = fp.get_space().range()
    rank = space.dim(isl.dim_type.set)
    ls = isl.LocalSpace.from_space(space)
    ma = isl.MultiAff.identity(space.map_from_set())
    last = isl.Aff.var_on_domain(ls, isl.dim_type.set, rank - 1).add_constant_val(
        isl.Val.int_from_si(fp.get_ctx(), by))
    return fp.apply_range(isl.Map.from_multi_aff(ma.set_aff(rank - 1, last)))


def split_footprint(fp: isl.Map, lanes: int) -> tuple[isl.Map, isl.Map]:
    """(leaders, rest) of footprint ``fp`` (see the module docstring); an AssertionError if
    the two do not cover ``fp`` exactly once."""
    rank = fp.dim(isl.dim_type.out)
    ctx = fp.get_ctx()
    names = ", ".join(f"a{i}" for i in range(rank))
    aligned = isl.Set.read_from_str(ctx, f"{{ [{names}] : a{rank - 1} mod {lanes} = 0 }}")
    aligned = aligned.set_tuple_id(fp.get_space().range().get_tuple_id(isl.dim_type.set))
    leaders = fp.intersect_range(aligned.align_params(fp.get_space()))
    for j in range(1, lanes):
        leaders = leaders.intersect(_shift(fp, -j))
    covered = leaders
    for j in range(1, lanes):
        covered = covered.union(_shift(leaders, j))
    rest = fp.subtract(covered)
    if not covered.is_subset(fp) or not covered.union(rest).is_equal(fp):
        raise AssertionError(f"vector copies do not cover the footprint {fp} exactly")
    for j in range(1, lanes):  # two leaders' groups never overlap
        if not leaders.intersect(_shift(leaders, j)).is_empty():
            raise AssertionError(f"vector copies overlap in {fp}")
    return leaders.coalesce(), rest.coalesce()


def leaders_aligned(leaders: isl.Map, buf: Buffer, lanes: int) -> bool:
    """Whether isl proves every leader's buffer coordinate along the last dimension, ``a_last -
    lo_last(p)``, a multiple of ``lanes`` (rows of the buffer hold a multiple of ``lanes``
    slots, so the leader's slot is then aligned)."""
    if leaders.is_empty():
        return True
    rank = leaders.dim(isl.dim_type.out)
    one = leaders.project_out(isl.dim_type.out, 0, rank - 1).reset_tuple_id(isl.dim_type.out)
    low = isl.Map.from_pw_aff(buf.box.lo[-1].neg())
    one, low = one.align_params(low.get_space()), low.align_params(one.get_space())
    offsets = one.sum(low.intersect_domain(one.domain())).range()
    multiple = isl.Set.read_from_str(leaders.get_ctx(), f"{{ [d] : d mod {lanes} = 0 }}")
    return offsets.is_subset(multiple.align_params(offsets.get_space()))
