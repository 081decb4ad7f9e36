"""Default mapping options for ``target="cpu"``, from the program and the host's caches and vectors.

`cpu_defaults(fn, sizes)` is what `MappingOptions.default_for` returns on the cpu target:

* a program that is one host contraction (`poly.host_contraction`: a float ``+=`` product of
  two plain reads at fixed sizes: matmul in any layout, batched matmul) gets the packed kernel
  (`passes/host_contraction.py`): ``tile`` = MC, NC, KC and ``register_tile`` = MR, NR from the
  host (`contraction_blocking`);
* other nests of three or more loops get the naive 32³ tiling (a batched one with its batch
  dimensions untiled, so they are the parallel loop);
* shallower programs (elementwise chains, row reductions, softmax) are fused, not tiled
  (measured: softmax 4096×1024 15.5 ms fused and untiled, 42.6 ms naive).

The host's vector width comes from llvmlite's host CPU features (AVX-512, AVX/AVX2, else 16
bytes: SSE, NEON), its cache sizes from sysfs (defaults where absent).
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Mapping
from typing import Any

__all__ = ["CacheSizes", "contraction_blocking", "cpu_defaults", "host_cache_sizes",
           "host_vector_bytes", "host_vector_registers"]


@functools.cache
def _host_features() -> dict[str, bool]:
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    try:
        return dict(llvm.get_host_cpu_features())
    except RuntimeError:  # pragma: no cover - LLVM knows no features for this host
        return {}


def host_vector_bytes() -> int:
    """Bytes in the widest float vector register the host JIT may use (16: SSE, NEON)."""
    features = _host_features()
    if features.get("avx512f"):
        return 64
    if features.get("avx") or features.get("avx2"):
        return 32
    return 16


def host_vector_registers() -> int:
    """How many of those registers there are: 32 with AVX-512 and on AArch64 (NEON), else 16."""
    features = _host_features()
    return 32 if features.get("avx512f") or features.get("neon") else 16


class CacheSizes:
    """Data cache bytes per core: ``l1`` and ``l2``."""

    def __init__(self, l1: int, l2: int):
        self.l1, self.l2 = l1, l2


def _sysfs_cache(level: int) -> int | None:
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        entries = os.listdir(base)
    except OSError:
        return None
    for entry in sorted(entries):
        try:
            with open(f"{base}/{entry}/level") as f:
                if int(f.read()) != level:
                    continue
            with open(f"{base}/{entry}/type") as f:
                if f.read().strip() not in ("Data", "Unified"):
                    continue
            with open(f"{base}/{entry}/size") as f:
                text = f.read().strip()
        except (OSError, ValueError):
            continue
        scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
        try:
            return int(text.rstrip("KM")) * scale
        except ValueError:
            return None
    return None


@functools.cache
def host_cache_sizes() -> CacheSizes:
    return CacheSizes(_sysfs_cache(1) or 32 << 10, _sysfs_cache(2) or 512 << 10)


def contraction_blocking(elt: int, m_rows: int, batch: int, threads: int
                         ) -> tuple[tuple[int, int, int], tuple[int, int]]:
    """(MC, NC, KC), (MR, NR) for a host contraction with ``elt``-byte elements, ``m_rows``
    rows and ``batch`` batch entries.

    Registers: NR is two vectors, MR rows as many as the vector registers allow with two for
    the ``b`` vectors and one broadcast (`host_vector_registers`), at most 8.
    Caches (footprints of the packed panels): an ``a`` micro-panel (KC x MR) takes a quarter of
    L1 (it stays there while the kernel walks the ``b`` panels), the packed ``b`` slice
    (KC x NC) half of L2 (it stays there while the kernel walks the ``a`` panels), the packed
    ``a`` block (MC x KC, streamed a micro-panel at a time) at most L2: larger blocks pack
    ``b`` fewer times (matmul 1024^3, one thread: MC 1024 6% faster than 256). The threads split the (batch entry, row block) pairs: MC is cut until their number
    is a multiple of ``threads`` (or at least 8 per thread), so that every thread gets as many.
    """
    vec = host_vector_bytes()
    vw = max(1, vec // elt)
    regs = host_vector_registers()
    nr = 2 * vw
    mr = max(1, min(8, (regs - 3) // 2))
    caches = host_cache_sizes()
    kc = max(16, caches.l1 // 4 // (mr * elt) // 16 * 16)
    nc = max(nr, caches.l2 // 2 // (kc * elt) // nr * nr)
    mc = max(mr, caches.l2 // (kc * elt) // mr * mr)
    if threads > 1 and m_rows > 0:
        blocks = -(-m_rows // mc)
        for cand in range(blocks, -(-m_rows // mr) + 1):
            if (batch * cand) % threads == 0 or batch * cand >= 8 * threads:
                blocks = cand
                break
        rows = -(-m_rows // blocks)
        mc = -(-rows // mr) * mr
    return (mc, nc, kc), (mr, nr)


def cpu_defaults(cls: Any, fn: Any, sizes: Mapping[str, int] | None) -> Any:
    """What a call without options uses on the cpu target (see the module docstring);
    ``cls`` is `MappingOptions`."""
    from .config import get_config
    from .poly.host_contraction import host_contraction

    statements = fn.statements
    if len(statements) == 1 and sizes is not None:
        plan = host_contraction(fn, 0, sizes)
        if not isinstance(plan, str):
            batch = math.prod(plan.extent(b) for b in plan.batch)
            threads = get_config().threads or os.cpu_count() or 1
            tile, reg = contraction_blocking(plan.dtype.bits // 8, plan.extent(plan.m), batch,
                                             threads)
            return cls.naive().tile(*tile).register_tiling(*reg)
    if max((len(s.ranges) for s in statements), default=0) < 3:
        return cls(fusion="max")
    if batch := _batch_dims(statements):
        # batched contraction: batch dimensions untiled (the parallel loop), the 32^3 tiles
        # on (m, n, k) (16x256^3 batched matmul: 231 -> 67 ms on 2 cores)
        return cls.naive().tile(*(0,) * batch, 32, 32, 32)
    return cls.naive()


def _batch_dims(statements: Any) -> int:
    """The number of leading batch dimensions of a batched contraction (one reduction
    statement with lhs rank r >= 3 and one reduction index: r - 2), else 0."""
    reductions = [s for s in statements if s.reduction is not None]
    if len(reductions) != 1:
        return 0
    st = reductions[0]
    if len(st.lhs) < 3 or len(st.index_names) != len(st.lhs) + 1:
        return 0
    return len(st.lhs) - 2
