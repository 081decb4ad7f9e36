"""A prepared CUDA launch: made once per (kernel, signature, input types, device).

Place: `tcmlir.api.TCFunction.__call__` → `CudaPlan.call` → one ``cuLaunchKernel`` per kernel
of the program, back to back on one stream with no host round trip. Made by
`cuda_launch.CudaRunner.plan` on the first call of a signature, which also checks the inputs.

Done once, when the plan is made: the module is loaded, every kernel's launch configuration is
validated against the device's and the kernel's limits and its parameter count checked, the
parameter block (`ParamBlock`: tensor pointers, the i64 sizes, the error flag's pointer) is
packed with the sizes and the flag, output shapes and which fresh buffers must start at zero
(`binding.needs_zero_fill`) are worked out, and the error flag is allocated and zeroed.

Per call (`launch_call.LaunchCalls`, which `CudaPlan` derives from): the pointers written into
the block, zero fills and launches queued on the stream, the gather flag read; see there.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

from .. import ir as tc
from ..binding import needs_zero_fill
from ..errors import CallError, CudaError
from .array_views import ArrayKind, DeviceArrayView
from .cuda_memory import check, driver
from .fast_driver import direct_calls
from .launch_call import ANY, HOST, SCALAR, LaunchCalls, input_code, row_major
from .launch_limits import validate_launch
from .launch_thunk import LaunchRecord
from .param_block import ParamBlock, kernel_layouts
from .streams import DriverMemory, memory_for

__all__ = ["CudaPlan", "ParamBlock"]


def _plain_torch_like(cls: type, view: Any, shape: tuple[int, ...], dtype: Any) -> bool:
    """Whether ``torch.empty_like`` of an input (of type ``cls``, bound as ``view``) gives a
    fresh row-major tensor of ``shape`` and ``dtype`` on its device."""
    if not (isinstance(view, DeviceArrayView) and view.kind is ArrayKind.TORCH_CUDA
            and cls.__name__ == "Tensor" and cls.__module__ == "torch"):
        return False
    if view.shape != shape or view.dtype != dtype:
        return False
    return tuple(s * dtype.itemsize for s in row_major(shape)) == tuple(view.strides_bytes)



def _span_bytes(view: Any) -> int:
    """Bytes from an array's data pointer to the end of its last element (0 for scalars)."""
    shape, strides = getattr(view, "shape", ()), getattr(view, "strides_bytes", None)
    if strides is None:
        return 0
    if any(n == 0 for n in shape):
        return 0
    return view.dtype.itemsize + sum((n - 1) * s for n, s in zip(shape, strides, strict=True))



