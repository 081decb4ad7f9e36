"""The cuda defaults' program classes: which programs are contractions, batched contractions,
convolutions or transposes, and the tiles and split-K `MappingOptions.default_for` gives them
(its dispatcher lives in `tcmlir.defaults`; the row programs' defaults in `gpu_defaults`, the
host's in `host_defaults`, everything else from `cost_model`), and the tiles and register
tiles of `MappingOptions.cuda_convolution` (`convolution_options`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from .contraction_model import TILINGS, Problem, choose_tiling
from .cost_model import GPU

__all__ = ["CONTRACTION_TILES", "MODEL_GPU", "SPLIT_K_DEFAULT", "SPLIT_K_MAX_PARTIAL_BYTES", "SPLIT_K_MIN_CHUNK", "SPLIT_K_MIN_EXTENT", "SPLIT_K_WAYS",
           "contraction_access", "contraction_choice", "contraction_problems", "contraction_tiles",
           "conv_extents", "conv_register_tiles", "convolution_options", "is_batched_contraction",
           "is_contraction", "is_convolution", "is_transpose_like", "lead_contraction_options",
           "reduction_innermost", "split_k_choice", "split_ways"]


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


# (tile, register tile) for contractions, largest first; each gives 16 x 16 threads: the
# candidates of the contraction model (`contraction_model.TILINGS`), which picks among them
CONTRACTION_TILES = TILINGS


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


def contraction_tiles(extents: tuple[int, int] | None, batch: int = 1, reduction: int | None = None,
                      aligned: bool = True, b_k_major: bool = False
                      ) -> tuple[tuple[int, int, int], tuple[int, int]]:
    """The (tile, register tile) of `CONTRACTION_TILES` the contraction model
    (`contraction_model.choose_tiling`, unsplit) predicts fastest for an output of ``extents``
    (rows, columns) repeated ``batch`` times over a reduction of ``reduction`` values (a
    square's when unknown); with ``batch`` > 1 only tiles less than twice each extent (a 26 x
    26 product of a batch does not get a 128-wide tile); ``aligned``, ``b_k_major``: see
    `contraction_model.Problem`. The 128 x 64 default when the
    extents are unknown (a parametric call)."""
    if extents is None:
        return CONTRACTION_TILES[1]
    tilings = CONTRACTION_TILES
    if batch > 1:
        tilings = tuple(c for c in tilings if c[0][0] < 2 * extents[0] and c[0][1] < 2 * extents[1])
        tilings = tilings or CONTRACTION_TILES[-1:]
    k = reduction if reduction is not None else max(extents)
    best = choose_tiling([Problem(extents, k, aligned, b_k_major)], batch, tilings=tilings,
                         gpu=MODEL_GPU)
    return best.tile, best.register_tile


def lead_contraction_options(cls: Any, fn: Any, sizes: Mapping[str, int] | None) -> Any:
    """The register-tiled contraction mapping for a contraction with leading output indices
    (`contraction_shape.lead_contraction`: batched matmuls, TC's Kronecker family), its
    leading indices untiled on the grid, else None (also when more than three dimensions
    would need the grid)."""
    from .contraction_shape import lead_contraction

    shape = lead_contraction(fn, sizes)
    if shape is None:
        return None
    st = next(s for s in fn.statements if s.reduction is not None)
    aligned = all(e % 4 == 0 for e in (*shape.extents, shape.reduction))
    tile, reg = contraction_tiles(shape.extents, shape.batch, shape.reduction, aligned,
                                  reduction_innermost(st, st.lhs[-1]))
    wide = sum(e > 1 for e in shape.lead_extents) + sum(
        -(-e // t) > 1 for e, t in zip(shape.extents, tile[:2], strict=True))
    if wide > 3:
        return None
    opts = contraction_access(cls.cuda_contraction(tile, reg))
    return dataclasses.replace(opts, tile_sizes=(0,) * shape.lead + opts.tile_sizes,
                               grid=(1024, 65535, 65535))


# split-K (`split_k_choice`): on when SPLIT_K_DEFAULT, for a program of one splittable
# contraction whose reduction has at least SPLIT_K_MIN_EXTENT elements, cut into one of
# SPLIT_K_WAYS chunks that divide it, each at least SPLIT_K_MIN_CHUNK long; the contraction
# model prices the split candidates beside the unsplit ones (blocks for the SMs against the
# partial sums' traffic and the fold's launch). Measured on the H200 (tools/variants.py): fc
# 1024x2048->1024: 128x64 tiles 2 ways 0.171 ms, 4 ways 0.179, 8 ways 0.214; 128x128 4 ways
# 0.226, 8 ways 0.244; unsplit 64x32 0.313. tmm 128x1024x1024: 128x64 16 ways 0.044 ms, 64x32
# 16 ways 0.044, 8 ways 0.075, 32x32 4 ways 0.045; unsplit 32x32 0.060.
SPLIT_K_DEFAULT = True
SPLIT_K_WAYS = (2, 4, 8, 16)
SPLIT_K_MIN_EXTENT = 512
SPLIT_K_MIN_CHUNK = 64
# the partial sums are a temporary of the call (ways x the output): a default never allocates
# more than this for them
SPLIT_K_MAX_PARTIAL_BYTES = 256 * 2**20
MODEL_GPU = GPU  # the machine the contraction model prices (tests scale it down)


def contraction_problems(statements: Any, sizes: Mapping[str, int] | None) -> list[Problem] | None:
    """Per reduction statement of a contraction (`is_contraction`): its output extents, its
    reduction's extent and whether all three are multiples of 4 (16-byte operand rows,
    vector copies), at ``sizes``; None when unknown."""
    if sizes is None:
        return None
    out: list[Problem] = []
    for st in statements:
        if st.reduction is None or not st.reduction_indices:
            continue
        try:
            box = {r.name: r.hi.evaluate(sizes) - r.lo.evaluate(sizes) for r in st.ranges}
            extents = (box[st.lhs[0]], box[st.lhs[1]])
            k = box[st.reduction_indices[0]]
        except (KeyError, TypeError, ValueError, IndexError):
            return None
        out.append(Problem(extents, k, all(e % 4 == 0 for e in (*extents, k)),
                           reduction_innermost(st, st.lhs[1]), streamed_operands(st)))
    return out or None


def streamed_operands(st: Any) -> int:
    """Reads of ``st`` that use both its output indices and its reduction index (directly or
    through a gather's index tensor: an embedding bag's ``E(idx(b, l), d)``): every point of
    the product reads its own element, no tile reuses it."""
    from . import ir

    need = {st.lhs[0], st.lhs[1], st.reduction_indices[0]}
    count = 0
    for rd in (x for x in ir.walk(st.rhs) if isinstance(x, ir.Read)):
        used = {x.name for i in rd.indices for x in ir.walk(i) if isinstance(x, ir.Index)}
        count += need <= used
    return count


def reduction_innermost(st: Any, index: str) -> bool:
    """A tensor read by ``st`` with ``index`` in its indices has the statement's (first)
    reduction index as its last index: stored with the reduction innermost (fc's ``Wt(n, m)``
    for the columns ``n``)."""
    from . import ir

    k = st.reduction_indices[0]
    for rd in (x for x in ir.walk(st.rhs) if isinstance(x, ir.Read)):
        used = {x.name for i in rd.indices for x in ir.walk(i) if isinstance(x, ir.Index)}
        last = rd.indices[-1] if rd.indices else None
        if index in used and isinstance(last, ir.Index) and last.name == k:
            return True
    return False


def split_ways(fn: Any, sizes: Mapping[str, int] | None) -> tuple[int, ...]:
    """The chunk counts split-K may use on ``fn`` at ``sizes``: 1, and with one splittable
    reduction statement (the program's only one) of at least `SPLIT_K_MIN_EXTENT` elements,
    those of `SPLIT_K_WAYS` that divide it into chunks of at least `SPLIT_K_MIN_CHUNK` and
    keep the partial sums within `SPLIT_K_MAX_PARTIAL_BYTES`."""
    from .passes.split_k import splittable_statements

    problems = contraction_problems(fn.statements, sizes)
    reductions = tuple(k for k, s in enumerate(fn.statements) if s.reduction_indices)
    if problems is None or len(reductions) != 1 or reductions != splittable_statements(fn):
        return (1,)
    (m, n), k = problems[0].extents, problems[0].reduction
    if k < SPLIT_K_MIN_EXTENT:
        return (1,)
    item = fn.tensor(fn.statements[reductions[0]].tensor).dtype.itemsize
    return (1, *(w for w in SPLIT_K_WAYS if k % w == 0 and k // w >= SPLIT_K_MIN_CHUNK
                 and w * m * n * item <= SPLIT_K_MAX_PARTIAL_BYTES))


def contraction_choice(fn: Any, sizes: Mapping[str, int] | None, split: bool = True
                       ) -> tuple[tuple[int, int, int], tuple[int, int], int]:
    """(tile, register tile, ways) of a contraction program (`is_contraction`) at ``sizes``:
    the contraction model's fastest over every reduction statement (one set of options for
    all), split-K among the candidates where `split_ways` allows and ``split``; the 128 x 64
    tile unsplit when the sizes are unknown."""
    problems = contraction_problems(fn.statements, sizes)
    if problems is None:
        tile, reg = CONTRACTION_TILES[1]
        return tile, reg, 1
    ways = split_ways(fn, sizes) if split else (1,)
    best = choose_tiling(problems, ways=ways, gpu=MODEL_GPU)
    return best.tile, best.register_tile, best.ways


def split_k_choice(fn: Any, sizes: Mapping[str, int] | None
                   ) -> tuple[tuple[int, int, int], tuple[int, int], int] | None:
    """(tile, register tile, ways) when the model's choice for ``fn`` at ``sizes``
    (`contraction_choice`) splits the reduction, else None."""
    tile, reg, ways = contraction_choice(fn, sizes)
    return (tile, reg, ways) if ways > 1 else None


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
