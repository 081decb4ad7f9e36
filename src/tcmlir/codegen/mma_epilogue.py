"""The epilogue of a tensor-core kernel (`codegen/gpu_mma.py`): each accumulator of the
block's output tile, rounded to the output's type and put through the pointwise epilogue
statements of the `ContractionPlan` (bias, activation, ...: each element in a register cell,
read and written by those statements through `CellContext`), then stored — staged through
shared memory into 16-byte rows where the output is contiguous and aligned (coalesced), else
straight from the fragments, two neighbouring columns at once where it can. An output whose
row or column group is several runs in memory (``O(n, m, h, w)`` with columns ``n, h, w``) is
addressed run by run (`ContractionPlan.segments`)."""

from __future__ import annotations

import math

from llvmlite import ir

from .mma_ir import F32, I32, I64, if_then, round_to, store_type
from .mma_layout import c_element

__all__ = ["CellContext", "EpilogueMixin", "clamp", "unflatten"]


class EpilogueMixin:
    """The epilogue methods of `gpu_mma.MmaEmitter` (which provides the block's state: ``b``,
    ``w``, ``plan``, ``mark``, ``sizes``, ``tid``, ``lane``, ``mi``, ``ni``, ``offsets``,
    ``batch_index``, ``ring``, ``ring_bytes``, ``cell``, ``slot_acc``, ``fn``)."""

    def staged_epilogue(self) -> tuple[int, int] | None:
        """(row pitch in elements, elements per 16-byte chunk) when the output tile can go
        through shared memory and leave in 16-byte rows: the output contiguous along n (its
        innermost run of n's group: `out_run`) and aligned, every other stride and the run's
        extent whole chunks, the tile within the operand ring."""
        plan, (bm, bn, _) = self.plan, self.mark.tile
        out = self.w.fn.tensor(plan.out)
        size = out.dtype.bits // 8
        chunk = 16 // size
        pitch = bn + chunk  # one chunk of padding: the 8 rows a fragment store covers hit 8 slots
        if (not self.out_run(chunk) or plan.out not in getattr(self.w.owner, "aligned", ())
                or bm * pitch * size > self.ring_bytes):
            return None
        return pitch, chunk

    def out_run(self, width: int) -> bool:
        """Whether ``width`` neighbouring output columns from a multiple of ``width`` are
        contiguous and ``width``-aligned in memory: n's innermost run (`ContractionPlan.
        segments`) of stride 1 and extent a multiple of ``width``, every other stride too."""
        plan = self.plan
        runs = plan.segments(plan.n, plan.out_strides)
        others = [r.stride for r in (*runs[1:], *plan.segments(plan.m, plan.out_strides))]
        others += [plan.out_stride(i) for i in plan.batch]
        return (runs[0].stride == 1 and runs[0].extent % width == 0
                and all(s % width == 0 for s in others))

    def out_offset(self, m: ir.Value, n: ir.Value) -> ir.Value:
        """Elements from the batch entry's output to (m, n): run by run where a group is not
        one dimension of the output (``O(n, f, h, w)`` with rows ``n, h, w``)."""
        b, plan = self.b, self.plan
        return b.add(self.offsets[plan.out], b.add(self.group_offset(plan.m, plan.out_strides, m),
                                                   self.group_offset(plan.n, plan.out_strides, n)))

    def fragment_pairs(self):
        """This thread's accumulators in pairs of neighbouring columns: their slots and the
        (row, first column) within the block's tile, by the C fragment layout."""
        mark = self.mark
        bm, bn, _ = mark.tile
        wm_rows, wn_cols = bm // mark.warps[0], bn // mark.warps[1]
        warp = self.tid // 32
        wm, wn = warp // mark.warps[1], warp % mark.warps[1]
        for mi in range(self.mi):
            for ni in range(self.ni):
                for half in range(2):
                    regs = (2 * half, 2 * half + 1)
                    r, c = c_element(self.lane, regs[0])
                    base = (mi * self.ni + ni) * 4
                    yield ((base + regs[0], base + regs[1]), wm * wm_rows + mi * 16 + r,
                           wn * wn_cols + ni * 8 + c)

    def epilogue_staged(self, m0: ir.Value, n0: ir.Value) -> None:
        """Accumulators (rounded) into a padded ``BM x (BN + chunk)`` tile in the operand ring,
        a barrier, then every thread moves 16-byte row pieces to global memory: coalesced
        stores (a fragment's own stores cover 8 rows of 16 bytes each)."""
        b, mark, plan = self.b, self.mark, self.plan
        pitch, chunk = self.staged_epilogue()  # type: ignore[misc]
        bm, bn, _ = mark.tile
        out = self.w.fn.tensor(plan.out)
        mty = store_type(out.dtype)
        tile = b.bitcast(self.ring, mty.as_pointer(3))
        for slots, row, col in self.fragment_pairs():
            vty = ir.VectorType(mty, 2)
            vec = ir.Constant(vty, ir.Undefined)
            for j, slot in enumerate(slots):
                v = self.finish(b.load(self.slot_acc(slot), typ=F32),
                                b.add(m0, row.wide().v), b.add(n0, (col + j).wide().v))
                vec = b.insert_element(vec, v, ir.Constant(I32, j))
            ptr = b.gep(tile, [(row * pitch + col).v], inbounds=True, source_etype=mty)
            b.store(vec, b.bitcast(ptr, vty.as_pointer(3)), align=2 * (out.dtype.bits // 8))
        b.call(self.fn("llvm.nvvm.barrier0", ir.VoidType(), []), [])
        per_row = bn // chunk
        total = bm * per_row
        base = self.w.pointer(plan.out)
        vty = ir.VectorType(mty, chunk)
        big_m, big_n = self.sizes[plan.m], self.sizes[plan.n]
        for i in range(math.ceil(total / mark.threads)):
            c = self.tid + i * mark.threads
            row, col = c // per_row, (c % per_row) * chunk

            def move(row=row, col=col) -> None:
                src = b.gep(tile, [(row * pitch + col).v], inbounds=True, source_etype=mty)
                value = b.load(b.bitcast(src, vty.as_pointer(3)), typ=vty, align=16)
                m = b.add(m0, row.wide().v)
                n = b.add(n0, col.wide().v)
                ok = b.and_(b.icmp_unsigned("<", m, ir.Constant(I64, big_m)),
                            b.icmp_unsigned("<", n, ir.Constant(I64, big_n)))
                off = self.out_offset(m, n)
                dst = b.gep(base, [off], inbounds=True, source_etype=mty)
                if_then(b, ok, lambda: b.store(value, b.bitcast(dst, vty.as_pointer(1)), align=16),
                    "mma.out")

            if (i + 1) * mark.threads > total:
                if_then(b, b.icmp_unsigned("<", c.v, ir.Constant(I32, total)), move, "mma.outrow")
            else:
                move()

    def finish(self, acc: ir.Value, m: ir.Value, n: ir.Value) -> ir.Value:
        """The float32 sum ``acc`` of output element (m, n) of the current batch entry, as
        stored: rounded to the output's type, then through the epilogue statements, each
        rounding its result again (as running them one after the other does)."""
        plan = self.plan
        out = self.w.fn.tensor(plan.out)
        value = round_to(self.b, acc, out.dtype)
        if not plan.epilogue:
            return value
        from .exprs import ExprEmitter, _emit_on

        b = self.b
        if self.cell is None:
            self.cell = self.w.entry.alloca(store_type(out.dtype), name="mma.cell")
        b.store(value, self.cell)
        # indices past the ends (a tile's rest, never stored) read the last element instead
        values = {**unflatten(b, plan, plan.m, clamp(b, m, self.sizes[plan.m])),
                  **unflatten(b, plan, plan.n, clamp(b, n, self.sizes[plan.n])), **self.batch_index}
        ctx = CellContext(self.w, plan.out, self.cell)
        for j in plan.epilogue:
            st = self.w.fn.statements[j]
            env = {name: values[p] for name, p in zip(st.lhs, plan.lhs, strict=True)}
            ctx.lhs = st.lhs
            _emit_on(ExprEmitter(ctx, env, j), st, j, False, self.cell, out.dtype)
        return b.load(self.cell, typ=store_type(out.dtype))

    def epilogue(self, m0: ir.Value, n0: ir.Value) -> None:
        b, mark, plan = self.b, self.mark, self.plan
        bm, bn, _ = mark.tile
        out = self.w.fn.tensor(plan.out)
        mty = store_type(out.dtype)
        base = self.w.pointer(plan.out)
        big_m, big_n = self.sizes[plan.m], self.sizes[plan.n]
        runs = plan.segments(plan.n, plan.out_strides)
        sn, split_n = runs[0].stride, len(runs) > 1
        pairs = self.out_run(2) and plan.out in getattr(self.w.owner, "aligned", ())
        for slots, row, col in self.fragment_pairs():
            m = b.add(m0, row.wide().v)
            n = b.add(n0, col.wide().v)
            vals = [self.finish(b.load(self.slot_acc(slot), typ=F32), m, b.add(n, ir.Constant(I64, j)))
                    for j, slot in enumerate(slots)]
            off = self.out_offset(m, n)
            ok_m = b.icmp_unsigned("<", m, ir.Constant(I64, big_m))

            def store(off=off, vals=vals, m=m, n=n) -> None:
                if pairs:
                    vty = ir.VectorType(mty, 2)
                    vec = ir.Constant(vty, ir.Undefined)
                    for j, v in enumerate(vals):
                        vec = b.insert_element(vec, v, ir.Constant(I32, j))
                    ptr = b.gep(base, [off], inbounds=True, source_etype=mty)
                    b.store(vec, ptr, align=2 * (out.dtype.bits // 8))
                    return
                for j, v in enumerate(vals):
                    nj = b.add(n, ir.Constant(I64, j))
                    # (the next column: sn further, unless n's group lies in several runs)
                    at = (b.add(off, ir.Constant(I64, j * sn)) if j == 0 or not split_n
                          else self.out_offset(m, nj))
                    ptr = b.gep(base, [at], inbounds=True, source_etype=mty)
                    if_then(b, b.icmp_unsigned("<", nj, ir.Constant(I64, big_n)),
                        lambda v=v, ptr=ptr: b.store(v, ptr), "mma.col")

            full_m, full_n = big_m % bm == 0, big_n % bn == 0
            cond = None if full_m else ok_m
            if pairs and not full_n:  # n even and pairs start even: both or neither fit
                ok_n = b.icmp_unsigned("<", n, ir.Constant(I64, big_n))
                cond = ok_n if cond is None else b.and_(cond, ok_n)
            if cond is None:
                store()
            else:
                if_then(b, cond, store, "mma.row")


def unflatten(b: ir.IRBuilder, plan, dim: str, flat: ir.Value) -> dict[str, ir.Value]:
    """The index of each member of ``dim``'s group (`ContractionPlan.members`) at ``flat``."""
    out: dict[str, ir.Value] = {}
    for name in reversed(plan.members(dim)):
        ext = ir.Constant(I64, plan.index_extent(name))
        out[name] = flat if name == plan.members(dim)[0] else b.urem(flat, ext)
        flat = b.udiv(flat, ext)
    return out


def clamp(b: ir.IRBuilder, v: ir.Value, extent: int) -> ir.Value:
    last = ir.Constant(I64, extent - 1)
    return b.select(b.icmp_unsigned("<", v, last), v, last)


class CellContext:
    """The walker, with the output element of an epilogue statement in a register cell: reads
    of the output at the statement's own indices (and its store) go to the cell."""

    def __init__(self, walker, out: str, cell: ir.Value):
        self._walker, self._out, self._cell = walker, out, cell
        self.lhs: tuple[str, ...] = ()

    def __getattr__(self, name: str):
        return getattr(self._walker, name)

    def redirect(self, key: object) -> ir.Value | None:
        if key == "lhs":
            return self._cell
        if getattr(key, "tensor", None) == self._out:
            return self._cell  # (plan: the output is read only at the statement's own indices)
        return None
