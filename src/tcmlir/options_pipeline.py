"""The pass pipeline a `MappingOptions` compiles to (`MappingOptions.to_pipeline`).

`pipeline(opts, target)` writes the pipeline string of the pass manager (``schedule{...},
tile{...},map-to-blocks{...},...``) for the cpu or the cuda target; `thread_block(opts)` is
the block a cuda kernel gets. The options' fields, presets, setters and JSON stay in
`tcmlir.options`, which calls these; this module reads the fields it is handed and imports
nothing of it.
"""

from __future__ import annotations

from typing import Any

from .errors import OptionsError

__all__ = ["cuda_mapping_steps", "pipeline", "thread_block"]


def pipeline(opts: Any, target: str = "cpu") -> str:
    """The pass pipeline the `MappingOptions` ``opts`` stand for on ``target`` ("cpu" or
    "cuda")."""
    def ints(values: tuple[int, ...]) -> str:
        return ",".join(map(str, values))

    steps = [
        f"schedule{{fusion={opts.fusion},skew={str(opts.allow_skewing).lower()},"
        f"positive-orthant={str(opts.positive_orthant).lower()}}}",
    ]
    if target == "cuda" and opts.kernels and (opts.mma_tile or opts.split_k > 1 or opts.row_block):
        raise OptionsError("per-kernel mappings (kernels) do not combine with tensor cores "
                           "(mma_tile), split_k or row_block: drop `kernels` or those")
    if target == "cuda" and opts.mma_tile:
        if opts.parametric or opts.split_k > 1 or opts.row_block:
            raise OptionsError("tensor cores (mma_tile) need fixed sizes and do not combine "
                               "with split_k or row_block")
        if opts.mma_pad_operands:  # an IR rewrite: before schedule
            steps.insert(0, "pad-operands" + ("{tf32=true}" if opts.allow_tf32 else ""))
        steps.append(f"map-mma{{tile={ints(opts.mma_tile)},warps={ints(opts.mma_warps)},"
                     f"stages={opts.mma_stages}" + (",wgmma=true" if opts.mma_wgmma else "")
                     + (",tf32=true}" if opts.allow_tf32 else "}"))
        return ",".join(steps)
    if opts.split_k > 1:
        if opts.parametric:
            raise OptionsError(f"split_k={opts.split_k} needs fixed sizes and does not "
                               "combine with parametric kernels")
        if target == "cuda" and opts.row_block:
            raise OptionsError("split_k does not combine with row_block (map-rows)")
        # an IR rewrite: before schedule. Chunks of whole k tiles (the last tile size):
        # a chunk of 13 under 16-wide tiles made isl's copy proofs take minutes
        align = opts.tile_sizes[-1] if opts.tile_sizes and opts.tile_sizes[-1] > 1 else 1
        steps.insert(0, f"split-k{{ways={opts.split_k}"
                        + (f",align={align}}}" if align > 1 else "}"))
    if target == "cuda" and opts.row_block:
        # one kernel for the whole row program: pointwise temporaries recomputed, a block
        # per row, phases separated by barriers (passes/inline_temporaries, map_rows)
        steps.insert(0, "inline-temporaries")
        mapper = "map-rows"
        extra = f",vector-bytes={opts.vector_bytes}" if opts.vector_bytes else ""
        if opts.mixed_rows:  # a gradient's adjoint written in pieces becomes one expression
            steps.insert(0, "merge-updates")
            mapper = "map-mixed"
            extra += "" if opts.mixed_rows == "fused" else ",fuse=false"
        steps.append(f"{mapper}{{threads={opts.row_block},grid={opts.grid[0]}{extra}}}")
        if opts.use_shared_memory or opts.use_private_memory:
            raise OptionsError("row_block (map-rows) keeps rows on chip itself and does not "
                               "combine with use_shared_memory/use_private_memory")
        if opts.unroll_factor > 1:
            steps.append(f"unroll{{factor={opts.unroll_factor}}}")
        return ",".join(steps)
    if target == "cuda":
        # per-kernel mappings first, then the shared one for the other kernels; pass by pass
        # (every kernel tiled, then mapped to blocks, ...: promotion comes last)
        claimed = sorted({k for km in opts.kernels for k in km.statements})
        mappings = [cuda_mapping_steps(km, "only=" + ints(km.statements)) for km in opts.kernels]
        mappings.append(cuda_mapping_steps(opts, "skip=" + ints(tuple(claimed)) if claimed else ""))
        for phase in range(len(mappings[-1])):
            steps.extend(m[phase] for m in mappings if m[phase])
        return ",".join(steps)
    tiles = opts.tile_sizes
    if opts.register_tile and not opts.parametric:
        # the packed kernel (passes/host_contraction: fixed sizes only; a parametric
        # kernel takes the tile sizes as isl tiles): MC, NC, KC and MR, NR, 0 = its default
        blocks, regs = (*tiles, 0, 0, 0)[:3], (*opts.register_tile, 0, 0)[:2]
        steps.append(f"host-contraction{{tile={ints(blocks)},register={ints(regs)}}}")
    elif any(tiles):
        steps.append(f"tile{{sizes={ints(tiles)}}}")
    steps.append("mark-parallel")
    steps.append("vectorize")  # a unit-stride parallel member innermost, if legal
    if opts.unroll_factor > 1:
        steps.append(f"unroll{{factor={opts.unroll_factor}}}")
    return ",".join(steps)


