"""The dispatcher of the default options: what a call without options uses.

`default_options(cls, fn, target, sizes)` is `MappingOptions.default_for` (whose docstring
says what each program gets): it asks `host_defaults` on the cpu; on cuda the tensor-core
choice of `poly.contraction`, then `gpu_defaults` (row, mixed and elementwise programs), then
the program classes of `cuda_defaults` (contractions with their tiles and split-K, batched
contractions, convolutions, transposes), then `cost_model.generic_mapping`. ``cls`` is the
options class (`MappingOptions`): handed in, so that this module imports nothing of
`tcmlir.options` (which calls it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .cuda_defaults import (
    SPLIT_K_DEFAULT,
    contraction_access,
    contraction_tiles,
    conv_extents,
    conv_register_tiles,
    is_batched_contraction,
    is_contraction,
    is_convolution,
    is_transpose_like,
    lead_contraction_options,
    output_extents,
    split_k_choice,
)

__all__ = ["default_options"]


def default_options(cls: Any, fn: Any, target: str, sizes: Mapping[str, int] | None = None) -> Any:
    """The `MappingOptions` (of class ``cls``) a call of ``fn`` (a `TCFunction` or its
    `ir.Function`) on ``target`` without options uses at ``sizes`` (the call's size values,
    when known): see `MappingOptions.default_for`."""
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
        split = split_k_choice(ir_fn, sizes) if SPLIT_K_DEFAULT else None
        if split is not None:
            tile, reg, ways = split
            return contraction_access(cls.cuda_contraction(tile, reg).split_reduction(ways))
        return contraction_access(
            cls.cuda_contraction(*contraction_tiles(output_extents(statements, sizes))))
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
    if target == "cuda":
        from .cost_model import generic_mapping

        g = generic_mapping(ir_fn, sizes)
        if g is not None:
            return cls(fusion=g.fusion, tile_sizes=g.tile_sizes, block=g.block, grid=g.grid,
                       unroll_factor=1)
    return cls.naive()
