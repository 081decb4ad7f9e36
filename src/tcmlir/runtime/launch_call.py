"""The warm call of a `launch_plan.CudaPlan`: what runs per call, once the plan is made.

Per call: read the stream (``stream=``, else the inputs' library's current stream, see
`streams`), write the input, output and temporary pointers into the block, queue zero fills
(``cuMemsetD32Async``) where needed and the launches. Outputs and temporaries come from torch's
caching allocator for torch inputs, CuPy's pool for CuPy, else the runtime's stream-ordered
`pool.BufferPool`; numpy inputs are copied in on the stream and outputs copied back, then the
stream is synchronised (the only synchronisation, besides a synchronous gather read). With the
real driver the fills and launches are one native call (`launch_thunk.LaunchRecord`); with
torch inputs the warm call's Python is generated for the plan (`torch_fast`).

The gather error flag is sticky: kernels set it on a failed bounds check and only reporting
resets it, so no failure is lost however calls interleave. Read with the call (``sync``) it
is copied to pinned memory and the stream synchronised; read ``async`` (the default for device
arrays, see ``TCMLIR_GATHER_CHECK``) the copy and an event are queued and the next call of the
plan, or `check_errors`, reports it. Inside a CUDA graph capture nothing is read (no host work
may happen there): replays set the flag, and a later call or `check_errors` reports it.

`LaunchCalls` holds these methods; `CudaPlan` derives from it and its constructor (in
`launch_plan`: loading, validating and packing, once) sets the state they read. The input
codes (`input_code`) are how the constructor sorts the inputs for the call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..config import hot_path_token
from ..errors import CallError, CudaError
from ..signature import ALIGN_BYTES
from .array_views import ArrayKind, DeviceArrayView, classify
from .arrays import DeviceArray
from .cuda_memory import check, driver, error_text
from .launch_thunk import STAGE_CONTEXT, STAGE_FILL, LaunchRecord, decode
from .streams import TorchMemory, stream_handle
from .torch_fast import OutputSpec, generate

__all__ = ["ANY", "CUPY_PTR", "HOST", "KEEP_TEMPORARY_BYTES", "KEEP_TEMPORARY_STREAMS", "SCALAR",
           "TORCH_PTR", "LaunchCalls", "input_code", "row_major"]

# how the call hands an input to the kernels (`input_code`): a torch or CuPy device pointer, a
# scalar, a numpy array copied in, anything else classified per call
TORCH_PTR, CUPY_PTR, SCALAR, HOST, ANY = range(5)
# a torch plan keeps its temporaries for reuse on up to this many streams, when they total at
# most this many bytes (see `LaunchCalls._make_torch_call`)
KEEP_TEMPORARY_STREAMS = 8
KEEP_TEMPORARY_BYTES = 64 << 20
_SCALAR_TYPES = (bool, int, float)


def row_major(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides in elements, as torch reports them (``Tensor.stride()``)."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))



def input_code(cls: type, view: Any) -> int:
    if isinstance(view, DeviceArrayView):
        if view.kind is ArrayKind.TORCH_CUDA:
            return TORCH_PTR
        return CUPY_PTR if view.kind is ArrayKind.CUPY else ANY
    if cls in _SCALAR_TYPES or issubclass(cls, np.generic):
        return SCALAR
    return HOST if cls is np.ndarray else ANY



class LaunchCalls:
    """The per-call methods of `launch_plan.CudaPlan` (see the module docstring)."""

    def call(self, inputs: Sequence[Any], stream: Any = None,
             outputs: Sequence[Any] | None = None) -> Any:
        """Launch on ``inputs`` (of the plan's signature and input types); ``outputs``: arrays
        to write instead of fresh ones (checked here)."""
        memory = self.memory
        if stream is None:
            if outputs is None and self._torch_call is not None:
                return self._torch_call(inputs)
            return self._call(inputs, memory.current_stream(), outputs)
        handle = stream_handle(stream)
        switch = getattr(memory, "on_stream", None)
        context = switch(handle, stream) if switch is not None else None
        if context is None:
            return self._call(inputs, handle, outputs)
        with context:  # torch/CuPy allocate (and fill scalars) on the launch stream
            return self._call(inputs, handle, outputs)

    def _make_torch_call(self) -> tuple[Callable[..., Any], Callable[..., Any]] | None:
        """The warm calls of the commonest case, without `_call`'s general branches: every
        input a torch CUDA tensor, temporaries (and fresh outputs) from torch's
        (capture-aware) caching allocator, no gather flag to watch, torch's current stream.

        Returns ``(call, into)``: ``call(inputs)`` allocates the outputs; ``into(inputs,
        outputs)`` writes torch tensors given with ``outputs=`` and returns them, or returns None
        (having done nothing) when they are not exactly what the kernels write — row-major
        CUDA tensors of the output's shape and dtype on the plan's device, aligned where the
        kernel assumes it, sharing no byte with an input or each other — and the caller takes
        the general path, whose checks say what is wrong. None when the case does not apply.
        Both are generated for the plan (`torch_fast`; their text is ``fast_source``), and so
        is ``fast_entry(key, token)``, the same call guarded by the inputs' call key."""
        if (not isinstance(self.memory, TorchMemory) or self.gathers or self._watch_capture
                or any(code != TORCH_PTR for _, code, _, _, _ in self._inputs)):
            return None
        memory, values, lock = self.memory, self.block.values, self._lock
        torch = memory.torch
        empty, device, uint8 = torch.empty, memory.device, torch.uint8
        current, index = memory._current, memory.index
        context, activate, enqueue, zero = self.context, self.context.activate, self._enqueue, self._zero
        empty_like = torch.empty_like if any(i is not None for i in self._like) else None
        temps = self._temps
        last, dev = self.runtime._last_launch, self.device
        # temporaries (a split-K partial sum, a program's intermediates) are kept per stream
        # and reused by the next call on it, which the stream orders after this one's kernels:
        # torch.empty costs ~6 us of host time on the H200's host, more than the partial
        # kernel of a small split-K contraction. Not inside a graph capture (a replay may run
        # beside later calls: fresh buffers from the capture's pool), and not for large ones
        # (their allocation is small beside their kernels').
        kept: dict[int, tuple[int, ...]] = {}
        keep = bool(temps) and sum(nbytes for _, nbytes, _ in temps) <= KEEP_TEMPORARY_BYTES
        capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)
        if capturing is None:
            keep = False
        held: list[Any] = []  # the tensors behind ``kept``

        def temporaries(handle: int, scratch: list[Any]) -> tuple[int, ...]:
            ptrs = None
            if keep and not capturing():
                ptrs = kept.get(handle)
                if ptrs is None and len(kept) < KEEP_TEMPORARY_STREAMS:
                    ts = [empty((n,), dtype=uint8, device=device) for _, n, _ in temps]
                    held.append(ts)
                    ptrs = kept[handle] = tuple(t.data_ptr() for t in ts)
            if ptrs is None:
                ts = [empty((n,), dtype=uint8, device=device) for _, n, _ in temps]
                scratch.append(ts)  # freed after the launch: torch's allocator orders reuse
                ptrs = tuple(t.data_ptr() for t in ts)
            return ptrs

        # through the launch thunk the zero fills are part of the record (one for fresh
        # outputs, one for given outputs, which keep their values: `+=` reads them), and its
        # one native call checks the context and queues fills and launches
        native = self._record is not None
        fresh_fills = [(k, nbytes) for k, _, nbytes, _, _, fill in self._outputs if fill]
        temp_fills = [(k, nbytes) for k, nbytes, fill in temps if fill]
        records: list[Any] = [None, None]
        if native:
            records = [LaunchRecord(self._direct.addresses, self._context_address(),
                                    self.block.address, self._kernels, fills,
                                    self.block.kernel_addresses)
                       for fills in (fresh_fills + temp_fills, temp_fills)]
        self._fast_records = records  # (kept alive with the plan)

        def set_temporaries(handle: int) -> list[Any]:
            """Write the temporaries' slots (zero-filling them without the thunk); returns
            the fresh buffers, which must live until the launch is queued."""
            scratch: list[Any] = []
            for (k, nbytes, fill), ptr in zip(temps, temporaries(handle, scratch), strict=True):
                values[k] = ptr
                if fill and not native:
                    zero(ptr, nbytes, handle)
            return scratch

        specs = [OutputSpec(k, shape, lib_dtype, row_major(shape), nbytes, like, fill,
                            name in self._aligned)
                 for (k, shape, nbytes, _, lib_dtype, fill), like, name
                 in zip(self._outputs, self._like, self._output_names, strict=True)]
        namespace = dict(values=values, lock=lock, current=current, index=index,
                         context=context, activate=activate, empty=empty,
                         empty_like=empty_like, device=device, temporaries=set_temporaries,
                         plan=self, last=last, dev=dev, Tensor=torch.Tensor,
                         token=hot_path_token, enqueue=enqueue, zero=zero,
                         fresh_record=records[0], given_record=records[1],
                         failed=self._thunk_failed)
        fast = generate(len(self._inputs), specs, [k for k, *_ in self._inputs],
                        self._input_spans, namespace, native, bool(temps))
        self.fast_source = fast.source
        self.fast_entry = fast.make_entry
        return fast.call, fast.into

    def is_capturing(self, handle: int) -> bool:
        status = check(driver.cuStreamIsCapturing(handle), "cuStreamIsCapturing",
                       context=f"stream {handle:#x}")
        return status != driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE

    def _call(self, inputs: Sequence[Any], handle: int, given: Sequence[Any] | None) -> Any:
        capturing = (self._watch_capture or given is not None) and self.is_capturing(handle)
        if capturing and (self._host_outputs or self._copies_in
                          or (given is None and self.memory.pooled)):
            raise CallError(
                f"{self.entry}: cannot be captured in a CUDA graph with "
                f"{self.kind.value} arrays: "
                + ("host arrays are copied in (and read back) synchronously"
                   if self._host_outputs or self._copies_in
                   else "its outputs would be allocated with cuMemAlloc; pass outputs=")
                + " (or call it with torch tensors, whose allocator is capture-aware)")
        if self._pending and not capturing:
            self._poll()
        memory = self.memory
        pooled: list[Any] = []  # pool buffers, given back after the launches
        keep: list[Any] = []    # objects that must outlive the call's host-side work
        copies_back: list[tuple[int, int, int]] = []
        moves_back: list[tuple[int, int, int]] = []  # (given output, its aligned stand-in, bytes)
        self.context.activate()
        with self._lock:
            values = self.block.values
            for (k, code, dtype, lib_dtype, what), x in zip(self._inputs, inputs, strict=True):
                if code == TORCH_PTR:
                    values[k] = x.data_ptr()
                elif code == CUPY_PTR:
                    values[k] = x.data.ptr
                elif code == SCALAR and not memory.pooled:
                    values[k], owner = memory.scalar(x, lib_dtype)
                    keep.append(owner)
                else:
                    values[k] = self._stage(x, code, dtype, what, handle, pooled, keep)
            results = []
            for i, (k, shape, nbytes, dtype, lib_dtype, zero) in enumerate(self._outputs):
                if given is not None:
                    values[k] = self._given_output(i, given[i], handle, pooled, keep, copies_back,
                                                   moves_back)
                    results.append(given[i])
                    continue
                if not memory.pooled:
                    ptr, result = memory.empty(shape, lib_dtype)
                elif self._host_outputs:
                    buf = self._pool.acquire(nbytes, handle)
                    pooled.append(buf)
                    ptr, result = buf.ptr, self._host_result(shape, dtype)
                    address = (result.ctypes.data if isinstance(result, np.ndarray)
                               else result.data_ptr())
                    copies_back.append((address, ptr, nbytes))
                else:  # the caller owns it: its own allocation, tagged with the stream
                    buf = self.runtime.alloc(nbytes, self.device)
                    ptr, result = buf.ptr, DeviceArray(buf, shape, dtype, stream=handle)
                values[k] = ptr
                results.append(result)
                if zero:
                    self._zero(ptr, nbytes, handle)
            for k, nbytes, zero in self._temps:
                ptr, owner = memory.scratch(nbytes, handle)
                (pooled if memory.pooled else keep).append(owner)
                values[k] = ptr
                if zero:
                    self._zero(ptr, nbytes, handle)
            self._enqueue(handle)
        self.runtime._last_launch[self.device] = self
        for dst, src, nbytes in moves_back:
            check(driver.cuMemcpyDtoDAsync(dst, src, nbytes, handle),
                  f"cuMemcpyDtoDAsync({nbytes} bytes)", context=f"output of {self.entry}")
        if self.gathers and not capturing:
            self._queue_flag_read(handle)
        if copies_back:
            self._copy_back(copies_back, handle)
        for buf in pooled:
            if capturing:  # the graph keeps using it: never hand it out again
                self._pool.retire(buf)
            else:
                self._pool.release(buf, handle)
        if self.gathers and not capturing and (self.gather_sync or copies_back):
            if not copies_back:
                self._synchronize(handle)
            self._report(self._pinned.int32(0))
        return results[0] if len(results) == 1 else tuple(results)

    def _context_address(self) -> int:
        return int(self.context.handle)

    def _enqueue(self, handle: int, params: Any = None) -> None:
        """Queue the kernels on ``handle`` with the plan's block, or ``params`` (what
        `packed_params` made for another block)."""
        record = self._record if params is None else params
        if isinstance(record, LaunchRecord):
            err = record.run(handle)
            if err:
                self._thunk_failed(record, err, handle)
            self.last_stream = handle
            return
        launch, ok = self._launch, self._success
        addresses = (self.block if params is None else params).kernel_addresses
        for i, (f, gx, gy, gz, bx, by, bz, shared) in enumerate(self._kernels):
            err = launch(f, gx, gy, gz, bx, by, bz, shared, handle, addresses[i], 0)[0]
            if err != ok:
                name, grid, block = self._launch_info[i]
                raise CudaError(f"CUDA driver call cuLaunchKernel failed: {error_text(err)} "
                                f"(kernel {name} with grid {grid}, block {block}, stream "
                                f"{handle:#x})")
        self.last_stream = handle

    def _thunk_failed(self, record: LaunchRecord, code: int, handle: int) -> None:
        """After a nonzero code of ``record``'s run: make the context current and run again
        (the thunk launches nothing when it is not), else raise the driver's error."""
        stage, i, err = decode(code)
        if stage == STAGE_CONTEXT:
            self.context.activate()
            code = record.fn(record.arg)  # (the stream is still in the record)
            if not code:
                return
            stage, i, err = decode(code)
            if stage == STAGE_CONTEXT:
                raise CudaError(f"{self.entry}: the CUDA context of device {self.device} is not "
                                f"current after cuCtxSetCurrent (cuCtxGetCurrent: "
                                f"{error_text(driver.CUresult(err))})")
        text = error_text(driver.CUresult(err))
        if stage == STAGE_FILL:
            raise CudaError(f"CUDA driver call cuMemsetD32Async failed: {text} (zero-filling "
                            f"buffer {i} of {self.entry}, stream {handle:#x})")
        name, grid, block = self._launch_info[i]
        raise CudaError(f"CUDA driver call cuLaunchKernel failed: {text} (kernel {name} with "
                        f"grid {grid}, block {block}, stream {handle:#x})")

    def launch_packed(self, params: Any, handle: int) -> None:
        """Queue the kernels on ``handle`` with a block the caller packed (``params``: its
        `packed_params`); the gather flag is read as after `call` (and reported now when
        ``gather_sync``)."""
        self.report_pending()
        self._enqueue(handle, params)
        self.runtime._last_launch[self.device] = self
        if self.gathers:
            self._queue_flag_read(handle)
            if self.gather_sync:
                self._synchronize(handle)
                self._report(self._pinned.int32(0))

    def report_pending(self, landed: bool = False) -> None:
        """Raise the failure of an earlier call whose flag read has landed (never waits);
        ``landed``: the caller synchronised after this call's read, which is reported as its own."""
        if self._pending and landed:
            self._pending = False
            self._report(self._pinned.int32(0))
        elif self._pending:
            self._poll()

    def _zero(self, ptr: int, nbytes: int, handle: int) -> None:
        if nbytes % 4 == 0:
            err = self._memset32(ptr, 0, nbytes // 4, handle)[0]
        else:
            err = self._memset8(ptr, 0, nbytes, handle)[0]
        if err != self._success:
            raise CudaError(f"CUDA driver call cuMemsetD32Async({nbytes} bytes) failed: "
                            f"{error_text(err)} (zero-filling a buffer of {self.entry})")

    def _stage(self, x: Any, code: int, dtype: Any, what: str, handle: int, pooled: list[Any],
               keep: list[Any]) -> int:
        """A device pointer for an input that is not a torch/CuPy device array."""
        if code == ANY:
            view = classify(x, what, runtime=self.runtime)
            if isinstance(view, DeviceArrayView):
                return self._on_device(view, what, keep)
            host = view.array
        else:
            host = x if type(x) is np.ndarray else np.asarray(x, dtype=dtype.numpy)
        if not host.flags.c_contiguous:
            host = np.ascontiguousarray(host).reshape(host.shape)
        buf = self._pool.acquire(host.nbytes, handle)
        pooled.append(buf)
        # From pageable memory the driver stages the bytes before returning, so ``host`` may go.
        check(driver.cuMemcpyHtoDAsync(buf.ptr, host.ctypes.data, host.nbytes, handle),
              f"cuMemcpyHtoDAsync({host.nbytes} bytes)", context=what)
        return buf.ptr

    def _on_device(self, view: DeviceArrayView, what: str, keep: list[Any]) -> int:
        """The pointer of an array already on a device: this plan's device, kept alive."""
        if view.device_ordinal != self.device:
            raise CallError(f"{what} is on CUDA device {view.device_ordinal}, the kernel "
                            f"runs on device {self.device}")
        keep.append(view.owner)
        return view.ptr

    def _host_result(self, shape: tuple[int, ...], dtype: Any) -> Any:
        if self.kind is ArrayKind.TORCH_CPU:
            import torch

            return torch.empty(shape, dtype=getattr(torch, dtype.value))
        return np.empty(shape, dtype.numpy)

    def _given_output(self, i: int, x: Any, handle: int, pooled: list[Any], keep: list[Any],
                      copies_back: list[tuple[int, int, int]],
                      moves_back: list[tuple[int, int, int]]) -> int:
        """The device pointer of a user-given output: its own memory, or (host arrays, and
        device arrays less aligned than the kernel assumes) a staging buffer holding a copy of
        it (``+=`` reads it), copied back after the launch."""
        _, shape, _, dtype, _, _ = self._outputs[i]
        what = f"{self.entry}: output {self._output_names[i]}"
        view = classify(x, what, runtime=self.runtime)
        if view.dtype is not dtype or tuple(view.shape) != shape:
            raise CallError(f"{what} must be {dtype} of shape {shape}, got {view.dtype} of "
                            f"shape {tuple(view.shape)}")
        if isinstance(view, DeviceArrayView):
            ptr = self._on_device(view, what, keep)
            if ptr % ALIGN_BYTES and self._output_names[i] in self._aligned:
                # the kernel takes this output 16-byte aligned (128-bit accesses): run it on an
                # aligned copy, moved back after the launch on the same stream
                _, _, nbytes, _, _, _ = self._outputs[i]
                buf = self._pool.acquire(nbytes, handle)
                pooled.append(buf)
                check(driver.cuMemcpyDtoDAsync(buf.ptr, ptr, nbytes, handle),
                      f"cuMemcpyDtoDAsync({nbytes} bytes)", context=what)
                moves_back.append((ptr, buf.ptr, nbytes))
                return buf.ptr
            return ptr
        host = view.array
        if not host.flags.c_contiguous or not host.flags.writeable:
            raise CallError(f"{what}: an output array must be C-contiguous and writeable "
                            "(use np.empty or np.ascontiguousarray)")
        ptr = self._stage(host, HOST, dtype, what, handle, pooled, keep)
        copies_back.append((host.ctypes.data, ptr, host.nbytes))
        keep.append(host)
        return ptr

    def _copy_back(self, copies: list[tuple[int, int, int]], handle: int) -> None:
        for host, ptr, nbytes in copies:
            check(driver.cuMemcpyDtoHAsync(host, ptr, nbytes, handle),
                  f"cuMemcpyDtoHAsync({nbytes} bytes)", context=f"output of {self.entry}")
        self._synchronize(handle)

    def _synchronize(self, handle: int) -> None:
        check(driver.cuStreamSynchronize(handle), "cuStreamSynchronize",
              context=f"after {self}")

    # ------------------------------------------------------------ the gather flag

    def _queue_flag_read(self, handle: int) -> None:
        check(driver.cuMemcpyDtoHAsync(self._pinned.address, self._err.ptr, 4, handle),
              "cuMemcpyDtoHAsync(gather flag)", context=self.entry)
        if not (self.gather_sync or self._host_outputs):
            check(driver.cuEventRecord(self._event, handle), "cuEventRecord", context=self.entry)
            self._pending = True

    def _poll(self) -> None:
        """Report a failure of an earlier call whose flag read has landed (never waits)."""
        result = driver.cuEventQuery(self._event)
        if result[0] == driver.CUresult.CUDA_ERROR_NOT_READY:
            return
        check(result, "cuEventQuery", context=f"gather flag of {self.entry}")
        self._pending = False
        self._report(self._pinned.int32(0), earlier=True)

    def _report(self, code: int, earlier: bool = False) -> None:
        if not code:
            return
        self._pinned.set_int32(0, 0)
        self.context.activate()  # reset, and wait for it: later launches on any stream see 0
        check(driver.cuMemsetD32(self._err.ptr, 0, 1), "cuMemsetD32(gather flag)")
        check(driver.cuCtxSynchronize(), "cuCtxSynchronize", context="resetting a gather flag")
        error = self._gather_error(code)
        if earlier:
            error = CallError(f"{error} [reported late: an earlier call, or a CUDA graph replay, of "
                              f"{self.entry} failed; set TCMLIR_GATHER_CHECK=sync to raise from "
                              "the failing call]")
        raise error

    def check_errors(self) -> None:
        """Wait for the device, then raise any gather failure not reported yet."""
        self.context.activate()
        check(driver.cuCtxSynchronize(), "cuCtxSynchronize", context=f"last launch: {self}"
              if self.last_stream is not None else None)
        if not self.gathers:
            return
        check(driver.cuMemcpyDtoH(self._pinned.address, self._err.ptr, 4),
              "cuMemcpyDtoH(gather flag)")
        self._pending = False
        self._report(self._pinned.int32(0), earlier=True)

    def close(self) -> None:
        event, self._event = self._event, None
        if event is not None:
            self.context.activate()
            check(driver.cuEventDestroy(event), "cuEventDestroy")
