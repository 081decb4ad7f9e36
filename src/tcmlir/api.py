"""The public surface: ``tc.define`` → `TCFunction` (call, compile, autotune) → `Kernel`.

A `TCFunction` holds one checked TC definition. Calling it binds and validates the inputs,
compiles once per (target, signature, options, arch) — kept in memory — and launches. The
stages of a compiled kernel (schedule, loops, LLVM IR, PTX) are exposed on the `Kernel`.

A call's hot path is bind → prepared plan → launch: the first call of a signature (with
default options and fresh outputs) makes a plan (`runtime.host_plan.HostPlan`,
`runtime.launch_plan.CudaPlan`) and files it under the inputs' `signature.call_key`; a later
call with an equal key and the same hot knobs goes straight to the plan.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from . import ir
from .array_kinds import given_outputs, has_zero_extent, in_input_kind
from .benchmark import clock
from .binding import allocate_outputs, bind_host_inputs, check_outputs
from .call_args import as_devices, as_mapping_options, order_inputs
from .config import get_config, hot_path_token
from .empty_calls import empty_call
from .errors import CallError, Source, TCError
from .input_spec import InputSpec, bind_input_spec
from .interrupt import stop_on_interrupt
from .kernel import Kernel, options_digest
from .lang import check, parse
from .lang.printer import format_def
from .log import setup_logging
from .options import MappingOptions
from .runtime.host_calls import host_calls, host_ready
from .runtime.torch_fast import MISS
from .signature import Signature, call_key
from .targets import TARGETS, check_target, resolve_target

if TYPE_CHECKING:  # pragma: no cover - tune is imported when a tuning starts
    from .tune.config import TunerConfig

# `Kernel` (`tcmlir.kernel`) and the targets (`tcmlir.targets`) live below the layers that use
# them; they are re-exported here, where the public surface is
__all__ = ["TARGETS", "Kernel", "TCFunction", "define", "options_digest", "resolve_target"]

OptionsFactory = Callable[["TCFunction", Sequence[Any]], MappingOptions]
# what ``options=`` takes (`call_args.as_mapping_options`): options, a preset name, JSON, a dict
OptionsArg = MappingOptions | str | Mapping[str, Any] | None


def define(source: str, name: str | None = None, *, target: str = "auto",
           options_factory: OptionsFactory | None = None, filename: str = "<string>") -> TCFunction:
    """Parse and check ``source`` and return its definition ``name`` (optional with one def).

    ``target``: ``"cuda"``, ``"cpu"`` (LLVM JIT on the host), ``"numpy"`` (the reference
    interpreter) or ``"auto"`` (cuda when a GPU is visible, else cpu).
    """
    setup_logging()
    if not isinstance(source, str):
        raise TCError(f"tc.define expects TC source text, got {type(source).__name__}")
    check_target(target)
    src = Source(source, filename)
    program = parse(source, filename)
    fn_ir = check(program, name, source=src)
    return TCFunction(src, program, fn_ir, target, options_factory)


class TCFunction:
    """One checked TC definition; call it like a function on arrays."""

    def __init__(self, source: Source, program: Any, fn: ir.Function, target: str,
                 options_factory: OptionsFactory | None) -> None:
        self.source = source
        self.program = program
        self.ir = fn
        self.entry = fn.name
        self.target = target
        self.options_factory = options_factory
        self.canonical_source = format_def(program.get(fn.name))
        self._kernels: dict[tuple, Kernel] = {}
        # call_key -> (hot knobs, plan.call, the plan's call without a stream argument or None,
        # its call into given outputs or None)
        self._plans: dict[tuple, tuple[tuple, Any, Any, Any]] = {}
        # (call_key, options key) -> (hot knobs, plan.call, plain call, the options) for calls
        # with explicit options (a tuned result passed on every call): the latest 32
        self._option_plans: dict[tuple, tuple[tuple, Any, Any, Any]] = {}
        # the latest torch plan's guarded call (`runtime.torch_fast`, a host plan's
        # `runtime.host_calls`), tried before the key
        self._fast: Callable[[Sequence[Any]], Any] | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<tcmlir function {self.entry} target={self.target}>"

    # ------------------------------------------------------------ signatures

    def definer(self) -> Callable[..., TCFunction]:
        """`define` bound to this definition's source text and name: a picklable callable that
        makes the function again in another process (``fn.definer()(target="cuda")``). The
        tuner's worker processes receive it, so `tune` never imports `api`."""
        return functools.partial(define, self.source.text, self.entry)

    def input_spec(self, inputs: Sequence[Any], target: str | None = None) -> InputSpec:
        """The signature and size values a call on ``target`` (default: the function's) binds
        ``inputs`` to: numpy, torch (CPU and CUDA), CuPy, ``__cuda_array_interface__`` and
        DLPack arrays, read without copying device data (`tcmlir.input_spec`)."""
        check_target(target)
        return bind_input_spec(self.ir, inputs, resolve_target(target or self.target))

    def signature(self, *inputs: Any, **named: Any) -> Signature:
        """The signature (shapes, dtypes, strides, alignment) these inputs bind to in a call
        (inputs by position or by TC name, as in a call)."""
        return self.input_spec(order_inputs(self.ir, inputs, named)).signature

    def size_values(self, *inputs: Any, **named: Any) -> dict[str, int]:
        """The value of each size parameter for these inputs (by position or by TC name)."""
        return self.input_spec(order_inputs(self.ir, inputs, named)).sizes

    def default_arch(self, target: str | None = None) -> str:
        """The arch a compile for ``target`` uses by default (the GPU's ``sm_XX``, or the
        host's)."""
        target = resolve_target(target or self.target)
        if target == "cuda":
            from .runtime import default_cuda_arch

            return default_cuda_arch()
        from .runtime.host_arch import host_arch

        return host_arch()

    # ------------------------------------------------------------ calling

    def __call__(self, *inputs: Any, options: OptionsArg = None,
                 outputs: Sequence[Any] | None = None, stream: Any = None,
                 devices: Sequence[int] | None = None, **named: Any) -> Any:
        """Run on ``inputs``, given in the definition's order, or by their TC names
        (``fn(A, B=b)``, as Python binds parameters; an input named like a keyword below goes
        by position). ``options``: see `compile`. ``stream`` (target cuda): the CUDA stream to launch on — a
        ``torch.cuda.Stream``, a CuPy stream, a raw ``CUstream`` handle (int) or a
        `tcmlir.runtime.cuda.Stream`; by default the current stream of the inputs' library
        (torch's or CuPy's), else the legacy default stream. ``devices`` (or
        ``options.devices``): split the call across these GPUs (`tcmlir.multi`, see `plan`)."""
        if named:
            inputs = order_inputs(self.ir, inputs, named)
        fast = self._fast
        if fast is not None and options is None and outputs is None and stream is None \
                and devices is None:
            done = fast(inputs)  # the latest torch plan, guarded by its inputs' call key
            # (MISS also: a host plan's torch inputs off the CPU; the full path says why)
            if done is not MISS:
                return done
        okey = None
        if options is not None and devices is None and outputs is None:
            # explicit options: their remembered plan (keyed by the text, or by the very
            # MappingOptions object, held in the entry so its id stays its own)
            okey = options if isinstance(options, str) else (
                id(options) if isinstance(options, MappingOptions) else None)
            if okey is not None:
                key = call_key(inputs)
                hit = self._option_plans.get((key, okey)) if key is not None else None
                if hit is not None and hit[0] == hot_path_token():
                    done = _replay(hit, inputs, stream)
                    if done is not MISS:
                        return done
        given = options
        options = as_mapping_options(options)
        devices = as_devices(devices)
        if devices is not None or (options is not None and options.devices):
            from .multi.execute import split_call

            return split_call(self, inputs, options.devices if devices is None else devices,
                              options, resolve_target(self.target), outputs=outputs,
                              stream=stream)
        if options is None:
            key = call_key(inputs)
            if key is not None:
                hit = self._plans.get(key)
                if hit is not None and hit[0] == hot_path_token():
                    if outputs is None:
                        done = _replay(hit, inputs, stream)
                        if done is not MISS:  # (MISS: torch tensors off the CPU)
                            return done
                    if stream is None and hit[3] is not None:
                        done = hit[3](inputs, outputs)  # None: not the plan's case, see below
                        if done is not None:
                            return done
        if has_zero_extent(inputs):  # empty outputs: nothing to compile or launch
            return empty_call(self, inputs, outputs)
        # inside a capture, nothing may compile (module loads, allocations would invalidate
        # the caller's capture): a kernel not compiled yet is refused before any driver call
        kernel, bound = self._compile(inputs, options, None, None,
                                      compile_missing=not _capturing_torch(inputs, stream))
        # (an options factory answers for the first call of each signature, factories.py: its
        # choice is remembered with the plan like the defaults')
        return self._launch(kernel, inputs, outputs, bound, stream=stream,
                            remember=options is None or okey is not None,
                            given=None if okey is None else (given, okey))

    def check_errors(self) -> None:
        """Wait for this function's CUDA work and raise the `CallError` of any gather bounds
        failure not reported yet (with ``TCMLIR_GATHER_CHECK=async``, or after CUDA graph
        replays, a failure is otherwise reported by a later call)."""
        for kernel in list(self._kernels.values()):
            check = getattr(kernel.runner, "check_errors", None)
            if check is not None:
                check()

    def compile(self, *inputs: Any, options: OptionsArg = None,
                target: str | None = None, arch: str | None = None,
                devices: Sequence[int] | None = None, **named: Any) -> Any:
        """Compile for these inputs' signature without launching (no GPU needed for a named arch).
        Inputs go by position or by TC name, as in a call. ``options``: a `MappingOptions`, a
        preset name (``"naive"``, ``"pointwise"``, ``"mlp"``, ``"convolution"``,
        ``"group_convolution"``), the JSON text of ``opts.to_json()`` or the dict of
        ``opts.to_dict()`` (anything else is an `OptionsError`); None: the function's options
        factory, else the defaults for these sizes. With ``devices`` (or
        ``options.devices``): a `tcmlir.multi.SplitKernel`, the split plan and each part's
        kernel."""
        inputs = order_inputs(self.ir, inputs, named)
        options = as_mapping_options(options)
        devices = as_devices(devices)
        if devices is not None or (options is not None and options.devices):
            from .multi.execute import split_kernel

            check_target(target)
            return split_kernel(self, inputs, options.devices if devices is None else devices,
                                options, resolve_target(target or self.target), arch)[0]
        return self._compile(inputs, options, target, arch)[0]

    def plan(self, *inputs: Any, devices: Sequence[int],
             output_device: int | None = None) -> Any:
        """How a call on ``inputs`` splits across ``devices`` (a `tcmlir.multi.SplitPlan`:
        parts with their device, sub-domain, footprints and bytes to move), computed with isl
        without a GPU; a program that cannot be split gets one part and a ``reason``."""
        from .multi.inputs import locate_inputs
        from .multi.plan import make_plan

        devices = as_devices(devices)
        views, where = locate_inputs(self.ir, inputs)
        from .binding import bind_sizes

        sizes = bind_sizes(self.ir, [tuple(views[t.name].shape) for t in self.ir.inputs])
        return make_plan(self.ir, sizes, devices, where, output_device)

    def _compile(self, inputs: Sequence[Any], options: MappingOptions | None, target: str | None,
                 arch: str | None, *, compile_missing: bool = True) -> tuple[Kernel, Any]:
        """The kernel and the bound inputs (a call binds once for compiling and launching)."""
        check_target(target)
        target = resolve_target(target or self.target)
        options = as_mapping_options(options)
        bound = bind_host_inputs(self.ir, inputs) if target != "cuda" else _bind_any(self, inputs)
        if options is None:
            options = (self.options_factory(self, inputs) if self.options_factory
                       else MappingOptions.default_for(self.ir, target, bound.sizes))
        # A parametric kernel takes its sizes as arguments: one compile serves every size of
        # the signature's ranks and dtypes, so only those enter the key.
        sig_key = bound.signature.ranks_and_dtypes if options.parametric else bound.signature
        key = (target, sig_key, options.to_json(), arch)
        config = get_config()
        with self._lock:
            kernel = None if config.always_compile else self._kernels.get(key)
            if kernel is None and not compile_missing:
                raise CallError(
                    f"{self.entry}: the first call for this signature is inside a CUDA graph "
                    "capture; compiling it and making its launch plan load a module and allocate "
                    "device memory, which a capture forbids. Call it once before capturing (a "
                    "warm-up, as torch.cuda.graph asks for anyway).")
            if kernel is None:
                from .compiler import compile_kernel

                kernel = compile_kernel(self, target, options, bound.signature, bound.sizes, arch)
                self._kernels[key] = kernel
                _dump(kernel, config.dump)
        return kernel, bound

    def autotune(self, *inputs: Any, generations: int | None = None,
                 population: int | None = None, cache: bool | str | Any = True,
                 devices: Sequence[int] | None = None, config: TunerConfig | None = None,
                 options: OptionsArg = None, target: str | None = None,
                 progress: bool = True, retune: bool = False, **named: Any) -> MappingOptions:
        """Search mapping options for these inputs with the genetic tuner (`tcmlir.tune`) and
        return the best found (the cache keeps the best few).

        ``generations``/``population`` override those of ``config`` (a `tc.TunerConfig`);
        ``cache``: True (the default database), False (none), a path or an `OptionsCache`;
        ``devices``: GPU ordinals to evaluate on (target cuda); ``options``: a starting point
        added to the first generation; ``target``: overrides the function's; ``progress``: a
        progress bar (and a line on stderr when a cached result is returned). A result cached
        for this exact signature is returned without tuning unless ``retune=True``. Inputs go
        by position or by TC name, as in a call; ``options`` takes what `compile`'s does.
        Ctrl-C ends the tuning after the current generation with the best found so far (the
        first generation's when none is measured yet); a second Ctrl-C aborts at once.
        """
        with stop_on_interrupt():  # from the first instant: Ctrl-C stops it, even in an import
            from .tune.autotune import autotune

            inputs = order_inputs(self.ir, inputs, named)
            options = as_mapping_options(options)
            return autotune(self, inputs, generations=generations, population=population,
                            cache=cache, devices=devices, config=config, options=options,
                            target=target, progress=progress, retune=retune)

    # ------------------------------------------------------------ launching

    def _launch(self, kernel: Kernel, inputs: Sequence[Any], outputs: Sequence[Any] | None,
                bound: Any = None, *, stream: Any = None, remember: bool = False,
                given: tuple[Any, Any] | None = None) -> Any:
        if kernel.target == "cuda":
            from .runtime.cuda_launch import launch_cuda

            result, plan = launch_cuda(kernel, inputs, outputs, stream=stream, bound=bound)
            if remember and plan is not None:  # (a plan does not depend on given outputs)
                self._remember(inputs, plan.call, getattr(plan, "_torch_call", None),
                               getattr(plan, "_torch_into", None),
                               getattr(plan, "fast_entry", None), given=given)
            return result
        if stream is not None:
            raise CallError(f"{self.entry}: stream= is for target='cuda'; this kernel runs on "
                            f"{kernel.target}")
        if bound is None:
            bound = bind_host_inputs(self.ir, inputs)
        if bound.signature != kernel.signature and not kernel.options.parametric:
            raise CallError(f"{self.entry}: kernel compiled for {kernel.signature.to_json()} "
                            f"called with {bound.signature.to_json()}")
        if kernel.target == "cpu" and outputs is None:
            from .runtime.host_plan import host_plan

            plan = host_plan(kernel.runner, kernel.compiled_ir or self.ir, bound.sizes)
            if remember and all(host_ready(x) for x in inputs):
                self._remember(inputs, *host_calls(plan, self.ir, inputs), given=given)
            return in_input_kind(self.ir, inputs, plan.call(list(bound.arrays.values())))
        outs = check_outputs(self.ir, bound.sizes, outputs, inputs)
        if outs is None:
            outs = allocate_outputs(self.ir, bound.sizes)
        if kernel.target == "numpy":
            from .reference import run

            run(self.ir, bound.arrays, bound.sizes, outs)
        else:
            kernel.runner.run({**bound.arrays, **outs}, bound.sizes)
        if outputs is not None:
            return given_outputs(outputs)
        results = tuple(outs[t.name] for t in self.ir.outputs)
        return in_input_kind(self.ir, inputs, results[0] if len(results) == 1 else results)

    def _remember(self, inputs: Sequence[Any], call: Callable[..., Any],
                  plain: Callable[..., Any] | None = None,
                  into: Callable[..., Any] | None = None,
                  entry: Callable[[tuple, tuple], Callable[..., Any]] | None = None,
                  *, given: tuple[Any, Any] | None = None) -> None:
        """File a plan under the inputs' call key (after a call with them passed every check);
        ``plain``: what ``call(inputs, None)`` does, taking only the inputs; ``into(inputs,
        outputs)``: a call writing given outputs on the current stream, or None when they are
        not of the case it takes (the full path then checks them); ``entry(key, token)``: the
        plan's call guarded by ``key`` and the knobs, tried first by the next call (`MISS`
        when the inputs are not that plan's). ``given``: the explicit options as passed and
        their key (their text, or the object's id: the entry holds the object, so the id
        stays its own); such plans go apart, the latest 32 kept, with no ``into`` or ``entry``."""
        if get_config().always_compile:
            return
        key = call_key(inputs)
        if key is None:
            return
        token = hot_path_token()
        with self._lock:
            if given is not None:
                plans = self._option_plans
                plans.pop((key, given[1]), None)
                plans[(key, given[1])] = (token, call, plain, given[0])
                while len(plans) > 32:
                    del plans[next(iter(plans))]
                return
            self._plans[key] = (token, call, plain, into)
            if entry is not None:
                self._fast = entry(key, token)

    def _benchmark(self, kernel: Kernel, inputs: Sequence[Any], runs: int
                   ) -> tuple[list[float], str]:
        """Seconds per run and what a run is (`Kernel.benchmark`)."""
        if kernel.target == "cuda":
            from .runtime.cuda_launch import benchmark_cuda

            return benchmark_cuda(kernel, inputs, runs), "launch sequence (CUDA events)"
        bound = bind_host_inputs(self.ir, inputs)
        if kernel.target == "numpy":
            from .reference import run

            outs = allocate_outputs(self.ir, bound.sizes)
            return clock(lambda: run(self.ir, bound.arrays, bound.sizes, outs), runs), \
                "reference interpreter (inputs bound once)"
        if bound.signature != kernel.signature and not kernel.options.parametric:
            raise CallError(f"{self.entry}: kernel compiled for {kernel.signature.to_json()} "
                            f"benchmarked with {bound.signature.to_json()}")
        if all(host_ready(x) for x in inputs):
            from .runtime.host_calls import WARM_CALL
            from .runtime.host_plan import host_plan

            plan = host_plan(kernel.runner, kernel.compiled_ir or self.ir, bound.sizes)
            warm = host_calls(plan, self.ir, inputs)[1]
            return clock(lambda: warm(inputs), runs), WARM_CALL
        return clock(lambda: self._launch(kernel, inputs, None), runs), \
            "full call (inputs bound, and non-contiguous ones copied, on every run)"

    def _profile_kernel(self, kernel: Kernel, inputs: Sequence[Any], runs: int,
                        ceilings: Any) -> Any:
        from .profile import profile_kernel

        return profile_kernel(kernel, inputs, runs=runs, ceilings=ceilings)

    def profile(self, *inputs: Any, options: OptionsArg = None, runs: int = 20,
                ceilings: Any = None, devices: Sequence[int] | None = None,
                **named: Any) -> Any:
        """Profile a call on ``inputs``: a `tcmlir.profile.Profile` with the median time of
        ``runs`` runs (CUDA events on the GPU, a wall clock on the host) of the call and of each
        launched kernel, the exact flops and minimal DRAM bytes (counted with isl), achieved
        FLOP/s and bytes/s, the binding ceiling and the roofline fraction, launch configuration,
        registers and occupancy (cuda), and advice. ``ceilings``: a `tcmlir.profile.Ceilings`
        or a dict of its fields, instead of the measured (cached) ones. ``devices``: profile
        the split call ``fn(*inputs, devices=devices)``, with each part's bytes and time of
        copies in and out per call (``profile.parts``, ``transfer_bytes``, ``transfer_s``).
        Inputs go by position or by TC name, as in a call."""
        from .profile import profile_function

        inputs, options = order_inputs(self.ir, inputs, named), as_mapping_options(options)
        return profile_function(self, inputs, options=options, runs=runs, ceilings=ceilings,
                                devices=devices)


