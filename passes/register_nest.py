"""`register-tile` for loop nests: the register part below every reduction band (convolutions).

`register-tile` (``passes/register_tile.py``) calls `split_nest_band` for a kernel whose point
band ``P`` has a chain of bands below it: a convolution's window loops. isl's scheduler gives
``O(n, g, f, h, w) +=! I(n, g, c, h + kh, w + kw) * W1(g, f, c, kh, kw)``, tiled
``0,0,16,14,14``, the tile band ``T = [n, g, f/16, h/14, w/14, c]``, the point band
``P = [f%16, h%14, w%14]`` and below it one band per window member, ``[kh]`` then ``[kw]``.
With register sizes ``R_0, R_1, ...`` for the leading members ``u_i`` of ``P``
(``register-tile{sizes=16,1,1}``: 16 outputs along ``f`` per thread), the kernel becomes::

    band T                                   (unchanged)
      band [floor(u_i / R_i) for i < r]      thread part (`map-to-threads`), less leading
                                             members of one value (R_i = extent)
        band [u_j for j >= r]                the other members of P, if any (sequential)
          band [kh]                          the chain below P, unchanged
            band [kw]
              band [u_i mod R_i : R_i > 1]   register part, every member unrolled by isl
                ...                          the statements, as before

so each thread walks the reduction (``c`` in ``T``, ``kh``, ``kw``) once for all of its
outputs, and in the innermost body every operand that does not depend on a register member
(``I`` for a register tile along ``f``) is read once for ``prod(R_i)`` multiply-adds;
`promote-private` keeps the accumulators in registers. Moving the register members below the
chain is legal when they carry no dependence (checked: each is parallel at its place in
``P``); the pass manager proves the result legal and the thread mapping exact anyway.

Left alone (None) when there is no band below ``P`` (the plain `register-tile` split applies),
when ``P`` is not permutable, a register member carries a dependence, a member's extent is not a
multiple of its register size, or every register size is 1 (nothing to move).
"""

from __future__ import annotations

import islpy as isl

from ..poly.gpu_mapping import member_extent
from ..poly.legality import member_is_parallel

__all__ = ["band_chain_below", "split_nest_band"]

_BAND = isl.schedule_node_type.band


def band_chain_below(point: isl.ScheduleNode) -> int:
    """The number of bands right below band ``point``, one below the other (each the only
    child of the one above)."""
    count, node = 0, point
    while node.n_children() == 1 and node.child(0).get_type() == _BAND:
        node = node.child(0)
        count += 1
    return count


def split_nest_band(point: isl.ScheduleNode, sizes: tuple[int, ...],
                    validity: isl.UnionMap) -> isl.ScheduleNode | None:
    """The nest register tiling of point band ``point`` (see the module docstring), or None
    when it is left alone; returns the thread-part band."""
    chain = band_chain_below(point)
    n = point.band_n_member()
    r = min(len(sizes), n)
    if chain == 0 or r == 0 or all(s == 1 for s in sizes[:r]):
        return None
    if n > 1 and not point.band_get_permutable():
        return None
    for i in range(r):
        if not member_is_parallel(point, i, validity):
            return None
        extent = member_extent(point, i)
        if extent is None or extent % sizes[i]:
            return None
    ctx = point.get_ctx()
    mupa = point.band_get_partial_schedule()
    coincident = [point.band_member_get_coincident(i) for i in range(n)]
    threads, regs = [], []
    for i in range(r):
        u = mupa.get_at(i)
        size = isl.Val.int_from_si(ctx, sizes[i])
        threads.append((i, u.scale_down_val(size).floor() if sizes[i] > 1 else u))
        if sizes[i] > 1:
            regs.append((i, u.mod_val(size)))
    # leading thread members of one value (a register tile as long as the tile) are dropped:
    # they would map to the block's outermost index with one thread, and the members after
    # them keep their block indices (the x member stays the innermost one)
    while len(threads) > 1 and member_extent(point, threads[0][0]) == sizes[threads[0][0]]:
        threads.pop(0)
    rest = [(j, mupa.get_at(j)) for j in range(r, n)]

    def band_of(upas: list[isl.UnionPwAff]) -> isl.MultiUnionPwAff:
        space = isl.Space.set_alloc(ctx, 0, len(upas)).align_params(mupa.get_space().params())
        lst = isl.UnionPwAffList.alloc(ctx, len(upas))
        for u in upas:
            lst = lst.add(u)
        return isl.MultiUnionPwAff.from_union_pw_aff_list(space, lst)

    node = point.delete()                      # now the first band of the chain
    for _ in range(chain):
        node = node.child(0)                   # below the chain: the statements
    node = node.insert_partial_schedule(band_of([u for _, u in regs]))
    for m, (i, _) in enumerate(regs):
        node = node.band_member_set_ast_loop_type(m, isl.ast_loop_type.unroll)
        node = node.band_member_set_coincident(m, int(coincident[i]))
    for _ in range(chain):
        node = node.parent()                   # back at the first band of the chain
    if rest:
        node = node.insert_partial_schedule(band_of([u for _, u in rest]))
        node = node.band_set_permutable(int(point.band_get_permutable()))
        for m, (j, _) in enumerate(rest):
            node = node.band_member_set_coincident(m, int(coincident[j]))
    node = node.insert_partial_schedule(band_of([u for _, u in threads]))
    node = node.band_set_permutable(1)
    for m, (i, _) in enumerate(threads):
        node = node.band_member_set_coincident(m, int(coincident[i]))
    return node
