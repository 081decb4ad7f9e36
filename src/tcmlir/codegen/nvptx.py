"""The NVPTX target (``target="cuda"``): one PTX kernel per ``kernel`` mark of the mapped schedule.

`compile_cuda(state, arch)` builds the isl AST of a schedule the GPU mapping passes have run on
(``map-to-blocks``/``map-to-threads``), finds every mark named ``kernel grid=GX,GY,GZ
block=BX,BY,BZ`` and lowers the subtree under each with the shared walk of `lower.py` into one
``ptx_kernel`` function. Block and thread indices appear in that AST as the isl parameters
``_bx _by _bz _tx _ty _tz``; `NvptxTarget.parameter` reads them from the special registers
(``llvm.nvvm.read.ptx.sreg.{ctaid,tid}.{x,y,z}``). The mapped loops are strided, so every
(block, thread) covers its share of the instances and no synchronisation is needed.

The kernel ABI (which kernels, their parameters, `KernelLaunch` and `CudaKernelImage`) is
`nvptx_abi`; linking libdevice, optimising and emitting PTX is `nvptx_link`. This module
holds the target strategy of the shared walk and the compile entry points; the names of the
other two that users import from here are re-exported.

Math built-ins go to libdevice (``__nv_expf``, ``__nv_tanh``, ...) except those NVPTX lowers
itself (sqrt, fabs, floor, fma, min/max, ...). libdevice is linked only into modules that call
it, with every definition made ``linkonce_odr`` so O3 drops the unused ones.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

import islpy as isl
from llvmlite import ir

from .. import ir as tc
from ..errors import CodegenError
from ..log import timed
from ..poly.promotion import SYNC_STMT
from ..signature import ALIGN_BYTES
from .exprs import I32, I64, ExprEmitter, const, memory_type
from .gpu_rows import on_chip_tensors
from .lower import GroupWalker
from .nvptx_abi import (
    CudaKernelImage,
    KernelLaunch,
    KernelLowerer,
    find_kernels,
    parse_kernel_mark,
    parse_reduction_mark,
)
from .nvptx_link import emit_ptx, find_libdevice, optimized_ir
from .param_space import PARAM_SPACE_BYTES, check_parameter_space
from .target import Target, declare

if TYPE_CHECKING:  # pragma: no cover
    from ..poly.state import CompileState

__all__ = ["ALIGN_BYTES", "PARAM_SPACE_BYTES", "CudaKernelImage", "KernelLaunch", "NvptxTarget",
           "aligned_tensors", "check_parameter_space", "compile_cuda", "compile_cuda_from_ast",
           "find_kernels", "find_libdevice", "optimized_ir", "parse_kernel_mark"]

_SREG = {"_bx": "ctaid.x", "_by": "ctaid.y", "_bz": "ctaid.z",
         "_tx": "tid.x", "_ty": "tid.y", "_tz": "tid.z"}


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
            from .gpu_wgmma import emit_mma

            mma = parse_mma_mark(name)
            if mma is None:
                raise CodegenError(f"bad mma mark {name!r}")
            emit_mma(walker, mma)  # the statements below are the mark's: not walked
            return
        red = parse_reduction_mark(name)
        if red is not None:
            from .gpu_reduce import ReducingWalker

            if not isinstance(walker, ReducingWalker):
                raise CodegenError(f"mark {name!r} outside a kernel")
            walker.reduce(red[0], red[1], child, atomic=red[2])
            return
        walker.node(child)


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
    lowerer = KernelLowerer(fn, NvptxTarget(arch), sizes, fn.name)
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
