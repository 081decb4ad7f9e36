"""LLVM for the NVPTX target: link libdevice, optimise at O3, emit PTX.

`emit_ptx(module, arch)` verifies a module built by `nvptx.compile_cuda_from_ast`, links into
it the libdevice functions it calls (``__nv_expf``, ``__nv_tanh``, ...: only those and what
they use are parsed from the library, every definition made ``linkonce_odr`` so O3 drops those
it inlined), optimises it at O3 and emits PTX for the arch; `optimized_ir` is the module it
hands to the backend, as text (``python -m tcmlir.dump``). LLVM's state is shared by the
process: one lock serialises its use.
"""

from __future__ import annotations

import functools
import os
import threading

import llvmlite.binding as llvm
from llvmlite import ir

from ..errors import CodegenError
from ..log import timed

__all__ = ["PTX_FEATURES", "TRIPLE", "emit_ptx", "find_libdevice", "nvptx_target_machine",
           "optimized_ir"]

TRIPLE = "nvptx64-nvidia-cuda"
PTX_FEATURES = "+ptx80"  # PTX ISA 8.0: sm_90 and the ptxas of CUDA 12/13 accept it
_LOCK = threading.RLock()
_LIBDEVICE_PLACES = ("/usr/local/cuda/nvvm/libdevice/libdevice.10.bc",
                     "/opt/cuda/nvvm/libdevice/libdevice.10.bc")


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
