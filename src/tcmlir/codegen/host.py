"""Host JIT (target ``cpu``): lower, verify, optimise at O3 and JIT with llvmlite's MCJIT.

`compile_host(state)` takes the polyhedral `CompileState`, builds its loop AST and returns a
`tcmlir.runtime.host.HostKernel`; `compile_host_from_ast(fn, ast, sizes)` does the same from an
isl AST built elsewhere. Each kernel owns its own MCJIT engine (kept alive by the kernel).

The module is checked twice before any machine code exists: llvmlite parses and verifies the
text, and every external symbol (libm) is looked up in the process, so a mistake ends as a
`CodegenError` with the IR attached rather than an LLVM abort.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import llvmlite.binding as llvm
from llvmlite import ir

from .. import ir as tc
from ..errors import CodegenError
from ..log import timed
from ..runtime.host import GROUP_FN, RANGE_FN, EntryPoint, HostKernel
from .lower import LoweredModule, lower_function
from .target import HostTarget

if TYPE_CHECKING:  # pragma: no cover
    import islpy as isl

__all__ = ["JitModule", "compile_host", "compile_host_from_ast", "host_target_machine", "jit"]

_LOCK = threading.RLock()
_LAYOUT: str | None = None


def host_target_machine() -> llvm.TargetMachine:
    """A new target machine for the host CPU and its features at O3 (each MCJIT engine takes
    ownership of the one it is given, so every kernel gets its own); loads libm once."""
    global _LAYOUT
    with _LOCK:
        if _LAYOUT is None:
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
            for lib in ("m", "gcc_s"):  # libm for math, libgcc for half-precision conversions
                path = ctypes.util.find_library(lib)
                if path:
                    try:
                        llvm.load_library_permanently(path)
                    except RuntimeError:  # pragma: no cover - depends on the system
                        pass
        target = llvm.Target.from_default_triple()
        tm = target.create_target_machine(
            cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(),
            opt=3, codemodel="jitdefault")
        if _LAYOUT is None:
            _LAYOUT = str(tm.target_data)
        return tm


@dataclass
class JitModule:
    """A finalised MCJIT engine and what it was built from."""

    engine: Any
    llvm_ir: str
    optimized_ir: str

    def address(self, name: str) -> int:
        addr = self.engine.get_function_address(name)
        if not addr:
            raise CodegenError(f"internal: JIT has no function {name}")
        return addr


def _fail(what: str, text: str) -> CodegenError:
    return CodegenError(f"{what}\n--- LLVM IR ---\n{text}")


class ObjectCache(Protocol):
    """Where MCJIT's object code can come from and go to (see `tcmlir.cache.artifacts`)."""

    def load(self) -> bytes | None: ...

    def store(self, obj: bytes) -> None: ...


def jit(module: ir.Module, object_cache: ObjectCache | None = None) -> JitModule:
    """Verify, optimise (new pass manager, O3, loop and SLP vectorisation) and JIT ``module``.

    With ``object_cache``: object code found there is used as is (neither the optimiser nor code
    generation runs), and freshly generated object code is handed to it.
    """
    with _LOCK:
        tm = host_target_machine()
        module.triple = llvm.get_process_triple()
        module.data_layout = _LAYOUT or ""
        with timed("LLVM IR"):
            text = str(module)
        try:
            with timed("LLVM parse"):
                mod = llvm.parse_assembly(text)
                mod.verify()
        except RuntimeError as exc:
            raise _fail(f"generated LLVM IR does not verify: {exc}", text) from None
        for f in mod.functions:
            if f.is_declaration and not f.name.startswith("llvm.") and not llvm.address_of_symbol(f.name):
                raise _fail(f"external function {f.name} is not available in this process", text)
        cached = object_cache.load() if object_cache is not None else None
        if cached is None:
            pto = llvm.PipelineTuningOptions(speed_level=3)
            pto.loop_vectorization = True
            pto.slp_vectorization = True
            with timed("LLVM opt"):
                pb = llvm.create_pass_builder(tm, pto)
                pb.getModulePassManager().run(mod, pb)
                optimized = str(mod)
        else:
            optimized = "; optimised IR not available: the object code came from the tcmlir cache"
        engine = llvm.create_mcjit_compiler(mod, tm)
        if object_cache is not None:
            engine.set_object_cache(lambda _m, buf: object_cache.store(bytes(buf)),
                                    lambda _m: cached)
        with timed("JIT"):
            engine.finalize_object()
            engine.run_static_constructors()
        return JitModule(engine, text, optimized)


def kernel_from_lowered(fn: tc.Function, lowered: LoweredModule, sizes: Mapping[str, int],
                        threads: int | None = None,
                        object_cache: ObjectCache | None = None) -> HostKernel:
    jm = jit(lowered.module, object_cache)
    entries = []
    for g in lowered.groups:
        call = GROUP_FN(jm.address(g.name))
        rng = RANGE_FN(jm.address(g.range_name)) if g.range_name else None
        entries.append(EntryPoint(g.name, call, rng))
    return HostKernel(fn, entries, lowered.gathers, jm.llvm_ir, jm.optimized_ir, keepalive=jm,
                      sizes=sizes, threads=threads, on_chip=lowered.on_chip)


def compile_host_from_ast(fn: tc.Function, ast: isl.AstNode, sizes: Mapping[str, int] | None = None,
                          threads: int | None = None,
                          object_cache: ObjectCache | None = None) -> HostKernel:
    """JIT ``fn`` scheduled as the isl AST ``ast``; ``sizes`` fixed at compile time (may be partial)."""
    sizes = dict(sizes or {})
    with timed("LLVM IR"):
        lowered = lower_function(fn, ast, HostTarget(), sizes)
    return kernel_from_lowered(fn, lowered, sizes, threads, object_cache)


def compile_host(state: Any, threads: int | None = None,
                 object_cache: ObjectCache | None = None) -> HostKernel:
    """JIT the function of a polyhedral `CompileState` (its schedule's loop AST)."""
    from ..poly.loops import build_ast

    sizes = getattr(state, "sizes", None) or {}
    return compile_host_from_ast(state.fn, build_ast(state), sizes, threads, object_cache)
