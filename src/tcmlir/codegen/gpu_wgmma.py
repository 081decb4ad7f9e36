"""Hopper tensor cores: the ``wgmma`` form of an ``mma ... wgmma`` mark (sm_90a).

The block, its tiles, the ``cp.async`` ring and the epilogue are those of `codegen/gpu_mma.py`;
what changes is the inner step. Each warpgroup (4 warps, 128 threads) owns 64 output rows of the
``BM x BN`` tile and issues, per 16 reduction steps, one asynchronous
``wgmma.mma_async.sync.aligned.m64n{BN}k16.f32.{f16,bf16}`` whose operands stay in shared memory,
described by 64-bit matrix descriptors (start address, stride between 8-row core-matrix groups
1024 bytes, 128-byte swizzle). An operand contiguous along k is stored k-major, 64 halves (128 bytes)
per row; one contiguous along its rows (``B(k, n)``, ``A(k, m)``) MN-major, in atoms of 64 rows
x ``BK`` steps, each step a 128-byte row (``imm-trans`` set). Either way chunk ``c`` of storage
row ``r`` sits at ``c ^ (r % 8)`` — the hardware's 128-byte swizzle (`mma_layout.swizzle`),
which needs the ring 1024-byte aligned.

Per reduction tile: the ``cp.async`` copies of this tile are waited for, made visible to the
async proxy (``fence.proxy.async.shared::cta``) and to every thread (a barrier); the copies of a
later tile are issued; then ``wgmma.fence``, ``BK / 16`` wgmma, ``commit_group`` and
``wait_group 0`` (the ring slot the next copies overwrite is no longer read). The accumulator
of ``m64nNk16`` gives warp ``w`` of a warpgroup rows ``16 w ..``, and within the warp the
``mma.sync`` C layout per 8 columns — so with ``warps = (BM / 16, 1)`` the accumulator array and
the epilogue of `gpu_mma` apply unchanged.

`emit_mma` (what `nvptx.NvptxTarget.mark` calls for an ``mma`` mark) picks this emitter or
`gpu_mma.MmaEmitter` (mma.sync): it lives here, above both.
"""

from __future__ import annotations

from llvmlite import ir

from ..dtypes import DType
from ..errors import CodegenError
from ..poly.contraction import WGMMA_ROW_HALVES as ROW_HALVES
from ..poly.contraction import MmaMark, contraction_plan, wgmma_problem
from .gpu_mma import F32, I32, I64, IntV, MmaEmitter
from .target import declare

__all__ = ["WgmmaEmitter", "emit_mma"]



