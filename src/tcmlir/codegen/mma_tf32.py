"""The reduction step of a TF32 tensor-core kernel (`codegen/gpu_mma.py`, ``mma ... tf32``
marks: float32 operands, allowed only on request, `MappingOptions.tensor_cores(...,
precision="tf32")`).

The operand tiles are those of the 16-bit kernel with every float32 element two 16-bit units
(rows of ``2 BK`` units k-major, else ``2 BM`` / ``2 BN``), so the ring, its swizzle and the
copies are shared. Per 8 reduction steps each warp loads its fragments — k-major ones with
``ldmatrix.x4`` at the 16-bit layouts' lane addresses (which yields exactly the TF32 fragments,
`codegen/mma_layout.py`), row-major ones element by element (``ldmatrix.trans`` would split
32-bit elements) — rounds them to TF32 (``cvt.rna.tf32.f32``) and issues one
``mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32`` per 16 x 8 piece.
"""

from __future__ import annotations

from llvmlite import ir

from .mma_ir import F32, I32, IntV
from .mma_layout import CHUNK, a_element_tf32, b_element_tf32, lane_row_address

__all__ = ["tf32_compute"]


def tf32_compute(em, stage: IntV) -> None:
    """Step ``stage`` of the ring for emitter ``em`` (a `gpu_mma.MmaEmitter`)."""
    b, mark = em.b, em.mark
    bm, bn, bk = mark.tile
    wm_rows, wn_cols = bm // mark.warps[0], bn // mark.warps[1]
    warp = em.tid // 32
    wm, wn = warp // mark.warps[1], warp % mark.warps[1]
    s4 = ir.LiteralStructType([I32] * 4)
    lds = em.fn("llvm.nvvm.ldmatrix.sync.aligned.m8n8.x4.b16", s4, [ir.PointerType(addrspace=3)])
    mma = em.fn("llvm.nvvm.mma.m16n8k8.row.col.tf32", ir.LiteralStructType([F32] * 4),
                [I32] * 6 + [F32] * 4)
    rna = em.fn("llvm.nvvm.f2tf32.rna", I32, [F32])
    abuf, bbuf = em.bufs

    def tf32(bits: ir.Value) -> ir.Value:
        return b.call(rna, [b.bitcast(bits, F32)])

    def element(buf, srow: IntV, col: IntV) -> ir.Value:
        """The float32 bits at storage row ``srow``, element column ``col`` (row-major tiles)."""
        unit = col * 2
        ptr = buf.slot(b, stage, srow, (unit // CHUNK) * CHUNK)
        ptr = b.gep(ptr, [(unit % CHUNK).v], inbounds=True, source_etype=ir.IntType(16))
        return b.load(b.bitcast(ptr, I32.as_pointer(3)), typ=I32, align=4)

    accs = [b.load(em.slot_acc(i), typ=F32) for i in range(em.mi * em.ni * 4)]
    for kk in range(bk // 8):
        afr = []
        for mi in range(em.mi):
            base = wm * wm_rows + mi * 16
            if abuf.operand.k_major:
                r, c = lane_row_address(em.lane, "a", True)
                res = b.call(lds, [abuf.slot(b, stage, base + r, c + kk * 16)])
                regs = [b.extract_value(res, j) for j in range(4)]
            else:  # [k][m]
                regs = []
                for i in range(4):
                    r, k = a_element_tf32(em.lane, i)
                    regs.append(element(abuf, k + kk * 8, base + r))
            afr.append([tf32(x) for x in regs])
        bfr = []
        for nj in range(em.ni // 2):
            base = wn * wn_cols + nj * 16
            if bbuf.operand.k_major:
                r, c = lane_row_address(em.lane, "b", True)
                res = b.call(lds, [bbuf.slot(b, stage, base + r, c + kk * 16)])
                regs = [b.extract_value(res, j) for j in range(4)]
            else:  # [k][n]: n-tile j // 2, register j % 2
                regs = []
                for j in range(4):
                    k, n = b_element_tf32(em.lane, j % 2)
                    regs.append(element(bbuf, k + kk * 8, base + 8 * (j // 2) + n))
            regs = [tf32(x) for x in regs]
            bfr += [regs[0:2], regs[2:4]]
        for mi in range(em.mi):
            for ni in range(em.ni):
                at = (mi * em.ni + ni) * 4
                d = b.call(mma, afr[mi] + bfr[ni] + accs[at:at + 4])
                accs[at:at + 4] = [b.extract_value(d, j) for j in range(4)]
    for i, v in enumerate(accs):
        b.store(v, em.slot_acc(i))
