"""MappingOptions: how a TC function is scheduled, tiled and mapped (TC's options, immutable).

A fluent, immutable value (``opts.tile(32, 32).map_to_threads(32, 8)`` returns a new object)
that round-trips exactly through JSON and compiles to a pass pipeline string (`to_pipeline`).
The presets follow Tensor Comprehensions' (`naive`, `pointwise`, `mlp`, `convolution`,
`group_convolution`). Which fields a backend honours: the CPU uses the schedule options,
tiling, unrolling, `threads` and `parametric`; the GPU backend uses the schedule options,
tiling, `block`, `grid`, unrolling and `parametric`, and rejects the promotion options
(`use_shared_memory`, `use_private_memory`: not implemented). `fix_parameters_before_scheduling`,
`tile_imperfectly_nested`, `unroll_copy_shared` and `use_readonly_cache` are kept for TC's
JSON and ignored.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass, fields
from typing import Any

from .errors import OptionsError
from .poly.scheduler import FUSION_STRATEGIES

__all__ = ["FUSION_STRATEGIES", "MappingOptions"]

_JSON_VERSION = 1


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
    """Scheduling and mapping choices for one kernel; see the README for each field."""

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
    row_block: int = 0                           # cuda: >0 maps a row program to one kernel
                                                 # (map-rows), this many threads per row; 0 off

    def __post_init__(self) -> None:
        if self.fusion not in FUSION_STRATEGIES:
            raise OptionsError(
                f"unknown fusion strategy {self.fusion!r}; choose one of {', '.join(FUSION_STRATEGIES)}")
        object.__setattr__(self, "tile_sizes",
                           _positive_tuple("tile sizes", self.tile_sizes, allow_zero=True))
        object.__setattr__(self, "block", _positive_tuple("block", self.block, max_len=3))
        object.__setattr__(self, "grid", _positive_tuple("grid", self.grid, max_len=3))
        if not self.block or not self.grid:
            raise OptionsError("block and grid need at least one dimension")
        for name in ("unroll_factor",):
            if getattr(self, name) < 1:
                raise OptionsError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("shared_depth", "private_depth", "max_shared_memory", "threads", "row_block"):
            if getattr(self, name) < 0:
                raise OptionsError(f"{name} must be >= 0, got {getattr(self, name)}")

    # ------------------------------------------------------------ presets (TC's)

    @classmethod
    def naive(cls) -> MappingOptions:
        return cls(fusion="preserve3coincident", tile_sizes=(32, 32, 32), block=(32, 8),
                   grid=(256, 256), unroll_factor=1)

    @classmethod
    def pointwise(cls) -> MappingOptions:
        return cls(fusion="max", tile_sizes=(32, 32, 32), block=(32, 4, 4), grid=(100, 100, 100),
                   unroll_factor=128)

    @classmethod
    def mlp(cls) -> MappingOptions:
        return cls(fusion="max", tile_sizes=(1,), block=(128,), grid=(128,), unroll_factor=1)

    @classmethod
    def convolution(cls) -> MappingOptions:
        return cls(fusion="max", tile_sizes=(4, 8, 8), block=(4, 16, 4), grid=(128, 128),
                   unroll_factor=1)

    @classmethod
    def group_convolution(cls) -> MappingOptions:
        return cls(fusion="max", tile_sizes=(1, 1), block=(4, 16, 4), grid=(128, 128),
                   unroll_factor=1)

    @classmethod
    def default_for(cls, fn: Any, target: str) -> MappingOptions:
        """What a call without options uses. On the CPU, nests of three or more loops
        (matmul, convolutions) get the naive 32³ tiling, which keeps their operands in cache;
        shallower programs (elementwise chains, row reductions, softmax) are fused instead of
        tiled (measured: softmax 4096×1024 15.5 ms fused and untiled, 42.6 ms naive). On the
        GPU: row programs (softmax, layernorm, row reductions) get `gpu_defaults.reduction_defaults`
        (one kernel, a block per row), other programs the naive options."""
        if target == "cpu" and max((len(s.ranges) for s in fn.statements), default=0) < 3:
            return cls(fusion="max")
        if target == "cuda":
            from .gpu_defaults import reduction_defaults

            rows = reduction_defaults(fn)
            if rows is not None:
                return rows
        return cls.naive()

    # ------------------------------------------------------------ fluent setters

    def _with(self, **changes: Any) -> MappingOptions:
        return dataclasses.replace(self, **changes)

    def tile(self, *sizes: int) -> MappingOptions:
        return self._with(tile_sizes=tuple(sizes))

    def map_to_threads(self, *block: int) -> MappingOptions:
        return self._with(block=tuple(block))

    def map_to_blocks(self, *grid: int) -> MappingOptions:
        return self._with(grid=tuple(grid))

    def unroll(self, factor: int) -> MappingOptions:
        return self._with(unroll_factor=int(factor))

    def outer_schedule_fusion_strategy(self, strategy: str) -> MappingOptions:
        return self._with(fusion=strategy.lower())

    def schedule_fusion_strategy(self, strategy: str) -> MappingOptions:
        return self.outer_schedule_fusion_strategy(strategy)

    def outer_schedule_allow_skewing(self, allow: bool) -> MappingOptions:
        return self._with(allow_skewing=bool(allow))

    def outer_schedule_positive_orthant(self, positive: bool) -> MappingOptions:
        return self._with(positive_orthant=bool(positive))

    def fix_parameters(self, fix: bool = True) -> MappingOptions:
        return self._with(fix_parameters_before_scheduling=bool(fix))

    def shared_memory(self, use: bool = True, depth: int | None = None,
                      max_bytes: int | None = None) -> MappingOptions:
        changes: dict[str, Any] = {"use_shared_memory": bool(use)}
        if depth is not None:
            changes["shared_depth"] = depth
        if max_bytes is not None:
            changes["max_shared_memory"] = max_bytes
        return self._with(**changes)

    def private_memory(self, use: bool = True, depth: int | None = None) -> MappingOptions:
        changes: dict[str, Any] = {"use_private_memory": bool(use)}
        if depth is not None:
            changes["private_depth"] = depth
        return self._with(**changes)

    def with_threads(self, threads: int) -> MappingOptions:
        return self._with(threads=int(threads))

    def with_parametric(self, parametric: bool = True) -> MappingOptions:
        return self._with(parametric=bool(parametric))

    def map_rows(self, threads: int) -> MappingOptions:
        """cuda: a row program as one kernel, ``threads`` per row (`passes/map_rows.py`);
        ``grid[0]`` caps the blocks; 0 turns it off."""
        return self._with(row_block=int(threads))

    # ------------------------------------------------------------ serialisation

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"version": _JSON_VERSION}
        for f in fields(self):
            value = getattr(self, f.name)
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
            if isinstance(default, tuple):
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
        def ints(values: tuple[int, ...]) -> str:
            return ",".join(map(str, values))

        steps = [
            f"schedule{{fusion={self.fusion},skew={str(self.allow_skewing).lower()},"
            f"positive-orthant={str(self.positive_orthant).lower()}}}",
        ]
        if target == "cuda" and self.row_block:
            # one kernel for the whole row program: pointwise temporaries recomputed, a block
            # per row, phases separated by barriers (passes/inline_temporaries, map_rows)
            steps.insert(0, "inline-temporaries")
            steps.append(f"map-rows{{threads={self.row_block},grid={self.grid[0]}}}")
            if self.use_shared_memory or self.use_private_memory:
                raise OptionsError("row_block (map-rows) keeps rows on chip itself and does not "
                                   "combine with use_shared_memory/use_private_memory")
            if self.unroll_factor > 1:
                steps.append(f"unroll{{factor={self.unroll_factor}}}")
            return ",".join(steps)
        tiles = self.tile_sizes
        if target == "cuda" and not any(tiles):
            tiles = tuple(reversed(self.block))  # threads need a point band to map onto
        if any(tiles):
            steps.append(f"tile{{sizes={ints(tiles)}}}")
        if target == "cpu":
            steps.append("mark-parallel")
            steps.append("vectorize")  # a unit-stride parallel member innermost, if legal
        elif target == "cuda":
            steps.append(f"map-to-blocks{{grid={ints(self.grid)}}}")
            steps.append(f"map-to-threads{{block={ints(self.block)}}}")
            # a reduction member left sequential goes to threadIdx.x with a block combine
            # (only where the kernel has at most one thread-mapped member; passes/map_reductions)
            steps.append(f"map-reduction{{threads={self.block[0]}}}")
            # Promotion to shared memory and registers is not built yet: say so plainly rather
            # than emit pipeline steps that name passes which do not exist.
            for flag, what in (("use_shared_memory", "shared-memory"),
                               ("use_private_memory", "register (private)")):
                if getattr(self, flag):
                    raise OptionsError(f"{flag}: {what} promotion is not implemented by the "
                                       f"CUDA backend yet; set {flag}=False")
        if self.unroll_factor > 1:
            steps.append(f"unroll{{factor={self.unroll_factor}}}")
        return ",".join(steps)

    def __str__(self) -> str:
        return self.to_json()
