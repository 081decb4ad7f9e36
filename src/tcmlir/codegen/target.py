"""Target strategies: what differs between the host (x86/ARM via MCJIT) and NVPTX code.

The walk in `lower.py` and the expression lowering in `exprs.py` are shared; a `Target` decides

* how a primitive math built-in is called (`math`): the host uses LLVM intrinsics where LLVM
  lowers them everywhere and libm otherwise, the NVPTX target will call libdevice;
* which address space tensor memory lives in (`global_addrspace`);
* which values isl AST ids other than iterators and sizes stand for (`parameter`);
* what an isl mark means (`mark`): the host turns the outermost ``parallel`` mark into a loop
  whose iterations are restricted to the function's ``[lo, hi)`` chunk (the runtime calls the
  function once per chunk on a thread pool); other marks are transparent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, ClassVar, Protocol

from llvmlite import ir

from ..errors import CodegenError
from .fastmath import FAST_F32, emit_fast_f32

if TYPE_CHECKING:  # pragma: no cover
    import islpy as isl

__all__ = ["HostTarget", "Target", "Walker", "declare", "type_suffix", "unroll_full"]


class Walker(Protocol):
    """What the hooks of `Target` use of the walk that calls them (`lower.GroupWalker`, whose
    module imports this one): a target's own hooks may use more of it."""

    chunkable: bool
    chunk_next_for: bool

    def node(self, node: isl.AstNode) -> None: ...


def declare(module: ir.Module, name: str, fnty: ir.FunctionType) -> ir.Function:
    """The function ``name`` of ``module``, declared with ``fnty`` if it is not there yet."""
    existing = module.globals.get(name)
    if existing is not None:
        if not isinstance(existing, ir.Function) or existing.function_type != fnty:
            raise CodegenError(f"internal: {name} declared twice with different types")
        return existing
    return ir.Function(module, fnty, name)


def type_suffix(ty: ir.Type) -> str:
    """The type suffix of an LLVM intrinsic on ``ty`` (``f32``, ``f64``)."""
    if isinstance(ty, ir.FloatType):
        return "f32"
    if isinstance(ty, ir.DoubleType):
        return "f64"
    raise CodegenError(f"math built-ins take float or double operands, not {ty}")


class Target:
    """Base strategy: LLVM intrinsics for everything it names, marks are transparent."""

    name = "abstract"
    global_addrspace = 0
    # Let LLVM reassociate the float + and * of reductions (TC leaves their order open), so
    # that loops carrying a float sum or product vectorise.
    reassociate_reductions = False
    # loads of input tensors carry !invariant.load (inputs are never written by a kernel)
    invariant_inputs = False
    # float + - * may be contracted into fused multiply-adds (nvcc's default -fmad=true)
    contract_floats = False
    # float x / y may become x * (1 / y) (LLVM's arcp), so a division by a loop-invariant
    # value (softmax's e / s(n)) leaves the loop as one reciprocal
    reciprocal_divisions = False
    # temporaries whose rows never cross a parallel loop's iterations live in a stack row
    # (`host_rows`)
    row_local_temporaries = False
    # a failed bounds check also writes the index and the extent after its code (`lower`'s err)
    records_index = False
    # built-ins lowered to `llvm.<name>.<type>` intrinsics (name in TC -> intrinsic stem)
    intrinsics: ClassVar[Mapping[str, str]] = MappingProxyType({})

    @property
    def pointer(self) -> ir.PointerType:
        return ir.PointerType(addrspace=self.global_addrspace)

    def math(self, b: ir.IRBuilder, module: ir.Module, name: str, args: Sequence[ir.Value]) -> ir.Value:
        """Call primitive built-in ``name`` (C spelling) on operands of one float type."""
        ty = args[0].type
        stem = self.intrinsics.get(name)
        if stem is not None:
            fn = declare(module, f"llvm.{stem}.{type_suffix(ty)}", ir.FunctionType(ty, [ty] * len(args)))
            return b.call(fn, list(args))
        return b.call(self.external_math(module, name, ty, len(args)), list(args))

    def external_math(self, module: ir.Module, name: str, ty: ir.Type, arity: int) -> ir.Function:
        raise CodegenError(f"built-in {name} is not available on target {self.name}")

    def mark(self, walker: Walker, name: str, child: isl.AstNode) -> None:
        """Lower the subtree under mark ``name`` (default: the mark is transparent)."""
        walker.node(child)

    def promoted_statement(self, walker: Walker, name: str, payload: object) -> None:
        """Lower a copy or barrier statement of promotion (GPU targets only)."""
        raise CodegenError(f"statement {name}: memory promotion is not supported on target {self.name}")

    def buffer_base(self, walker: Walker, buf: object) -> ir.Value:
        raise CodegenError(f"memory promotion is not supported on target {self.name}")

    def parameter(self, b: ir.IRBuilder, name: str) -> ir.Value | None:
        """An i64 value for an isl AST id that is neither a loop iterator nor a size (the GPU
        target's ``_bx``, ``_tx``, ...), emitted with ``b`` in the function's entry block;
        None: the name is unknown (a CodegenError)."""
        return None


