"""The dispatcher of the default options: what a call without options uses.

`default_options(cls, fn, target, sizes)` is `MappingOptions.default_for` (whose docstring
says what each program gets): it asks `host_defaults` on the cpu; on cuda the tensor-core
choice of `poly.contraction`, then `gpu_defaults` (row, mixed and elementwise programs), then
the program classes of `cuda_defaults` (contractions with their tiles and split-K, batched
contractions, convolutions, transposes), then for a program of several kernels some of which
are of those classes a mapping per kernel (`per_kernel_options`), then
`cost_model.generic_mapping`. ``cls`` is the
options class (`MappingOptions`): handed in, so that this module imports nothing of
`tcmlir.options` (which calls it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .cuda_defaults import (
    SPLIT_K_DEFAULT,
    contraction_access,
    contraction_choice,
    conv_extents,
    conv_register_tiles,
    is_batched_contraction,
    is_contraction,
    is_convolution,
    is_transpose_like,
    lead_contraction_options,
)
from .kernel_mapping import KernelMapping

__all__ = ["default_options", "per_kernel_options", "statements_function"]


def default_options(cls: Any, fn: Any, target: str, sizes: Mapping[str, int] | None = None,
                    *, per_kernel: bool = True) -> Any:
    """The `MappingOptions` (of class ``cls``) a call of ``fn`` (a `TCFunction` or its
    `ir.Function`) on ``target`` without options uses at ``sizes`` (the call's size values,
    when known; `MappingOptions.default_for`). ``per_kernel=False`` leaves out the per-kernel
    mappings (`per_kernel_options` asks so of each kernel's statements).

    On the CPU, `host_defaults.cpu_defaults`: a contraction gets the packed kernel
    (``register_tile`` with ``tile`` sizes: `passes/host_contraction.py`), other nests of
    three or more loops the naive 32³ tiling, shallower programs maximal fusion. On the GPU, row programs (softmax,
    layernorm, row, column and full reductions: bandwidth-bound) get
    `gpu_defaults.reduction_defaults` (one kernel, a block per row), programs that mix
    row statements and column reductions (a layernorm's gradient with scale and shift)
    `gpu_defaults.mixed_defaults` (one row kernel that also accumulates the column
    reductions, else a row kernel and column kernels), 1-D elementwise
    programs `gpu_defaults.elementwise_defaults`; a contraction (one statement with two
    lhs indices and one reduction index: matmul, its transposed forms, fc) gets
    `cuda_contraction` with the tiles, register tiles and split-K (chunks of a long
    reduction on blocks of their own) that the contraction model predicts fastest at
    ``sizes`` (`cuda_defaults.contraction_choice`, `contraction_model`: waves over the
    SMs, occupancy from registers and shared memory, partial tiles, shared-memory
    bandwidth, the partial sums' traffic); a batched contraction (three lhs
    indices, one reduction index: batched matmul) `cuda_batched_contraction`; a convolution
    `cuda_convolution`; a program that reads a tensor across its rows where it writes
    along them (a transpose) the naive options with `promote-shared`, whose tile copies
    read rows; a program of several kernels some of which are of these classes a mapping
    per kernel (`defaults.per_kernel_options`, the ``kernels`` field: attention's batched
    matmuls the contraction mapping, its row reductions a block per row; so does a program
    of several matmuls whose tiles differ, as mlp2's); everything else
    on cuda the mapping `cost_model.generic_mapping` prices
    best at ``sizes`` (tiles, threads, grid and fusion from an analytic model over the
    schedule), the naive options where it has none (sizes not known)."""
    ir_fn = getattr(fn, "ir", fn)
    statements = ir_fn.statements
    if target == "cpu":  # host_defaults: the packed contraction kernel, tiles, fusion
        from .host_defaults import cpu_defaults

        return cpu_defaults(cls, ir_fn, sizes)
    if target == "cuda":
        from .gpu_defaults import elementwise_defaults, mixed_defaults, reduction_defaults
        from .poly.contraction import contraction_plan, mma_tile_choice
        from .poly.operand_pad import pad_saving

        plan = contraction_plan(ir_fn, sizes)
        if not isinstance(plan, str):  # half-precision contraction: tensor cores
            tile, warps, stages, wgmma = mma_tile_choice(plan)
            assert sizes is not None  # (a plan needs them)
            pad = pad_saving(ir_fn, sizes, tile) > 0  # misaligned operands copied first
            return cls(fusion="preserve3coincident").tensor_cores(tile, warps, stages, wgmma,
                                                                  pad=pad)

        rows = reduction_defaults(cls, ir_fn, sizes) or mixed_defaults(cls, ir_fn)
        if rows is not None:
            return rows
        flat = elementwise_defaults(cls, ir_fn)
        if flat is not None:
            return flat
    if target == "cuda" and is_contraction(statements):
        tile, reg, ways = contraction_choice(ir_fn, sizes, split=SPLIT_K_DEFAULT)
        if ways > 1:
            return contraction_access(cls.cuda_contraction(tile, reg).split_reduction(ways))
        whole = contraction_access(cls.cuda_contraction(tile, reg))
        if per_kernel and sum(bool(st.reduction_indices) for st in statements) > 1:
            # several matmuls (mlp2): each its own tiles where they differ from the first's
            per = per_kernel_options(cls, ir_fn, sizes)
            if per is not None and any(km.knobs() != KernelMapping.of(km.statements, whole).knobs()
                                       for km in per.kernels):
                return per
        return whole
    if target == "cuda" and (lead := lead_contraction_options(cls, ir_fn, sizes)) is not None:
        return lead
    if target == "cuda" and is_batched_contraction(statements):
        return cls.cuda_batched_contraction()
    if target == "cuda" and (conv := is_convolution(statements)):
        return cls.cuda_convolution(len(conv.lhs), conv_extents(conv, sizes),
                                    register=conv_register_tiles(conv))
    if target == "cuda" and is_transpose_like(statements):
        # 64 x 64 tiles, 64 x 4 threads: 85% of the copy ceiling on an 8192^2 transpose
        # (32 x 32 tiles with 32 x 8 threads: 80%)
        return cls.naive().tile(64, 64).map_to_threads(64, 4).map_to_blocks(1024, 1024) \
            .shared_memory(True)
    if target == "cuda" and per_kernel and (per := per_kernel_options(cls, ir_fn, sizes)) is not None:
        return per
    if target == "cuda":
        from .cost_model import generic_mapping

        g = generic_mapping(ir_fn, sizes)
        if g is not None:
            return cls(fusion=g.fusion, tile_sizes=g.tile_sizes, block=g.block, grid=g.grid,
                       unroll_factor=1)
    return cls.naive()


def statements_function(fn: Any, numbers: Any) -> Any:
    """The `ir.Function` of the statements ``S{k}`` of ``fn`` for ``k`` in ``numbers``, as a
    program of their own: the tensors they write are its outputs, those they only read its
    inputs (a temporary computed by another kernel is an input here)."""
    import dataclasses

    from . import ir

    statements = tuple(st for k, st in enumerate(fn.statements) if k in set(numbers))
    written = {st.tensor for st in statements}
    read = {x.tensor for st in statements for x in ir.walk(st.rhs) if isinstance(x, ir.Read)}
    return dataclasses.replace(
        fn, statements=statements, temporaries=(),
        inputs=tuple(t for t in fn.tensors if t.name in read and t.name not in written),
        outputs=tuple(t for t in fn.tensors if t.name in written))


def _own_mapping(cls: Any, fn: Any, numbers: Any, sizes: Mapping[str, int]) -> Any:
    """The options the statements ``numbers`` of ``fn`` get as a program of their own when
    those are a class mapping of the standard cuda passes (shared-memory tiles or a register
    tile: a contraction, a batched one, a transpose), else None. A contraction that would be
    split (split-K) takes the tiles it gets unsplit (a per-kernel mapping has no IR rewrite). Convolutions are left out: a
    convolution's weight gradient (``W1_grad(f, c, kh, kw)``, a reduction over the batch and
    the image) would take the convolution tiles of its 3 x 3 outputs, 18 threads a block."""

    sub = statements_function(fn, numbers)
    if is_convolution(sub.statements):
        return None
    if not any(st.reduction_indices for st in sub.statements) and not is_transpose_like(
            sub.statements):
        return None  # no class of these (spares the generic mapping's schedules)
    own = default_options(cls, sub, "cuda", sizes, per_kernel=False)
    if own.mma_tile or own.row_block or own.parametric or own.kernels:
        return None
    if not (own.use_shared_memory or own.register_tile):
        return None
    if own.split_k > 1:  # the tiles it would take unsplit
        tile, reg, _ = contraction_choice(sub, sizes, split=False)
        own = contraction_access(cls.cuda_contraction(tile, reg))
    return own


ROW_REDUCTION_THREADS = 256  # threads per row of a row reduction kernel (map-reduction)
# rows per block, one after the other: a block per row left its initialisation (a kernel of
# its own under fusion=min) one thread per block, 32768 blocks for attention's row maximum
ROW_REDUCTION_ROWS = 8


def _row_reduction_mapping(cls: Any, fn: Any, numbers: Any, sizes: Mapping[str, int]) -> Any:
    """For a kernel of one reduction statement (``mx(b, i) max=! P(b, i, j)``): a block per
    `ROW_REDUCTION_ROWS` output elements along the last lhs index (tiles of 1 on the others),
    the reduction indices untiled, so that `map-reduction` spreads each row over the block's
    threads and combines them (warp shuffles, shared memory), row after row — the generic
    mapping gave a thread per row, the warp reading down a column; else None. The threads:
    the largest power of two up to `ROW_REDUCTION_THREADS` no larger than the reduced
    extent (at least 32)."""
    sub = statements_function(fn, numbers)
    if len(sub.statements) != 1:
        return None
    st = sub.statements[0]
    if st.reduction is None or not st.reduction_indices or len(st.lhs) > 3:
        return None
    extent = 1
    try:
        for name in st.reduction_indices:
            rng = st.range_of(name)
            extent *= rng.hi.evaluate(sizes) - rng.lo.evaluate(sizes)
    except (KeyError, TypeError, ValueError):
        return None
    threads = 32
    while threads < ROW_REDUCTION_THREADS and 2 * threads <= extent:
        threads *= 2
    rows = (1,) * (len(st.lhs) - 1) + (ROW_REDUCTION_ROWS,) if st.lhs else ()
    return cls(tile_sizes=rows + (0,) * len(st.reduction_indices),
               block=(threads,), grid=(2**31 - 1, 65535, 65535))


def per_kernel_options(cls: Any, fn: Any, sizes: Mapping[str, int] | None) -> Any:
    """cuda options (of class ``cls``) that map each kernel of a program of several kernels
    with what its statements would get as a program of their own, where that is one of the
    class mappings (`_own_mapping`: attention's two batched matmuls get the register-tiled
    contraction mapping), and the other kernels with `cost_model.generic_mapping` of their
    statements (`MappingOptions.kernels`, `kernel_mapping`); None when no kernel has a class
    mapping or the sizes are not all known. The fusion (`cost_model.FUSIONS`) is the one
    under which the class mappings cover the most statement instances (ties: the first):
    attention's scores fuse with their row maximum under ``preserve3coincident``, so
    ``min`` gives both matmuls their own kernels."""
    from .cost_model import FUSIONS, generic_mapping, kernel_statement_groups
    from .ir import instance_count

    if sizes is None or len(fn.statements) < 2 or any(p not in sizes for p in fn.sizes):
        return None
    best: tuple[int, str, list] | None = None
    for fusion in FUSIONS:
        groups = kernel_statement_groups(fn, sizes, fusion)
        if groups is None or len(groups) < 2:
            continue
        claimed = []
        for numbers in groups:
            own = _own_mapping(cls, fn, numbers, sizes)
            if own is not None:
                claimed.append((tuple(sorted(numbers)), own))
        work = sum(instance_count(statements_function(fn, n), sizes) for n, _ in claimed)
        if claimed and (best is None or work > best[0]):
            best = (work, fusion, claimed, groups)
    if best is None:
        return None
    _, fusion, claimed, groups = best
    for numbers in groups:  # row reductions beside them: a block per row (map-reduction)
        row = _row_reduction_mapping(cls, fn, numbers, sizes)
        if row is not None and not any(set(numbers) & set(n) for n, _ in claimed):
            claimed.append((tuple(sorted(numbers)), row))
    rest = [k for k in range(len(fn.statements)) if not any(k in n for n, _ in claimed)]
    shared = generic_mapping(statements_function(fn, rest), sizes, fusions=(fusion,)) if rest else None
    base = cls.naive() if shared is None else cls(
        tile_sizes=shared.tile_sizes, block=shared.block, grid=shared.grid, unroll_factor=1)
    return base.outer_schedule_fusion_strategy(fusion).per_kernel(*claimed)
