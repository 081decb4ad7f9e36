"""Tensor-core kernels on NVPTX: what an ``mma S<k> ...`` mark (`passes/map_mma.py`) becomes.

The mark sits right below the kernel mark and the block filters, above the contraction's
statements; the walk does not descend into them. Instead, for the `ContractionPlan` of the
function (`poly/contraction.py`), every block walks its tiles the way the filters state (the
batch entries ``_bz, _bz + GZ, ...``, row tiles ``_by, _by + GY, ...``, column tiles ``_bx, ...``)
and computes each ``BM x BN`` output tile with ``WM x WN`` warps:

* the operand tiles of ``BK`` reduction steps go to shared memory with ``cp.async.cg ... 16``
  (16 bytes per copy, or as wide as the plan's ``Operand.copy``, else element loads; rows and
  steps past the end zero-filled with a source size of 0, never read; a row or step group
  that is several runs in memory — a convolution's im2col rows ``n, h, w`` — addressed run by
  run, `ContractionPlan.segments`) in a ring of ``stages`` buffers: the copies of step ``kt + stages - 1`` are in flight while step
  ``kt`` computes (``cp.async.wait_group stages-2`` and a barrier before each step);
* each warp owns a ``BM/WM x BN/WN`` tile of ``m16n8k16`` accumulators (float32 registers),
  reads its fragments with ``ldmatrix.x4`` (``.trans`` for operands stored row-contiguous) from
  the swizzled buffers and issues one ``mma.sync`` per 16 x 8 piece and 16 steps;
* the epilogue stores the accumulators (rounded to the output's type: the half output's
  rounding statement is fused, its float32 accumulator never exists in global memory), two
  neighbouring columns at once where the output is contiguous along them.

Every lane position comes from `codegen/mma_layout.py` (the same functions the CPU simulator
checks), evaluated on LLVM values through `mma_ir.IntV`; the epilogue is
`codegen/mma_epilogue.py`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llvmlite import ir

from ..dtypes import DType
from ..errors import CodegenError
from ..poly.contraction import ContractionPlan, MmaMark, Operand
from .mma_epilogue import EpilogueMixin
from .mma_ir import F32, I16, I32, I64, IntV, counted_loop, if_then, sreg
from .mma_layout import CHUNK, lane_row_address, swizzle
from .mma_tf32 import tf32_compute
from .target import declare

__all__ = ["MmaEmitter", "RingBuffer"]

STATIC_SHARED_BYTES = 48 * 1024   # above: dynamic shared memory, opted in at load
MAX_SHARED_BYTES = 227 * 1024     # per block on sm_90


@dataclass
class RingBuffer:
    """One operand's ring of shared tiles: ``stages`` tiles of ``rows x row_len`` halves."""

    operand: Operand
    rows: int        # storage rows per tile
    row_len: int     # halves per storage row
    array: ir.Value  # [stages * rows * row_len x i16] addrspace(3)
    array_type: ir.Type
    atom: int = 0    # > 0: rows stored in blocks of this many columns, one block after the
    #                  other (wgmma's MN-major 128-byte atoms: 64 halves x the tile's rows)

    @property
    def elems(self) -> int:
        return self.rows * self.row_len

    def slot(self, b: ir.IRBuilder, stage: IntV, srow: IntV, scol: IntV) -> ir.Value:
        """Pointer to storage (srow, scol) of tile ``stage`` (``scol`` a multiple of 8)."""
        if self.atom:
            block, inner = scol // self.atom, scol % self.atom
            chunk = swizzle(srow, self.atom // CHUNK) ^ (inner // CHUNK)
            index = (stage * self.elems + block * (self.rows * self.atom) + srow * self.atom
                     + chunk * CHUNK)
        else:
            chunk = swizzle(srow, self.row_len // CHUNK) ^ (scol // CHUNK)
            index = stage * self.elems + srow * self.row_len + chunk * CHUNK
        return b.gep(self.array, [ir.Constant(I32, 0), index.v], inbounds=True,
                     source_etype=self.array_type)


class MmaEmitter(EpilogueMixin):
    def __init__(self, walker, plan: ContractionPlan, mark: MmaMark):
        self.w, self.plan, self.mark = walker, plan, mark
        self.b: ir.IRBuilder = walker.builder
        bm, bn, bk = mark.tile
        wm, wn = mark.warps
        if bm % (16 * wm) or bn % (16 * wn) or bk % 16:
            raise CodegenError(f"mark {mark.name!r}: the warp tiles must be multiples of 16x16 "
                               "and the k tile of 16")
        self.mi, self.ni = bm // wm // 16, bn // wn // 8
        self.sizes = {i: plan.extent(i) for i in (plan.m, plan.n, plan.k)}
        mod = self.b.module
        fname = walker.llfn.name
        self.units = plan.dtype.bits // 16  # 16-bit storage units per element (2: float32)
        u = self.units
        shapes = [((rows, bk * u) if op.k_major else (bk, rows * u))
                  for op, rows in ((plan.a, bm), (plan.b, bn))]
        nbytes = sum(r * c for r, c in shapes) * 2 * mark.stages
        if nbytes > MAX_SHARED_BYTES:
            raise CodegenError(f"mark {mark.name!r}: {nbytes} bytes of shared memory "
                               f"({MAX_SHARED_BYTES} at most)")
        if nbytes > STATIC_SHARED_BYTES:  # the launch's dynamic shared memory (`KernelLaunch`)
            ring = mod.globals.get("tcmlir_dynamic_shared") or ir.GlobalVariable(
                mod, ir.ArrayType(I16, 0), "tcmlir_dynamic_shared", addrspace=3)
            walker.owner.kernel_shared_bytes = nbytes
        else:
            ring = ir.GlobalVariable(mod, ir.ArrayType(I16, nbytes // 2), f"{fname}.mma_ring",
                                     addrspace=3)
            ring.linkage = "internal"
            ring.initializer = ir.Constant(ring.value_type, ir.Undefined)
        ring.align = 128
        self.ring, self.ring_bytes = ring, nbytes
        self.cell: ir.Value | None = None  # the element the epilogue statements work on
        self.bufs = []
        start = 0
        for (op, _), (srows, row_len) in zip(((plan.a, bm), (plan.b, bn)), shapes, strict=True):
            elems = mark.stages * srows * row_len
            ty = ir.ArrayType(I16, elems)
            gv = walker.entry.gep(ring, [ir.Constant(I32, 0), ir.Constant(I32, start)], inbounds=True,
                                  source_etype=ring.value_type)
            start += elems
            self.bufs.append(RingBuffer(op, srows, row_len, gv, ty))

    # ---- pieces

    def before_barrier(self) -> None:
        """Hook: what the waited-for copies need before the barrier that publishes them."""

    def prefetch_distance(self) -> int:
        """Steps whose copies are in flight ahead of the one computing: the ring's other
        slots (each slot is free again once the barrier after its step is passed)."""
        return self.mark.stages - 1

    def drain(self) -> None:
        """Hook: wait for asynchronous tensor-core work before the epilogue."""

    def fn(self, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
        return declare(self.b.module, name, ir.FunctionType(ret, args))

    def v32(self, value: ir.Value) -> IntV:
        return IntV(self.b, value)

    def run(self) -> None:
        b, mark, plan = self.b, self.mark, self.plan
        tid = self.v32(sreg(b, "tid.x"))
        self.lane = tid % 32
        self.tid = tid
        entry = self.w.entry
        self.acc = entry.alloca(F32, size=self.mi * self.ni * 4, name="mma.acc")
        bx, by, bz = (b.zext(sreg(b, f"ctaid.{d}"), I64) for d in "xyz")
        bm, bn, _ = mark.tile
        tiles_m = math.ceil(self.sizes[plan.m] / bm)
        tiles_n = math.ceil(self.sizes[plan.n] / bn)
        gx, gy, gz = mark.grid

        def batch(bflat: ir.Value) -> None:
            self.batch_offsets(bflat)
            counted_loop(b, by, tiles_m, gy, lambda tm: counted_loop(
                b, bx, tiles_n, gx, lambda tn: self.tile(tm, tn), "mma.tn"), "mma.tm")

        counted_loop(b, bz, plan.batch_count, gz, batch, "mma.batch")

    def batch_offsets(self, bflat: ir.Value) -> None:
        b, plan = self.b, self.plan
        # per operand (one tensor may be both, read at other indices) and the output: the
        # constant terms of the index expressions, then the batch entry's elements
        self.offsets: dict[Operand | str, ir.Value] = {
            plan.a: ir.Constant(I64, plan.a.base), plan.b: ir.Constant(I64, plan.b.base),
            plan.out: ir.Constant(I64, 0)}
        self.batch_index: dict[str, ir.Value] = {}
        inner = 1
        for name in reversed(plan.batch):
            ext = plan.extent(name)
            idx = b.urem(b.udiv(bflat, ir.Constant(I64, inner)), ir.Constant(I64, ext))
            self.batch_index[name] = idx
            inner *= ext
            for t, stride in ((plan.a, plan.a.stride(name)), (plan.b, plan.b.stride(name)),
                              (plan.out, plan.out_stride(name))):
                if stride:
                    self.offsets[t] = b.add(self.offsets[t], b.mul(idx, ir.Constant(I64, stride)))

    def tile(self, tm: ir.Value, tn: ir.Value) -> None:
        b, mark, plan = self.b, self.mark, self.plan
        bm, bn, bk = mark.tile
        m0 = b.mul(tm, ir.Constant(I64, bm))
        n0 = b.mul(tn, ir.Constant(I64, bn))
        zero = ir.Constant(F32, 0.0)
        for i in range(self.mi * self.ni * 4):
            b.store(zero, self.slot_acc(i))
        ktiles = math.ceil(self.sizes[plan.k] / bk)
        stages = mark.stages
        commit = self.fn("llvm.nvvm.cp.async.commit.group", ir.VoidType(), [])
        wait = self.fn("llvm.nvvm.cp.async.wait.group", ir.VoidType(), [I32])
        barrier = self.fn("llvm.nvvm.barrier0", ir.VoidType(), [])
        ahead = self.prefetch_distance()
        for s in range(ahead):
            if s < ktiles:
                self.load_stage(s, ir.Constant(I64, s), m0, n0)
            b.call(commit, [])

        def step(kt: ir.Value) -> None:
            b.call(wait, [ir.Constant(I32, ahead - 1)])  # step kt's copies have landed
            self.before_barrier()
            b.call(barrier, [])
            nk = b.add(kt, ir.Constant(I64, ahead))
            if_then(b, b.icmp_unsigned("<", nk, ir.Constant(I64, ktiles)),
                lambda: self.load_stage(b.trunc(b.urem(nk, ir.Constant(I64, stages)), I32), nk, m0, n0),
                "mma.next")
            b.call(commit, [])
            self.compute(self.v32(b.trunc(b.urem(kt, ir.Constant(I64, stages)), I32)))

        counted_loop(b, ir.Constant(I64, 0), ktiles, 1, step, "mma.k")
        self.drain()
        b.call(wait, [ir.Constant(I32, 0)])
        b.call(barrier, [])
        if self.staged_epilogue():
            self.epilogue_staged(m0, n0)
            b.call(barrier, [])  # the next tile's copies overwrite the staged outputs
        else:
            self.epilogue(m0, n0)

    def slot_acc(self, i: int) -> ir.Value:
        return self.b.gep(self.acc, [ir.Constant(I32, i)], inbounds=True, source_etype=F32)

    def load_stage(self, stage: int | ir.Value, kt: ir.Value, m0: ir.Value, n0: ir.Value) -> None:
        """Issue the copies of reduction step ``kt`` into ring slot ``stage``."""
        b = self.b
        stage_v = self.v32(stage if isinstance(stage, ir.Value) else ir.Constant(I32, stage))
        k0 = b.mul(kt, ir.Constant(I64, self.mark.tile[2]))
        threads = self.mark.threads
        for buf, r0 in zip(self.bufs, (m0, n0), strict=True):
            total = buf.rows * (buf.row_len // CHUNK)
            for i in range(math.ceil(total / threads)):
                c = self.tid + i * threads
                if (i + 1) * threads > total:  # fewer copies than threads: the rest idle
                    if_then(b, b.icmp_unsigned("<", c.v, ir.Constant(I32, total)),
                        lambda c=c, buf=buf, r0=r0: self.copy_chunk(buf, c, r0, k0, stage_v),
                        "mma.copy")
                else:
                    self.copy_chunk(buf, c, r0, k0, stage_v)

    def copy_chunk(self, buf: RingBuffer, c: IntV, r0: ir.Value, k0: ir.Value, stage: IntV) -> None:
        """Chunk ``c`` (16 bytes along the storage row) of ``buf``'s tile, rows from ``r0``,
        steps from ``k0``. Where the operand is 16-byte aligned (the kernel's aligned tensors)
        the plan's ``copy`` width says how: ``cp.async`` of 16, 8 or 4 bytes each, the bytes
        past the end of the contiguous dimension zero-filled by a shorter source size; else
        element loads (zero past the ends) and one 16-byte store. Along a dimension that is
        several runs in memory (`ContractionPlan.segments`: ``w`` of ``I(n, c, h + kh, w +
        kw)``) each copy (no wider than a run, `Operand.copy`) or element finds its own
        address; a row or step past the end is never read."""
        b, plan = self.b, self.plan
        op = buf.operand
        per_row = buf.row_len // CHUNK
        epc = CHUNK // self.units  # elements per chunk
        srow, sch = c // per_row, c % per_row
        if op.k_major:
            row, k = b.add(r0, srow.wide().v), b.add(k0, (sch * epc).wide().v)
            outer_ok = b.icmp_unsigned("<", row, ir.Constant(I64, self.sizes[op.row]))
            inner, inner_ext, dim = k, self.sizes[plan.k], plan.k
        else:
            k, row = b.add(k0, srow.wide().v), b.add(r0, (sch * epc).wide().v)
            outer_ok = b.icmp_unsigned("<", k, ir.Constant(I64, self.sizes[plan.k]))
            inner, inner_ext, dim = row, self.sizes[op.row], op.row
        runs = plan.segments(dim, op.strides)
        inner_stride = runs[0].stride

        def offset(row: ir.Value, k: ir.Value) -> ir.Value:
            return b.add(self.offsets[op], b.add(self.group_offset(op.row, op.strides, row),
                                                        self.group_offset(plan.k, op.strides, k)))

        crossing: list[ir.Value] = []  # (left, the next run's first offset), once

        def at(off: ir.Value, step: int) -> ir.Value:  # ``step`` elements further along ``dim``
            if len(runs) == 1:
                return b.add(off, ir.Constant(I64, step * inner_stride))
            if runs[0].extent < epc:  # several runs within a chunk: each element from scratch
                nxt = b.add(inner, ir.Constant(I64, step))
                return offset(row, nxt) if op.k_major else offset(nxt, k)
            # at most one run boundary within the chunk, ``left`` elements from its start
            if not crossing:
                left = b.sub(ir.Constant(I64, runs[0].extent),
                             b.urem(inner, ir.Constant(I64, runs[0].extent)))
                nxt = b.add(inner, left)
                crossing.extend((left, offset(row, nxt) if op.k_major else offset(nxt, k)))
            left, after = crossing
            same = b.add(off, ir.Constant(I64, step * inner_stride))
            beyond = b.add(after, b.mul(b.sub(ir.Constant(I64, step), left),
                                        ir.Constant(I64, inner_stride)))
            return b.select(b.icmp_unsigned("<", ir.Constant(I64, step), left), same, beyond)

        off = offset(row, k)
        dst = buf.slot(b, stage, srow, sch * CHUNK)
        base = self.w.pointer(op.tensor)
        esize = 2 * self.units
        width = op.copy if op.tensor in getattr(self.w.owner, "aligned", ()) else 1
        etype = I16 if self.units == 1 else I32
        if width * esize >= 4:
            cache = "cg" if width == epc else "ca"  # (.cg exists for 16 bytes only)
            copy = self.fn(f"llvm.nvvm.cp.async.{cache}.shared.global.{esize * width}.s",
                           ir.VoidType(), [ir.PointerType(addrspace=3), ir.PointerType(addrspace=1), I32])
            for p in range(epc // width):
                start = b.add(inner, ir.Constant(I64, p * width))
                valid = b.and_(outer_ok, b.icmp_unsigned("<", start, ir.Constant(I64, inner_ext)))
                if inner_ext % width:  # the last piece of a row is partly past the end
                    left = b.trunc(b.sub(ir.Constant(I64, inner_ext), start), I32)
                    n = b.select(b.icmp_unsigned("<", left, ir.Constant(I32, width)), left,
                                 ir.Constant(I32, width))
                    nbytes = b.select(valid, b.mul(n, ir.Constant(I32, esize)), ir.Constant(I32, 0))
                else:
                    nbytes = b.select(valid, ir.Constant(I32, esize * width), ir.Constant(I32, 0))
                # (a float32 operand with no contiguous dimension: width 1, strided)
                src_off = b.select(valid, off if p == 0 else at(off, p * width), ir.Constant(I64, 0))
                src = b.gep(base, [src_off], inbounds=True, source_etype=etype)
                piece = dst if p == 0 else b.gep(dst, [ir.Constant(I32, p * width * self.units)],
                                                 inbounds=True, source_etype=I16)
                b.call(copy, [piece, src, nbytes])
            return
        vec = ir.Constant(ir.VectorType(etype, epc), None)
        for e in range(epc):
            nxt = b.add(inner, ir.Constant(I64, e))
            valid = b.and_(outer_ok, b.icmp_unsigned("<", nxt, ir.Constant(I64, inner_ext)))
            where = b.select(valid, off if e == 0 else at(off, e), ir.Constant(I64, 0))
            src = b.gep(base, [where], inbounds=True, source_etype=etype)
            val = b.select(valid, b.load(src, typ=etype), ir.Constant(etype, 0))
            vec = b.insert_element(vec, val, ir.Constant(I32, e))
        b.store(vec, b.bitcast(dst, vec.type.as_pointer(3)), align=16)

    def group_offset(self, dim: str, strides, flat: ir.Value) -> ir.Value:
        """Elements from index 0 to flat position ``flat`` of ``dim``'s group in a tensor of
        ``strides``: one product where the group is one dimension of it, else run by run
        (`ContractionPlan.segments`; ``flat`` past the end gives an address never used)."""
        b = self.b
        runs = self.plan.segments(dim, strides)
        total: ir.Value | None = None
        for j, run in enumerate(runs):
            v = flat if run.below == 1 else b.udiv(flat, ir.Constant(I64, run.below))
            if j < len(runs) - 1:
                v = b.urem(v, ir.Constant(I64, run.extent))
            term = b.mul(v, ir.Constant(I64, run.stride))
            total = term if total is None else b.add(total, term)
        assert total is not None
        return total

    def compute(self, stage: IntV) -> None:
        if self.units == 2:  # float32 operands: TF32 fragments
            tf32_compute(self, stage)
            return
        b, mark, plan = self.b, self.mark, self.plan
        bm, bn, bk = mark.tile
        wm_rows, wn_cols = bm // mark.warps[0], bn // mark.warps[1]
        warp = self.tid // 32
        wm = warp // mark.warps[1]
        wn = warp % mark.warps[1]
        s4 = ir.LiteralStructType([I32] * 4)
        p3 = ir.PointerType(addrspace=3)
        lds = {t: self.fn("llvm.nvvm.ldmatrix.sync.aligned.m8n8.x4" + (".trans" if t else "") + ".b16",
                          s4, [p3]) for t in (False, True)}
        if plan.dtype is DType.BFLOAT16:
            mma = self.fn("llvm.nvvm.mma.m16n8k16.row.col.bf16", ir.LiteralStructType([F32] * 4),
                          [I32] * 6 + [F32] * 4)
            conv = lambda x: x  # noqa: E731
        else:
            h2 = ir.VectorType(ir.HalfType(), 2)
            mma = self.fn("llvm.nvvm.mma.m16n8k16.row.col.f32.f32", ir.LiteralStructType([F32] * 4),
                          [h2] * 6 + [F32] * 4)
            conv = lambda x: b.bitcast(x, h2)  # noqa: E731
        abuf, bbuf = self.bufs
        accs = [b.load(self.slot_acc(i), typ=F32) for i in range(self.mi * self.ni * 4)]
        for kk in range(bk // 16):
            afr = []
            for mi in range(self.mi):
                r, c = lane_row_address(self.lane, "a", abuf.operand.k_major)
                base = wm * wm_rows + mi * 16
                srow, scol = (base + r, c + kk * 16) if abuf.operand.k_major else (r + kk * 16, base + c)
                res = b.call(lds[not abuf.operand.k_major], [abuf.slot(b, stage, srow, scol)])
                afr.append([conv(b.extract_value(res, j)) for j in range(4)])
            bfr = []
            for nj in range(self.ni // 2):
                r, c = lane_row_address(self.lane, "b", bbuf.operand.k_major)
                base = wn * wn_cols + nj * 16
                srow, scol = (base + r, c + kk * 16) if bbuf.operand.k_major else (r + kk * 16, base + c)
                res = b.call(lds[not bbuf.operand.k_major], [bbuf.slot(b, stage, srow, scol)])
                regs = [conv(b.extract_value(res, j)) for j in range(4)]
                bfr += [regs[0:2], regs[2:4]]
            for mi in range(self.mi):
                for ni in range(self.ni):
                    at = (mi * self.ni + ni) * 4
                    d = b.call(mma, afr[mi] + bfr[ni] + accs[at:at + 4])
                    accs[at:at + 4] = [b.extract_value(d, j) for j in range(4)]
        for i, v in enumerate(accs):
            b.store(v, self.slot_acc(i))
