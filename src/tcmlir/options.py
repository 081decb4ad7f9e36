"""MappingOptions: how a TC function is scheduled, tiled and mapped (TC's options, immutable).

A fluent, immutable value (``opts.tile(32, 32).map_to_threads(32, 8)`` returns a new object)
that round-trips exactly through JSON and compiles to a pass pipeline string (`to_pipeline`).
The presets follow Tensor Comprehensions' (`naive`, `pointwise`, `mlp`, `convolution`,
`group_convolution`). Which fields a backend honours: the CPU uses the schedule options,
tiling, unrolling, `threads`, `parametric` and `register_tile` (MR, NR of the packed
contraction kernel, `passes/host_contraction.py`, its tile sizes then MC, NC, KC); the GPU backend uses the schedule options,
tiling, `block` (replaced by tile / register sizes when `register_tile` is set), `grid`,
unrolling, `parametric`, `register_tile`, `use_shared_memory` (with `max_shared_memory`, at most
the 48 KiB of static shared memory, and `unroll_copy_shared`) and `use_private_memory`. Both use
`split_k` (`passes/split_k.py`: a long reduction cut into chunks computed by different blocks,
then folded; needs fixed sizes, so it does not combine with `parametric`).
`shared_depth`, `private_depth` (the promotion passes pick the depth),
`fix_parameters_before_scheduling`, `tile_imperfectly_nested` and `use_readonly_cache` (inputs
are read through the read-only path anyway) are kept for TC's JSON and ignored.

This module holds the fields and their checks, the presets, the setters and the JSON; the
pipeline string is `options_pipeline`'s, `default_for`'s dispatcher is `defaults`'s and the
defaults' program classes and tiles are `cuda_defaults`', `gpu_defaults`' and
`host_defaults`' (each takes the options class or object as an argument).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from . import options_pipeline
from .cuda_defaults import (  # noqa: F401  (CONTRACTION_TILES, contraction_access: re-exported, tests name them here)
    CONTRACTION_TILES,
    contraction_access,
    convolution_options,
)
from .defaults import default_options
from .errors import OptionsError
from .kernel_mapping import KernelMapping, check_kernels, kernels_from_json
from .poly.scheduler import FUSION_STRATEGIES

__all__ = ["FUSION_STRATEGIES", "MappingOptions"]

_JSON_VERSION = 1
# MappingOptions.mixed_rows: off, the column reductions inside the row kernel (passes/row_partials,
# falling back to column kernels), column kernels after the row kernel (passes/map_mixed)
MIXED_ROWS = ("", "fused", "kernels")


def _positive_tuple(name: str, values: tuple[int, ...], *, max_len: int | None = None,
                    allow_zero: bool = False) -> tuple[int, ...]:
    out = tuple(int(v) for v in values)
    if max_len is not None and len(out) > max_len:
        raise OptionsError(f"{name} takes at most {max_len} values, got {len(out)}: {out}")
    for v in out:
        if v < 0 or (v == 0 and not allow_zero):
            raise OptionsError(f"{name} values must be {'>= 0' if allow_zero else '>= 1'}, got {out}")
    return out


@dataclass(frozen=True)
class MappingOptions:
    """Scheduling and mapping choices for one kernel; see docs/using.md for each field."""

    fusion: str = "preserve3coincident"          # outer schedule fusion strategy
    allow_skewing: bool = False
    positive_orthant: bool = True
    fix_parameters_before_scheduling: bool = False
    tile_sizes: tuple[int, ...] = ()             # 0 leaves a dimension untiled; () no tiling
    tile_imperfectly_nested: bool = False
    block: tuple[int, ...] = (32, 8)              # threads per block (x, y, z)
    grid: tuple[int, ...] = (256, 256)            # blocks (x, y, z); loops stride beyond
    unroll_factor: int = 1
    use_shared_memory: bool = False
    use_private_memory: bool = False
    shared_depth: int = 0
    private_depth: int = 0
    max_shared_memory: int = 0                   # bytes; 0: the device's limit
    unroll_copy_shared: bool = False
    use_readonly_cache: bool = False
    threads: int = 0                             # CPU worker threads; 0: all cores
    parametric: bool = False                     # sizes as kernel arguments: one kernel, every size
    register_tile: tuple[int, ...] = ()          # outputs per thread along the point band (GPU)
    double_buffer: bool = False                  # shared copies one tile ahead (cp.async), GPU
    row_block: int = 0                           # cuda: >0 maps a row program to one kernel
                                                 # (map-rows), this many threads per row; 0 off
    mixed_rows: str = ""                         # cuda, with row_block: row statements and
                                                 # column reductions (map-mixed): "fused" (in
                                                 # the row kernel where possible), "kernels"
                                                 # (column kernels after it); "": off
    devices: tuple[int, ...] = ()                # split a call across these GPUs (tcmlir.multi);
                                                 # (): one device, the inputs'
    vector_bytes: int = 0                        # cuda: bytes a thread accesses at once along
                                                 # its innermost member (16: 128-bit); 0 off
    split_k: int = 1                             # cut each contraction's reduction into at most
                                                 # this many chunks (passes/split_k); 1 off
    register_interleave: tuple[int, ...] = ()    # cuda, per register-tiled member: a thread's
                                                 # outputs in groups of this width spread over
                                                 # the tile (register-tile interleave); 0 or ():
                                                 # a contiguous block
    copy_bytes: int = 0                          # cuda: bytes one shared-memory copy moves
                                                 # where proved aligned (16: cp.async.cg 16);
                                                 # 0 off (one element per copy)
    copy_transposed: bool = False                # cuda, with copy_bytes: also tiles stored
                                                 # transposed (one 16-byte load, a store per
                                                 # element; no cp.async)
    mma_tile: tuple[int, ...] = ()               # cuda: BM, BN, BK of a tensor-core kernel
                                                 # (map-mma, half-precision contractions);
                                                 # (): tensor cores off
    mma_warps: tuple[int, ...] = ()              # cuda, with mma_tile: warps along m and n
    mma_stages: int = 0                          # cuda, with mma_tile: operand tiles in flight
    mma_wgmma: bool = False                      # cuda, with mma_tile: warpgroup wgmma (sm_90)
                                                 # instead of mma.sync
    mma_pad_operands: bool = False               # cuda, mma_tile: misaligned operands padded first
    allow_tf32: bool = False                     # cuda, with mma_tile: a float32 contraction
                                                 # may run on tensor cores in TF32 (10-bit
                                                 # mantissa products, float32 sums; a
                                                 # permission, as torch's); never by default
    kernels: tuple[KernelMapping, ...] = ()      # cuda: kernels mapped their own way
                                                 # (`kernel_mapping`); the rest: fields above

    def __post_init__(self) -> None:
        if self.fusion not in FUSION_STRATEGIES:
            raise OptionsError(
                f"unknown fusion strategy {self.fusion!r}; choose one of {', '.join(FUSION_STRATEGIES)}")
        object.__setattr__(self, "tile_sizes",
                           _positive_tuple("tile sizes", self.tile_sizes, allow_zero=True))
        object.__setattr__(self, "block", _positive_tuple("block", self.block, max_len=3))
        object.__setattr__(self, "grid", _positive_tuple("grid", self.grid, max_len=3))
        object.__setattr__(self, "register_tile",
                           _positive_tuple("register tile", self.register_tile, max_len=3))
        object.__setattr__(self, "devices",
                           _positive_tuple("devices", self.devices, allow_zero=True))
        object.__setattr__(self, "register_interleave",
                           _positive_tuple("register interleave", self.register_interleave,
                                           max_len=3, allow_zero=True))
        object.__setattr__(self, "mma_tile", _positive_tuple("mma tile", self.mma_tile, max_len=3))
        object.__setattr__(self, "mma_warps", _positive_tuple("mma warps", self.mma_warps, max_len=2))
        if self.mma_tile and (len(self.mma_tile) != 3 or len(self.mma_warps) != 2
                              or self.mma_stages < 2):
            raise OptionsError("tensor cores take mma_tile=(BM, BN, BK), mma_warps=(WM, WN) and "
                               f"mma_stages >= 2, got {self.mma_tile}, {self.mma_warps}, "
                               f"{self.mma_stages}")
        if self.copy_bytes not in (0, 4, 8, 16):
            raise OptionsError(f"copy_bytes must be 0 (off), 4, 8 or 16, got {self.copy_bytes}")
        if not self.block or not self.grid:
            raise OptionsError("block and grid need at least one dimension")
        if self.mixed_rows not in MIXED_ROWS:
            raise OptionsError(f"mixed_rows must be one of {', '.join(map(repr, MIXED_ROWS))}, "
                               f"got {self.mixed_rows!r}")
        for name in ("unroll_factor", "split_k"):
            if getattr(self, name) < 1:
                raise OptionsError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.vector_bytes not in (0, 1, 2, 4, 8, 16):
            raise OptionsError(f"vector_bytes must be 0 (off) or a power of two <= 16, got {self.vector_bytes}")
        object.__setattr__(self, "kernels", check_kernels(self.kernels))
        for name in ("shared_depth", "private_depth", "max_shared_memory", "threads", "row_block"):
            if getattr(self, name) < 0:
                raise OptionsError(f"{name} must be >= 0, got {getattr(self, name)}")

    # ------------------------------------------------------------ presets (TC's)

    @classmethod
    def naive(cls) -> MappingOptions:
        """TC's naive options: fusion preserve3coincident, 32³ tiles, 32×8 threads, a
        256×256 grid, no unrolling."""
        return cls(fusion="preserve3coincident", tile_sizes=(32, 32, 32), block=(32, 8),
                   grid=(256, 256), unroll_factor=1)

    @classmethod
    def pointwise(cls) -> MappingOptions:
        """TC's preset for elementwise programs: maximal fusion, 32×4×4 threads, unroll 128."""
        return cls(fusion="max", tile_sizes=(32, 32, 32), block=(32, 4, 4), grid=(100, 100, 100),
                   unroll_factor=128)

    @classmethod
    def mlp(cls) -> MappingOptions:
        """TC's preset for fully connected layers: maximal fusion, 1-wide tiles, 128 threads."""
        return cls(fusion="max", tile_sizes=(1,), block=(128,), grid=(128,), unroll_factor=1)

    @classmethod
    def convolution(cls) -> MappingOptions:
        """TC's preset for convolutions: maximal fusion, 4×8×8 tiles, 4×16×4 threads."""
        return cls(fusion="max", tile_sizes=(4, 8, 8), block=(4, 16, 4), grid=(128, 128),
                   unroll_factor=1)

    @classmethod
    def group_convolution(cls) -> MappingOptions:
        """TC's preset for grouped convolutions: maximal fusion, 1×1 tiles, 4×16×4 threads."""
        return cls(fusion="max", tile_sizes=(1, 1), block=(4, 16, 4), grid=(128, 128),
                   unroll_factor=1)

    @classmethod
    def default_for(cls, fn: Any, target: str,
                    sizes: Mapping[str, int] | None = None) -> MappingOptions:
        """What a call without options uses (``fn``: a `TCFunction` or its `ir.Function`;
        ``sizes``: the call's size values, when known): on the CPU the packed contraction
        kernel or tiling and fusion (`host_defaults.cpu_defaults`); on the GPU a mapping by
        program class — row programs, contractions with the contraction model's tiles and
        split-K, batched contractions, convolutions, transposes, tensor cores for half
        precision, a mapping per kernel for programs that mix classes — else the mapping the
        analytic cost model prices best (`defaults.default_options` says which class gets
        what)."""
        return default_options(cls, fn, target, sizes)

    @classmethod
    def cuda_batched_contraction(cls) -> MappingOptions:
        """Options for batched matmul-like kernels on the GPU (``Z(b, n, m) +=! X(b, n, k) *
        Y(b, m, k)``): one batch entry and a 32×32 output tile per block, one output per
        thread (32×32 threads), operand tiles of 32 along k in shared memory, accumulators in
        registers (docs/perf.md: TBMM 500 × 26×26×72)."""
        return cls(fusion="preserve3coincident", tile_sizes=(1, 32, 32, 32), block=(32, 32, 1),
                   grid=(64, 64, 1024), use_shared_memory=True, use_private_memory=True)

    @classmethod
    def cuda_contraction(cls, tile: tuple[int, int, int] = (128, 64, 16),
                         register_tile: tuple[int, int] = (8, 4)) -> MappingOptions:
        """Register-tiled, shared-memory-promoted options for matmul-like kernels on the GPU:
        ``tile`` (default 128×64×16) tiles, ``register_tile`` (8×4) outputs per thread (16×16
        threads for the default), both operand tiles in shared memory copied one tile ahead
        (cp.async), accumulators in registers. `default_for` picks the tiles by size
        (`cuda_defaults.contraction_choice`)."""
        block = (tile[1] // register_tile[1], tile[0] // register_tile[0])
        return cls(fusion="preserve3coincident", tile_sizes=tuple(tile), register_tile=tuple(register_tile),
                   block=block, grid=(1024, 1024), use_shared_memory=True,
                   use_private_memory=True, double_buffer=True)

    @classmethod
    def cuda_convolution(cls, rank: int, extents: tuple[int, int, int] | None = None,
                         register: bool = True) -> MappingOptions:
        """Options for convolution-like kernels on the GPU (one statement, an output of rank
        >= 4, two or more reduction indices; the last three output dimensions are taken as
        (channel, rows, columns): ``O(n, g, f, h, w)``). ``extents`` are those three extents
        at the call's sizes, when known.

        With ``register`` (the default; `default_for` turns it off when every operand depends
        on the channel, as in pooling): each thread owns the outputs of ``Rf`` channels at one
        (row, column) in registers (`register-tile` in its nest form, `passes/register_nest.py`:
        the reduction loops ``c``, ``kh``, ``kw`` outside the register part, so each input
        value read from shared memory feeds ``Rf`` multiply-adds and the weights are read as
        broadcast 128-bit loads); the leading dimensions untiled, on blocks with the channel
        tile (a 3-d grid); tiles of ``Tf = min(16, F)`` channels and ``ceil(E / ceil(E / 16))``
        rows and columns (14 for 14: no idle threads; 15 for 30; 16 when the extents are
        unknown), ``Rf = Tf``, so ``Th × Tw`` threads (``Tw`` on x); the input channel loop
        stays in the tile band, each of its steps copying the input and weight tiles of one
        input channel to shared memory. Where the tiles allow, a thread takes 8 channels and 2
        columns instead (``Rf = 8``, ``Rw = 2``: measured 0.045 against 0.070 ms on the
        benchmark's grouped convolution, H200). On the benchmark's grouped convolution
        (32×32×16×16² input, 16 3×3 filters per group) that is 14×14 threads, 16 outputs each:
        ptxas (sm_90) 44 registers, 15 shared loads (12 of them 128-bit) per 48 multiply-adds,
        against 2 shared loads per multiply-add and 16×16×2 threads before.

        Without ``register`` (also when an output extent is 1): the previous mapping, 16×16×16 tiles over the last three
        dimensions, 16×16×2 threads, input and weight tiles in shared memory (0.18-0.21 ms on
        that benchmark, H200)."""
        return convolution_options(cls, rank, extents, register)

    # ------------------------------------------------------------ fluent setters

    def _with(self, **changes: Any) -> MappingOptions:
        return dataclasses.replace(self, **changes)

    def tile(self, *sizes: int) -> MappingOptions:
        """Tile the outermost permutable band with these sizes (0: leave that member untiled)."""
        return self._with(tile_sizes=tuple(sizes))

    def map_to_threads(self, *block: int) -> MappingOptions:
        """The CUDA block: threads along x, y, z (innermost coincident member on x)."""
        return self._with(block=tuple(block))

    def map_to_blocks(self, *grid: int) -> MappingOptions:
        """The CUDA grid's upper bounds along x, y, z (blocks loop when there are more tiles)."""
        return self._with(grid=tuple(grid))

    def unroll(self, factor: int) -> MappingOptions:
        """Unroll innermost loops up to ``factor`` iterations (1: no unrolling)."""
        return self._with(unroll_factor=int(factor))

    def outer_schedule_fusion_strategy(self, strategy: str) -> MappingOptions:
        """isl's fusion strategy: ``max``, ``preserve3coincident`` or ``min``."""
        return self._with(fusion=strategy.lower())

    def schedule_fusion_strategy(self, strategy: str) -> MappingOptions:
        """The same as `outer_schedule_fusion_strategy` (TC's second name for it)."""
        return self.outer_schedule_fusion_strategy(strategy)

    def outer_schedule_allow_skewing(self, allow: bool) -> MappingOptions:
        """Whether isl's scheduler may skew loops."""
        return self._with(allow_skewing=bool(allow))

    def outer_schedule_positive_orthant(self, positive: bool) -> MappingOptions:
        """Whether isl's scheduler keeps schedule coefficients non-negative."""
        return self._with(positive_orthant=bool(positive))

    def fix_parameters(self, fix: bool = True) -> MappingOptions:
        """Fix the size parameters to the call's values before scheduling."""
        return self._with(fix_parameters_before_scheduling=bool(fix))

    def shared_memory(self, use: bool = True, depth: int | None = None,
                      max_bytes: int | None = None) -> MappingOptions:
        """Promote reused or uncoalesced tiles to shared memory (``depth``: the band depth
        of the copies; ``max_bytes``: a cap, 0 = the device's limit)."""
        changes: dict[str, Any] = {"use_shared_memory": bool(use)}
        if depth is not None:
            changes["shared_depth"] = depth
        if max_bytes is not None:
            changes["max_shared_memory"] = max_bytes
        return self._with(**changes)

    def private_memory(self, use: bool = True, depth: int | None = None) -> MappingOptions:
        """Promote per-thread data to registers (``depth``: the band depth of the promotion)."""
        changes: dict[str, Any] = {"use_private_memory": bool(use)}
        if depth is not None:
            changes["private_depth"] = depth
        return self._with(**changes)

    def register_tiling(self, *sizes: int) -> MappingOptions:
        """Each GPU thread computes ``sizes[i]`` outputs along point member ``i`` (registers);
        the block then has ``tile / sizes`` threads per mapped member (`register-tile`)."""
        return self._with(register_tile=tuple(sizes))

    def interleave_registers(self, *widths: int) -> MappingOptions:
        """cuda: along register-tiled member ``i`` a thread owns ``register_tile[i] /
        widths[i]`` groups of ``widths[i]`` adjacent outputs spread across the tile instead
        of one contiguous block (``interleave_registers(0, 4)`` with ``register_tiling(8,
        8)``: columns ``4t..4t+3`` and ``64+4t..64+4t+3`` of a 128-wide tile, so the
        128-bit shared-memory reads of a warp are conflict-free); 0 keeps a member
        contiguous, no argument turns it off (`register-tile` ``interleave``)."""
        return self._with(register_interleave=tuple(widths))

    def vector_copies(self, nbytes: int = 16, transposed: bool = False) -> MappingOptions:
        """cuda: shared-memory tile copies move ``nbytes`` at once (16: one
        ``cp.async.cg ... 16`` or one 128-bit load and store per thread) where the copied
        rows are contiguous in the tensor and in the buffer and 16-byte alignment is proved;
        elsewhere one element per copy. With ``transposed``, tiles the buffer stores
        transposed (a matmul's A) are read ``nbytes`` at once too and stored one element at
        a time (synchronous loads: cp.async cannot scatter). 0 turns it off (`promote-shared`
        ``copy-bytes``, ``copy-transposed``)."""
        return self._with(copy_bytes=int(nbytes), copy_transposed=bool(transposed) and nbytes > 0)

    def double_buffering(self, use: bool = True) -> MappingOptions:
        """Copy the next tile to shared memory while computing on this one (two buffers,
        cp.async on sm_80+), where the tile band ends with a sequential loop."""
        return self._with(double_buffer=bool(use))

    def with_threads(self, threads: int) -> MappingOptions:
        """CPU threads for ``target='cpu'`` (0: ``TCMLIR_THREADS`` or all cores)."""
        return self._with(threads=int(threads))

    def with_parametric(self, parametric: bool = True) -> MappingOptions:
        """Keep the sizes symbolic: one kernel serves every size of a signature's ranks and
        dtypes."""
        return self._with(parametric=bool(parametric))

    def map_rows(self, threads: int) -> MappingOptions:
        """cuda: a row program as one kernel, ``threads`` per row (`passes/map_rows.py`);
        ``grid[0]`` caps the blocks; 0 turns it off."""
        return self._with(row_block=int(threads))

    def split_reduction(self, ways: int) -> MappingOptions:
        """Set `split_k`: cut each contraction's reduction into at most ``ways`` chunks computed
        by different blocks, then folded (1: off; `passes/split_k.py`). Needs fixed sizes (not
        `with_parametric`); a program without a ``+=`` reduction over one index is an
        `OptionsError` when it compiles."""
        return self._with(split_k=int(ways))

    def vector_access(self, nbytes: int = 16) -> MappingOptions:
        """cuda: each thread accesses ``nbytes`` (16: 128 bits) of adjacent elements along its
        innermost member at once, where the extents allow (`map-rows`, `map-to-threads`);
        LLVM merges them into vector loads and stores when the pointers are 16-byte aligned,
        which the call's signature records (an unaligned input gets its own scalar kernel).
        0 turns it off."""
        return self._with(vector_bytes=int(nbytes))

    def tensor_cores(self, tile: tuple[int, int, int] = (128, 128, 32),
                     warps: tuple[int, int] = (2, 2), stages: int = 3,
                     wgmma: bool = False, precision: str = "half", pad: bool = False) -> MappingOptions:
        """A half-precision contraction as one tensor-core kernel (`passes/map_mma.py`):
        ``tile`` = output rows, columns and reduction steps per block, ``warps`` along rows and
        columns (32 threads each), ``stages`` operand tiles in flight (cp.async ring); the other
        mapping fields do not apply to it. ``tile=()`` turns tensor cores off.
        ``precision="tf32"`` also lets a float32 contraction run on them (``allow_tf32``:
        products of operands rounded to TF32's 10-bit mantissa, relative error about 1e-3 per
        product, sums in float32; ``mma.sync`` only); ``"half"`` (the default) takes only
        float16/bfloat16 operands, as without tensor cores float32 stays float32. ``pad``: an
        operand whose rows are not 16 bytes apart is first copied into a padded temporary
        (`passes/pad_operands.py`; `default_for` decides it with a cost model)."""
        if precision not in ("half", "tf32"):
            raise OptionsError(f"tensor cores: precision is 'half' or 'tf32', got {precision!r}")
        if not tile:
            return self._with(mma_tile=(), mma_warps=(), mma_stages=0, mma_wgmma=False,
                              allow_tf32=False, mma_pad_operands=False)
        return self._with(mma_tile=tuple(tile), mma_warps=tuple(warps), mma_stages=int(stages),
                          mma_wgmma=bool(wgmma), allow_tf32=precision == "tf32",
                          mma_pad_operands=bool(pad))

    def per_kernel(self, *mappings: tuple[tuple[int, ...], MappingOptions]) -> MappingOptions:
        """cuda: map the kernel of statements ``S{k}`` (``k`` in ``statements``: its group
        under these options' fusion) with the mapping fields (tiles, threads, grid, register
        tile, promotion, unrolling, vector and copy widths) of ``options``, for each
        ``(statements, options)`` given; the other kernels keep these options' fields
        (`kernel_mapping`). No argument: one mapping for every kernel."""
        return self._with(kernels=tuple(KernelMapping.of(tuple(st), o) for st, o in mappings))

    def on_devices(self, *devices: int) -> MappingOptions:
        """Split each call across these CUDA devices (`tcmlir.multi`; ``on_devices(0, 0)``: two
        parts on device 0); no argument: one device. A part's kernel uses these options without
        ``devices``, so it is the single-device kernel of the chunk's size."""
        return self._with(devices=tuple(devices))

    # ------------------------------------------------------------ serialisation

    def to_dict(self) -> dict[str, Any]:
        """The options as a JSON-ready dict (every field, tuples as lists, with a ``version``)."""
        out: dict[str, Any] = {"version": _JSON_VERSION}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("devices", "vector_bytes", "mixed_rows", "register_interleave",
                          "copy_bytes", "copy_transposed", "mma_tile", "mma_warps",
                          "mma_stages", "mma_wgmma", "allow_tf32", "mma_pad_operands") and not value:
                continue  # one device, scalar access, no mixed mapping: kept out so cache keys
                # stay those of before
            if f.name == "split_k" and value == 1:
                continue  # no split: kept out so cache keys stay those of before
            if f.name == "kernels":
                if value:  # (one mapping for every kernel: kept out, as above)
                    out[f.name] = [km.to_dict() for km in value]
                continue
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    def to_json(self) -> str:
        """Canonical JSON (sorted keys): equal options give equal text."""
        return self._json

    @functools.cached_property
    def _json(self) -> str:  # computed once: the text is part of every compile-cache key
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MappingOptions:
        """Options from `to_dict`'s form; unknown or ill-typed fields are an `OptionsError`."""
        data = dict(data)
        version = data.pop("version", _JSON_VERSION)
        if version != _JSON_VERSION:
            raise OptionsError(f"mapping options JSON version {version} is not supported "
                               f"(this tcmlir reads version {_JSON_VERSION})")
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise OptionsError(f"unknown mapping option(s) {', '.join(unknown)}; "
                               f"known: {', '.join(known)}")
        kwargs: dict[str, Any] = {}
        for name, value in data.items():
            default = known[name].default
            if name == "kernels":
                value = kernels_from_json(value, cls.from_dict)
            elif isinstance(default, tuple):
                if not isinstance(value, list | tuple) or not all(isinstance(v, int) for v in value):
                    raise OptionsError(f"option {name} must be a list of integers, got {value!r}")
                value = tuple(value)
            elif isinstance(default, bool):
                if not isinstance(value, bool):
                    raise OptionsError(f"option {name} must be true or false, got {value!r}")
            elif isinstance(default, int):
                if isinstance(value, bool) or not isinstance(value, int):
                    raise OptionsError(f"option {name} must be an integer, got {value!r}")
            elif isinstance(default, str) and not isinstance(value, str):
                raise OptionsError(f"option {name} must be a string, got {value!r}")
            kwargs[name] = value
        return cls(**kwargs)

    @classmethod
    def from_json(cls, text: str) -> MappingOptions:
        """Options from `to_json`'s text (round-trips exactly); bad JSON is an `OptionsError`."""
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, TypeError) as exc:
            raise OptionsError(f"mapping options are not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise OptionsError("mapping options JSON must be an object")
        return cls.from_dict(data)

    # ------------------------------------------------------------ pipelines

    def to_pipeline(self, target: str = "cpu") -> str:
        """The pass pipeline these options stand for on ``target`` ("cpu" or "cuda")."""
        return options_pipeline.pipeline(self, target)

    def thread_block(self) -> tuple[int, ...]:
        """The block a cuda kernel gets: ``block``, or with a register tile, the tile sizes
        divided by the register sizes (innermost mapped member on x). The register sizes go
        with the point band's members, the tiled ones: tile sizes of 0 (untiled members, such
        as a convolution's batch and group) are skipped."""
        return options_pipeline.thread_block(self)

    def __str__(self) -> str:
        return self.to_json()
