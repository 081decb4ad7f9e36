"""Advice: rules that read a profile and the schedule and say what to change.

Each rule looks at one launched kernel (or at the call) and, when its problem is there, says
what it saw and which option or pass addresses it. Every piece of advice starts with its
rule's tag in brackets, so tools (and tests) can tell them apart:

* ``[coalescing]`` a global access whose stride between neighbouring ``threadIdx.x`` threads
  (`structure.AccessStride`, from the isl access relations and the thread mapping) is more
  than one element: reorder the mapping or stage the tensor through shared memory;
* ``[promotion]`` a tensor whose elements the kernel reads `REUSE_MIN` times or more each
  (reading instances / distinct elements, counted exactly) with no shared or register copy,
  where those re-reads would at least double the kernel's ideal traffic; a row kernel
  (``map-rows`` / ``map-mixed``: a ``rows`` mark) whose re-reads of a tensor are all by the
  thread that read the element (`structure.KernelStructure.same_thread_reads`) is not
  advised: its phases reuse the row the thread loaded — in registers where the phases are
  unrolled (layernorm at D=4096: D / B / 4 128-bit loads per thread, X read once), from L1/L2 where
  a long row makes them loops — and a shared copy would hold only what each thread has;
* ``[registers]`` a reduction whose threads each compute several outputs that reuse an
  operand's elements (`KernelStructure.thread_reuse`: conv's ``I`` for every ``f``) while
  neither register tiling nor private memory is on, where the PTX's hot loop shows the cost
  (more than `SHARED_BYTES_PER_FMA` shared bytes per FMA, or the accumulators read and
  written in global memory; LLVM may already hoist a reused operand, as it does conv's ``I``
  window out of the ``f`` loop, and then only those costs are named);
* ``[shared]`` (static, from the PTX: `ptx_shape.inner_loop_shape`) the hot innermost loop
  of a compute-bound kernel under `SHARED_ADVICE_BELOW` of its roofline loads, per FMA, more
  shared-memory bytes — times the mean bank-conflict degree of the shared tensors it reads
  (`ptx_shape.bank_conflicts` at the strides of `structure.AccessStride` kind ``"shared"``)
  — than an SM's shared-memory pipe feeds at full FMA rate (`SHARED_BYTES_PER_FMA`);
* ``[reduction]`` a reduction that runs on at most 32 threads in all, each doing at least
  `REDUCTION_UPDATES` of its updates one after the other;
* ``[fusion]`` a bandwidth-bound row program (`gpu_defaults.is_bandwidth_bound_rows`: the
  programs `map-rows` runs as one kernel) split into several kernels;
* ``[occupancy]`` theoretical occupancy at most `OCCUPANCY_MIN` (`OCCUPANCY_MIN_TILED` for a
  register-tiled kernel, whose independent FMAs hide latency with fewer warps), with the limit
  that binds (registers: registers per thread x threads per block against the register file),
  for a kernel under `OCCUPANCY_ADVICE_BELOW` of its roofline;
* ``[launch]`` a kernel (or a call) whose time is within `LAUNCH_FACTOR` of the launch cost;
  a split-K fold (`passes.split_k.fold_statements`) or an initialisation-only kernel (only
  ``S<k>_init`` statements: the output set to the reduction's identity before an atomic
  accumulation) is named for what it is: a fixed launch of the call's structure;
* ``[host]`` a cuda call whose time exceeds the sum of its kernels' by more than
  `HOST_GAP_FRACTION` of it and `HOST_GAP_MIN_S`: the GPU waits for the host's launch path;
* ``[ceilings]`` a measured rate more than 5% above the ceilings (they were measured low);
  each piece of work is compared with the bandwidth of its own read/write mix
  (`ceilings.Ceilings.bandwidth_for`), so a read-only kernel with the read ceiling;
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
from .units import format_si

__all__ = ["AUTOTUNE_BELOW", "HOST_GAP_FRACTION", "HOST_GAP_MIN_S", "LAUNCH_FACTOR",
           "OCCUPANCY_ADVICE_BELOW", "OCCUPANCY_MIN", "OCCUPANCY_MIN_TILED", "REUSE_MIN", "SHARED_ADVICE_BELOW",
           "SHARED_BYTES_PER_FMA", "advise", "advise_kernel", "advise_split"]

REUSE_MIN = 4.0
# a kernel at this fraction of its roofline or above gets no [occupancy] advice
OCCUPANCY_ADVICE_BELOW = 0.8
OCCUPANCY_MIN = 0.25  # at most this: advice (one 512-thread block of 78 registers per SM is 25%)
# a register-tiled kernel's independent FMAs hide latency at lower occupancy (an 8x8 tile of
# 127 registers x 256 threads, 25%, is the usual SGEMM shape): advice at this or below
OCCUPANCY_MIN_TILED = 0.125
HOST_GAP_FRACTION = 0.25
HOST_GAP_MIN_S = 5e-6
SHARED_ADVICE_BELOW = 0.8
# an SM loads 128 bytes of shared memory per clock and issues 128 fp32 FMAs per clock
# (sm_80 / sm_90): above 1 byte per FMA the shared-memory pipe, not the FMA units, bounds
SHARED_BYTES_PER_FMA = 1.0
LAUNCH_FACTOR = 2.0
AUTOTUNE_BELOW = 0.5
WARP = 32
REDUCTION_UPDATES = 64  # sequential updates per busy thread before a reduction is worth advice


def advise_kernel(fn: ir.Function, ks: KernelStructure, kp: KernelProfile, work: WorkCounts,
                  ceil: Ceilings, target: str, shape: Any = None) -> list[str]:
    """The advice for one launched kernel (``shape``: its PTX's `ptx_shape.LoopShape`)."""
    out: list[str] = []
    if target == "cuda":
        out += _coalescing(ks)
        out += _promotion(fn, ks, work)
        out += _registers(fn, ks, work, shape)
        out += _reduction(fn, ks, work)
        out += _occupancy(kp, ks.register_tiled)
        out += _shared(kp, shape)
    if ceil.launch_s > 0 and kp.time_s < LAUNCH_FACTOR * ceil.launch_s:
        out.append(_launch(fn, ks, kp, ceil))
    return out


def _launch(fn: ir.Function, ks: KernelStructure, kp: KernelProfile, ceil: Ceilings) -> str:
    from ..passes.split_k import fold_statements

    head = (f"[launch] {kp.name} takes {_us(kp.time_s)}, about the launch cost "
            f"({_us(ceil.launch_s)})")
    folds = {f"S{k}" for k in fold_statements(fn)}
    if ks.statements and set(ks.statements) <= folds:
        tensors = ", ".join(sorted({fn.statements[int(s[1:])].tensor for s in ks.statements}))
        return (f"{head}: it is the split-K fold (summing the partial products into {tensors}), "
                "a launch the split adds to every call; fewer ways (MappingOptions."
                "split_reduction) trade it against the blocks the split gains, and the call's "
                "fixed costs go with CUDA graphs (torch.cuda.graph) or larger batches")
    if ks.statements and all(s.endswith("_init") for s in ks.statements):
        tensors = ", ".join(sorted({fn.statements[int(s[1:].removesuffix('_init'))].tensor
                                    for s in ks.statements}))
        return (f"{head}: it is the output's initialisation kernel ({tensors} set to the "
                "reduction's identity before the next kernel accumulates into it atomically), "
                "a fixed launch of every call; it goes with the call's other fixed costs "
                "(CUDA graphs: torch.cuda.graph, or larger batches)")
    return (f"{head}: give each call more work (larger or batched inputs) or fuse it with its "
            "neighbours (MappingOptions fusion='max'; on cuda map_rows for row programs)")


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
    if target == "cuda":
        out += _host(whole, kernels)
    pieces = [whole, *kernels]
    top = max(pieces, key=lambda k: k.raw_fraction)
    if top.raw_fraction > 1.05:
        which = "the call" if top is whole else top.name
        bw = top.bandwidth_ceiling or ceil.bandwidth
        against = (f"the FMA ceiling {format_si(ceil.flops, 'FLOP/s')}" if top.bound == "compute"
                   else f"its bandwidth ceiling {format_si(bw, 'B/s')} for its read/write mix"
                   f"{'' if ceil.read_bandwidth else ', no read ceiling known'}")
        out.append(f"[ceilings] a measured rate ({which}) is {top.raw_fraction:.2f}x the "
                   f"roofline of the ceilings ({ceil.source}; {against}): they were measured "
                   "low; measure again (python -m tcmlir.profile --measure) or set "
                   "TCMLIR_CEILINGS")
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


def _host(whole: Any, kernels: Sequence[KernelProfile]) -> list[str]:
    """The call's time against its kernels': the rest is time the GPU waits for the host."""
    busy = sum(k.time_s for k in kernels)
    gap = whole.time_s - busy
    if whole.time_s <= 0 or gap <= HOST_GAP_FRACTION * whole.time_s or gap <= HOST_GAP_MIN_S:
        return []
    host = getattr(whole, "host_s", 0.0)
    measured = (f"; the host spends {_us(host)} per call in the launch path" if host > 0 else "")
    return [f"[host] the call takes {_us(whole.time_s)} but its {len(kernels)} kernel(s) "
            f"{_us(busy)}: for {_us(gap)} ({100 * gap / whole.time_s:.0f}%) per call the GPU "
            "waits for the host (the launch path: checking the arguments, allocating the "
            f"outputs and temporaries, zero fills, {len(kernels)} launch(es){measured}), so "
            "the call is host-bound: capture repeated calls in a CUDA graph (torch.cuda.graph "
            "is supported with torch tensors), give each call more work (larger batches), or "
            "fuse its kernels (fusion='max')"]


def _registers(fn: ir.Function, ks: KernelStructure, work: WorkCounts, shape: Any) -> list[str]:
    """Operands reused across a thread's outputs (the schedule) with no register tiling, where
    the PTX's hot loop shows the cost: shared bytes per FMA above the pipe's feed, or the
    accumulators read and written in global memory (no PTX loop: the schedule alone)."""
    from .counts import distinct_writes

    if ks.register_tiled or not ks.thread_reuse or not ks.threads:
        return []
    seen = ""
    if shape is not None and shape.fmas:
        per_fma = shape.shared_bytes / shape.fmas
        memory_acc = shape.global_stores > 0
        if per_fma <= SHARED_BYTES_PER_FMA and not memory_acc:
            return []  # the code generator already keeps the reused values in registers
        seen = (f"; its hot loop (PTX) loads {per_fma:.2f} bytes of shared memory per FMA"
                + (f" and reads and writes its accumulators in global memory "
                   f"({shape.global_loads} ld.global and {shape.global_stores} st.global "
                   f"instructions beside its {shape.fmas} FMAs)" if memory_acc else ""))
    out = []
    for name in dict.fromkeys(s for s, _ in ks.thread_reuse):
        stmt = fn.statements[int(name[1:])]
        operands = ", ".join(f"{t} ({'shared' if t in ks.promoted else 'global'} memory)"
                             for s, t in ks.thread_reuse if s == name)
        per_thread = distinct_writes(fn, name, work.sizes) / ks.threads
        out.append(f"[registers] {ks.name}'s threads each compute about {per_thread:.0f} "
                   f"outputs of statement {name} ({stmt.tensor}), all reusing the same "
                   f"elements of {operands}, with register tiling and private memory off"
                   f"{seen}: keep the accumulators and the reused operands in registers "
                   "(MappingOptions.register_tiling(...) with private_memory(True): passes "
                   "register-tile, promote-private)")
    return out


def _shared(kp: KernelProfile, shape: Any) -> list[str]:
    if shape is None or not shape.fmas or kp.bound != "compute" \
            or kp.roofline_fraction >= SHARED_ADVICE_BELOW:
        return []
    per_fma = shape.shared_bytes / shape.fmas
    conflicts = shape.bank_conflicts
    if per_fma * shape.conflict_factor <= SHARED_BYTES_PER_FMA:
        return []
    cap = min(1.0, SHARED_BYTES_PER_FMA / (per_fma * shape.conflict_factor))
    conflict = (f"; its {8 * shape.widest_load}-bit shared loads are up to {conflicts}-way bank "
                f"conflicted ({shape.why}; {shape.conflict_factor:.2f}x the wavefronts, the "
                "loads taken as shared evenly by the tensors read)" if conflicts > 1 else "")
    layout = ("; conflict-free reads restore the full shared bandwidth: interleaved register "
              "tiles, where neighbouring threads read consecutive 16-byte vectors "
              "(MappingOptions.interleave_registers(0, 4): register-tile interleave), or a "
              "padded layout" if conflicts > 1 else "")
    return [f"[shared] {kp.name} looks shared-memory bound (a static estimate from the PTX, "
            f"not a measurement): its innermost loop loads {shape.shared_bytes} bytes with "
            f"ld.shared for {shape.fmas} FMAs ({per_fma:.2f} B/FMA; an SM feeds "
            f"{SHARED_BYTES_PER_FMA:g} B/FMA at full FMA rate){conflict}, which caps it near "
            f"{100 * cap:.0f}% of the FMA peak: larger register tiles (MappingOptions."
            f"register_tiling) reuse each loaded value for more FMAs{layout}"]


def _coalescing(ks: KernelStructure) -> list[str]:
    out, seen = [], set()
    for a in ks.strides:
        if a.kind == "shared" or a.stride is None or abs(a.stride) <= 1 \
                or (a.tensor, a.kind) in seen:
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
        if ks.rows and t.tensor in ks.same_thread_reads:
            continue  # a row kernel's phases reuse the row each thread loaded: read once
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


def _occupancy(kp: KernelProfile, register_tiled: bool = False) -> list[str]:
    limit = OCCUPANCY_MIN_TILED if register_tiled else OCCUPANCY_MIN
    if kp.occupancy is None or kp.occupancy > limit:
        return []
    if kp.roofline_fraction >= OCCUPANCY_ADVICE_BELOW:
        # near its roofline a low occupancy costs nothing (the H200's softmax: 19% occupancy
        # at 98% of the read + write ceiling; its threads hold their rows in registers)
        return []
    threads = 1 if kp.block is None else kp.block[0] * kp.block[1] * kp.block[2]
    pct = f"{100 * kp.occupancy:.0f}%"
    if kp.occupancy_limiter == "registers":
        blocks = "" if kp.blocks_per_sm is None else (
            f": the SM's register file holds {kp.blocks_per_sm} block(s) at once")
        fix = (f"registers: {kp.registers} registers per thread x {threads} threads per block"
               f"{blocks}; fewer threads per block (MappingOptions.map_to_threads) or smaller "
               "tiles (tile), smaller register tiles (register_tiling), fewer unrolled "
               "statements")
    elif kp.occupancy_limiter == "shared memory":
        fix = (f"{kp.shared_bytes} bytes of shared memory per block: smaller tiles "
               "(MappingOptions.tile) or a lower max_shared_memory")
    else:
        fix = f"blocks of {threads} threads: larger blocks (MappingOptions.map_to_threads)"
    return [f"[occupancy] {kp.name} has a theoretical occupancy of {pct}, limited by {fix}"]


def _us(s: float) -> str:
    return f"{s * 1e6:.1f} us"
