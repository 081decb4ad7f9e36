"""Advice: rules that read a profile and the schedule and say what to change.

Each rule looks at one launched kernel (or at the call) and, when its problem is there, says
what it saw and which option or pass addresses it. Every piece of advice starts with its
rule's tag in brackets, so tools (and tests) can tell them apart:

* ``[coalescing]`` a global access whose stride between neighbouring ``threadIdx.x`` threads
  (`structure.AccessStride`, from the isl access relations and the thread mapping) is more
  than one element: reorder the mapping or stage the tensor through shared memory;
* ``[promotion]`` a tensor whose elements the kernel reads `REUSE_MIN` times or more each
  (reading instances / distinct elements, counted exactly) with no shared or register copy,
  where those re-reads would at least double the kernel's ideal traffic;
* ``[reduction]`` a reduction that runs on at most 32 threads in all, each doing at least
  `REDUCTION_UPDATES` of its updates one after the other;
* ``[fusion]`` a bandwidth-bound row program (`gpu_defaults.is_bandwidth_bound_rows`: the
  programs `map-rows` runs as one kernel) split into several kernels;
* ``[occupancy]`` theoretical occupancy under `OCCUPANCY_MIN`, with the limit that binds;
* ``[launch]`` a kernel (or a call) whose time is within `LAUNCH_FACTOR` of the launch cost;
* ``[ceilings]`` a measured rate above the ceilings (they were measured low);
* ``[transfers]`` a split call (``devices=[...]``) whose parts spend longer copying their
  slabs in and out than running their kernels;
* ``[autotune]`` far from the roofline (under `AUTOTUNE_BELOW`) with nothing above to blame.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import ir
from .ceilings import Ceilings
from .counts import WorkCounts
from .report import KernelProfile
from .structure import KernelStructure

__all__ = ["AUTOTUNE_BELOW", "LAUNCH_FACTOR", "OCCUPANCY_MIN", "REUSE_MIN", "advise",
           "advise_kernel", "advise_split"]

REUSE_MIN = 4.0
OCCUPANCY_MIN = 0.25
LAUNCH_FACTOR = 2.0
AUTOTUNE_BELOW = 0.5
WARP = 32
REDUCTION_UPDATES = 64  # sequential updates per busy thread before a reduction is worth advice


def advise_kernel(fn: ir.Function, ks: KernelStructure, kp: KernelProfile, work: WorkCounts,
                  ceil: Ceilings, target: str) -> list[str]:
    """The advice for one launched kernel."""
    out: list[str] = []
    if target == "cuda":
        out += _coalescing(ks)
        out += _promotion(fn, ks, work)
        out += _reduction(fn, ks, work)
        out += _occupancy(kp)
    if ceil.launch_s > 0 and kp.time_s < LAUNCH_FACTOR * ceil.launch_s:
        out.append(f"[launch] {kp.name} takes {_us(kp.time_s)}, about the launch cost "
                   f"({_us(ceil.launch_s)}): give each call more work (larger or batched inputs) "
                   "or fuse it with its neighbours (MappingOptions fusion='max'; on cuda "
                   "map_rows for row programs)")
    return out


def advise(fn: ir.Function, structures: Sequence[KernelStructure],
           kernels: Sequence[KernelProfile], whole: Any, ceil: Ceilings, target: str) -> list[str]:
    """The call's advice: every kernel's (also kept in ``kernel.advice``), then the call's."""
    out = [a for k in kernels for a in k.advice]
    if target == "cuda" and len(structures) > 1:
        from ..gpu_defaults import is_bandwidth_bound_rows

        if is_bandwidth_bound_rows(fn):
            out.append(f"[fusion] this row program runs as {len(structures)} kernels, each "
                       "reading its operands from global memory again: run it as one kernel, "
                       "a block per row with the row on chip (MappingOptions.map_rows(threads="
                       "256): passes inline-temporaries and map-rows), or fuse with "
                       "fusion='max'")
    if len(kernels) > 1 and ceil.launch_s > 0 and whole.time_s < LAUNCH_FACTOR * len(kernels) \
            * ceil.launch_s and not any(a.startswith("[launch]") for a in out):
        out.append(f"[launch] the call's {len(kernels)} launches take {_us(whole.time_s)}, about "
                   f"their launch cost: fuse them (fusion='max') or batch the work")
    raw = max([whole.raw_fraction, *(k.raw_fraction for k in kernels)])
    if raw > 1.05:
        out.append(f"[ceilings] a measured rate is {raw:.2f}x the roofline of the ceilings "
                   f"({ceil.source}): they were measured low; measure again (python -m "
                   "tcmlir.profile --measure) or set TCMLIR_CEILINGS")
    if not out and whole.roofline_fraction < AUTOTUNE_BELOW:
        out.append(f"[autotune] the call reaches {100 * whole.roofline_fraction:.0f}% of its "
                   f"{whole.bound}-bound roofline and no rule above names a cause: search the "
                   "mapping options with fn.autotune(*inputs) (or `tcmlir tune`)")
    return out


