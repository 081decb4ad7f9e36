"""The NVPTX target (``target="cuda"``): one PTX kernel per ``kernel`` mark of the mapped schedule.

`compile_cuda(state, arch)` builds the isl AST of a schedule the GPU mapping passes have run on
(``map-to-blocks``/``map-to-threads``), finds every mark named ``kernel grid=GX,GY,GZ
block=BX,BY,BZ`` and lowers the subtree under each with the shared walk of `lower.py` into one
``ptx_kernel`` function. Block and thread indices appear in that AST as the isl parameters
``_bx _by _bz _tx _ty _tz``; `NvptxTarget.parameter` reads them from the special registers
(``llvm.nvvm.read.ptx.sreg.{ctaid,tid}.{x,y,z}``). The mapped loops are strided, so every
(block, thread) covers its share of the instances and no synchronisation is needed.

Kernel ABI (the k-th kernel mark, in program order; kernels run in that order on one stream)::

    .entry {entry}_k{k}(T0*, ..., Tn*,  i64 size0, ..., i64 sizem,  i32* err)

* one ``ptr addrspace(1)`` per tensor the kernel reads or writes (`KernelLaunch.tensors`: its
  statements' tensors and those its promoted buffers copy, in `ir.Function.tensors` order),
  row-major, C-contiguous, storage types of `exprs.memory_type`;
* one ``i64`` per size the kernel reads (`KernelLaunch.sizes`, in `ir.Function.sizes` order):
  sizes fixed at compile time are folded into the code as constants and not passed, so only a
  parametric kernel takes sizes;
* ``err``: a device ``i32`` set to ``1 + c`` when gather site ``c`` (`CudaKernelImage.gathers`)
  reads outside its tensor (the offending thread then stops).

Math built-ins go to libdevice (``__nv_expf``, ``__nv_tanh``, ...) except those NVPTX lowers
itself (sqrt, fabs, floor, fma, min/max, ...). libdevice is linked only into modules that call
it, with every definition made ``linkonce_odr`` so O3 drops the unused ones.
"""

from __future__ import annotations

import functools
import os
import re
import threading
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

import islpy as isl
import llvmlite.binding as llvm
from llvmlite import ir

from .. import ir as tc
from ..errors import CodegenError
from ..log import timed
from ..poly.promotion import SYNC_STMT
from ..signature import ALIGN_BYTES
from .exprs import I32, I64, ExprEmitter, const, memory_type
from .gpu_rows import on_chip_tensors
from .lower import PTR, GatherSite, GroupWalker, Lowerer, group_tensors
from .param_space import PARAM_SPACE_BYTES, check_kernel_parameters, check_parameter_space
from .target import Target, declare

if TYPE_CHECKING:  # pragma: no cover
    from ..poly.state import CompileState

__all__ = ["ALIGN_BYTES", "PARAM_SPACE_BYTES", "CudaKernelImage", "KernelLaunch", "NvptxTarget",
           "aligned_tensors", "check_parameter_space",
           "compile_cuda", "find_libdevice", "parse_kernel_mark"]

TRIPLE = "nvptx64-nvidia-cuda"
PTX_FEATURES = "+ptx80"  # PTX ISA 8.0: sm_90 and the ptxas of CUDA 12/13 accept it
_LOCK = threading.RLock()
_KERNEL_MARK = re.compile(r"kernel\s+grid=(\d+),(\d+),(\d+)\s+block=(\d+),(\d+),(\d+)\s*$")
_SREG = {"_bx": "ctaid.x", "_by": "ctaid.y", "_bz": "ctaid.z",
         "_tx": "tid.x", "_ty": "tid.y", "_tz": "tid.z"}
_LIBDEVICE_PLACES = ("/usr/local/cuda/nvvm/libdevice/libdevice.10.bc",
                     "/opt/cuda/nvvm/libdevice/libdevice.10.bc")


@dataclass(frozen=True)
class KernelLaunch:
    """One kernel of the sequence: its PTX entry name and launch configuration."""

    name: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    has_gathers: bool = False
    shared_bytes: int = 0  # dynamic shared memory per block (tensor-core rings above 48 KB)
    tensors: tuple[str, ...] = ()  # its tensor parameters, in `CudaKernelImage.arg_order` order
    sizes: tuple[str, ...] = ()    # its size parameters, in `CudaKernelImage.sizes_order` order

    @property
    def parameter_count(self) -> int:
        """Its parameters: the tensors, the sizes, the error flag."""
        return len(self.tensors) + len(self.sizes) + 1


