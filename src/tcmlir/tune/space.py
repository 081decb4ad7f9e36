"""The search space of the autotuner: which MappingOptions fields vary, and over what values.

The space depends on the target: on the CPU only the fields the host backend honours vary
(fusion, tiling, threads), so no evaluation is spent on knobs that change nothing; on the GPU
block, grid, unrolling and promotion vary too. Candidates that break a hardware limit (more
than 1024 threads per block, a z-dimension over 64) are filtered before compiling.
"""

from __future__ import annotations

import dataclasses
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import ir
from ..options import FUSION_STRATEGIES, MappingOptions

__all__ = ["SearchSpace", "space_for"]

_POW2 = (1, 2, 4, 8, 16, 32, 64, 128, 256)
MAX_THREADS_PER_BLOCK = 1024
MAX_BLOCK_Z = 64


@dataclass(frozen=True)
class SearchSpace:
    """Named generators of field values; `sample`, `mutate` and `crossover` build candidates."""

    target: str
    depth: int  # number of loops of the deepest statement: how many tile sizes matter
    cores: int

    def _draw(self, rng: random.Random, field: str) -> Any:
        return _FIELDS[field](self, rng)

    @property
    def fields(self) -> tuple[str, ...]:
        if self.target == "cuda":
            return ("fusion", "tile_sizes", "block", "grid", "unroll_factor",
                    "use_shared_memory", "use_private_memory")
        return ("fusion", "tile_sizes", "threads")

    def is_valid(self, opts: MappingOptions) -> bool:
        if self.target != "cuda":
            return True
        product = 1
        for b in opts.block:
            product *= b
        return product <= MAX_THREADS_PER_BLOCK and (len(opts.block) < 3 or opts.block[2] <= MAX_BLOCK_Z)

    def sample(self, rng: random.Random, base: MappingOptions) -> MappingOptions:
        for _ in range(100):
            cand = dataclasses.replace(base, **{f: self._draw(rng, f) for f in self.fields})
            if self.is_valid(cand):
                return cand
        return base

    def mutate(self, rng: random.Random, opts: MappingOptions, rate: float) -> MappingOptions:
        for _ in range(100):
            changes = {f: self._draw(rng, f) for f in self.fields if rng.random() < rate}
            cand = dataclasses.replace(opts, **changes)
            if self.is_valid(cand):
                return cand
        return opts

    def crossover(self, rng: random.Random, a: MappingOptions, b: MappingOptions) -> MappingOptions:
        for _ in range(100):
            changes = {f: getattr(b, f) for f in self.fields if rng.random() < 0.5}
            cand = dataclasses.replace(a, **changes)
            if self.is_valid(cand):
                return cand
        return a


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


_FIELDS: dict[str, Callable[[SearchSpace, random.Random], Any]] = {
    "fusion": lambda s, r: r.choice(FUSION_STRATEGIES),
    "tile_sizes": _tiles,
    "block": _block,
    "grid": _grid,
    "unroll_factor": lambda s, r: r.choice((1, 2, 4, 8, 16)),
    "use_shared_memory": lambda s, r: r.random() < 0.5,
    "use_private_memory": lambda s, r: r.random() < 0.5,
    "threads": lambda s, r: r.choice(sorted({1, max(1, s.cores // 2), s.cores})),
}


def space_for(fn: ir.Function, target: str) -> SearchSpace:
    depth = max((len(s.ranges) for s in fn.statements), default=1)
    return SearchSpace(target=target, depth=max(1, depth), cores=os.cpu_count() or 1)
