"""Tuning a split call: tune the part's kernel at the chunk's signature, once per chunk size.

Place: beside `multi.execute`; uses ``fn.autotune`` (`tcmlir.tune`) unchanged. A part of a split
call is an ordinary call at the chunk's size (`multi.plan`), so its best options are those of
that signature, and they are cached under it (canonical TC text, entry, the chunk's input
signature, arch). Then:

* a split call whose function has ``make_load_from_cache_options_factory`` (or
  ``make_autotuned_options_factory``) finds them, because `multi.execute` asks the factory with
  each part's own inputs;
* a one-device call at the chunk's size finds the same row, and the reverse: options tuned for
  a one-device call at that size serve the split without tuning again.

Parts of equal size (a balanced split of an even range) share one tuning run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..options import MappingOptions
from .inputs import host_slab, locate_inputs
from .plan import make_plan

__all__ = ["autotune_split", "chunk_inputs"]


def chunk_inputs(fn: Any, inputs: Sequence[Any], devices: Sequence[int]) -> list[list[Any]]:
    """Host inputs of each distinct part of the split of this call (slices of host arrays,
    copies of device ones), in part order, one list per distinct chunk size."""
    views, where = locate_inputs(fn.ir, inputs)
    from ..binding import bind_sizes

    sizes = bind_sizes(fn.ir, [tuple(views[t.name].shape) for t in fn.ir.inputs])
    plan = make_plan(fn.ir, sizes, devices, where)
    seen, out = set(), []
    for part in plan.parts:
        key = tuple(sorted(part.sizes.items()))
        if key in seen:
            continue
        seen.add(key)
        out.append([host_slab(views[t.name], *part.slabs.get(t.name, (0, 0)), t.rank)
                    for t in fn.ir.inputs])
    return out


def autotune_split(fn: Any, *inputs: Any, devices: Sequence[int],
                   **autotune_kwargs: Any) -> list[MappingOptions]:
    """Tune the kernel of each distinct chunk of ``fn(*inputs, devices=devices)`` (keyword
    arguments go to ``fn.autotune``: ``generations``, ``population``, ``cache``, ...); returns
    the best options per distinct chunk, in part order. The tuner runs on ``autotune_kwargs``'s
    ``devices`` (its worker GPUs), not on the split's."""
    return [fn.autotune(*sub, **autotune_kwargs) for sub in chunk_inputs(fn, inputs, devices)]