def _bind_any(fn: TCFunction, inputs: Sequence[Any]) -> Any:
    from .runtime.arrays import bind_device_inputs

    return bind_device_inputs(fn.ir, inputs)


def _dump(kernel: Kernel, stages: frozenset[str]) -> None:
    if not stages:
        return
    texts = {"ir": str(kernel.function.ir), "schedule": kernel.schedule, "loops": kernel.loops,
             "llvm": kernel.llvm_ir, "ptx": kernel.ptx_text}
    for stage in ("ir", "schedule", "loops", "llvm", "ptx"):
        if stage in stages and texts[stage]:
            print(f"== {kernel.function.entry}: {stage} ==\n{texts[stage]}", file=sys.stderr)


def _capturing_torch(inputs: Sequence[Any], stream: Any) -> bool:
    """Whether torch's current stream is capturing a CUDA graph (host-side query, no driver
    call), for a call on torch CUDA tensors without an explicit stream."""
    if stream is not None or not inputs:
        return False
    torch = sys.modules.get("torch")
    tensor = getattr(torch, "Tensor", None)
    if tensor is None or not any(isinstance(x, tensor) and getattr(x, "is_cuda", False)
                                 for x in inputs):
        return False
    capturing = getattr(getattr(torch, "cuda", None), "is_current_stream_capturing", None)
    return bool(capturing()) if capturing is not None else False


def _replay(hit: tuple, inputs: Sequence[Any], stream: Any) -> Any:
    """Run a remembered plan ``(knobs, call, plain, ...)`` on ``inputs``: ``plain`` when no
    stream is given (one call frame less; `MISS` for torch tensors off the plan's device),
    else ``call(inputs, stream)``."""
    if stream is None and hit[2] is not None:
        return hit[2](inputs)
    return hit[1](inputs, stream)
