"""The search space of the autotuner: which MappingOptions fields vary, and over what values.

The space depends on the target: only the fields the backend honours vary, so no evaluation
is spent on knobs that change nothing. On the CPU: fusion, tiling, unrolling, threads. On CUDA: fusion,
tiling, block, grid, unrolling, register tiles, shared/private promotion, double buffering and
128-bit access (`vector_bytes` 0 or 16), and for row
programs (softmax, layernorm, reductions: `gpu_defaults.reduction_defaults`) the one-kernel
``row_block`` (with ``mixed_rows`` for programs of rows and column reductions:
`gpu_defaults.mixed_defaults`), and for contractions `split_k` (1, 2, 4, 8 or 16 chunks of the
reduction: `passes/split_k.py`); for half-precision contractions the tensor-core mapping
(`passes/map_mma.py`: ``mma_tile`` — off among the choices —, ``mma_warps``, ``mma_stages``,
``mma_wgmma``, ``mma_pad_operands``; a combination the pass or the instruction refuses, or that needs more shared
memory than the device has, is filtered with the reason). Candidates that
break a device limit (threads per block, block and grid dimensions, shared memory), whose
register tile does not divide their tiles or needs too many registers are filtered before
compiling (`SearchSpace.why_invalid`, the reason recorded); the limits default to those of
sm_90 and can be given per device.
"""

from __future__ import annotations

import dataclasses
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import ir
from ..errors import OptionsError
from ..options import FUSION_STRATEGIES, MappingOptions

__all__ = ["CPU_FIELDS", "CUDA_FIELDS", "MAX_REGISTER_TILE", "SPLIT_K_CHOICES", "DeviceLimits", "SearchSpace",
           "cuda_limits", "space_for"]

_POW2 = (1, 2, 4, 8, 16, 32, 64, 128, 256)
CPU_FIELDS = ("fusion", "tile_sizes", "unroll_factor", "threads")
CUDA_FIELDS = ("fusion", "tile_sizes", "block", "grid", "unroll_factor", "register_tile",
               "use_shared_memory", "use_private_memory", "double_buffer", "vector_bytes",
               "register_interleave", "copy_bytes", "copy_transposed")
SPLIT_K_CHOICES = (1, 2, 4, 8, 16)
MAX_REGISTER_TILE = 128  # outputs per thread kept in registers (8 x 8 fits in 96 registers)


@dataclass(frozen=True)
class DeviceLimits:
    """What a GPU accepts (defaults: every NVIDIA GPU since sm_30; shared memory of sm_90)."""

    max_threads_per_block: int = 1024
    max_block: tuple[int, int, int] = (1024, 1024, 64)
    max_grid: tuple[int, int, int] = (2**31 - 1, 65535, 65535)
    max_shared_bytes: int = 227 * 1024  # opt-in maximum per block on sm_90


MAX_THREADS_PER_BLOCK = DeviceLimits.max_threads_per_block
MAX_BLOCK_Z = DeviceLimits.max_block[2]


