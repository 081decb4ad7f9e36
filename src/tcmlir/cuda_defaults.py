"""The cuda defaults' program classes: which programs are contractions, batched contractions,
convolutions or transposes, and the tiles and split-K `MappingOptions.default_for` gives them
(its dispatcher lives in `tcmlir.defaults`; the row programs' defaults in `gpu_defaults`, the
host's in `host_defaults`, everything else from `cost_model`), and the tiles and register
tiles of `MappingOptions.cuda_convolution` (`convolution_options`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

__all__ = ["CONTRACTION_MIN_BLOCKS", "CONTRACTION_TILES", "SPLIT_K_BELOW_TILE", "SPLIT_K_DEFAULT", "SPLIT_K_MIN_BLOCKS", "SPLIT_K_MIN_CHUNK", "SPLIT_K_MIN_EXTENT", "SPLIT_K_TILES", "SPLIT_K_WAYS", "contraction_access", "contraction_tiles", "conv_extents", "conv_register_tiles", "convolution_options", "is_batched_contraction", "is_contraction", "is_convolution", "is_transpose_like", "lead_contraction_options", "output_extents", "split_k_choice"]


def is_convolution(statements: Any) -> Any:
    """The statement of a single-statement convolution-like program (an output of rank >= 4,
    two or more reduction indices), else None."""
    if len(statements) != 1 or statements[0].reduction is None:
        return None
    st = statements[0]
    return st if len(st.lhs) >= 4 and len(st.index_names) - len(st.lhs) >= 2 else None


def conv_extents(st: Any, sizes: Mapping[str, int] | None) -> tuple[int, int, int] | None:
    """The extents of a convolution's last three lhs indices at ``sizes`` (None if unknown)."""
    if sizes is None:
        return None
    try:
        box = {r.name: r.hi.evaluate(sizes) - r.lo.evaluate(sizes) for r in st.ranges}
        return box[st.lhs[-3]], box[st.lhs[-2]], box[st.lhs[-1]]
    except (KeyError, TypeError, ValueError):
        return None


def conv_register_tiles(st: Any) -> bool:
    """A ``+`` reduction that reads a tensor without the channel index (``lhs[-3]``): the
    input of a convolution, reused by every channel a thread keeps in registers (not pooling,
    whose one read depends on the channel)."""
    from . import ir

    if st.reduction is not ir.Reduction.ADD:
        return False
    channel = st.lhs[-3]
    for rd in (x for x in ir.walk(st.rhs) if isinstance(x, ir.Read)):
        used = {x.name for i in rd.indices for x in ir.walk(i) if isinstance(x, ir.Index)}
        if channel not in used:
            return True
    return False


# (tile, register tile) for contractions, largest first; each gives 16 x 16 threads. Measured on
# the H200 (fp32, docs/perf.md): matmul 4096^3 3.88 ms with 128x128x16 / 8x8 against 4.15 ms
# with 128x64x16 / 8x4; fc 1024x2048x1024 0.30 ms with 64x32x16 / 4x2 against 0.61 ms with
# 128x64 (128 blocks for 132 SMs); TMM 128x1024x1024 0.059 ms with 32x32x16 / 2x2 against
# 0.11 ms with 128x64 (16 blocks).
CONTRACTION_TILES = (((128, 128, 16), (8, 8)), ((128, 64, 16), (8, 4)), ((64, 32, 16), (4, 2)),
                     ((32, 32, 16), (2, 2)))
CONTRACTION_MIN_BLOCKS = 2 * 132  # two blocks per SM of an H200


def contraction_access(opts: Any) -> Any:
    """The shared-memory access choices of a default contraction, measured on the H200 (fp32,
    `tools/variants.py`):

    * an 8-wide register tile along the columns reads its B operand as two interleaved groups
      of four (conflict-free 128-bit shared reads), copies its tiles 16 bytes at a time with the
      copy loops unrolled and unrolls the k loop of a tile: matmul 4096^3 3.91 -> 2.90 ms (0.70x
      -> 0.96x cuBLAS; interleaving alone 3.60, 16-byte copies alone 3.63, both 3.34, with the
      copy loops unrolled 3.03; 128 registers, no spill);
    * narrower register tiles (the split-K tiles of tmm and fc: 8x4) copy both operands 16 bytes
      at a time from global memory (the transposed A through registers) and unroll the k loop of
      a tile: fc 0.159 -> 0.144 ms (the copy loops unrolled there spilled)."""
    reg, tile = opts.register_tile, opts.tile_sizes
    if len(reg) != 2 or len(tile) != 3:
        return opts
    if reg[1] == 8 and tile[1] % 8 == 0:
        return dataclasses.replace(opts.interleave_registers(0, 4).vector_copies(16),
                                   unroll_copy_shared=True).unroll(tile[2])
    return opts.vector_copies(16, transposed=True).unroll(tile[2])


