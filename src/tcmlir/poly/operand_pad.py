"""Tensor-core operands whose rows are misaligned, copied first into aligned temporaries.

A tensor-core kernel copies its operand tiles into shared memory with 16-byte ``cp.async``
only where every row of the operand starts 16 bytes aligned (`ContractionPlan`'s
``Operand.copy``): ``A(M, K)`` of float16 with ``K = 4093`` has rows 8186 bytes apart, so
its tiles are loaded element by element, synchronously, and the ring of stages no longer
hides them (measured on an H100: 4095x4097x4093 in 1.26 ms, against 0.20 ms at 4096^3).
PyTorch's inductor pads such matmuls (``torch/_inductor/fx_passes/pad_mm.py``); so does
this module, in the IR, as `passes/split_k.py` adds its partial sums:

    C(m, n) +=! A(m, k) * B(k, n)         A_pad(i0, i1) = A(i0, i1)          (i1 < K)
                                    ->    B_pad(i0, i1) = B(i0, i1)          (i1 < N)
                                          C(m, n) +=! A_pad(m, k) * B_pad(k, n)

``A_pad`` is a temporary of ``A``'s type and shape with its last dimension rounded up to a
multiple of 16 bytes (`padded_function`): every other stride becomes a multiple of 16 bytes.
Its padding is never written nor read: the kernel reads each row only up to the operand's
extent (copies reaching past it have a shorter source size, zero-filled in shared memory),
so the sums are those of the unpadded program. Where the reduction indices are several runs
of an operand (an NHWC convolution, ``I(n, h + kh, w + kw, c) * Wt(m, kh, kw, c)``: runs of
``C`` channels), padding the rows cannot align them: both operands are padded along their
common last index ``c`` instead and the contraction runs ``c`` over the padding as well,
which the runtime zero-fills (``binding.needs_zero_fill``: it is read), so it adds nothing.
The copies are the statements
`contraction.operand_copies` recognises before the contraction; `passes/map_mma.py` makes
them one elementwise kernel launched before the tensor-core kernel.

`pad_saving` is the cost model that decides it by default: the time the narrow loads lose
against the time the copies take (bytes at HBM speed, zero fills included, and a launch) and
the tensor-core work of a reduction run over padding.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from .. import ir
from ..binding import needs_zero_fill
from .contraction import ContractionPlan, Operand, contraction_plan

__all__ = ["ASYNC_COPY_S", "COPY_BYTES_PER_S", "COPY_LAUNCH_S", "ELEMENT_LOAD_S", "TENSOR_FLOPS", "copy_loss",
           "pad_saving", "padded_function", "padded_operands"]

# Measured on an H100 (tools/bench_mma.py, 2026-12-06; wgmma 128x256x64 tiles, 4 stages, one
# block per SM): 4095x4097x4093 with element loads of both operands took 1.2604 ms against
# ~0.254 ms for the aligned kernel at those sizes (0.2036 ms at 4096^3 with 4 waves of blocks,
# 5 waves here): 1.006 ms over 855.6 M elements loaded -> 1.2 ps per element (GPU-wide);
# 4096x4096x4092 (A in 8-byte copies) took 0.2318 ms against 0.2036: 28.2 us over 33.5 M
# copies beyond the 16-byte ones -> 0.84 ps per extra copy.
ELEMENT_LOAD_S = 1.2e-12      # per operand element loaded into shared memory by a thread
ASYNC_COPY_S = 0.84e-12       # per cp.async beyond those 16-byte copies would need
COPY_BYTES_PER_S = 2.0e12     # read + written by the copy kernel (element by element: 2/3 of
#                               the 3.0 TB/s copy ceiling, `cost_model.Gpu.dram_bytes_per_s`)
COPY_LAUNCH_S = 5e-6          # one more launch, and the tail of a short kernel
TENSOR_FLOPS = 6.0e14         # half-precision tensor-core work (675 TFLOP/s at 4096^3)


def padded_operands(fn: ir.Function, plan: ContractionPlan) -> tuple[str, ...]:
    """The operand tensors of ``plan`` worth padding: inputs copied in pieces narrower than
    16 bytes (`Operand.copy`), read in full by the contraction statement only."""
    chunk = 128 // plan.dtype.bits
    out: list[str] = []
    for op in (plan.a, plan.b):
        t = fn.tensor(op.tensor)
        if op.copy < chunk and t.role is ir.Role.INPUT and op.tensor not in out:
            out.append(op.tensor)
    return tuple(out)


def _with_copies(fn: ir.Function, plan: ContractionPlan, tensors: tuple[str, ...],
                 sizes: Mapping[str, int], extend: str | None = None
                 ) -> tuple[ir.Function, dict[str, str]]:
    """``fn`` with each of ``tensors`` copied first into a padded temporary that the
    contraction statement reads instead (see the module docstring), and the temporaries'
    names by tensor. ``extend``: a reduction index that is the last index of both operands,
    whose range the contraction then runs to the padded extent (over the padding's zeros)."""
    taken = {t.name for t in fn.tensors} | set(fn.sizes)
    copies: list[ir.Statement] = []
    temps: list[ir.Tensor] = []
    renamed: dict[str, str] = {}
    chunk = 128 // plan.dtype.bits
    for name in tensors:
        src = fn.tensor(name)
        pad = ir.fresh_name(f"{name}_pad", taken)
        taken.add(pad)
        last = src.shape[-1].evaluate(sizes)
        shape = (*src.shape[:-1], ir.SizeExpr.constant(math.ceil(last / chunk) * chunk))
        temps.append(ir.Tensor(pad, src.dtype, shape, ir.Role.TEMP, src.span))
        indices = tuple(ir.fresh_name(f"{pad}_i{d}", taken) for d in range(src.rank))
        ranges = tuple(ir.IndexRange(i, ir.SizeExpr.constant(0), s)
                       for i, s in zip(indices, src.shape, strict=True))
        read = ir.Read(name, tuple(ir.Index(i) for i in indices), src.dtype.compute, src.span)
        copies.append(ir.Statement(pad, indices, None, False, read, ranges, src.span))
        renamed[name] = pad
    st = fn.statements[plan.statement]
    st = dataclasses.replace(st, rhs=_rename_reads(st.rhs, renamed))
    if extend is not None:
        hi = ir.SizeExpr.constant(math.ceil(st.range_of(extend).hi.evaluate(sizes) / chunk) * chunk)
        st = dataclasses.replace(st, ranges=tuple(
            dataclasses.replace(r, hi=hi) if r.name == extend else r for r in st.ranges))
    statements = (*fn.statements[:plan.statement], *copies, st,
                  *fn.statements[plan.statement + 1:])
    return (dataclasses.replace(fn, statements=statements, temporaries=(*fn.temporaries, *temps)),
            renamed)


def padded_function(fn: ir.Function, sizes: Mapping[str, int], tf32: bool = False
                    ) -> ir.Function:
    """``fn`` with its tensor-core operands padded (the module docstring): those whose copies
    get wider for it (an operand read along a stride, or a convolution's input whose rows
    are runs of ``w``, does not gain: it is left alone); ``fn`` itself when none gains or
    ``fn`` is no tensor-core contraction at ``sizes``."""
    plan = contraction_plan(fn, sizes, tf32=tf32)
    if isinstance(plan, str) or plan.statement:  # not a contraction, or already padded
        return fn
    tensors = padded_operands(fn, plan)
    extend = _last_reduction_index(fn, plan, sizes)
    if extend is not None and tensors:  # both operands padded along it, zeros summed
        both = tuple(dict.fromkeys((plan.a.tensor, plan.b.tensor)))
        new, renamed = _with_copies(fn, plan, both, sizes, extend)
        after = contraction_plan(new, sizes, tf32=tf32)
        assert not isinstance(after, str), after
        if all(_width(plan, t) <= _width(after, renamed[t]) for t in both) and any(
                _width(plan, t) < _width(after, renamed[t]) for t in both):
            return new
    while tensors:
        new, renamed = _with_copies(fn, plan, tensors, sizes)
        after = contraction_plan(new, sizes, tf32=tf32)
        assert not isinstance(after, str), after
        worse = [t for t in tensors if _width(plan, t) >= _width(after, renamed[t])]
        if not worse:
            return new
        tensors = tuple(t for t in tensors if t not in worse)
    return fn


def _last_reduction_index(fn: ir.Function, plan: ContractionPlan, sizes: Mapping[str, int]
                          ) -> str | None:
    """A reduction index whose extent is no multiple of 16 bytes and that both operands
    read, alone, as their last index over their whole last dimension, and nowhere else
    (``c`` of an NHWC convolution, ``I(n, h + kh, w + kw, c) * Wt(m, kh, kw, c)``): padding
    it rounds up the contiguous run of every copy (padding only the rows cannot, where the
    reduction indices are several runs), or None."""
    st = fn.statements[plan.statement]
    reads = [x for x in ir.walk(st.rhs) if isinstance(x, ir.Read)]
    chunk = 128 // plan.dtype.bits
    if len(reads) != 2 or not plan.members(plan.k)[1:]:
        return None  # (one reduction dimension of both: the rows' padding does it)
    lasts = {getattr(r.indices[-1], "name", None) for r in reads}
    if len(lasts) != 1 or None in lasts:
        return None
    (k,) = lasts
    if k not in st.reduction_indices:
        return None
    rng = st.range_of(k)
    extent = rng.hi.evaluate(sizes)
    if rng.lo.evaluate(sizes) != 0 or extent % chunk == 0:
        return None
    for r in reads:
        t = fn.tensor(r.tensor)
        uses = sum(1 for i in r.indices for x in ir.walk(i) if isinstance(x, ir.Index) and x.name == k)
        if uses != 1 or t.role is not ir.Role.INPUT or t.shape[-1].evaluate(sizes) != extent:
            return None
    return k


def _width(plan: ContractionPlan, tensor: str) -> int:
    """The narrowest copy of ``tensor`` as an operand of ``plan``."""
    return min(op.copy for op in (plan.a, plan.b) if op.tensor == tensor)


def copy_loss(plan: ContractionPlan, op: Operand, tile: tuple[int, int, int]) -> float:
    """Seconds the copies of ``op`` lose against 16-byte ``cp.async`` (the constants above):
    every block loads ``BM`` (``BN``) rows of each of its ``BK`` steps."""
    bm, bn, bk = tile
    blocks = (math.ceil(plan.extent(plan.m) / bm) * math.ceil(plan.extent(plan.n) / bn)
              * plan.batch_count)
    rows = bm if op is plan.a else bn
    loaded = blocks * rows * math.ceil(plan.extent(plan.k) / bk) * bk
    chunk = 128 // plan.dtype.bits
    if op.copy >= chunk:
        return 0.0
    if op.copy == 1:
        return loaded * ELEMENT_LOAD_S
    return loaded * (1 / op.copy - 1 / chunk) * ASYNC_COPY_S


def pad_saving(fn: ir.Function, sizes: Mapping[str, int], tile: tuple[int, int, int],
               tf32: bool = False) -> float:
    """Seconds that padding the operands (`padded_function`) saves a tensor-core kernel of
    ``tile`` at ``sizes``: the narrow copies' loss minus the copy kernel's time (bytes read
    and written at `COPY_BYTES_PER_S`, plus `COPY_LAUNCH_S`); 0 when nothing is padded."""
    plan = contraction_plan(fn, sizes, tf32=tf32)
    if isinstance(plan, str):
        return 0.0
    padded = padded_function(fn, sizes, tf32)
    if padded is fn:
        return 0.0
    after = contraction_plan(padded, sizes, tf32=tf32)
    assert not isinstance(after, str), after
    loss = sum(copy_loss(plan, op, tile) - copy_loss(after, new, tile)
               for op, new in ((plan.a, after.a), (plan.b, after.b)))
    nbytes = 0
    for st in padded.statements[:after.statement]:
        src, dst = (padded.tensor(t) for t in (st.rhs.tensor, st.tensor))  # type: ignore[union-attr]
        for t in (src, dst):
            nbytes += math.prod(d.evaluate(sizes) for d in t.shape) * t.dtype.itemsize
        if needs_zero_fill(padded, dst, sizes):  # its padding is summed: zeros first
            nbytes += math.prod(d.evaluate(sizes) for d in dst.shape) * dst.dtype.itemsize
    # a reduction run over the padding too: that much more tensor-core work
    extra = (after.extent(after.k) - plan.extent(plan.k)) * 2 * plan.extent(plan.m) \
        * plan.extent(plan.n) * plan.batch_count / TENSOR_FLOPS
    return loss - nbytes / COPY_BYTES_PER_S - COPY_LAUNCH_S - extra


def _rename_reads(e: ir.Expr, renamed: Mapping[str, str]) -> ir.Expr:
    match e:
        case ir.Read(tensor=t, indices=idx) if t in renamed:
            return dataclasses.replace(e, tensor=renamed[t],
                                       indices=tuple(_rename_reads(i, renamed) for i in idx))
        case ir.Read(indices=idx):
            return dataclasses.replace(e, indices=tuple(_rename_reads(i, renamed) for i in idx))
        case ir.Unary(operand=x) | ir.Cast(operand=x):
            return dataclasses.replace(e, operand=_rename_reads(x, renamed))
        case ir.Binary(lhs=a, rhs=b):
            return dataclasses.replace(e, lhs=_rename_reads(a, renamed), rhs=_rename_reads(b, renamed))
        case ir.Select(cond=c, then=t, orelse=o):
            return dataclasses.replace(e, cond=_rename_reads(c, renamed),
                                       then=_rename_reads(t, renamed), orelse=_rename_reads(o, renamed))
        case ir.Call(args=args):
            return dataclasses.replace(e, args=tuple(_rename_reads(a, renamed) for a in args))
    return e