@dataclass(frozen=True)
class CudaKernelImage:
    """Everything needed to launch a compiled TC function on a GPU (no GPU needed to build it).

    ``kernels`` run in order; each takes its own tensors (`KernelLaunch.tensors`, a part of
    ``arg_order``: the function's tensors), then its sizes (`KernelLaunch.sizes`, a part of
    ``sizes_order``) as i64, then the error flag. ``sizes`` are the values fixed at compile time.
    """

    entry: str
    arch: str
    ptx: str
    llvm_ir: str
    kernels: tuple[KernelLaunch, ...]
    arg_order: tuple[str, ...]
    sizes_order: tuple[str, ...]
    gathers: tuple[GatherSite, ...] = ()
    sizes: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    on_chip: tuple[str, ...] = ()  # temporaries without a global buffer (codegen.gpu_rows)
    aligned: tuple[str, ...] = ()  # tensors whose pointers must be ALIGN_BYTES-aligned at launch

    @property
    def uses_libdevice(self) -> bool:
        return "__nv_" in self.llvm_ir


def parse_kernel_mark(name: str) -> tuple[tuple[int, int, int], tuple[int, int, int]] | None:
    """(grid, block) of a ``kernel grid=GX,GY,GZ block=BX,BY,BZ`` mark name, else None."""
    m = _KERNEL_MARK.match(name.strip())
    if m is None:
        return None
    v = tuple(int(x) for x in m.groups())
    grid, block = v[:3], v[3:]
    if min(v) < 1:
        raise CodegenError(f"kernel mark {name!r}: grid and block extents must be at least 1")
    return grid, block  # type: ignore[return-value]


def _reduction_mark(name: str) -> tuple[int, int, bool] | None:
    """(statement, threads, atomic) of a ``reduction S<k> threads=B[ atomic]`` mark
    (passes/map_reductions, passes/map_full_reduction)."""
    m = re.match(r"^reduction S(\d+) threads=(\d+)( atomic)?$", name.strip())
    return (int(m.group(1)), int(m.group(2)), m.group(3) is not None) if m else None


# ---------------------------------------------------------------- the target strategy