@dataclass(frozen=True)
class SearchSpace:
    """Named generators of field values; `sample`, `mutate` and `crossover` build candidates."""

    target: str
    depth: int  # number of loops of the deepest statement: how many tile sizes matter
    cores: int
    limits: DeviceLimits = DeviceLimits()
    rows: bool = False  # a row program (`gpu_defaults.reduction_defaults`): search map-rows too
    mixed: bool = False  # rows and column reductions (`gpu_defaults.mixed_defaults`): map-mixed
    contraction: bool = False  # a (batched) contraction with a splittable reduction: split_k too
    tensor_cores: bool = False  # a half-precision contraction (poly.contraction): the mma fields

    def _draw(self, rng: random.Random, field: str) -> Any:
        return _FIELDS[field](self, rng)

    @property
    def fields(self) -> tuple[str, ...]:
        if self.target != "cuda":
            return CPU_FIELDS
        extra = ("split_k",) * self.contraction + MMA_FIELDS * self.tensor_cores
        if self.mixed:
            return (*CUDA_FIELDS, "row_block", "mixed_rows", *extra)
        return (*CUDA_FIELDS, "row_block", *extra) if self.rows else (*CUDA_FIELDS, *extra)

    def why_invalid(self, opts: MappingOptions) -> str | None:
        """None if ``opts`` fits the device, else the limit it breaks."""
        if self.target != "cuda":
            return None
        lim = self.limits
        try:
            block = opts.thread_block()
        except OptionsError as exc:
            return str(exc)
        outputs = 1
        for r in opts.register_tile:
            outputs *= r
        if outputs > MAX_REGISTER_TILE:
            return f"register tile {opts.register_tile}: {outputs} outputs per thread > {MAX_REGISTER_TILE}"
        product = 1
        for b in block:
            product *= b
        if product > lim.max_threads_per_block:
            return f"{product} threads per block > {lim.max_threads_per_block}"
        for axis, (b, top) in enumerate(zip(block, lim.max_block, strict=False)):
            if b > top:
                return f"block dimension {'xyz'[axis]} = {b} > {top}"
        for axis, (g, top) in enumerate(zip(opts.grid, lim.max_grid, strict=False)):
            if g > top:
                return f"grid dimension {'xyz'[axis]} = {g} > {top}"
        if opts.split_k > 1 and opts.parametric:
            return "split_k needs fixed sizes: it does not combine with parametric kernels"
        if opts.split_k > 1 and opts.row_block:
            return "split_k does not combine with map-rows (row_block)"
        if opts.row_block and (opts.use_shared_memory or opts.use_private_memory):
            return "map-rows (row_block) does not combine with shared/private promotion"
        if opts.use_shared_memory and opts.max_shared_memory > lim.max_shared_bytes:
            return (f"shared memory request {opts.max_shared_memory} B > "
                    f"{lim.max_shared_bytes} B per block")
        if opts.mma_tile:
            return _mma_problem(opts, lim)
        return None

    def is_valid(self, opts: MappingOptions) -> bool:
        return self.why_invalid(opts) is None

    def fields_of(self, opts: MappingOptions) -> tuple[str, ...]:
        """The fields varied from ``opts``: `fields`, without ``fusion`` when ``opts`` maps
        kernels their own way (``kernels``: made from the kernels of one fusion, which
        another fusion groups otherwise; the tuner keeps them and searches the shared knobs)."""
        return tuple(f for f in self.fields if f != "fusion") if opts.kernels else self.fields

    def sample(self, rng: random.Random, base: MappingOptions) -> MappingOptions:
        for _ in range(100):
            cand = dataclasses.replace(base, **{f: self._draw(rng, f) for f in self.fields_of(base)})
            if self.is_valid(cand):
                return cand
        return base

    def mutate(self, rng: random.Random, opts: MappingOptions, rate: float) -> MappingOptions:
        for _ in range(100):
            changes = {f: self._draw(rng, f) for f in self.fields_of(opts) if rng.random() < rate}
            cand = dataclasses.replace(opts, **changes)
            if self.is_valid(cand):
                return cand
        return opts

    def crossover(self, rng: random.Random, a: MappingOptions, b: MappingOptions) -> MappingOptions:
        for _ in range(100):
            changes = {f: getattr(b, f) for f in self.fields_of(a) if rng.random() < 0.5}
            cand = dataclasses.replace(a, **changes)
            if self.is_valid(cand):
                return cand
        return a