def contraction_tiles(extents: tuple[int, int] | None, batch: int = 1
                      ) -> tuple[tuple[int, int, int], tuple[int, int]]:
    """The (tile, register tile) of `CONTRACTION_TILES` for an output of ``extents`` (rows,
    columns) repeated ``batch`` times: the largest whose tiles give at least
    `CONTRACTION_MIN_BLOCKS` blocks and fit the extents (a tile no more than twice an extent),
    else the smallest; the 128×64 default when the extents are unknown (a parametric call)."""
    if extents is None:
        return CONTRACTION_TILES[1]
    for tile, reg in CONTRACTION_TILES:
        if batch > 1 and (tile[0] >= 2 * extents[0] or tile[1] >= 2 * extents[1]):
            continue
        if batch * -(-extents[0] // tile[0]) * -(-extents[1] // tile[1]) >= CONTRACTION_MIN_BLOCKS:
            return tile, reg
    return CONTRACTION_TILES[-1]


def lead_contraction_options(cls: Any, fn: Any, sizes: Mapping[str, int] | None) -> Any:
    """The register-tiled contraction mapping for a contraction with leading output indices
    (`contraction_shape.lead_contraction`: batched matmuls, TC's Kronecker family), its
    leading indices untiled on the grid, else None (also when more than three dimensions
    would need the grid)."""
    from .contraction_shape import lead_contraction

    shape = lead_contraction(fn, sizes)
    if shape is None:
        return None
    tile, reg = contraction_tiles(shape.extents, shape.batch)
    wide = sum(e > 1 for e in shape.lead_extents) + sum(
        -(-e // t) > 1 for e, t in zip(shape.extents, tile[:2], strict=True))
    if wide > 3:
        return None
    opts = contraction_access(cls.cuda_contraction(tile, reg))
    return dataclasses.replace(opts, tile_sizes=(0,) * shape.lead + opts.tile_sizes,
                               grid=(1024, 65535, 65535))


# split-K defaults (`split_k_choice`): on when SPLIT_K_DEFAULT, for contractions whose unsplit
# tiles (`contraction_tiles`) would be smaller than SPLIT_K_BELOW_TILE; a reduction of at least
# SPLIT_K_MIN_EXTENT elements cut into the fewest of SPLIT_K_WAYS chunks that divide it, each
# at least SPLIT_K_MIN_CHUNK long, giving SPLIT_K_MIN_BLOCKS blocks of the largest of
# SPLIT_K_TILES whose rows divide the output's. Measured on the H200 (tools/variants.py):
# fc 1024x2048->1024: 128x64 tiles 2 ways 0.171 ms, 4 ways 0.179, 8 ways 0.214; 128x128 4 ways
# 0.226, 8 ways 0.244; unsplit 64x32 0.313. tmm 128x1024x1024: 128x64 16 ways 0.044 ms, 64x32
# 16 ways 0.044, 8 ways 0.075, 32x32 4 ways 0.045; unsplit 32x32 0.060. Fewer, larger tiles and
# just enough blocks win: the partial sums cost DRAM traffic per way.
SPLIT_K_DEFAULT = True
SPLIT_K_BELOW_TILE = (128, 64, 16)
SPLIT_K_TILES = (((128, 64, 16), (8, 4)), ((64, 32, 16), (4, 2)), ((32, 32, 16), (2, 2)))
SPLIT_K_WAYS = (2, 4, 8, 16)
SPLIT_K_MIN_EXTENT = 512
SPLIT_K_MIN_CHUNK = 64
SPLIT_K_MIN_BLOCKS = 256


def split_k_choice(fn: Any, sizes: Mapping[str, int] | None
                   ) -> tuple[tuple[int, int, int], tuple[int, int], int] | None:
    """(tile, register tile, ways) for split-K on a one-contraction program at ``sizes``, or
    None to keep the unsplit `contraction_tiles`: split only when those would be smaller than
    `SPLIT_K_BELOW_TILE` (fewer than `CONTRACTION_MIN_BLOCKS` blocks with it: tmm 128x1024x1024
    and fc 1024x2048->1024, not matmul 2048^3) and the reduction has at least
    `SPLIT_K_MIN_EXTENT` elements; then the largest of `SPLIT_K_TILES` (fewest ways for it)
    whose rows divide the output's, with ways from `SPLIT_K_WAYS` dividing the reduction into
    chunks of at least `SPLIT_K_MIN_CHUNK`, that reaches `SPLIT_K_MIN_BLOCKS` blocks (the
    partial sums: ``ways`` times the blocks of ``rows`` rows, passes/split_k)."""
    from .passes.split_k import splittable_statements

    if sizes is None:
        return None
    statements = fn.statements
    targets = splittable_statements(fn)
    reductions = tuple(k for k, s in enumerate(statements) if s.reduction_indices)
    if len(reductions) != 1 or reductions != targets:
        return None
    st = statements[targets[0]]
    extents = output_extents(statements, sizes)
    try:
        rng = st.range_of(st.reduction_indices[0])
        extent = rng.hi.evaluate(sizes) - rng.lo.evaluate(sizes)
    except (KeyError, TypeError, ValueError):
        return None
    if extents is None or extent < SPLIT_K_MIN_EXTENT:
        return None

    def blocks(tile: tuple[int, int, int], rows: int) -> int:
        return -(-rows // tile[0]) * -(-extents[1] // tile[1])

    if blocks(SPLIT_K_BELOW_TILE, extents[0]) >= CONTRACTION_MIN_BLOCKS:
        return None
    for tile, reg in SPLIT_K_TILES:
        if extents[0] % tile[0]:
            continue
        for ways in SPLIT_K_WAYS:
            if (extent % ways == 0 and extent // ways >= SPLIT_K_MIN_CHUNK
                    and blocks(tile, ways * extents[0]) >= SPLIT_K_MIN_BLOCKS):
                return tile, reg, ways
    return None


def output_extents(statements: Any, sizes: Mapping[str, int] | None) -> tuple[int, int] | None:
    """The extents of a contraction's two lhs indices at ``sizes`` (None if unknown)."""
    if sizes is None:
        return None
    st = next(s for s in statements if s.reduction is not None and s.reduction_indices)
    try:
        box = {r.name: r.hi.evaluate(sizes) - r.lo.evaluate(sizes) for r in st.ranges}
        return box[st.lhs[0]], box[st.lhs[1]]
    except (KeyError, TypeError, ValueError):
        return None


def is_transpose_like(statements: Any) -> bool:
    """Some elementwise statement reads a tensor of rank >= 2 whose last index is a plain
    index other than the statement's last lhs index, and that lhs index is one of the read's
    other indices (``B(m, n) = A(n, m)``): consecutive threads would read it with a stride."""
    from . import ir

    for st in statements:
        # rank 2 only: its 64 x 64 tiles on a rank-3 permutation's two outer members left 16
        # blocks (the model's generic mapping takes higher ranks)
        if st.reduction is not None or len(st.lhs) != 2:
            continue
        inner = st.lhs[-1]
        for rd in (x for x in ir.walk(st.rhs) if isinstance(x, ir.Read)):
            if len(rd.indices) < 2 or not isinstance(rd.indices[-1], ir.Index):
                continue
            others = {x.name for i in rd.indices[:-1] for x in ir.walk(i) if isinstance(x, ir.Index)}
            if rd.indices[-1].name != inner and inner in others:
                return True
    return False


def is_batched_contraction(statements: Any) -> bool:
    """One reduction statement with three lhs indices and one reduction index (a batched
    matmul), plus at most elementwise statements of rank <= 3."""
    reductions = [s for s in statements if s.reduction is not None]
    if len(reductions) != 1:
        return False
    st = reductions[0]
    if len(st.lhs) != 3 or len(st.index_names) != 4:
        return False
    # the batch index leads the output and every operand (``C(m, n, b)`` with the batch
    # last got the batch's tile of 1 on ``m``: one block)
    batch = st.lhs[0]
    from . import ir

    for rd in (x for x in ir.walk(st.rhs) if isinstance(x, ir.Read)):
        if not rd.indices or not isinstance(rd.indices[0], ir.Index) or rd.indices[0].name != batch:
            return False
    return all(len(s.index_names) <= 3 for s in statements if s is not st)


def is_contraction(statements: Any) -> bool:
    """Reduction statements with two lhs indices and one reduction index each (matmul-like:
    one, or several such as a matmul's gradient), plus at most elementwise statements of rank
    <= 2 (a bias, an activation)."""
    reductions = [s for s in statements if s.reduction is not None and s.reduction_indices]
    if not reductions:
        return False
    return all(len(st.lhs) == 2 and len(st.index_names) == 3 for st in reductions) and all(
        len(s.index_names) <= 2 for s in statements if s not in reductions)


def convolution_options(cls: Any, rank: int, extents: tuple[int, int, int] | None = None,
                        register: bool = True) -> Any:
    """`MappingOptions.cuda_convolution` (``cls``: the options class; its docstring says what
    the tiles, threads and register tiles are and why)."""
    lead = (0,) * (rank - 3)
    if extents is not None and min(extents) < 2:
        # an output dimension of one value: isl's schedule may drop its member, and the
        # tile sizes would then fall on the wrong members (a 1-channel strided conv's
        # reduction member was mapped to threads and half of it never ran)
        register = False
    if not register:
        return cls(fusion="preserve3coincident", tile_sizes=(*lead, 16, 16, 16),
                   block=(16, 16, 2), grid=(256, 256), use_shared_memory=True)
    f, h, w = extents if extents is not None else (16, 16, 16)
    tf = max(1, min(16, f))
    th, tw = (max(1, -(-e // -(-e // 16))) for e in (h, w))
    # 8 channels x 2 columns per thread where the tiles allow: on the H200 the grouped
    # convolution ran 0.045 ms with (8, 1, 2) against 0.070 ms with (16, 1, 1)
    rf = 8 if tf % 8 == 0 else tf
    rw = 2 if tw % 2 == 0 else 1
    return cls(fusion="preserve3coincident", tile_sizes=(*lead, tf, th, tw),
               register_tile=(rf, 1, rw), block=(tw // rw, th, tf // rf),
               grid=(256, 256, 256), use_shared_memory=True, use_private_memory=True)
