"""From a checked function, options and a signature to a `Kernel`: the pipeline in one place.

    options --to_pipeline(target)--> passes --PassManager--> CompileState
      cpu:   codegen.host.compile_host(state)   -> HostKernel (ctypes, thread pool)
      cuda:  codegen.nvptx.compile_cuda(state)  -> PTX + a lazily loaded CudaRunner
      numpy: the reference interpreter (the schedule and loops are still computed, for inspection)

Sizes are fixed in the scop (specialised kernels) unless the options ask for a parametric
kernel, which keeps them symbolic so one kernel serves every size of a signature's ranks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .options import MappingOptions
from .signature import Signature

if TYPE_CHECKING:  # pragma: no cover
    from .api import Kernel, TCFunction
    from .poly.state import CompileState

__all__ = ["compile_kernel", "lower"]


def lower(fn_ir: Any, sizes: Mapping[str, int] | None, options: MappingOptions, target: str,
          *, verify: bool = True) -> CompileState:
    """Run the pass pipeline ``options`` stand for on ``target`` and return the final state."""
    from .passes import PassManager, parse_pipeline
    from .poly.gpu_mapping import check_coverage, kernel_marks
    from .poly.state import CompileState

    state = CompileState.initial(fn_ir, None if options.parametric else sizes)
    passes = parse_pipeline(options.to_pipeline("cuda" if target == "cuda" else "cpu"))
    state = PassManager(passes, verify_each=verify).run(state)
    if verify and target == "cuda" and state.schedule is not None and kernel_marks(state.schedule):
        check_coverage(state.schedule, state.scop.domain, state.scop.context)
    return state


def compile_kernel(fn: TCFunction, target: str, options: MappingOptions, signature: Signature,
                   sizes: Mapping[str, int], arch: str | None) -> Kernel:
    from .api import Kernel
    from .poly.loops import build_ast, format_loops

    state = lower(fn.ir, sizes, options, target)
    kernel = Kernel(function=fn, target=target, options=options, signature=signature,
                    sizes=dict(sizes), schedule=str(state.schedule), arch=arch)
    if target == "cuda":
        from .codegen.nvptx import compile_cuda
        from .runtime.cuda_launch import CudaRunner

        arch = arch or fn.default_arch("cuda")
        image = compile_cuda(state, arch)
        kernel.arch = arch
        kernel.loops = format_loops(build_ast(state))
        kernel.llvm_ir, kernel.ptx_text = image.llvm_ir, image.ptx
        kernel.runner = CudaRunner(image, device=0)
        return kernel
    kernel.loops = format_loops(build_ast(state))
    if target == "cpu":
        from .codegen.host import compile_host
        from .config import get_config

        threads = options.threads or get_config().threads
        runner = compile_host(state, threads=threads)
        kernel.runner = runner
        kernel.llvm_ir = runner.llvm_ir
        kernel.arch = fn.default_arch("cpu")
    return kernel