class NvptxTarget(Target):
    """NVPTX: global memory in address space 1, libdevice math, block/thread ids from sregs."""

    name = "cuda"
    global_addrspace = 1
    invariant_inputs = True  # with noalias arguments: ld.global.nc (the read-only path)
    contract_floats = True

    def __init__(self, arch: str = "sm_90"):
        # cp.async (sm_80+) for double-buffered shared copies; before that, plain copies
        # (the barriers stay, so the kernel is the same program, only without the overlap)
        digits = re.sub(r"\D", "", arch)
        self.arch = arch
        self.arch_number = int(digits) if digits else 0
        self.async_copies = self.arch_number >= 80
    intrinsics = MappingProxyType({
        "sqrt": "sqrt", "fabs": "fabs", "floor": "floor", "ceil": "ceil", "trunc": "trunc",
        "fma": "fma", "copysign": "copysign", "fmin": "minnum", "fmax": "maxnum",
        # TC's min/max on floats propagate NaN (numpy's minimum/maximum)
        "fminimum": "minimum", "fmaximum": "maximum",
    })

    def external_math(self, module: ir.Module, name: str, ty: ir.Type, arity: int) -> ir.Function:
        cname = "__nv_" + name + ("f" if isinstance(ty, ir.FloatType) else "")
        return declare(module, cname, ir.FunctionType(ty, [ty] * arity))

    def parameter(self, b: ir.IRBuilder, name: str) -> ir.Value | None:
        reg = _SREG.get(name)
        if reg is None:
            return None
        fn = declare(b.module, f"llvm.nvvm.read.ptx.sreg.{reg}", ir.FunctionType(I32, []))
        return b.zext(b.call(fn, []), I64, name=name)

    def buffer_base(self, walker: GroupWalker, buf: Any) -> ir.Value:
        """The array of a promoted buffer: a static shared array of the module (one per
        kernel and buffer) or a private array in the kernel's entry block (registers once
        the unrolled accesses have constant indices)."""
        made = walker.buffers_made
        if buf.name not in made:
            ty = ir.ArrayType(memory_type(walker.fn.tensor(buf.tensor).dtype), buf.slots)
            if buf.space == "shared":
                gv = ir.GlobalVariable(walker.llfn.module, ty, f"{walker.llfn.name}.{buf.name}",
                                       addrspace=3)
                gv.linkage = "internal"
                gv.initializer = ir.Constant(ty, ir.Undefined)
                gv.align = 16
                made[buf.name] = gv
            else:
                made[buf.name] = walker.entry.alloca(ty, name=buf.name)
        return made[buf.name]

    def promoted_statement(self, walker: GroupWalker, name: str, payload: Any) -> None:
        b = walker.builder
        if SYNC_STMT.match(name):
            void = ir.FunctionType(ir.VoidType(), [])
            if name.startswith("commit_"):
                if self.async_copies:
                    b.call(declare(b.module, "llvm.nvvm.cp.async.commit.group", void), [])
                return
            if name.startswith("wait_") and self.async_copies:  # all but the newest group
                wait = declare(b.module, "llvm.nvvm.cp.async.wait.group",
                               ir.FunctionType(ir.VoidType(), [I32]))
                b.call(wait, [ir.Constant(I32, 1)])
            b.call(declare(b.module, "llvm.nvvm.barrier0", void), [])
            return
        if payload is None:
            raise CodegenError(f"copy statement {name} without its accesses")
        buf = walker.owner.promotion.buffer(payload.buffer)
        t = walker.fn.tensor(buf.tensor)
        mty = memory_type(t.dtype)
        local = walker.buffer_element(buf.name, [walker.expr(e) for e in payload.local_index])
        if payload.kind == "init":  # the registers start at the reduction's identity
            st = walker.fn.statements[buf.fill]
            em = ExprEmitter(walker, {}, buf.fill)
            dt = t.dtype.compute
            b.store(em.to_memory(const(dt, st.reduction.identity(dt)), t.dtype), local)
            return
        gidx = [walker.expr(e) for e in payload.global_index]
        off = gidx[0] if gidx else ir.Constant(I64, 0)
        for d in range(1, len(gidx)):
            off = b.add(b.mul(off, walker.extent(t.name, d)), gidx[d])
        gptr = b.gep(walker.pointer(t.name), [off], inbounds=True, source_etype=mty)
        if payload.kind in ("vin", "vnext"):
            self._vector_copy(walker, buf, t, local, gptr)
            return
        if payload.kind in ("in", "next"):
            self._element_copy(walker, buf, t, local, gptr)
        else:
            b.store(b.load(local, typ=mty), gptr)

    def _vector_copy(self, walker: GroupWalker, buf: Any, t: tc.Tensor, local: ir.Value,
                     gptr: ir.Value) -> None:
        """``buf.copy_lanes`` elements from ``gptr`` on, along the tensor's last dimension, to
        the buffer from ``local`` on (`poly.vector_copy` proved the tensor offset, and unless
        ``buf.copy_scatter`` the buffer slot, aligned to the lanes). When the tensor's pointer
        is `ALIGN_BYTES`-aligned (the kernel's ``aligned`` tensors): one ``cp.async.cg ... 16``
        (double buffering), or one vector load and one vector store, or (scatter) one vector
        load and a store per element; otherwise element by element. (One ``cp.async.ca`` per
        element of a scattered double-buffered row was measured on the H200: fc + bias + relu
        0.141 -> 0.162 ms, tmm unchanged; the synchronous vector load stays.)"""
        b = walker.builder
        mty = memory_type(t.dtype)
        lanes = buf.copy_lanes
        nbytes = lanes * (t.dtype.bits // 8)
        step = buf.strides()[-1]  # slots between neighbours along the tensor's last dimension
        slots = [b.gep(local, [ir.Constant(I64, j * step)], inbounds=True, source_etype=mty)
                 for j in range(lanes)] if buf.copy_scatter or step != 1 else None
        if t.name not in getattr(walker.owner, "aligned", ()) or nbytes > ALIGN_BYTES:
            for j in range(lanes):
                src = b.gep(gptr, [ir.Constant(I64, j)], inbounds=True, source_etype=mty)
                dst = slots[j] if slots else b.gep(local, [ir.Constant(I64, j)], inbounds=True,
                                                   source_etype=mty)
                self._element_copy(walker, buf, t, dst, src)
            return
        if not slots and buf.stages > 1 and self.async_copies and nbytes == 16:
            copy = declare(b.module, "llvm.nvvm.cp.async.cg.shared.global.16",
                           ir.FunctionType(ir.VoidType(), [ir.PointerType(addrspace=3),
                                                           ir.PointerType(addrspace=1)]))
            b.call(copy, [b.bitcast(local, ir.PointerType(addrspace=3)), gptr])
            return
        vty = ir.VectorType(mty, lanes)
        value = b.load(b.bitcast(gptr, vty.as_pointer(1)), typ=vty, align=nbytes)
        if t.role is tc.Role.INPUT:
            value.set_metadata("invariant.load", b.module.add_metadata([]))
        if not slots:
            b.store(value, b.bitcast(local, vty.as_pointer(3)), align=nbytes)
            return
        for j, dst in enumerate(slots):
            b.store(b.extract_element(value, ir.Constant(I32, j)), dst)

    def _element_copy(self, walker: GroupWalker, buf: Any, t: tc.Tensor, local: ir.Value,
                      gptr: ir.Value) -> None:
        """One element from ``gptr`` to the buffer element ``local`` (cp.async, which copies 4
        or 8 bytes, when double-buffered: promote-shared stages only those)."""
        b = walker.builder
        mty = memory_type(t.dtype)
        size = t.dtype.bits // 8
        if buf.stages > 1 and self.async_copies and size in (4, 8):
            copy = declare(b.module, f"llvm.nvvm.cp.async.ca.shared.global.{size}",
                           ir.FunctionType(ir.VoidType(), [ir.PointerType(addrspace=3),
                                                           ir.PointerType(addrspace=1)]))
            b.call(copy, [b.bitcast(local, ir.PointerType(addrspace=3)), gptr])
            return
        value = b.load(gptr, typ=mty)
        if t.role is tc.Role.INPUT:
            value.set_metadata("invariant.load", b.module.add_metadata([]))
        b.store(value, local)

    def mark(self, walker: GroupWalker, name: str, child: isl.AstNode) -> None:
        if parse_kernel_mark(name) is not None:
            raise CodegenError(f"kernel mark {name!r} nested in another kernel")
        if name.startswith(("rows ", "accumulate ")):
            from .gpu_rows import RowWalker

            if not isinstance(walker, RowWalker):
                raise CodegenError(f"mark {name!r} outside a kernel")
            walker.row_mark(name, child)
            return
        if name.startswith("mma "):
            from ..poly.contraction import parse_mma_mark
            from .gpu_mma import emit_mma

            mma = parse_mma_mark(name)
            if mma is None:
                raise CodegenError(f"bad mma mark {name!r}")
            emit_mma(walker, mma)  # the statements below are the mark's: not walked
            return
        red = _reduction_mark(name)
        if red is not None:
            from .gpu_reduce import ReducingWalker

            if not isinstance(walker, ReducingWalker):
                raise CodegenError(f"mark {name!r} outside a kernel")
            walker.reduce(red[0], red[1], child, atomic=red[2])
            return
        walker.node(child)


# ---------------------------------------------------------------- finding the kernels

Guard = tuple[isl.AstExpr, bool]


def find_kernels(ast: isl.AstNode) -> list[tuple[str, isl.AstNode, tuple[Guard, ...]]]:
    """The ``kernel`` marks of ``ast`` in program order: (mark name, subtree, the ``if``
    conditions above it with the branch taken). A loop above a kernel mark is an error."""
    found: list[tuple[str, isl.AstNode, tuple[Guard, ...]]] = []

    def visit(node: isl.AstNode, guards: tuple[Guard, ...]) -> None:
        kind = node.get_type()
        if kind == isl.ast_node_type.mark:
            name = node.mark_get_id().get_name()
            if parse_kernel_mark(name) is not None:
                found.append((name, node.mark_get_node(), guards))
            else:
                visit(node.mark_get_node(), guards)
        elif kind == isl.ast_node_type.block:
            kids = node.block_get_children()
            for i in range(kids.n_ast_node()):
                visit(kids.get_at(i), guards)
        elif kind == isl.ast_node_type.if_:
            cond = node.if_get_cond()
            visit(node.if_get_then_node(), (*guards, (cond, True)))
            if node.if_has_else_node():
                visit(node.if_get_else_node(), (*guards, (cond, False)))
        elif kind == isl.ast_node_type.for_:
            if _has_kernel_mark(node.for_get_body()):
                raise CodegenError("a kernel mark lies inside a loop: the GPU mapping must put "
                                   "every kernel at the top of the schedule")
            raise CodegenError("statement instances outside every kernel mark (a loop above "
                               "the kernels): run the GPU mapping passes on the whole tree")
        elif kind == isl.ast_node_type.user:
            raise CodegenError(f"statement {node.user_get_expr().to_C_str()} lies outside every "
                               "kernel mark")

    visit(ast, ())
    return found


def _has_row_mark(node: isl.AstNode) -> bool:
    """True if a ``rows`` or ``reduction`` mark (a bandwidth-bound row kernel) lies in ``node``
    and no ``accumulate ... over-rows`` mark: a row kernel that also keeps column partials in
    registers across its rows (`passes/row_partials.py`) spilled under the 32-register budget
    (a 128-byte frame at 1024 threads; 62 registers without it), so it gets no ``minctasm``;
    nor does one whose threads hold more than `MINCTASM_ROW_VALUES` row elements each, nor a
    full reduction. (isl hands each node to the callback for that call only: counted there.)"""
    hit, partials = [], []

    def fn(n: isl.AstNode) -> bool:
        if n.get_type() == isl.ast_node_type.mark:
            name = n.mark_get_id().get_name()
            if name.startswith(("rows ", "reduction ")):
                # a full reduction (`map_full_reduction`, folded atomically) walks long
                # strides: 32 registers cost it 6% (2^28 float32 on the H200: 0.288 ms with
                # minctasm, 0.271 without, 0.267 with 128-bit lanes)
                full = name.startswith("reduction ") and name.endswith(" atomic")
                hit.append(MINCTASM_ROW_VALUES + 1 if full else _unrolled_calls(n))
            if name.startswith("accumulate ") and "over-rows" in name:
                partials.append(n)
        return True

    node.foreach_descendant_top_down(fn)
    return bool(hit) and not partials and max(hit) <= MINCTASM_ROW_VALUES


#: a row kernel whose threads hold at most this many row elements each (straight-line phase
#: code) gets ``minctasm``; with more, the 32-register budget spills (softmax 4096 wide on 256
#: threads: 16 values, a 32-byte frame) and the larger register file per thread is the point
MINCTASM_ROW_VALUES = 8


def _unrolled_calls(mark: isl.AstNode) -> int:
    """Statement calls below a ``reduction`` mark (one phase of a row) in straight-line code:
    the row elements a thread holds at once when its stride loop is unrolled (0 for a
    ``rows`` mark, and below a loop: a thread then walks its elements and holds few)."""
    from ..poly.llvm_unroll import unrolled_calls

    if not mark.mark_get_id().get_name().startswith("reduction "):
        return 0
    calls, loops = unrolled_calls(mark.mark_get_node())
    return 0 if loops else calls


def _has_kernel_mark(node: isl.AstNode) -> bool:
    hit = []

    def fn(n: isl.AstNode) -> bool:
        if n.get_type() == isl.ast_node_type.mark and parse_kernel_mark(n.mark_get_id().get_name()):
            hit.append(n)
        return True

    node.foreach_descendant_top_down(fn)
    return bool(hit)


def _has_statement(node: isl.AstNode) -> bool:
    found: list[isl.AstNode] = []

    def visit(n: isl.AstNode) -> bool:
        if n.get_type() == isl.ast_node_type.user:
            found.append(n)
        return not found

    node.foreach_descendant_top_down(visit)
    return bool(found)


class _KernelLowerer(Lowerer):
    """The shared `Lowerer`, emitting one ``ptx_kernel`` per kernel mark instead of groups."""

    needs_sm90a = False  # a generator used sm_90a-only instructions (wgmma)

    def target_arch_number(self) -> int:
        return self.target.arch_number

    def kernels(self, ast: isl.AstNode) -> tuple[KernelLaunch, ...]:
        if not _has_kernel_mark(ast):
            if _has_statement(ast):
                raise CodegenError("cuda target needs the mapping passes map-to-blocks/map-to-threads")
            return ()  # every statement's domain is empty at these sizes: nothing to launch
        from .gpu_rows import phase_statements
        from .lower import communicated_tensors

        found = find_kernels(ast)
        launches = []
        for k, (mark, node, guards) in enumerate(found):
            grid, block = parse_kernel_mark(mark)  # type: ignore[misc]
            name = f"{self.name}_k{k}"
            before = len(self.gathers)
            self.kernel_shared_bytes = 0  # set by a generator that needs dynamic shared memory
            statements = phase_statements(node)
            self.shared_tensors = communicated_tensors(self.fn, statements)
            # the kernel takes only what it touches: a definition of many kernels and many
            # tensors lowers, and launches, in time linear in its size
            tensors = group_tensors(self.fn, node, self.promotion)
            body, sizes = self.kernel_body(name, node, guards, tensors)
            check_kernel_parameters(self.fn, name, statements, tensors, sizes)
            self.kernel_entry(name, body, tensors, sizes)
            self.launch_bounds(name, block, _has_row_mark(node))
            launches.append(KernelLaunch(name, grid, block, len(self.gathers) > before,
                                         self.kernel_shared_bytes, tensors, sizes))
        return tuple(launches)

    def launch_bounds(self, name: str, block: tuple[int, int, int], bandwidth_bound: bool) -> None:
        """``nvvm.annotations`` for kernel ``name``: its exact block size (``maxntid``: ptxas
        budgets registers for it) and, for row kernels of at least 256 threads, as many
        blocks per SM as fill its 2048 thread slots (``minctasm``: ptxas keeps registers at
        or under 32 per thread; measured on the H200, softmax's 34 registers left a quarter
        of the thread slots empty)."""
        fn = self.module.get_global(name)
        i32 = ir.IntType(32)
        md = self.module.add_named_metadata("nvvm.annotations")
        entries = [("maxntidx", block[0]), ("maxntidy", block[1]), ("maxntidz", block[2])]
        threads = block[0] * block[1] * block[2]
        if bandwidth_bound and threads >= 256:
            entries.append(("minctasm", 2048 // threads))
        for key, value in entries:
            md.add(self.module.add_metadata([fn, ir.MetaDataString(self.module, key),
                                             ir.Constant(i32, value)]))

    def kernel_body(self, name: str, node: isl.AstNode, guards: Sequence[Guard],
                    tensors: tuple[str, ...]) -> tuple[ir.Function, tuple[str, ...]]:
        """The kernel's body over ``tensors``, and the sizes it reads (the others are folded)."""
        body = self.new_body(name, tensors)
        from .gpu_rows import RowWalker

        walker = RowWalker(self, body, parallel=False, tensors=tensors)
        b = walker.builder
        for cond, taken in guards:
            c = walker.expr(cond)
            if not taken:
                c = b.not_(c)
            inside = b.append_basic_block("guard")
            b.cbranch(c, inside, walker.exit)
            b.position_at_end(inside)
        walker.node(node)
        walker.finish()
        self.local_tensors = getattr(self, "local_tensors", set()) | walker.local_seen
        return body, walker.sizes_read()

    def kernel_entry(self, name: str, body: ir.Function, tensors: tuple[str, ...],
                     sizes: tuple[str, ...]) -> None:
        """The ``ptx_kernel`` ``name(tensors..., sizes..., err)`` calling ``body``."""
        nbuf, nsize = len(tensors), len(sizes)
        gptr = self.target.pointer
        fnty = ir.FunctionType(ir.VoidType(), [gptr] * nbuf + [I64] * nsize + [gptr])
        fn = ir.Function(self.module, fnty, name)
        fn.calling_convention = "ptx_kernel"
        fn.attributes.add("nounwind")
        names = [*tensors, *sizes, "err"]
        for a, n in zip(fn.args, names, strict=True):
            a.name = n
        for a in fn.args[:nbuf]:
            if a.name not in self.shared_tensors:  # (`lower.communicated_tensors`)
                a.add_attribute("noalias")
            if a.name in self.aligned:  # the call guarantees it (`Signature`'s alignment)
                a.attributes.align = ALIGN_BYTES
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        # the body reads sizes from memory (the host ABI: at their `ir.Function.sizes`
        # positions); after inlining, SROA makes them registers again
        slots = b.alloca(I64, size=max(1, len(self.fn.sizes)), name="sizes")
        for size, a in zip(sizes, fn.args[nbuf:nbuf + nsize], strict=True):
            at = ir.Constant(I64, self.fn.sizes.index(size))
            b.store(a, b.gep(slots, [at], inbounds=True, source_etype=I64))
        sizes_ptr = b.bitcast(slots, PTR)
        err = b.addrspacecast(fn.args[-1], PTR)
        b.call(body, [*fn.args[:nbuf], sizes_ptr, ir.Constant(I64, 0), ir.Constant(I64, 0), err])
        b.ret_void()


# ---------------------------------------------------------------- LLVM: link, optimise, emit


@functools.cache
def _init_nvptx() -> None:
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()


def nvptx_target_machine(arch: str = "sm_90") -> llvm.TargetMachine:
    _init_nvptx()
    target = llvm.Target.from_triple(TRIPLE)
    return target.create_target_machine(cpu=arch, features=PTX_FEATURES, opt=3)


def find_libdevice() -> str | None:
    """Path of ``libdevice.10.bc`` (``TCMLIR_LIBDEVICE``, then the CUDA toolkit), or None."""
    candidates = [os.environ.get("TCMLIR_LIBDEVICE", "")]
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(os.path.join(os.environ[var], "nvvm", "libdevice", "libdevice.10.bc"))
    candidates.extend(_LIBDEVICE_PLACES)
    for path in candidates:
        if path and os.path.isfile(path):
            return path
    return None


@functools.cache
def _libdevice_bitcode() -> bytes:
    path = find_libdevice()
    if path is None:
        raise CodegenError("libdevice.10.bc was not found (needed for math built-ins on the GPU): "
                           "install the CUDA toolkit or set TCMLIR_LIBDEVICE to its path")
    with open(path, "rb") as f:
        return f.read()


@functools.lru_cache(maxsize=64)
def _libdevice_subset(names: frozenset[str], data_layout: str) -> bytes:
    """Bitcode of the libdevice functions ``names`` and what they use, nothing else: parsing
    the whole 450 KB library took longer than optimising a kernel that calls ``expf``
    (issue 31); this is parsed once per process and set of functions."""
    lib = llvm.parse_bitcode(_libdevice_bitcode())
    lib.triple = TRIPLE
    lib.data_layout = data_layout
    for f in lib.functions:
        if not f.is_declaration and f.name not in names:
            f.linkage = llvm.Linkage.internal  # dropped below unless a kept one calls it
    pm = llvm.create_new_module_pass_manager()
    pm.add_global_dead_code_eliminate_pass()
    pm.run(lib, llvm.create_pass_builder(nvptx_target_machine(),
                                         llvm.PipelineTuningOptions(speed_level=0)))
    return lib.as_bitcode()


def _link_libdevice(mod: llvm.ModuleRef, tm: llvm.TargetMachine) -> None:
    """Link the libdevice functions ``mod`` calls into it, every definition ``linkonce_odr``
    (O3 then drops those it inlined)."""
    names = frozenset(f.name for f in mod.functions
                      if f.is_declaration and f.name.startswith("__nv_"))
    lib = llvm.parse_bitcode(_libdevice_subset(names, str(tm.target_data)))
    for f in lib.functions:
        if not f.is_declaration:
            f.linkage = llvm.Linkage.linkonce_odr
    mod.link_in(lib)


def _fail(what: str, text: str) -> CodegenError:
    return CodegenError(f"{what}\n--- LLVM IR ---\n{text}")


def emit_ptx(module: ir.Module, arch: str = "sm_90") -> tuple[str, str]:
    """(LLVM IR text as generated, PTX) of ``module``: verify, link libdevice if it calls
    ``__nv_*`` functions, optimise at O3, emit PTX for ``arch``."""
    with _LOCK:
        tm = nvptx_target_machine(arch)
        module.triple = TRIPLE
        module.data_layout = str(tm.target_data)
        with timed("LLVM IR"):
            text = str(module)
        mod = _optimized(text, tm)
        try:
            with timed("PTX"):
                ptx = tm.emit_assembly(mod)
        except RuntimeError as exc:  # pragma: no cover - LLVM reports, rarely
            raise _fail(f"the NVPTX backend failed: {exc}", text) from None
        return text, ptx


def optimized_ir(text: str, arch: str = "sm_90") -> str:
    """The module ``emit_ptx`` hands to the NVPTX backend, as text: ``text`` (the LLVM IR as
    generated, `CudaKernelImage.llvm_ir`) verified, libdevice linked in, optimised at O3."""
    with _LOCK:
        return str(_optimized(text, nvptx_target_machine(arch)))


def _optimized(text: str, tm: llvm.TargetMachine) -> llvm.ModuleRef:
    try:
        with timed("LLVM parse"):
            mod = llvm.parse_assembly(text)
            mod.verify()
    except RuntimeError as exc:
        raise _fail(f"generated NVPTX LLVM IR does not verify: {exc}", text) from None
    if any(f.is_declaration and f.name.startswith("__nv_") for f in mod.functions):
        with timed("libdevice"):
            _link_libdevice(mod, tm)
    with timed("LLVM opt"):
        pb = llvm.create_pass_builder(tm, llvm.PipelineTuningOptions(speed_level=3))
        pb.getModulePassManager().run(mod, pb)
    leftover = [f.name for f in mod.functions if f.is_declaration
                and not f.name.startswith("llvm.")]
    if leftover:
        raise _fail(f"unresolved functions after linking libdevice: {', '.join(leftover)}", text)
    return mod


class PtxCache(Protocol):
    """Where PTX can come from and go to (see `tcmlir.cache.artifacts`)."""

    def load(self) -> str | None: ...

    def store(self, ptx: str) -> None: ...


def compile_cuda_from_ast(fn: tc.Function, ast: isl.AstNode, sizes: Mapping[str, int] | None = None,
                          arch: str = "sm_90", ptx_cache: PtxCache | None = None,
                          promotion: Any = None, aligned: Collection[str] = ()) -> CudaKernelImage:
    """PTX for ``fn`` scheduled and mapped as the isl AST ``ast`` (see the module docstring).

    With ``ptx_cache``, PTX found there replaces LLVM's optimiser and NVPTX backend, and fresh
    PTX is handed to it. ``aligned`` names the tensors whose pointers every launch guarantees
    to be `ALIGN_BYTES`-aligned: their kernel parameters say so (``align 16``), which lets
    LLVM's load/store vectoriser merge a thread's adjacent accesses into 128-bit ones.
    """
    if not re.fullmatch(r"sm_\d+a?", arch or ""):
        raise CodegenError(f"cuda arch must look like sm_90, got {arch!r}")
    sizes = {k: int(v) for k, v in (sizes or {}).items() if k in fn.sizes}
    lowerer = _KernelLowerer(fn, NvptxTarget(arch), sizes, fn.name)
    lowerer.promotion = promotion
    lowerer.aligned = frozenset(aligned)
    with timed("LLVM IR"):
        launches = lowerer.kernels(ast)
    cached = ptx_cache.load() if ptx_cache is not None else None
    if cached is not None:
        with timed("LLVM IR"):
            text, ptx = str(lowerer.module), cached
    else:
        # wgmma exists only on sm_90a: its PTX runs on sm_90 devices alone
        text, ptx = emit_ptx(lowerer.module, "sm_90a" if lowerer.needs_sm90a and arch == "sm_90" else arch)
        if ptx_cache is not None:
            ptx_cache.store(ptx)
    return CudaKernelImage(fn.name, arch, ptx, text, launches, tuple(t.name for t in fn.tensors),
                           tuple(fn.sizes), tuple(lowerer.gathers), MappingProxyType(sizes),
                           on_chip_tensors(fn, getattr(lowerer, "local_tensors", set())),
                           tuple(t.name for t in fn.tensors if t.name in lowerer.aligned))


def compile_cuda(state: CompileState | Any, arch: str = "sm_90",
                 ptx_cache: PtxCache | None = None, aligned: Collection[str] = ()) -> CudaKernelImage:
    """PTX for a `CompileState` whose schedule the GPU mapping passes have run on."""
    from ..poly.loops import build_ast

    return compile_cuda_from_ast(state.fn, build_ast(state), getattr(state, "sizes", None) or {},
                                 arch or "sm_90", ptx_cache, getattr(state, "promotion", None),
                                 aligned)


def aligned_tensors(fn: tc.Function, signature: Any, options: Any) -> tuple[str, ...]:
    """The tensors a call of ``signature`` (None: inputs as fresh arrays come, aligned) hands
    over `ALIGN_BYTES`-aligned and whose kernel parameters say so: the inputs whose signature
    records it, and every output and temporary (the runtime allocates them; a user-given output
    that is not aligned is staged, `runtime.launch_plan`). None for a parametric kernel, which
    serves every signature of its ranks and dtypes."""
    if options.parametric:
        return ()
    args = signature.args if signature is not None else ()
    inputs = {t.name: a for t, a in zip(fn.inputs, args, strict=False)}
    names = [t.name for t in fn.tensors
             if t.name not in inputs or inputs[t.name].align >= ALIGN_BYTES]
    if options.register_tile:
        # register-tiled outputs are written once, from registers: claiming them aligned only
        # turns the epilogue into 128-bit stores, for which ptxas took 153 registers instead
        # of 127 in the default 4096^3 matmul (one block per SM instead of two: 4.50 against
        # 3.89 ms on the H200)
        outputs = {t.name for t in fn.outputs}
        names = [name for name in names if name not in outputs]
    return tuple(names)