class CudaPlan(LaunchCalls):
    """One signature's launch of a compiled program; ``call(inputs, stream)`` returns outputs."""

    def __init__(self, runner: Any, fn: tc.Function, bound: Any, input_types: Sequence[type],
                 runtime: Any, gather_error: Callable[[int], CallError]):
        image = runner.image
        self.entry = image.entry
        self.device = device = bound.device
        self.kind = bound.kind
        self.runtime = runtime
        self._gather_error = gather_error
        module = runner.module(device)
        self.context = module.context
        limits = runtime.device(device).limits
        n_tensors, n_sizes = len(image.arg_order), len(image.sizes_order)
        count = n_tensors + n_sizes + 1
        kernels = []
        for k in image.kernels:
            f = module.function(k.name)
            shared = getattr(k, "shared_bytes", 0)
            validate_launch(limits, k.grid, k.block, shared, kernel=k.name,
                            kernel_max_threads=f.max_threads_per_block,
                            static_shared_bytes=f.static_shared_bytes)
            takes = f.param_count
            if takes is not None and takes != k.parameter_count:
                raise CudaError(f"kernel {k.name} takes {takes} parameters, the tcmlir ABI passes "
                                f"{k.parameter_count} ({len(k.tensors)} tensors, {len(k.sizes)} "
                                "sizes, the error flag)")
            if shared:  # opt in above the default 48 KB (once per plan)
                f.allow_dynamic_shared(shared)
            kernels.append((f.handle, *k.grid, *k.block, shared))
        self._kernels = tuple(kernels)
        self._launch_info = tuple((k.name, k.grid, k.block) for k in image.kernels)
        self.block = ParamBlock(count, kernel_layouts(image))
        for j, name in enumerate(image.sizes_order):
            self.block.values[n_tensors + j] = int(bound.sizes[name])
        slot = {name: k for k, name in enumerate(image.arg_order)}
        self.memory = memory_for(self.kind, runtime, device)
        lib_dtype = getattr(self.memory, "dtype", lambda d: None)  # torch's / CuPy's dtype
        sizes = bound.sizes
        self._inputs = tuple(
            (slot[t.name], input_code(cls, bound.views[t.name]), t.dtype, lib_dtype(t.dtype),
             f"{fn.name}: input {t.name}")
            for t, cls in zip(fn.inputs, input_types, strict=True))
        self._output_names = tuple(t.name for t in fn.outputs)
        # per output, an input (by position) it can be allocated like: a plain torch tensor of
        # its shape and dtype laid out row-major (`torch.empty_like`: 3.2 us against 5.9 for
        # `torch.empty` on the H200's host; the signature fixes the strides, so it holds for
        # every call of this plan)
        like: list[int | None] = []
        for t in fn.outputs:
            shape = tuple(e.evaluate(bound.sizes) for e in t.shape)
            like.append(next((i for i, (u, cls) in enumerate(zip(fn.inputs, input_types, strict=True))
                              if _plain_torch_like(cls, bound.views[u.name], shape, t.dtype)),
                             None))
        self._like = tuple(like)
        self._aligned = frozenset(getattr(image, "aligned", ()))
        self._outputs = tuple(
            (slot[t.name], shape, math.prod(shape) * t.dtype.itemsize, t.dtype, lib_dtype(t.dtype),
             needs_zero_fill(fn, t, sizes))
            for t, shape in ((t, tuple(e.evaluate(sizes) for e in t.shape)) for t in fn.outputs))
        # temporaries kept on chip or recomputed (codegen.gpu_rows) get no buffer: their
        # parameter slot stays a null pointer the kernel never dereferences
        on_chip = set(getattr(image, "on_chip", ()))
        self._temps = tuple(
            (slot[t.name], max(1, math.prod(e.evaluate(sizes) for e in t.shape) * t.dtype.itemsize),
             needs_zero_fill(fn, t, sizes)) for t in fn.temporaries if t.name not in on_chip)
        self._host_outputs = self.kind in (ArrayKind.NUMPY, ArrayKind.TORCH_CPU)
        self._pool = runtime.pool(device)
        self.gathers = any(k.has_gathers for k in image.kernels)
        self.gather_sync = self._host_outputs
        self._err = runtime.alloc(4, device)
        self._err.memset(0)  # once; afterwards only reporting a failure resets it
        # the memset is queued on the legacy stream, which a non-blocking stream (torch's)
        # does not wait for: let it finish before any launch can set the flag
        check(driver.cuCtxSynchronize(), "cuCtxSynchronize", context="zeroing a gather flag")
        self.block.values[count - 1] = self._err.ptr
        self._pinned = self._event = None
        self._pending = False
        if self.gathers:
            self._pinned = runtime.pinned(4, device)
            self._pinned.set_int32(0, 0)
            flags = driver.CUevent_flags.CU_EVENT_DISABLE_TIMING.value
            self._event = check(driver.cuEventCreate(flags), "cuEventCreate")
        codes = [code for _, code, _, _, _ in self._inputs]
        self._copies_in = any(code == HOST or (code == SCALAR and self.memory.pooled)
                              for code in codes)
        self._watch_capture = (self.gathers or isinstance(self.memory, DriverMemory)
                               or self._copies_in or ANY in codes)
        self._lock = threading.Lock()
        self.last_stream: int | None = None  # test hook: the stream of the latest launch
        self._success = driver.CUresult.CUDA_SUCCESS
        self._launch = driver.cuLaunchKernel
        self._memset32 = driver.cuMemsetD32Async
        self._memset8 = driver.cuMemsetD8Async
        # warm launches go straight into libcuda when the real driver is loaded: one native
        # call per launch (`launch_thunk`) makes the context check, the zero fills and every
        # kernel's cuLaunchKernel; without it, cuda-python's calls
        self._direct = direct_calls(driver)
        if self._direct is not None and not all(self._direct.fits(*rest) for _, *rest in self._kernels):
            self._direct = None
        self._record = None
        if self._direct is not None:
            self._record = LaunchRecord(self._direct.addresses, self._context_address(),
                                        self.block.address, self._kernels,
                                        kernel_params=self.block.kernel_addresses)
        # per input, the bytes from its data pointer to its last element (`_make_torch_call`)
        self._input_spans = tuple(_span_bytes(bound.views[t.name]) for t in fn.inputs)
        self.fast_source: str | None = None
        self.fast_entry: Callable[[tuple, tuple], Callable[..., Any]] | None = None
        fast = self._make_torch_call()
        self._torch_call, self._torch_into = fast if fast is not None else (None, None)

    def __repr__(self) -> str:
        names = ", ".join(name for name, _, _ in self._launch_info)
        return f"<CudaPlan {self.entry} [{names}] device {self.device} {self.kind.value}>"

    def __str__(self) -> str:
        if not self._launch_info:  # every statement's domain is empty: nothing is launched
            return f"{self.entry} (no kernel) on stream {self.last_stream:#x}"
        name, grid, block = self._launch_info[-1]
        return f"kernel {name} with grid {grid}, block {block} on stream {self.last_stream:#x}"

    # ------------------------------------------------------------ a split call's part

    def slots(self) -> tuple[tuple[int, ...], tuple[int, ...], tuple[tuple[int, int, bool], ...],
                             frozenset[str]]:
        """For a caller packing its own `ParamBlock` (`multi.prepared`): the slots of the inputs'
        and outputs' pointers, the temporaries (slot, bytes, zero-filled) it must provide, and
        the outputs the kernels take ``ALIGN_BYTES``-aligned; the other slots (sizes, the error
        flag) are those of ``self.block``; `ParamBlock.blank` makes a block of its layouts."""
        return (tuple(k for k, *_ in self._inputs), tuple(k for k, *_ in self._outputs),
                self._temps, frozenset(n for n in self._output_names if n in self._aligned))

    def packed_params(self, block: ParamBlock) -> Any:
        """What `launch_packed` takes for ``block`` (made once per block; of the plan's
        block's layouts, `ParamBlock.blank`)."""
        if block.layouts != self.block.layouts:
            raise ValueError(f"{self.entry}: a parameter block of other kernel layouts")
        if self._record is None:
            return block
        return self._record.with_params(block.address, block.kernel_addresses)