class HostTarget(Target):
    """The host CPU: intrinsics for the common functions, libm (``tanhf``/``tanh``, ...) for the rest,
    except float32 ``exp``, ``exp2``, ``expm1``, ``log``, ``log2`` and ``tanh``, emitted inline by
    `fastmath` so that loops using them vectorise.

    MCJIT resolves the libm symbols from the process once `codegen.host` has loaded libm
    permanently. A ``parallel`` mark whose loop is not nested in another loop becomes the
    chunked loop of its group (see `lower.GroupWalker.chunk_next_for`).
    """

    name = "cpu"
    reassociate_reductions = True
    # a*b+c as one fma where the host has it (what BLAS and nvcc do; within a rounding of the
    # unfused value): a multiply and an add took twice the time in every vectorised loop
    contract_floats = True
    reciprocal_divisions = True
    row_local_temporaries = True
    records_index = True
    intrinsics = MappingProxyType({
        "sqrt": "sqrt", "exp": "exp", "log": "log", "fabs": "fabs", "floor": "floor",
        "ceil": "ceil", "trunc": "trunc", "round": "round", "pow": "pow", "copysign": "copysign",
        "fmin": "minnum", "fmax": "maxnum", "fma": "fma", "exp2": "exp2", "log2": "log2",
        "log10": "log10", "sin": "sin", "cos": "cos",
        # TC's min/max on floats propagate NaN (numpy's minimum/maximum)
        "fminimum": "minimum", "fmaximum": "maximum",
    })

    def math(self, b: ir.IRBuilder, module: ir.Module, name: str, args: Sequence[ir.Value]) -> ir.Value:
        # float32 exp/log/tanh family inline (see `fastmath`): libm calls would keep loops scalar
        if name in FAST_F32 and isinstance(args[0].type, ir.FloatType):
            return emit_fast_f32(b, name, args[0])
        return super().math(b, module, name, args)

    def external_math(self, module: ir.Module, name: str, ty: ir.Type, arity: int) -> ir.Function:
        cname = name + ("f" if isinstance(ty, ir.FloatType) else "")
        # Not declared readnone on purpose: LLVM would then vectorise the loop into vector
        # intrinsics (llvm.tanh.v16f32) that the backend scalarises again, twice as slow as the
        # scalar loop, since llvmlite's pass builder has no vector math library (libmvec).
        return declare(module, cname, ir.FunctionType(ty, [ty] * arity))

    def mark(self, walker: Walker, name: str, child: isl.AstNode) -> None:
        if name == "parallel" and walker.chunkable:
            walker.chunk_next_for = True
        if name.startswith("host-gemm"):  # passes/host_contraction: the packed kernel
            from ..poly.host_contraction import parse_host_gemm_mark
            from .host_gemm import emit_host_gemm

            mark = parse_host_gemm_mark(name)
            if mark is None:
                raise CodegenError(f"malformed host-gemm mark {name!r}")
            emit_host_gemm(walker, mark, child)
            return
        walker.node(child)


class _LoopID(ir.values.MDValue):
    """A distinct, self-referential loop id ``!N = distinct !{!N, options...}`` (llvmlite's
    `Module.add_metadata` makes only uniqued nodes)."""

    def __init__(self, module: ir.Module, options: list[ir.values.MDValue]):
        super().__init__(module, (), name=str(len(module.metadata)))
        self.operands = (self, *options)

    def descr(self, buf: list[str]) -> None:
        buf.append("distinct ")
        super().descr(buf)

    __eq__ = object.__eq__
    __ne__ = object.__ne__
    __hash__ = object.__hash__


def unroll_full(module: ir.Module) -> ir.values.MDValue:
    """A fresh loop id asking LLVM to unroll the loop fully (``llvm.loop.unroll.full``)."""
    full = module.add_metadata([ir.MetaDataString(module, "llvm.loop.unroll.full")])
    return _LoopID(module, [full])