def advise_split(prof: Any) -> list[str]:
    """The advice of a split call's profile (`split_profile`): its transfers and ceilings."""
    out = []
    compute = sum(p.kernels_s for p in prof.parts)
    if prof.transfer_s > compute > 0:
        out.append(f"[transfers] the parts spend {_us(prof.transfer_s)} per call copying "
                   f"{prof.transfer_bytes} bytes in and out, more than their kernels "
                   f"({_us(compute)}): pass inputs that already live on the parts' devices "
                   "(device arrays; the shards of tcmlir.multi.call_sharded for a chain of "
                   "split calls) and leave outputs there (call_sharded)")
    raw = max([prof.raw_fraction, *(k.raw_fraction for k in prof.kernels)])
    if raw > 1.05:
        out.append(f"[ceilings] a measured rate is {raw:.2f}x the roofline of the ceilings "
                   f"({prof.ceilings.source}): they were measured low; measure again "
                   "(python -m tcmlir.profile --measure) or set TCMLIR_CEILINGS")
    return out


def _coalescing(ks: KernelStructure) -> list[str]:
    out, seen = [], set()
    for a in ks.strides:
        if a.stride is None or abs(a.stride) <= 1 or (a.tensor, a.kind) in seen:
            continue
        seen.add((a.tensor, a.kind))
        verb = "reads" if a.kind == "read" else "writes"
        out.append(f"[coalescing] {ks.name} {verb} {a.tensor} (statement {a.statement}) "
                   f"{abs(a.stride)} elements apart between neighbouring threads along "
                   "threadIdx.x, so a warp's accesses are not coalesced: map threadIdx.x to the "
                   f"loop that walks {a.tensor}'s last dimension (block order: MappingOptions "
                   "tile/map_to_threads) or stage it through shared memory (promote-shared: "
                   "MappingOptions.shared_memory(True))")
    return out


def _reading_instances(fn: ir.Function, work: WorkCounts, tensor: str) -> int:
    total = 0
    for name in work.statements:
        if name.endswith("_init"):
            continue
        stmt = fn.statements[int(name[1:])]
        reads = sum(1 for e in ir.walk(stmt.rhs) if isinstance(e, ir.Read) and e.tensor == tensor)
        total += reads * work.instances[name].value
    return total


def _promotion(fn: ir.Function, ks: KernelStructure, work: WorkCounts) -> list[str]:
    out = []
    for t in work.traffic:
        if t.tensor in ks.promoted or not t.read.exact or t.read.value == 0:
            continue
        if fn.tensor(t.tensor).rank == 0:
            continue
        reads = _reading_instances(fn, work, t.tensor)
        reuse = reads / t.read.value
        # worth a copy when the re-reads would at least double the kernel's ideal traffic
        # (a per-row scalar re-read along its row is not: caches serve it)
        if reuse >= REUSE_MIN and (reads - t.read.value) * t.itemsize >= work.bytes:
            out.append(f"[promotion] {ks.name} reads each element of {t.tensor} {reuse:.0f} times "
                       "(exact count) from global memory with no on-chip copy: promote it to "
                       "shared memory (MappingOptions.shared_memory(True): promote-shared) or "
                       "registers (private_memory(True), register_tiling: promote-private, "
                       "register-tile)")
    return out


def _reduction(fn: ir.Function, ks: KernelStructure, work: WorkCounts) -> list[str]:
    from .counts import distinct_writes

    out = []
    threads = ks.threads
    if threads is None:
        return out
    for name in work.statements:
        if name.endswith("_init"):
            continue
        stmt = fn.statements[int(name[1:])]
        if stmt.reduction is None or not stmt.reduction_indices:
            continue
        outputs = distinct_writes(fn, name, work.sizes)
        busy = min(threads, outputs * ks.reduction_threads)
        if busy <= WARP and work.instances[name].value >= REDUCTION_UPDATES * busy:
            out.append(f"[reduction] {ks.name} runs the reduction of statement {name} "
                       f"({stmt.tensor}, {work.instances[name].value} updates) on {busy} "
                       "thread(s): spread it over the threads of a block and the blocks of the "
                       "grid (the cuda defaults do: MappingOptions.default_for(fn, 'cuda') picks "
                       "map-rows / map-full-reduction; or MappingOptions.map_rows(threads=256), "
                       "pass map-reduction)")
    return out


def _occupancy(kp: KernelProfile) -> list[str]:
    if kp.occupancy is None or kp.occupancy >= OCCUPANCY_MIN:
        return []
    threads = 1 if kp.block is None else kp.block[0] * kp.block[1] * kp.block[2]
    pct = f"{100 * kp.occupancy:.0f}%"
    if kp.occupancy_limiter == "registers":
        fix = (f"{kp.registers} registers per thread: smaller register tiles "
               "(MappingOptions.register_tiling) or tiles (tile), fewer unrolled statements")
    elif kp.occupancy_limiter == "shared memory":
        fix = (f"{kp.shared_bytes} bytes of shared memory per block: smaller tiles "
               "(MappingOptions.tile) or a lower max_shared_memory")
    else:
        fix = f"blocks of {threads} threads: larger blocks (MappingOptions.map_to_threads)"
    return [f"[occupancy] {kp.name} has a theoretical occupancy of {pct}, limited by {fix}"]


def _us(s: float) -> str:
    return f"{s * 1e6:.1f} us"
