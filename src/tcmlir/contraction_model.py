"""The cost model of the register-tiled fp32 contraction kernel: which tiles and split-K a
default contraction gets (`cuda_defaults`), priced from counts instead of a table of sizes.

A candidate is a block tile ``tm x tn x tk`` of 16 x 16 threads, each owning an ``rx x ry``
register tile, both operand tiles copied to shared memory one k tile ahead (the kernel of
`MappingOptions.cuda_contraction` with `cuda_defaults.contraction_access`), optionally with
the reduction cut into ``ways`` chunks on blocks of their own (`passes/split_k.py`). Its time
(`tiling_time`) is that of the busiest SM:

1. **Blocks and waves.** ``batch x ways x ceil(M / tm) x ceil(N / tn)`` blocks over the SMs
   (`GpuModel.sms`); the busiest SM runs ``ceil(blocks / sms)`` of them in rounds of
   ``resident`` at a time. Partial tiles cost a whole tile (their threads still copy, wait
   and synchronise).
2. **Occupancy** from registers and shared memory: blocks resident per SM = the fewest of
   2048 threads, 64K registers (``REGISTERS``: what ptxas gives the kernel's PTX; the 8 x 8
   tile needs 128, and 156-157 once both output dimensions end in a partial tile, so one block
   per SM) and 227 KB of shared memory (two buffers of ``(tm + tn + 8) x tk`` floats).
3. **Per-SM rate**: 128 FMA per cycle, times
   * *issue*: every other instruction of a k step (shared loads, the copies, the loop) takes
     an issue slot the FMAs need (fp32 FMA alone fills the four schedulers);
   * *shared memory*: wavefronts (128 B each, one per cycle) of a warp's operand reads — a
     warp's 32 threads read ``32 / bx`` rows of A (a broadcast) and ``bx`` column groups of B —
     and of the copies' stores, against the warp's FMA cycles (bytes per FMA);
   * *latency hiding* by the blocks resident together (``HIDE``): one block alone stalls at
     every barrier of its k loop.
   Each round also pays ``ROUND_CYCLES`` (the first tile's copy, the epilogue's stores).
4. **Memory**: every block streams its operand panels from L2, and DRAM moves the operands,
   the output and, split, the partial sums twice (written, then read by the fold: a second
   kernel and launch). A *streamed* operand — one read at every (row, column, reduction)
   point, as an embedding bag's gathered rows ``E(idx(b, l), d)``: no tile reuses it — moves
   all its ``rows x columns x reduction`` elements, and at a rate that needs loads in flight:
   ``STREAM_WARPS`` resident warps per SM reach the DRAM ceiling, fewer a proportional part
   (a 64 x 32 tile gave the 1024 x 256 x 32 bag 128 blocks of 8 warps, one per SM: 0.042 ms
   on the H100 against 0.029 with 32 x 32 tiles, two blocks per SM).

Calibrated on the H100 (fp32, no TF32, 2026-12-06): matmul 4096³ with 128 x 128 / 8 x 8 at
2.916 ms (two blocks per SM: ``HIDE[2]``), 3000 x 1000 x 2000 with the same tiles at 0.568 ms
(157 registers, one block per SM: ``HIDE[1]``). Predictions rank candidates; they are not a
timer (the partial-tile and unaligned-copy code paths are slower than the model says at
2047 x 2049 x 2051, uniformly enough not to change which candidate wins).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import NamedTuple

from .cost_model import GPU, GpuModel

__all__ = [
    "HIDE",
    "K_MAJOR_B_RATE",
    "REGISTERS",
    "ROUND_CYCLES",
    "STREAM_WARPS",
    "TILINGS",
    "TRANSPOSED_COPY_RATE",
    "TRANSPOSED_COPY_RESIDENT",
    "ContractionTiling",
    "Problem",
    "choose_tiling",
    "interleaved",
    "registers",
    "resident_blocks",
    "tiling_time",
]

# (tile, register tile) candidates, in order of preference at equal predictions; each gives
# 16 x 16 threads
TILINGS = (((128, 128, 16), (8, 8)), ((128, 64, 16), (8, 4)), ((64, 64, 16), (4, 4)),
           ((64, 32, 16), (4, 2)), ((32, 32, 16), (2, 2)))

# registers per thread of the kernel (`ptxas -arch=sm_90 -v` of the PTX tcmlir emits under
# `contraction_access`): (full or one partial output dimension, both output dimensions
# partial with 16-byte rows, both partial with unaligned rows). Measured at 2048³, 2000 x
# 2048 x 2048, 2048 x 2049 x 2048, 1000³, 3000 x 1000 x 2000 and 2047 x 2049 x 2051 (the
# largest of each form); tests/test_contraction_model.py checks them against ptxas.
REGISTERS = {(8, 8): (128, 157, 157), (8, 4): (80, 80, 105), (4, 4): (64, 64, 73),
             (4, 2): (48, 48, 63), (2, 2): (39, 39, 52)}
# a register tile not in the table: accumulators, operand fragments, addresses
DEFAULT_EXTRA_REGISTERS = 36

# the fraction of the issue- and shared-limited rate reached with 1, 2, 3+ blocks resident
HIDE = (0.42, 0.89, 0.95)
# the kernel copying A through registers (`contraction_access` for register tiles narrower
# than 8 columns), H100: 128 x 64 / 8 x 4 ran 1536 x 2048 x 1536 (3 blocks on the busiest SM)
# in 0.507 ms and 2048³ (4 blocks) in 0.535 ms: as two rounds of two blocks each, although
# ptxas reports 80 registers (three blocks); at two blocks resident, 0.74 of the rate of the
# cp.async kernel
TRANSPOSED_COPY_RESIDENT = 2
TRANSPOSED_COPY_RATE = 0.74
# the cp.async kernel copies an operand stored with the reduction innermost one element at a
# time (A always, in a matmul): with B too (fc, ``Wt(n, k)``), H200, fc 1024x2048->1024 ran
# 0.226 ms with 128 x 128 tiles and 4 ways against 0.171 with 128 x 64 and 2 ways (before
# the access changes of `contraction_access`, which took 26% off the first and 9% off the
# second: about 0.167 against 0.155, 8% slower), where the rates above alone would make it
# 25% faster: this factor on the cp.async kernel's rate reproduces the 8%
K_MAJOR_B_RATE = 0.65
ROUND_CYCLES = 1500          # a round's first copy (global latency) and epilogue stores
STREAM_WARPS = 32            # resident warps per SM a streamed operand needs for the ceiling
SHARED_BYTES_PER_SM = 227 * 1024
REGISTERS_PER_SM = 65536
FMA_PER_CYCLE = 128          # fp32 lanes per SM
THREADS = 256


@dataclass(frozen=True)
class ContractionTiling:
    """A candidate and what the model says of it (seconds: `tiling_time`)."""

    tile: tuple[int, int, int]
    register_tile: tuple[int, int]
    ways: int                # the split asked for (`MappingOptions.split_k`)
    chunks: int              # the chunks it gives (`passes.split_k.chunking`)
    predicted_s: float
    blocks: int
    resident: int
    registers: int


def registers(reg: tuple[int, int], both_partial: bool, aligned: bool) -> int:
    """Registers per thread of the kernel with register tile ``reg`` (``REGISTERS``)."""
    if reg in REGISTERS:
        full, partial, unaligned = REGISTERS[reg]
        return full if not both_partial else (partial if aligned else unaligned)
    return reg[0] * reg[1] + 2 * (reg[0] + reg[1]) + DEFAULT_EXTRA_REGISTERS


def resident_blocks(tile: tuple[int, int, int], regs: int, gpu: GpuModel = GPU) -> int:
    """Blocks of 256 threads resident per SM: threads, registers (allocated 8 at a time per
    thread) and the two shared buffers."""
    by_threads = gpu.max_threads_per_sm // THREADS
    by_regs = REGISTERS_PER_SM // (THREADS * (-(-regs // 8) * 8))
    shared = 2 * (tile[0] + tile[1] + 8) * tile[2] * 4
    return max(0, min(by_threads, by_regs, SHARED_BYTES_PER_SM // shared, gpu.max_blocks_per_sm))


def _resident(tile: tuple[int, int, int], reg: tuple[int, int], regs: int, gpu: GpuModel) -> int:
    n = resident_blocks(tile, regs, gpu)
    return n if interleaved(tile, reg) else min(n, TRANSPOSED_COPY_RESIDENT)


def _rate(tile: tuple[int, int, int], reg: tuple[int, int], aligned: bool) -> float:
    """The fraction of the SM's FMA rate one k step reaches with enough blocks resident."""
    rx, ry = reg
    bx = tile[1] // ry
    warps = THREADS // 32
    fmas = rx * ry
    # vector shared loads where 4 outputs are adjacent, else one load per value
    a_loads, b_loads = (-(-r // 4) if r % 2 == 0 else r for r in (rx, ry))
    copies = (tile[0] + tile[1]) / THREADS / (4 if aligned else 1)
    issue = fmas / (fmas + a_loads + b_loads + 2 * copies + 1)
    rows = max(1, 32 // bx)   # distinct A rows a warp reads (a broadcast within each)
    cols = min(32, bx)
    wave = 128
    shared = (a_loads * -(-rows * 4 * min(rx, 4) // wave) + b_loads * -(-cols * 4 * min(ry, 4) // wave)
              + (tile[0] + tile[1]) * 4 / wave / warps)
    path = 1.0 if interleaved(tile, reg) else TRANSPOSED_COPY_RATE
    return path * issue * min(1.0, (fmas / 4) / shared)


def interleaved(tile: tuple[int, int, int], reg: tuple[int, int]) -> bool:
    """The kernel `contraction_access` gives an 8-wide register tile (B read as interleaved
    groups of four, both tiles copied by cp.async); the others copy A through registers."""
    return reg[1] == 8 and tile[1] % 8 == 0


def tiling_time(tile: tuple[int, int, int], reg: tuple[int, int], extents: tuple[int, int],
                reduction: int, batch: int = 1, ways: int = 1, aligned: bool = True,
                itemsize: int = 4, b_k_major: bool = False, streamed: int = 0,
                gpu: GpuModel = GPU) -> ContractionTiling:
    """The model's time of one candidate for an ``extents`` = (rows, columns) output over a
    reduction of ``reduction`` values, ``batch`` times, split ``ways`` ways (see the module
    docstring); ``aligned``: every operand row is a multiple of 16 bytes; ``b_k_major``: the
    columns' operand is stored with the reduction innermost (``Wt(n, k)``); ``streamed``:
    operands read at every point of the product, no tile reusing them (`Problem`)."""
    m, n = extents
    tm, tn, tk = tile
    chunk = -(-reduction // max(1, min(ways, reduction)))
    chunk = min(reduction, -(-chunk // tk) * tk)
    chunks = -(-reduction // chunk)
    tiles = -(-m // tm) * -(-n // tn)
    blocks = batch * chunks * tiles
    both_partial = m % tm != 0 and n % tn != 0
    regs = registers(reg, both_partial, aligned)
    resident = _resident(tile, reg, regs, gpu)
    if resident < 1:
        return ContractionTiling(tile, reg, ways, chunks, math.inf, blocks, 0, regs)
    rate = _rate(tile, reg, aligned)
    if b_k_major and interleaved(tile, reg):
        rate *= K_MAJOR_B_RATE
    steps = -(-chunk // tk) * tk
    work = tm * tn * steps / FMA_PER_CYCLE   # cycles of one block at the full FMA rate
    per_sm = -(-blocks // gpu.sms)
    cycles = 0.0
    while per_sm > 0:
        r = min(resident, per_sm)
        cycles += r * work / (rate * HIDE[min(r, len(HIDE)) - 1]) + ROUND_CYCLES
        per_sm -= r
    compute = cycles / gpu.clock_hz
    out = batch * m * n * itemsize
    operands = batch * (m + n) * reduction * itemsize
    dram = operands + (out if chunks == 1 else 2 * chunks * out)
    l2 = blocks * (tm + tn) * steps * itemsize
    memory = max(dram / gpu.dram_bytes_per_s, l2 / gpu.l2_bytes_per_s)
    if streamed:
        warps = min(resident, -(-blocks // gpu.sms)) * THREADS // 32
        rate = gpu.dram_bytes_per_s * min(1.0, warps / STREAM_WARPS) * min(1.0, blocks / gpu.sms)
        memory += streamed * batch * m * n * reduction * itemsize / rate
    seconds = max(compute, memory) + gpu.launch_s
    if chunks > 1:  # the fold: partial sums read, the output written, a second launch
        seconds += gpu.launch_s + (chunks + 1) * out / gpu.dram_bytes_per_s
    return ContractionTiling(tile, reg, ways, chunks, seconds, blocks, resident, regs)


class Problem(NamedTuple):
    """One contraction of a program, at the call's sizes."""

    extents: tuple[int, int]    # output rows, columns
    reduction: int              # the reduction's extent
    aligned: bool = True        # every operand row a multiple of 16 bytes (vector copies)
    b_k_major: bool = False     # the columns' operand stored with the reduction innermost
    streamed: int = 0           # operands read at every (row, column, reduction) point


def choose_tiling(problems: list[Problem], batch: int = 1, ways: tuple[int, ...] = (1,),
                  tilings: tuple = TILINGS, gpu: GpuModel = GPU) -> ContractionTiling:
    """The candidate of ``tilings`` x ``ways`` the model predicts fastest for a program whose
    contractions are ``problems`` (one set of options for all of them: their times add up;
    ``ways`` > 1 only for a single one); a candidate within 2% of an earlier one does not
    replace it (larger tiles come first, and for each the fewest ways)."""
    best: ContractionTiling | None = None
    for tile, reg in tilings:
        for w in sorted(set(ways)):
            parts = [tiling_time(tile, reg, p.extents, p.reduction, batch, w, p.aligned,
                                 b_k_major=p.b_k_major, streamed=p.streamed, gpu=gpu)
                     for p in problems]
            if w > 1 and any(p.chunks < 2 for p in parts):
                continue
            cand = replace(parts[0], predicted_s=sum(p.predicted_s for p in parts))
            if best is None or cand.predicted_s < best.predicted_s * 0.98:
                best = cand
    assert best is not None
    return best
