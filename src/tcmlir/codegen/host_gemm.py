"""The host's packed contraction kernel: what a ``host-gemm`` mark stands for (`passes/host_contraction.py`).

Below the mark lies one row block of a `poly.host_contraction.HostContraction` (one batch
entry, rows ``[m0, m0 + MC)``); the statements under it are not walked. The block is computed
the way BLIS/GotoBLAS do::

    for k0 in 0..K step KC:                    a slice of the reduction
      pack a: rows of the block x the slice     into MR-row panels (k-major, MR values per k)
      for n0 in 0..N step NC:
        pack b: the slice x columns n0..        into NR-column panels (NR values per k)
        for each a panel p, for each b panel q: micro-kernel, then add to the output tile

Panels are zero-padded to whole panels and to a multiple of `UNROLL` along k, so the
micro-kernel has no edge case: ``MR x NR/VW`` accumulators of type ``<VW x float>`` (kept in
registers by SROA), per k one vector load of ``b`` per ``VW`` columns, one broadcast of ``a``
per row and ``llvm.fma`` into each accumulator. The tile is added to the output (contiguous
along ``n``, its last index) with vector loads and stores when it is whole, element by element
at the edges; with the initialisation under the mark (``init``) the first slice stores
instead of adding. The packed buffers come from
``aligned_alloc`` (a failed allocation traps) and are freed at the end of the block.

The row block and batch entry are read from the AST below the mark: the first statement
instance reached through its loops' first iterations lies in the block.
"""

from __future__ import annotations

from typing import Any, Protocol

import islpy as isl
from llvmlite import ir

from .. import ir as tc
from ..errors import CodegenError
from ..poly.host_contraction import HostContraction, HostGemmMark, host_contraction


class GroupWalker(Protocol):
    """What the emitter uses of `lower.GroupWalker` (not imported: `target` imports this
    module, and `lower` imports `target`)."""

    builder: ir.IRBuilder
    entry: ir.IRBuilder
    env: dict[str, ir.Value]
    llfn: ir.Function
    fn: tc.Function
    owner: Any

    def expr(self, e: isl.AstExpr) -> ir.Value: ...

    def pointer(self, tensor: str) -> ir.Value: ...


__all__ = ["UNROLL", "emit_host_gemm"]

UNROLL = 4  # k steps per micro-kernel iteration (panels are padded to a multiple of it)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
PTR = ir.PointerType()
_STMT_PREFIX = "S"


def _c(v: int) -> ir.Constant:
    return ir.Constant(I64, v)


