"""DTensor sharding strategies for tcmlir ops, proved by the polyhedral model.

Place: `tcmlir.torch.op` calls `register` for the forward operator and for its gradient
operator (itself a TC function), so a tcmlir op called on `DTensor`s runs on each rank's local
shards and autograd keeps working. The strategies come from `tcmlir.multi.axes`: per axis of
the program that isl proves local at the call's global shapes and mesh size,

- tensors with a dimension on the axis → ``Shard(d)``, in and out;
- outputs reduced over the axis (``+=!``, ``*=!``, ``max=!``, ``min=!``) → ``Partial`` with
  the matching reduce op (``sum``, ``product``, ``max``, ``min``);
- every other tensor → ``Replicate()`` (read whole by every rank);

plus the all-``Replicate`` strategy, always valid. DTensor picks the cheapest strategy and does
any redistribution (all-gather, all-reduce) itself: tcmlir calls no collective. An axis that
isl cannot prove (a stencil ``O(i) = A(i) + A(i + 1)`` reads its neighbour's chunk; a softmax
over its reduced dimension combines partial values mid-program) offers no strategy, so DTensor
gathers the operand: slower, never wrong. `strategies` lists every axis with the reason it is
refused, for inspection.

Meshes of one dimension get the proven strategies; on a mesh of several dimensions only the
all-``Replicate`` strategy is offered (chunks of chunks are not proved).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .. import ir
from ..multi.axes import ShardAxis, prove_axis, shard_axes

__all__ = ["Strategy", "register", "strategies"]


@dataclass(frozen=True)
class Strategy:
    """One axis of a program at given shapes and mesh size: ``outputs`` / ``inputs`` are the
    placements (in words: ``Shard(0)``, ``Partial(sum)``, ``Replicate()``) when ``reason`` is
    None; otherwise ``reason`` says why the axis is not offered to DTensor."""

    axis: str
    outputs: tuple[str, ...]
    inputs: tuple[str, ...]
    reason: str | None

    def __str__(self) -> str:
        if self.reason is not None:
            return f"{self.axis}: refused: {self.reason}"
        return f"{self.axis}: ({', '.join(self.inputs)}) -> ({', '.join(self.outputs)})"


def _placement_words(fn: ir.Function, axis: ShardAxis) -> tuple[tuple[str, ...], tuple[str, ...]]:
    def one(t: ir.Tensor) -> str:
        if t.name in axis.dims:
            return f"Shard({axis.dims[t.name]})"
        if t.name in axis.partial:
            return f"Partial({axis.partial[t.name]})"
        return "Replicate()"

    return tuple(one(t) for t in fn.outputs), tuple(one(t) for t in fn.inputs)


_PROOFS: dict[tuple, tuple[Strategy, ...]] = {}
_LOCK = threading.Lock()


def strategies(fn: ir.Function, shapes: Sequence[tuple[int, ...]], ranks: int
               ) -> tuple[Strategy, ...]:
    """Every candidate axis of ``fn`` at global input ``shapes`` over ``ranks`` (a 1-D mesh),
    proved or refused (see `tcmlir.multi.axes`)."""
    shapes = tuple(tuple(int(n) for n in s) for s in shapes)
    key = (fn, shapes, int(ranks))
    with _LOCK:
        hit = _PROOFS.get(key)
    if hit is not None:
        return hit
    out = []
    for axis in shard_axes(fn):
        outs, ins = _placement_words(fn, axis)
        out.append(Strategy(str(axis), outs, ins, prove_axis(fn, axis, shapes, ranks)))
    result = tuple(out)
    with _LOCK:
        _PROOFS[key] = result
    return result


def _placement(word: str) -> Any:
    from torch.distributed.tensor import Partial, Replicate, Shard

    if word.startswith("Shard("):
        return Shard(int(word[6:-1]))
    if word.startswith("Partial("):
        return Partial(word[8:-1])
    return Replicate()


def register(overload: Any, fn: ir.Function) -> bool:
    """Register ``fn``'s proven strategies for the torch operator ``overload`` with DTensor;
    False (nothing registered) where this torch has no ``torch.distributed``."""
    if not torch.distributed.is_available():
        return False
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.experimental import register_sharding

    n_in, n_out = len(fn.inputs), len(fn.outputs)

    def sharding(*specs: Any) -> list[tuple[list[Any], list[Any]]]:
        every = [([Replicate()] * n_out, [Replicate()] * n_in)]
        meshes = [s.mesh for s in specs if hasattr(s, "mesh")]
        if not meshes or meshes[0].ndim != 1:
            return every
        shapes = [tuple(s.tensor_meta.shape) for s in specs]
        for st in strategies(fn, shapes, meshes[0].size()):
            if st.reason is None:
                every.append(([_placement(w) for w in st.outputs],
                              [_placement(w) for w in st.inputs]))
        return every

    register_sharding(overload)(sharding)
    return True
