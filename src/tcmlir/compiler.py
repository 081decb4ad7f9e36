"""From a checked function, options and a signature to a `Kernel`: the pipeline in one place.

    options --to_pipeline(target)--> passes --PassManager--> CompileState
      cpu:   codegen.host.compile_host(state)   -> HostKernel (ctypes, thread pool)
      cuda:  codegen.nvptx.compile_cuda(state)  -> PTX + a lazily loaded CudaRunner
      numpy: the reference interpreter (the schedule and loops are still computed, for inspection)

Sizes are fixed in the scop (specialised kernels) unless the options ask for a parametric
kernel, which keeps them symbolic so one kernel serves every size of a signature's ranks.

Compiled artifacts (host object code, whole cuda kernels, PTX, cubins) go through the
persistent `KernelCache` (see `tcmlir.cache.artifacts`), so another process compiling the same
kernel skips LLVM (host) or the whole compiler (cuda).
``COMPILE_COUNTS["compile_kernel"]`` counts the compiles of this process (tests read it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .kernel import Kernel, KernelOwner
from .log import get_logger, options_digest, stage_times, timed
from .options import MappingOptions
from .signature import Signature

if TYPE_CHECKING:  # pragma: no cover
    from .poly.state import CompileState

__all__ = ["COMPILE_COUNTS", "compile_kernel", "cuda_kernel_from", "lower"]

COMPILE_COUNTS: dict[str, int] = {"compile_kernel": 0}
log = get_logger("compile")


def lower(fn_ir: Any, sizes: Mapping[str, int] | None, options: MappingOptions, target: str,
          *, verify: bool = True) -> CompileState:
    """Run the pass pipeline ``options`` stand for on ``target`` and return the final state."""
    from .passes import PassManager, parse_pipeline
    from .poly.gpu_mapping import check_coverage, kernel_marks
    from .poly.state import CompileState

    state = CompileState.initial(fn_ir, None if options.parametric else sizes)
    passes = parse_pipeline(options.to_pipeline("cuda" if target == "cuda" else "cpu"))
    manager = PassManager(passes, verify_each=verify)
    state = manager.run(state)
    if log.isEnabledFor(logging.DEBUG):
        log.debug("%s: passes %s", fn_ir.name,
                  ", ".join(f"{name} {t * 1e3:.2f} ms" for name, t in manager.timings))
    if verify and target == "cuda" and state.schedule is not None and kernel_marks(state.schedule):
        with timed("verify"):
            check_coverage(state.proof_schedule, state.scop.domain, state.scop.context)
    return state


def compile_kernel(fn: KernelOwner, target: str, options: MappingOptions, signature: Signature,
                   sizes: Mapping[str, int], arch: str | None) -> Kernel:
    """Lower, generate code and build the runner; logs the compile (`tcmlir.log`)."""
    from .cache.artifacts import COUNTERS

    start = time.perf_counter()
    before = (COUNTERS.hits, COUNTERS.misses)
    with stage_times() as stages:
        kernel = _compile_kernel(fn, target, options, signature, sizes, arch)
    total = time.perf_counter() - start
    hits, misses = COUNTERS.hits - before[0], COUNTERS.misses - before[1]
    if hits or misses:  # (counters are process-wide: approximate under concurrent compiles)
        log.debug("%s: compiled-artifact cache %s (%d hit(s), %d miss(es))", fn.entry,
                  "miss" if misses else "hit", hits, misses)
    if log.isEnabledFor(logging.INFO):
        log.info("compiled %s for %s (%s), options %s, in %.1f ms (%s)", fn.entry, target,
                 kernel.arch or "-", options_digest(options.to_json()), total * 1e3,
                 ", ".join(f"{name} {t * 1e3:.1f} ms" for name, t in stages.items()))
    return kernel


def _compile_kernel(fn: KernelOwner, target: str, options: MappingOptions, signature: Signature,
                    sizes: Mapping[str, int], arch: str | None) -> Kernel:
    from .poly.loops import build_ast, format_loops
    from .pretty import format_schedule

    COMPILE_COUNTS["compile_kernel"] += 1
    if target == "cuda":
        from .cache.artifacts import load_cuda_kernel
        from .codegen.param_space import check_parameter_space
        from .passes import parse_pipeline

        # before the passes, cheap and early: each statement's tensors that no pass removes
        # (only inline-temporaries removes temporaries; split-k adds one, and fused
        # statements share a kernel: each kernel is checked again when it is lowered)
        inlines = "inline-temporaries" in (p.name for p in parse_pipeline(options.to_pipeline("cuda")))
        check_parameter_space(fn.ir, temporaries_may_go=inlines)
        arch = arch or fn.default_arch("cuda")
        with timed("cached kernel"):
            fields = load_cuda_kernel(fn, signature, options, arch)
        if fields is not None:
            return cuda_kernel_from(fn, options, signature, sizes, fields)
    state = lower(fn.ir, sizes, options, target)
    kernel = Kernel(function=fn, target=target, options=options, signature=signature,
                    sizes=dict(sizes), schedule=format_schedule(state.schedule), arch=arch,
                    compiled_ir=None if state.fn is fn.ir else state.fn)
    if target == "cuda":
        from .cache.artifacts import compile_cuda_cached, make_cuda_runner, store_cuda_kernel

        assert arch is not None
        image, cubin_key = compile_cuda_cached(fn, state, signature, options, arch)
        kernel.arch = arch
        ast = build_ast(state)  # code generation's AST (memoised)
        with timed("loops text"):
            kernel.loops = format_loops(ast)
        kernel.llvm_ir, kernel.ptx_text = image.llvm_ir, image.ptx
        kernel.runner = make_cuda_runner(image, cubin_key, device=0)
        with timed("cache store"):
            store_cuda_kernel(fn, signature, options, arch, kernel)
        return kernel
    ast = build_ast(state)
    with timed("loops text"):
        kernel.loops = format_loops(ast)
    if target == "cpu":
        from .cache.artifacts import compile_host_cached
        from .config import get_config

        threads = options.threads or get_config().threads
        kernel.arch = fn.default_arch("cpu")
        runner = compile_host_cached(fn, state, signature, options, kernel.arch, threads)
        kernel.runner = runner
        kernel.llvm_ir = runner.llvm_ir
    return kernel


def cuda_kernel_from(fn: KernelOwner, options: MappingOptions, signature: Signature,
                     sizes: Mapping[str, int], fields: Mapping[str, Any]) -> Kernel:
    """A cuda `Kernel` from the fields of a packed one (`cache.kernel_image`), with a fresh
    runner (its module loads on the first launch)."""
    from .cache.artifacts import cubin_artifact_key, make_cuda_runner

    image = fields["image"]
    kernel = Kernel(function=fn, target="cuda", options=options, signature=signature,
                    sizes=dict(sizes), schedule=fields["schedule"], arch=image.arch,
                    compiled_ir=fields["compiled_ir"])
    kernel.loops, kernel.llvm_ir, kernel.ptx_text = fields["loops"], image.llvm_ir, image.ptx
    kernel.runner = make_cuda_runner(image, cubin_artifact_key(fn, signature, options, image.arch),
                                     device=0)
    return kernel