class _Emitter:
    def __init__(self, walker: GroupWalker, mark: HostGemmMark, plan: HostContraction):
        self.w, self.mark, self.plan = walker, mark, plan
        self.b = walker.builder
        self.elt = ir.FloatType() if plan.dtype.bits == 32 else ir.DoubleType()
        self.vw = mark.vector
        self.vec = ir.VectorType(self.elt, self.vw)
        self.module = self.b.module
        self.ealign = plan.dtype.bits // 8

    # ---- small IR helpers

    def declare(self, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
        fn = self.module.globals.get(name)
        if fn is None:
            fn = ir.Function(self.module, ir.FunctionType(ret, args), name)
        return fn

    def loop(self, lo: ir.Value, hi: ir.Value, step: int, name: str, body) -> None:
        """``for (iv = lo; iv < hi; iv += step) body(iv)``."""
        b = self.b
        slot = self.w.entry.alloca(I64, name=name)
        b.store(lo, slot)
        head = b.append_basic_block(f"{name}.head")
        inner = b.append_basic_block(f"{name}.body")
        done = b.append_basic_block(f"{name}.end")
        b.branch(head)
        b.position_at_end(head)
        iv = b.load(slot, typ=I64, name=name)
        b.cbranch(b.icmp_signed("<", iv, hi), inner, done)
        b.position_at_end(inner)
        body(iv)
        b.store(b.add(iv, _c(step)), slot)
        b.branch(head)
        b.position_at_end(done)

    def min(self, x: ir.Value, y: ir.Value) -> ir.Value:
        return self.b.select(self.b.icmp_signed("<", x, y), x, y)

    def elem(self, base: ir.Value, off: ir.Value) -> ir.Value:
        return self.b.gep(base, [off], source_etype=self.elt)

    def scaled(self, v: ir.Value, s: int) -> ir.Value:
        return v if s == 1 else self.b.mul(v, _c(s))

    # ---- the block

    def run(self, point: dict[str, ir.Value]) -> None:
        p, b = self.plan, self.b
        mc, nc, kc = self.mark.tile
        mr, nr = self.mark.register
        m_ext, n_ext, k_ext = p.extent(p.m), p.size(p.n), p.size(p.k)
        kcp = -(-kc // UNROLL) * UNROLL
        self.a_base, self.b_base, self.c_base = (
            self.batch_base(self.w.pointer(t), which, point)
            for t, which in ((p.a, "a"), (p.b, "b"), (p.out, "out")))
        m0 = b.mul(b.sdiv(point[p.m], _c(mc)), _c(mc))
        m_end = self.min(b.add(m0, _c(mc)), _c(m_ext))
        esize = self.ealign
        alloc = self.declare("aligned_alloc", PTR, [I64, I64])
        free = self.declare("free", ir.VoidType(), [PTR])
        a_bytes = -(-(mc * kcp * esize) // 64) * 64
        b_bytes = -(-((-(-nc // nr) * nr) * kcp * esize) // 64) * 64
        self.a_pack = b.call(alloc, [_c(64), _c(a_bytes)])
        self.b_pack = b.call(alloc, [_c(64), _c(b_bytes)])
        self.trap_if_null(self.a_pack)
        self.trap_if_null(self.b_pack)
        self.kcp = kcp
        self.accs = [[self.w.entry.alloca(self.vec, name=f"acc{r}_{v}") for v in range(nr // self.vw)]
                     for r in range(mr)]
        self.tile_tmp = self.w.entry.alloca(self.elt, size=mr * nr, name="tile")
        panels_m = b.sdiv(b.add(b.sub(m_end, m0), _c(mr - 1)), _c(mr))

        def k_slice(k0: ir.Value) -> None:
            kk = self.min(_c(kc), b.sub(_c(k_ext), k0))
            kk_pad = b.mul(b.sdiv(b.add(kk, _c(UNROLL - 1)), _c(UNROLL)), _c(UNROLL))
            self.pack("a", m0, m_end, k0, kk, kk_pad, mr, (p.m,))
            first = (b.icmp_signed("==", k0, _c(0)) if self.mark.init
                     else ir.Constant(ir.IntType(1), 0))

            def n_slice(n0: ir.Value) -> None:
                n_end = self.min(b.add(n0, _c(nc)), _c(n_ext))
                self.pack("b", n0, n_end, k0, kk, kk_pad, nr, p.n)
                panels_n = b.sdiv(b.add(b.sub(n_end, n0), _c(nr - 1)), _c(nr))

                def a_panel(pi: ir.Value) -> None:
                    def b_panel(qi: ir.Value) -> None:
                        self.micro(pi, qi, kk_pad)
                        self.store(b.add(m0, b.mul(pi, _c(mr))), m_end,
                                   b.add(n0, b.mul(qi, _c(nr))), n_end, first)

                    self.loop(_c(0), panels_n, 1, "gemm.q", b_panel)

                self.loop(_c(0), panels_m, 1, "gemm.p", a_panel)

            self.loop(_c(0), _c(n_ext), nc, "gemm.n0", n_slice)

        self.loop(_c(0), _c(k_ext), kc, "gemm.k0", k_slice)
        b.call(free, [self.a_pack])
        b.call(free, [self.b_pack])

    def trap_if_null(self, ptr: ir.Value) -> None:
        b = self.b
        bad = b.append_basic_block("gemm.nomem")
        ok = b.append_basic_block("gemm.mem")
        b.cbranch(b.icmp_unsigned("==", b.ptrtoint(ptr, I64), _c(0)), bad, ok)
        b.position_at_end(bad)
        b.call(self.declare("llvm.trap", ir.VoidType(), []), [])
        b.unreachable()
        b.position_at_end(ok)

    def batch_base(self, ptr: ir.Value, which: str, point: dict[str, ir.Value]) -> ir.Value:
        off: ir.Value = _c({"a": self.plan.a_offset, "b": self.plan.b_offset}.get(which, 0))
        for i in self.plan.batch:
            s = self.plan.stride(which, i)
            if s:
                off = self.b.add(off, self.scaled(point[i], s))
        return self.elem(ptr, off)

    def table(self, name: str, values: list[int]):
        """A function from an i64 position to ``values[position]``: a constant global."""
        b = self.b
        name = f"{self.w.llfn.name}.{name}"
        table = self.module.globals.get(name)
        if table is None:
            ty = ir.ArrayType(I64, len(values))
            table = ir.GlobalVariable(self.module, ty, name)
            table.global_constant = True
            table.linkage = "internal"
            table.initializer = ir.Constant(ty, values)
        return lambda v: b.load(b.gep(table, [_c(0), v], inbounds=True), typ=I64)

    def offsets(self, which: str, group: tuple[str, ...]):
        """A function from a flat position of ``group`` (i64) to its offset in operand
        ``which``: a multiply for one index, a load from a constant table for several."""
        p = self.plan
        if len(group) == 1:
            s = p.stride(which, group[0])
            return lambda v: self.scaled(v, s)
        return self.table(f"{which}.{'_'.join(group)}", p.offsets(which, group))

    def runs(self, which: str, group: tuple[str, ...]):
        """For a flattened ``group`` (else None): a function from a flat position to how many
        positions from it on lie at consecutive offsets of operand ``which`` (a convolution's
        ``(h, w)`` rows: up to the end of the row)."""
        if len(group) == 1:
            return None
        offs = self.plan.offsets(which, group)
        out = [1] * len(offs)
        for i in range(len(offs) - 2, -1, -1):
            if offs[i + 1] == offs[i] + 1:
                out[i] = out[i + 1] + 1
        return self.table(f"{which}.{'_'.join(group)}.runs", out)

    def pack(self, which: str, r0: ir.Value, r_end: ir.Value, k0: ir.Value, kk: ir.Value,
             kk_pad: ir.Value, width: int, rows_of: tuple[str, ...]) -> None:
        """Pack rows ``[r0, r_end)`` (flat positions of ``rows_of``) x reduction ``[k0, k0 +
        kk)`` of operand ``which`` into panels of ``width`` rows: element (row r0 + width*q + j,
        k0 + k) at ``(q * KCP + k) * width + j``; rows past ``r_end`` and k past ``kk`` (to
        ``kk_pad``) are 0. The innermost loop walks ``j``: the stores are contiguous, and so
        are the loads where the operand is contiguous along its rows (else LLVM gathers them).
        Flattened rows are copied in runs of consecutive offsets (`runs`), each a contiguous
        copy per k, instead of element by element through the offset table."""
        b, p = self.b, self.plan
        src = self.a_base if which == "a" else self.b_base
        dst = self.a_pack if which == "a" else self.b_pack
        row_off, k_off = self.offsets(which, rows_of), self.offsets(which, p.k)
        runs = self.runs(which, rows_of)
        panels = b.sdiv(b.add(b.sub(r_end, r0), _c(width - 1)), _c(width))
        zero = ir.Constant(self.elt, 0.0)

        def slot(q: ir.Value, k: ir.Value, j: ir.Value) -> ir.Value:
            return self.elem(dst, b.add(b.mul(b.add(b.mul(q, _c(self.kcp)), k), _c(width)), j))

        def panel(q: ir.Value) -> None:
            first = b.add(r0, b.mul(q, _c(width)))
            rows = self.min(_c(width), b.sub(r_end, first))

            def copy(at: ir.Value, k: ir.Value, j: ir.Value) -> None:
                b.store(b.load(self.elem(src, at), typ=self.elt), slot(q, k, j))

            def row_k(k: ir.Value) -> None:
                k_src = k_off(b.add(k0, k))
                if runs is None:
                    self.loop(_c(0), rows, 1, f"pack.{which}.j",
                              lambda j: copy(b.add(row_off(b.add(first, j)), k_src), k, j))
                self.loop(rows, _c(width), 1, f"pack.{which}.z",
                          lambda j: b.store(zero, slot(q, k, j)))

            if runs is not None:
                def segment(j: ir.Value) -> ir.Value:
                    count = self.min(runs(b.add(first, j)), b.sub(rows, j))
                    base = row_off(b.add(first, j))

                    def run_k(k: ir.Value) -> None:
                        at = b.add(base, k_off(b.add(k0, k)))
                        self.loop(_c(0), count, 1, f"pack.{which}.r",
                                  lambda i: copy(b.add(at, i), k, b.add(j, i)))

                    self.loop(_c(0), kk, 1, f"pack.{which}.rk", run_k)
                    return count

                self.steps(rows, f"pack.{which}.seg", segment)
            self.loop(_c(0), kk, 1, f"pack.{which}.k", row_k)
            self.loop(kk, kk_pad, 1, f"pack.{which}.kz",
                      lambda k: self.loop(_c(0), _c(width), 1, f"pack.{which}.zz",
                                          lambda j: b.store(zero, slot(q, k, j))))

        self.loop(_c(0), panels, 1, f"pack.{which}.q", panel)

    def steps(self, hi: ir.Value, name: str, body) -> None:
        """``for (iv = 0; iv < hi; iv += body(iv))`` (``body`` returns its step, >= 1)."""
        b = self.b
        slot = self.w.entry.alloca(I64, name=name)
        b.store(_c(0), slot)
        head = b.append_basic_block(f"{name}.head")
        inner = b.append_basic_block(f"{name}.body")
        done = b.append_basic_block(f"{name}.end")
        b.branch(head)
        b.position_at_end(head)
        iv = b.load(slot, typ=I64, name=name)
        b.cbranch(b.icmp_signed("<", iv, hi), inner, done)
        b.position_at_end(inner)
        step = body(iv)
        b.store(b.add(iv, step), slot)
        b.branch(head)
        b.position_at_end(done)

    def micro(self, pi: ir.Value, qi: ir.Value, kk_pad: ir.Value) -> None:
        b = self.b
        mr, nr = self.mark.register
        nv = nr // self.vw
        fma = self.declare(f"llvm.fma.v{self.vw}f{self.plan.dtype.bits}",
                           self.vec, [self.vec] * 3)
        zero = ir.Constant(self.vec, [0.0] * self.vw)
        for row in self.accs:
            for acc in row:
                b.store(zero, acc)
        a_panel = self.elem(self.a_pack, b.mul(pi, _c(self.kcp * mr)))
        b_panel = self.elem(self.b_pack, b.mul(qi, _c(self.kcp * nr)))
        splat_mask = ir.Constant(ir.VectorType(I32, self.vw), [0] * self.vw)
        undef = ir.Constant(self.vec, ir.Undefined)

        def step(k0: ir.Value) -> None:
            vals = [[b.load(acc, typ=self.vec) for acc in row] for row in self.accs]
            for u in range(UNROLL):
                k = b.add(k0, _c(u))
                bv = [b.load(self.elem(b_panel, b.add(b.mul(k, _c(nr)), _c(v * self.vw))),
                             typ=self.vec, align=self.ealign)
                      for v in range(nv)]
                for r in range(mr):
                    a = b.load(self.elem(a_panel, b.add(b.mul(k, _c(mr)), _c(r))), typ=self.elt)
                    s = b.shuffle_vector(b.insert_element(undef, a, ir.Constant(I32, 0)), undef,
                                         splat_mask)
                    for v in range(nv):
                        vals[r][v] = b.call(fma, [s, bv[v], vals[r][v]])
            for r, row in enumerate(self.accs):
                for v, acc in enumerate(row):
                    b.store(vals[r][v], acc)

        self.loop(_c(0), kk_pad, UNROLL, "gemm.k", step)

    def store(self, i0: ir.Value, m_end: ir.Value, j0: ir.Value, n_end: ir.Value,
              first: ir.Value) -> None:
        """Add the accumulators to the output tile at rows ``i0..``, columns ``j0..`` (store
        them on the first slice of a ``+=!``)."""
        b, p = self.b, self.plan
        mr, nr = self.mark.register
        s_m = p.stride("out", p.m)
        whole = b.and_(b.icmp_signed("<=", b.add(i0, _c(mr)), m_end),
                       b.icmp_signed("<=", b.add(j0, _c(nr)), n_end))
        then_bb = b.append_basic_block("gemm.whole")
        else_bb = b.append_basic_block("gemm.edge")
        join = b.append_basic_block("gemm.stored")
        b.cbranch(whole, then_bb, else_bb)
        b.position_at_end(then_bb)
        vzero = ir.Constant(self.vec, [0.0] * self.vw)
        for r, row in enumerate(self.accs):
            base = b.add(self.scaled(b.add(i0, _c(r)), s_m), j0)
            for v, acc in enumerate(row):
                ptr = self.elem(self.c_base, b.add(base, _c(v * self.vw)))
                old = b.load(ptr, typ=self.vec, align=self.ealign)
                b.store(b.fadd(b.select(first, vzero, old), b.load(acc, typ=self.vec)), ptr,
                        align=self.ealign)
        b.branch(join)
        b.position_at_end(else_bb)
        tile = self.tile_tmp
        for r, row in enumerate(self.accs):
            for v, acc in enumerate(row):
                b.store(b.load(acc, typ=self.vec),
                        b.bitcast(self.elem(tile, _c(r * nr + v * self.vw)), self.vec.as_pointer()),
                        align=self.ealign)
        rows = self.min(_c(mr), b.sub(m_end, i0))
        cols = self.min(_c(nr), b.sub(n_end, j0))
        zero = ir.Constant(self.elt, 0.0)

        def element(r: ir.Value, c: ir.Value) -> None:
            at = b.add(self.scaled(b.add(i0, r), s_m), b.add(j0, c))
            ptr = self.elem(self.c_base, at)
            old = b.load(ptr, typ=self.elt)
            val = b.load(self.elem(tile, b.add(b.mul(r, _c(nr)), c)), typ=self.elt)
            b.store(b.fadd(b.select(first, zero, old), val), ptr)

        self.loop(_c(0), rows, 1, "gemm.er",
                  lambda r: self.loop(_c(0), cols, 1, "gemm.ec", lambda c: element(r, c)))
        b.branch(join)
        b.position_at_end(join)


def _first_instance(walker: GroupWalker, node: isl.AstNode, plan: HostContraction
                    ) -> dict[str, ir.Value]:
    """The index values of the first statement instance below ``node`` (each loop at its
    first iteration), as i64 values computed at the mark."""
    bound: list[tuple[str, ir.Value | None]] = []
    try:
        while True:
            kind = node.get_type()
            if kind == isl.ast_node_type.for_:
                name = node.for_get_iterator().get_id().get_name()
                bound.append((name, walker.env.get(name)))
                walker.env[name] = walker.expr(node.for_get_init())
                node = node.for_get_body()
            elif kind == isl.ast_node_type.block:
                node = node.block_get_children().get_at(0)
            elif kind == isl.ast_node_type.if_:
                node = node.if_get_then_node()
            elif kind == isl.ast_node_type.mark:
                node = node.mark_get_node()
            elif kind == isl.ast_node_type.user:
                call = node.user_get_expr()
                name = call.get_op_arg(0).get_id().get_name()
                k = plan.statement
                st = walker.fn.statements[k]
                dims = st.lhs if name.endswith("_init") else st.index_names
                if name.removesuffix("_init") != f"{_STMT_PREFIX}{k}":
                    raise CodegenError(f"host-gemm mark of S{k} holds statement {name}")
                return {d: walker.expr(call.get_op_arg(i + 1)) for i, d in enumerate(dims)}
            else:
                raise CodegenError(f"host-gemm: unexpected isl AST node of type {kind}")
    finally:
        for name, saved in reversed(bound):
            if saved is None:
                walker.env.pop(name, None)
            else:
                walker.env[name] = saved


def emit_host_gemm(walker: GroupWalker, mark: HostGemmMark, child: isl.AstNode) -> None:
    """Emit the row block of the host contraction below ``mark`` (see the module docstring)."""
    plan = host_contraction(walker.fn, mark.statement, walker.owner.sizes)
    if isinstance(plan, str):
        raise CodegenError(f"host-gemm mark on statement {mark.statement}: {plan}")
    if mark.register[1] % mark.vector:
        raise CodegenError(f"host-gemm: NR={mark.register[1]} is not a multiple of the vector "
                           f"width {mark.vector}")
    point = _first_instance(walker, child, plan)
    _Emitter(walker, mark, plan).run(point)
