"""What a kernel's innermost loop does, read off its PTX: FMAs, shared-memory loads, conflicts.

Place: `profiler.build_profile` reads, per cuda kernel entry, `inner_loop_shape` of the
compiled PTX, and the ``[shared]`` rule of `advice` compares the loop's shared-memory bytes
per FMA with what an SM's shared-memory pipe feeds at full FMA rate. A static estimate, not
a measurement (no counters, no ncu):

* loops are the backward branches of the entry's body (``@%p bra $L..`` to a label above);
  the innermost ones contain no other (two that overlap, a loop LLVM rotated, are one); the
  hot loop is the innermost loop with the most ``fma.rn.f32`` instructions (matmul's k loop
  over the shared tiles); counts are of static instructions in it;
* its ``ld.shared`` instructions are counted in bytes per thread (vector width × element
  size: ``ld.shared.v4.b32`` 16 bytes), its FMAs one per ``fma`` instruction, and its
  ``ld.global`` / ``st.global`` (an accumulator kept in memory rather than registers); a rough
  model of the shared pipe: a load every thread of a warp reads at one address (a broadcast,
  matmul's A along ``threadIdx.x``) costs it fewer wavefronts than its bytes say, and the
  ``cp.async`` copies that fill the tiles also use it and are not counted;
* `bank_conflicts` is the n-way conflict of a warp phase's accesses of ``width`` bytes per
  thread at ``stride`` bytes between neighbouring threads (the stride comes from the access
  relations: `structure.AccessStride` of kind ``"shared"``): 32 banks of 4 bytes; a warp's
  128-bit accesses are served in phases of 8 threads, 64-bit in 16, 32-bit in 32; the degree
  is the most distinct 4-byte words one bank holds in a phase (threads of a phase reading
  the same word are a broadcast, not a conflict).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["LoopShape", "bank_conflicts", "entry_bodies", "inner_loop_shape"]

_ENTRY = re.compile(r"^\.visible \.entry (\w[\w$]*)\(", re.M)
_LABEL = re.compile(r"^(\$?[\w$]+):")
_BRANCH = re.compile(r"\bbra(?:\.uni)?\s+(\$?[\w$]+);")
_LD_SHARED = re.compile(r"\bld\.shared(?:\.v(\d))?\.([busf])(\d+)\b")
_FMA = re.compile(r"\bfma\.rn(?:\.ftz)?\.f32\b")
_LD_GLOBAL = re.compile(r"\bld\.global\b")
_ST_GLOBAL = re.compile(r"\bst\.global\b")
_BYTES = {"8": 1, "16": 2, "32": 4, "64": 8}
BANKS = 32
BANK_BYTES = 4


@dataclass(frozen=True)
class LoopShape:
    """The hot innermost loop of one kernel: per trip and thread."""

    fmas: int            # fma.rn.f32 instructions
    shared_bytes: int    # bytes loaded with ld.shared
    shared_loads: int    # ld.shared instructions
    widest_load: int     # bytes of the widest ld.shared (16: 128-bit)
    global_loads: int = 0     # ld.global instructions (an accumulator in memory: one per trip)
    global_stores: int = 0    # st.global instructions
    bank_conflicts: int = 1   # n-way, the worst of the access strides (1: none found)
    why: str = ""             # what the conflict degree was computed from
    conflict_factor: float = 1.0  # the mean degree over the shared tensors read (wavefronts)


def entry_bodies(ptx: str) -> dict[str, list[str]]:
    """The body lines of every ``.visible .entry`` of ``ptx``, by entry name."""
    out: dict[str, list[str]] = {}
    starts = [(m.group(1), m.start()) for m in _ENTRY.finditer(ptx)]
    for i, (name, start) in enumerate(starts):
        end = starts[i + 1][1] if i + 1 < len(starts) else len(ptx)
        out[name] = [line.strip() for line in ptx[start:end].splitlines()]
    return out


def inner_loop_shape(lines: list[str]) -> LoopShape | None:
    """The `LoopShape` of the body ``lines``' hot innermost loop; None without a loop with FMAs."""
    labels = {}
    for i, line in enumerate(lines):
        m = _LABEL.match(line)
        if m:
            labels[m.group(1)] = i
    loops = []
    for j, line in enumerate(lines):
        m = _BRANCH.search(line)
        if m and m.group(1) in labels and labels[m.group(1)] < j:
            loops.append((labels[m.group(1)], j))
    inner = sorted((a, b) for a, b in loops
                   if not any((c, d) != (a, b) and a <= c and d <= b for c, d in loops))
    merged: list[tuple[int, int]] = []
    for a, b in inner:  # a rotated loop is two overlapping back edges: one region
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(b, merged[-1][1]))
        else:
            merged.append((a, b))
    inner = merged
    best: LoopShape | None = None
    for a, b in inner:
        body = lines[a:b + 1]
        fmas = sum(1 for line in body if _FMA.search(line))
        if fmas == 0:
            continue
        loads = [m for line in body if (m := _LD_SHARED.search(line))]
        sizes = [int(m.group(1) or 1) * _BYTES.get(m.group(3), 4) for m in loads]
        shape = LoopShape(fmas, sum(sizes), len(sizes), max(sizes, default=0),
                          sum(1 for line in body if _LD_GLOBAL.search(line)),
                          sum(1 for line in body if _ST_GLOBAL.search(line)))
        if best is None or shape.fmas > best.fmas:
            best = shape
    return best


def bank_conflicts(stride_bytes: int, width: int) -> int:
    """The n-way bank conflict of a phase of threads ``t = 0, 1, ...`` each reading ``width``
    bytes at ``t * stride_bytes`` (see the module docstring)."""
    width = max(BANK_BYTES, width)
    phase = max(1, BANKS * BANK_BYTES // width)
    words: dict[int, set[int]] = {}
    for t in range(phase):
        base = t * stride_bytes
        for off in range(0, width, BANK_BYTES):
            word = (base + off) // BANK_BYTES
            words.setdefault(word % BANKS, set()).add(word)
    return max(len(w) for w in words.values())
