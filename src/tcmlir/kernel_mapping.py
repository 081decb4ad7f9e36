"""The per-kernel part of `MappingOptions`: a kernel of a multi-kernel program mapped its own way.

A program of several statements compiles to several kernels (one per top-level group of the
schedule: `poly.gpu_mapping.kernel_groups`); attention's two batched matmuls, row max,
exponential and row sum are five such kernels under ``fusion="min"``. One set of tiles and
threads for all of them maps each badly (the matmuls want shared-memory operand tiles and a
register tile per thread, the others do not). A `KernelMapping` holds the mapping knobs of
one kernel — the fields of `MappingOptions` that the cuda mapping passes read, under the same
names — and the statements ``S{k}`` of its group; `MappingOptions.kernels` lists them, and
the kernels none of them claims keep the options' own (shared) knobs. `options_pipeline`
runs each mapping pass once per `KernelMapping` (``only=...``) and once for the rest
(``skip=...``; `poly.kernel_select`). The defaults fill it (`defaults.per_kernel_options`:
each kernel gets what its statements would get as a program of their own, where that is a
mapping of these knobs); the tuner keeps it and searches the shared knobs.

This module imports nothing of `tcmlir.options` (which holds and serialises these).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

__all__ = ["KERNEL_FIELDS", "KernelMapping"]

# the MappingOptions fields a KernelMapping carries (what the cuda mapping passes read)
KERNEL_FIELDS = ("tile_sizes", "block", "grid", "unroll_factor", "register_tile",
                 "register_interleave", "use_shared_memory", "use_private_memory",
                 "max_shared_memory", "unroll_copy_shared", "double_buffer", "vector_bytes",
                 "copy_bytes", "copy_transposed")


@dataclass(frozen=True)
class KernelMapping:
    """The mapping of the kernel of statements ``S{k}`` for ``k`` in ``statements`` (its
    group under the options' fusion, initialisations included); the other fields mean what
    `MappingOptions`' fields of the same names mean. Build it with `of` from options that
    have been checked (`MappingOptions.per_kernel` does)."""

    statements: tuple[int, ...]
    tile_sizes: tuple[int, ...] = ()
    block: tuple[int, ...] = (32, 8)
    grid: tuple[int, ...] = (256, 256)
    unroll_factor: int = 1
    register_tile: tuple[int, ...] = ()
    register_interleave: tuple[int, ...] = ()
    use_shared_memory: bool = False
    use_private_memory: bool = False
    max_shared_memory: int = 0
    unroll_copy_shared: bool = False
    double_buffer: bool = False
    vector_bytes: int = 0
    copy_bytes: int = 0
    copy_transposed: bool = False

    @classmethod
    def of(cls, statements: tuple[int, ...], opts: Any) -> KernelMapping:
        """The mapping knobs of ``opts`` (a `MappingOptions`) for the kernel of ``statements``."""
        return cls(tuple(sorted(set(statements))), **{f: getattr(opts, f) for f in KERNEL_FIELDS})

    def knobs(self) -> dict[str, Any]:
        """The mapping knobs as `MappingOptions` fields (tuples as they are)."""
        return {f: getattr(self, f) for f in KERNEL_FIELDS}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``statements`` and the knobs that differ from their defaults."""
        out: dict[str, Any] = {"statements": list(self.statements)}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name != "statements" and value != f.default:
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out


def check_kernels(kernels: Any) -> tuple[KernelMapping, ...]:
    """``kernels`` as a tuple of `KernelMapping`s whose statement sets are non-empty and
    disjoint (each kernel has one mapping), else an `OptionsError`."""
    from .errors import OptionsError

    out = tuple(kernels)
    seen: set[int] = set()
    for km in out:
        if not isinstance(km, KernelMapping):
            raise OptionsError(f"kernels takes KernelMapping values, got {km!r}")
        if not km.statements or any(k < 0 for k in km.statements):
            raise OptionsError(f"a per-kernel mapping needs statement numbers >= 0, got {km.statements}")
        if seen & set(km.statements):
            raise OptionsError(f"statements {sorted(seen & set(km.statements))} have two "
                               "per-kernel mappings")
        seen.update(km.statements)
    return out


def kernels_from_json(value: Any, options_from_dict: Any) -> tuple[KernelMapping, ...]:
    """`KernelMapping`s from the ``kernels`` list of the options' JSON; each entry's knobs are
    checked as options by ``options_from_dict`` (`MappingOptions.from_dict`)."""
    from .errors import OptionsError

    if not isinstance(value, list | tuple):
        raise OptionsError(f"option kernels must be a list of objects, got {value!r}")
    out = []
    for entry in value:
        if not isinstance(entry, dict) or "statements" not in entry:
            raise OptionsError(f"a per-kernel mapping must be an object with 'statements', got {entry!r}")
        knobs = dict(entry)
        statements = knobs.pop("statements")
        if not isinstance(statements, list | tuple) or not all(
                isinstance(k, int) and not isinstance(k, bool) for k in statements):
            raise OptionsError(f"per-kernel 'statements' must be a list of integers, got {statements!r}")
        unknown = sorted(set(knobs) - set(KERNEL_FIELDS))
        if unknown:
            raise OptionsError(f"unknown per-kernel option(s) {', '.join(unknown)}; known: "
                               f"statements, {', '.join(KERNEL_FIELDS)}")
        out.append(KernelMapping.of(tuple(statements), options_from_dict(knobs)))
    return check_kernels(out)