def _mma_problem(opts: MappingOptions, lim: DeviceLimits) -> str | None:
    """Why the tensor-core fields of ``opts`` cannot compile (None: they can)."""
    from ..passes.map_mma import MapMma
    from ..poly.contraction import wgmma_problem

    if opts.parametric or opts.split_k > 1 or opts.row_block:
        return "tensor cores need fixed sizes and do not combine with split_k or row_block"
    if len(opts.mma_warps) != 2 or opts.mma_stages < 2:
        return "tensor cores need mma_warps (WM, WN) and mma_stages >= 2"
    try:
        MapMma(opts.mma_tile, opts.mma_warps, opts.mma_stages, opts.mma_wgmma)
    except ValueError as exc:
        return str(exc)
    bm, bn, bk = opts.mma_tile
    if 32 * opts.mma_warps[0] * opts.mma_warps[1] > lim.max_threads_per_block:
        return f"{32 * opts.mma_warps[0] * opts.mma_warps[1]} threads per block"
    if opts.mma_stages * (bm + bn) * bk * 2 > lim.max_shared_bytes:
        return (f"{opts.mma_stages} stages of {bm}x{bk} and {bn}x{bk} halves > "
                f"{lim.max_shared_bytes} B of shared memory")
    if opts.mma_wgmma:  # (the operand layouts were checked by the plan: wgmma takes any)
        why = wgmma_problem(None, opts.mma_tile, opts.mma_warps)
        if why is not None:
            return why
    elif (bm // opts.mma_warps[0] // 16) * (bn // opts.mma_warps[1] // 8) > 32:
        return "mma.sync warp tile above 64 x 64 (its accumulators would spill)"
    return None


MMA_FIELDS = ("mma_tile", "mma_warps", "mma_stages", "mma_wgmma", "mma_pad_operands")
_MMA_TILES = ((), (128, 256, 64), (128, 128, 64), (64, 256, 64), (64, 128, 64), (128, 64, 64),
              (128, 128, 32), (64, 128, 32), (128, 64, 32), (64, 64, 32))


def _tiles(space: SearchSpace, rng: random.Random) -> tuple[int, ...]:
    if rng.random() < 0.15:
        return ()
    return tuple(rng.choice((0, *_POW2[2:], 512)) for _ in range(space.depth))


def _block(space: SearchSpace, rng: random.Random) -> tuple[int, ...]:
    dims = rng.choice((1, 2, 3))
    return tuple(rng.choice(_POW2[: 9 if i == 0 else 6]) for i in range(dims))


def _grid(space: SearchSpace, rng: random.Random) -> tuple[int, ...]:
    dims = rng.choice((1, 2, 3))
    return tuple(rng.choice((1, 8, 32, 64, 128, 256, 512, 1024)) for _ in range(dims))


def _register_tile(space: SearchSpace, rng: random.Random) -> tuple[int, ...]:
    if rng.random() < 0.4:
        return ()
    return tuple(rng.choice((1, 2, 4, 8)) for _ in range(min(2, space.depth)))


_FIELDS: dict[str, Callable[[SearchSpace, random.Random], Any]] = {
    # the tensor-core mapping of a half-precision contraction (passes/map_mma): () leaves it off
    "mma_tile": lambda s, r: r.choice(_MMA_TILES),
    "mma_warps": lambda s, r: r.choice(((8, 1), (4, 1), (2, 2), (2, 4), (4, 2))),
    "mma_stages": lambda s, r: r.choice((2, 3, 4, 5)),
    "mma_wgmma": lambda s, r: r.random() < 0.6,
    "mma_pad_operands": lambda s, r: r.random() < 0.5,  # (passes/pad_operands)
    # a row program's one-kernel mapping (map-rows): 0 leaves it off
    "row_block": lambda s, r: r.choice((0, 32, 64, 128, 256, 512, 1024)),
    # a mixed program's: column reductions inside the row kernel, or column kernels after it
    "mixed_rows": lambda s, r: r.choice(("fused", "kernels")),
    # chunks of a contraction's reduction on different blocks (passes/split_k): 1 leaves it off
    "split_k": lambda s, r: r.choice(SPLIT_K_CHOICES),
    "register_tile": _register_tile,
    "use_shared_memory": lambda s, r: r.random() < 0.6,
    "use_private_memory": lambda s, r: r.random() < 0.6,
    # shared copies one tile ahead (cp.async); 128-bit accesses along threadIdx.x (0: off)
    "double_buffer": lambda s, r: r.random() < 0.5,
    "vector_bytes": lambda s, r: r.choice((0, 16)),
    # a register tile in groups of 4 (or 2) spread over the tile; 16-byte shared copies
    "register_interleave": lambda s, r: r.choice(((), (), (0, 4), (4, 4), (0, 2))),
    "copy_bytes": lambda s, r: r.choice((0, 16)),
    "copy_transposed": lambda s, r: r.random() < 0.5,
    "fusion": lambda s, r: r.choice(FUSION_STRATEGIES),
    "tile_sizes": _tiles,
    "block": _block,
    "grid": _grid,
    "unroll_factor": lambda s, r: r.choice((1, 2, 4, 8, 16)),
    "threads": lambda s, r: r.choice(sorted({1, max(1, s.cores // 2), s.cores})),
}


def space_for(fn: ir.Function, target: str, limits: DeviceLimits | None = None,
              sizes: Any = None) -> SearchSpace:
    """The space of ``fn`` on ``target`` (``sizes``: the tuning call's, which decide whether
    the tensor-core fields apply: `poly.contraction.contraction_plan`)."""
    from ..cuda_defaults import is_batched_contraction, is_contraction
    from ..gpu_defaults import mixed_defaults, reduction_defaults
    from ..passes.split_k import splittable_statements
    from ..poly.contraction import contraction_plan

    depth = max((len(s.ranges) for s in fn.statements), default=1)
    rows = target == "cuda" and reduction_defaults(MappingOptions, fn) is not None
    mixed = target == "cuda" and not rows and mixed_defaults(MappingOptions, fn) is not None
    contraction = (target == "cuda" and bool(splittable_statements(fn))
                   and (is_contraction(fn.statements) or is_batched_contraction(fn.statements)))
    tensor_cores = target == "cuda" and not isinstance(contraction_plan(fn, sizes), str)
    return SearchSpace(target=target, depth=max(1, depth), cores=os.cpu_count() or 1,
                       limits=limits or DeviceLimits(), rows=rows, mixed=mixed,
                       contraction=contraction, tensor_cores=tensor_cores)


def cuda_limits(device: int = 0) -> DeviceLimits:
    """The limits of a visible GPU (the defaults if its properties cannot be read)."""
    try:
        from ..runtime.cuda import get_runtime

        lim = get_runtime().device(device).limits
        return DeviceLimits(lim.max_threads_per_block, tuple(lim.max_block_dims),
                            tuple(lim.max_grid_dims), lim.max_shared_per_block_optin)
    except Exception:  # noqa: BLE001 - limits are advisory; the driver has the last word
        return DeviceLimits()