def cuda_mapping_steps(m: Any, select: str = "") -> list[str]:
    """The cuda mapping passes of the knobs of ``m`` (a `MappingOptions` or a
    `kernel_mapping.KernelMapping`: the fields they share), one entry per phase (tile,
    blocks, register tile, threads, reduction, unroll, shared, private; "" where a phase has
    no pass); ``select`` (``only=...`` / ``skip=...``, `poly.kernel_select`) is added to each."""
    def ints(values: tuple[int, ...]) -> str:
        return ",".join(map(str, values))

    def step(name: str, *options: str) -> str:
        parts = [o for o in (*options, select) if o]
        return name + ("{" + ",".join(parts) + "}" if parts else "")

    split_k = getattr(m, "split_k", 1)
    tiles = m.tile_sizes
    if not any(tiles):
        tiles = tuple(reversed(m.block))  # threads need a point band to map onto
    tile = step("tile", f"sizes={ints(tiles)}") if any(tiles) else ""
    if tile and split_k > 1:
        # the fold of split-k: one element per thread, a block per thread-block tile
        tile += "," + step("tile-folds", f"sizes={ints(tuple(reversed(thread_block(m))))}")
    block = thread_block(m)
    grid = m.grid
    if split_k > 1 and len(grid) < 3:
        # the chunk index of split-k's partial sums, their outer band member: its own
        # (outermost) grid dimension (passes/split_k)
        grid = (*grid, split_k)
    register = ""
    if m.register_tile:
        lace = (f",interleave={ints(m.register_interleave)}"
                if any(m.register_interleave) else "")
        register = step("register-tile", f"sizes={ints(m.register_tile)}{lace}")
    vec = f"vector-bytes={m.vector_bytes}" if m.vector_bytes else ""
    shared = ""
    if m.use_shared_memory:
        limit = m.max_shared_memory or 48 * 1024
        shared = step("promote-shared",
                      f"max-bytes={min(limit, 48 * 1024)},"
                      f"unroll-copies={str(m.unroll_copy_shared).lower()},"
                      f"double-buffer={str(m.double_buffer).lower()}"
                      + (f",copy-bytes={m.copy_bytes}" if m.copy_bytes else "")
                      + (",copy-transposed=true" if m.copy_transposed else ""))
    return [
        tile,
        step("map-to-blocks", f"grid={ints(grid)}"),
        register,
        step("map-to-threads", f"block={ints(block)}", vec),
        # a reduction member left sequential goes to threadIdx.x with a block combine
        # (only where the kernel has at most one thread-mapped member; passes/map_reductions)
        step("map-reduction", f"threads={block[0]}"),
        step("unroll", f"factor={m.unroll_factor}") if m.unroll_factor > 1 else "",
        shared,
        step("promote-private") if m.use_private_memory else "",
    ]


def thread_block(opts: Any) -> tuple[int, ...]:
    """The block a cuda kernel of the `MappingOptions` ``opts`` gets: ``block``, or with a register tile, the tile sizes
    divided by the register sizes (innermost mapped member on x). The register sizes go
    with the point band's members, the tiled ones: tile sizes of 0 (untiled members, such
    as a convolution's batch and group) are skipped."""
    if any(opts.register_interleave):
        if len(opts.register_interleave) > len(opts.register_tile):
            raise OptionsError(f"register interleave {opts.register_interleave} needs a "
                               f"register tile size per width, got {opts.register_tile}")
        for w, r in zip(opts.register_interleave, opts.register_tile, strict=False):
            if w and r % w:
                raise OptionsError(f"register interleave width {w} does not divide the "
                                   f"register tile size {r} ({opts.register_tile})")
    if not opts.register_tile:
        return opts.block
    tiles = tuple(t for t in opts.tile_sizes if t)
    n = min(len(opts.register_tile), len(tiles))
    if n == 0 or any(tiles[i] == 0 or tiles[i] % opts.register_tile[i] for i in range(n)):
        raise OptionsError(f"register tile {opts.register_tile} needs tile sizes that are "
                           f"multiples of it, got tile sizes {tiles}")
    return tuple(reversed([tiles[i] // opts.register_tile[i] for i in range(n)]))