class WgmmaEmitter(MmaEmitter):
    """`MmaEmitter` with the warpgroup step (see the module docstring)."""

    def __init__(self, walker, plan, mark):
        why = wgmma_problem(plan, mark.tile, mark.warps)
        if why is not None:
            raise CodegenError(f"mark {mark.name!r}: {why}")
        super().__init__(walker, plan, mark)
        self.ring.align = 1024
        for buf in self.bufs:  # an operand contiguous along its rows: MN-major atoms
            if not buf.operand.k_major:
                buf.atom = ROW_HALVES
        walker.owner.needs_sm90a = True

    def asm(self, text: str, ret: ir.Type, args: list[ir.Value], constraints: str) -> ir.Value:
        fnty = ir.FunctionType(ret, [a.type for a in args])
        return self.b.asm(fnty, text, constraints, args, side_effect=True)

    def before_barrier(self) -> None:
        """The waited-for cp.async writes, visible to wgmma's (async proxy) reads."""
        self.asm("fence.proxy.async.shared::cta;", ir.VoidType(), [], "~{memory}")

    @property
    def overlap(self) -> bool:
        """Keep one step's wgmma in flight while the next is issued (3 stages or more)."""
        return self.mark.stages >= 3

    def prefetch_distance(self) -> int:
        # with a step's wgmma still reading its slot, copies may refill only the slot of
        # the step before it: one slot fewer ahead
        return self.mark.stages - 2 if self.overlap else self.mark.stages - 1

    def wgmma_wait(self, pending: int) -> None:
        b = self.b
        b.call(declare(b.module, "llvm.nvvm.wgmma.wait_group.sync.aligned",
                       ir.FunctionType(ir.VoidType(), [I64])), [ir.Constant(I64, pending)])

    def drain(self) -> None:
        self.wgmma_wait(0)

    def descriptor(self, buf, stage: IntV, row: ir.Value, kk: int) -> ir.Value:
        """The matrix descriptor of ``buf``'s tile in ring slot ``stage``: operand rows from
        ``row`` (a multiple of 8, or of 64 for MN-major atoms), reduction steps ``16 kk ..``.
        K-major: storage rows are operand rows, 16 steps are 32 bytes along a row (the
        hardware applies the swizzle to the address), 8-row groups 1024 bytes apart (SBO).
        MN-major: storage rows are steps, 16 of them 2048 bytes; 64-row atoms LBO apart,
        8-step groups 1024 bytes apart (SBO)."""
        b = self.b
        zero = IntV(b, ir.Constant(I32, 0))
        if buf.operand.k_major:
            ptr = buf.slot(b, stage, IntV(b, row), zero)
            addr = b.add(b.ptrtoint(ptr, I64), ir.Constant(I64, kk * 32))
            lbo = 16
        else:
            ptr = buf.slot(b, stage, IntV(b, ir.Constant(I32, 16 * kk)), IntV(b, row))
            addr = b.ptrtoint(ptr, I64)
            lbo = buf.rows * buf.atom * 2  # bytes from one 64-row atom column to the next
        start = b.and_(b.lshr(addr, ir.Constant(I64, 4)), ir.Constant(I64, 0x3FFF))
        fixed = ((lbo >> 4) << 16) | ((1024 >> 4) << 32) | (1 << 62)  # SBO 1024, 128B swizzle
        return b.or_(start, ir.Constant(I64, fixed))

    def compute(self, stage: IntV) -> None:
        b, mark, plan = self.b, self.mark, self.plan
        _, bn, bk = mark.tile
        n_acc = self.mi * self.ni * 4  # = bn / 2 per thread
        accs = [b.load(self.slot_acc(i), typ=F32) for i in range(n_acc)]
        group = self.tid // 128
        abuf, bbuf = self.bufs
        kind = "bf16" if plan.dtype is DType.BFLOAT16 else "f16"
        outs = ",".join(f"${i}" for i in range(n_acc))
        text = ("{ .reg .pred p; setp.ne.b32 p, 1, 0; "
                f"wgmma.mma_async.sync.aligned.m64n{bn}k16.f32.{kind}.{kind} "
                f"{{{outs}}}, ${n_acc * 2}, ${n_acc * 2 + 1}, p, 1, 1, "
                f"{int(not abuf.operand.k_major)}, {int(not bbuf.operand.k_major)}; }}")
        constraints = ",".join(["=f"] * n_acc + [str(i) for i in range(n_acc)] + ["l", "l"])
        ret = ir.LiteralStructType([F32] * n_acc)
        void = ir.FunctionType(ir.VoidType(), [])
        b.call(declare(b.module, "llvm.nvvm.wgmma.fence.sync.aligned", void), [])
        for kk in range(bk // 16):
            # this warpgroup's 64 rows of A: a row offset inside the slot (multiple of 8 rows)
            a_row = b.mul(group.v, ir.Constant(I32, 64))
            da = self.descriptor(abuf, stage, a_row, kk)
            db = self.descriptor(bbuf, stage, ir.Constant(I32, 0), kk)
            d = self.asm(text, ret, [*accs, da, db], constraints)
            accs = [b.extract_value(d, i) for i in range(n_acc)]
        b.call(declare(b.module, "llvm.nvvm.wgmma.commit_group.sync.aligned", void), [])
        self.wgmma_wait(1 if self.overlap else 0)
        for i, v in enumerate(accs):
            b.store(v, self.slot_acc(i))


def emit_mma(walker, mark: MmaMark) -> None:
    """The whole tensor-core kernel body for ``mark`` at the walker's builder position: the
    wgmma emitter below where the mark asks for it and the arch has it, else `MmaEmitter`'s
    mma.sync (here, above both emitters, so that `gpu_mma` need not import this module)."""
    plan = contraction_plan(walker.fn, walker.owner.sizes, tf32=mark.tf32)
    if isinstance(plan, str):
        raise CodegenError(f"mark {mark.name!r}: {plan}")
    if mark.wgmma and walker.owner.target_arch_number() >= 90:
        WgmmaEmitter(walker, plan, mark).run()
    else:  # (wgmma exists from sm_90 on: elsewhere the same tiles run on mma.sync)
        MmaEmitter(walker, plan, mark).run()
    local = getattr(walker, "local_seen", None)
    if local is not None and plan.cast is not None:
        local.add(plan.acc)  # the float32 accumulator stays in registers
