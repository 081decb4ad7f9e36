"""A fake CUDA driver with two devices, for split calls (`tcmlir.multi`) without a GPU.

Used by tests/test_multi_exec.py and ``tools/bench_multigpu.py --fake``: `fake_cuda`'s driver
plus streams, stream waits, peer queries and device-to-device copies (memory is host memory,
so copies really move bytes), a runtime with a context per device that records which device
each allocation is on, and `two_devices`, which installs both and defines a cuda function
whose launches run its host build.
"""

from __future__ import annotations

import ctypes
import types
from typing import Any

import numpy as np
from fake_cuda import (
    FakeContext,
    FakeDriver,
    FakeRuntime,
    install_fake,
    native_calls,
    simulate_with_host,
)

import tcmlir as tc
from tcmlir.runtime import array_views, arrays, cuda_memory, launch_call, launch_plan, peer
from tcmlir.runtime.cuda_launch import CudaRunner

__all__ = ["TwoDeviceDriver", "TwoDeviceRuntime", "device_array_on", "install_two_devices",
           "two_devices"]


class TwoDeviceDriver(FakeDriver):
    """The fake driver plus what a split call uses: streams, stream waits, peer queries and
    device-to-device copies (memory is host memory, so copies really move bytes)."""

    def __init__(self, peer_access: bool = True):
        super().__init__()
        self.peer_access = peer_access
        self._next_stream = 0x100

    def cuStreamWaitEvent(self, stream, event, flags):
        self.calls.append(("cuStreamWaitEvent", int(stream)))
        return (self.CUresult.CUDA_SUCCESS,)

    def cuMemcpyPeerAsync(self, dst, dst_ctx, src, src_ctx, nbytes, stream):
        self.calls.append(("cuMemcpyPeerAsync", nbytes, int(stream), dst_ctx, src_ctx))
        ctypes.memmove(int(dst), int(src), nbytes)
        return (self.CUresult.CUDA_SUCCESS,)

    def cuMemcpyDtoD(self, dst, src, nbytes):
        return self._copy("cuMemcpyDtoD", dst, src, nbytes)

    def cuMemcpyPeer(self, dst, dst_ctx, src, src_ctx, nbytes):
        self.calls.append(("cuMemcpyPeer", nbytes, None, dst_ctx, src_ctx))
        ctypes.memmove(int(dst), int(src), nbytes)
        return (self.CUresult.CUDA_SUCCESS,)

    def cuMemcpyDtoDAsync(self, dst, src, nbytes, stream):
        return self._copy("cuMemcpyDtoDAsync", dst, src, nbytes, int(stream))

    def cuDeviceGet(self, ordinal):
        return self.CUresult.CUDA_SUCCESS, ordinal

    def cuDeviceCanAccessPeer(self, dev, peer_dev):
        self.calls.append(("cuDeviceCanAccessPeer", dev, peer_dev))
        return self.CUresult.CUDA_SUCCESS, int(self.peer_access)

    def cuCtxEnablePeerAccess(self, ctx, flags):
        self.calls.append(("cuCtxEnablePeerAccess", ctx))
        return (self.CUresult.CUDA_SUCCESS,)

    def new_stream(self) -> int:
        self._next_stream += 0x100
        self.calls.append(("cuStreamCreate", self._next_stream))
        return self._next_stream


class _ContextHandle(str):
    """A context's name in the fake's logs, and an integer for the native launch thunk."""

    value = 0

    def __int__(self) -> int:
        return self.value


class DeviceContext(FakeContext):
    def __init__(self, ordinal: int):
        self.ordinal = ordinal
        self.handle = _ContextHandle(f"ctx{ordinal}")
        self.handle.value = 0xC70 + ordinal


class TwoDeviceRuntime(FakeRuntime):
    """Per-device contexts, streams, and a record of which device each allocation is on."""

    def __init__(self, driver: TwoDeviceDriver):
        super().__init__(driver)
        self.contexts = {d: DeviceContext(d) for d in (0, 1)}
        self.placed: list[tuple[int, int, int]] = []  # (address, nbytes, device)

    def context(self, device: int = 0):
        return self.contexts[device]

    def stream(self, device: int = 0):
        return types.SimpleNamespace(handle=self.driver.new_stream(), context=self.contexts[device])

    def alloc(self, nbytes: int, device: int = 0):
        buf = cuda_memory.DeviceBuffer(self.contexts[device], nbytes)
        self.placed.append((buf.ptr, max(1, nbytes), device))
        return buf

    def pinned(self, nbytes: int, device: int = 0):
        return cuda_memory.PinnedHostBuffer(self.contexts[device], nbytes)

    def place(self, array: np.ndarray, device: int) -> np.ndarray:
        self.placed.append((array.ctypes.data, max(1, array.nbytes), device))
        return array

    def pointer_device(self, ptr: int) -> int:
        for address, nbytes, device in reversed(self.placed):
            if address <= ptr < address + nbytes:
                return device
        return 0


def install_two_devices(monkeypatch: Any, peer_access: bool = True, native: bool = False
                        ) -> tuple[TwoDeviceDriver, TwoDeviceRuntime]:
    """Route the launch path's driver calls to a new two-device fake (``monkeypatch``: pytest's,
    or a ``pytest.MonkeyPatch()``); returns (driver, runtime). ``native``: as for
    `fake_cuda.install_fake`."""
    driver = TwoDeviceDriver(peer_access)
    install_fake(monkeypatch)
    from tcmlir.runtime import cuda as rcuda
    from tcmlir.runtime import cuda_launch, streams

    if native:
        calls = native_calls(driver)
        monkeypatch.setattr(launch_plan, "direct_calls", lambda _driver: calls)

    for module in (cuda_memory, rcuda, cuda_launch, launch_call, launch_plan, streams, peer):
        monkeypatch.setattr(module, "driver", driver)
    runtime = TwoDeviceRuntime(driver)
    monkeypatch.setattr(cuda_launch, "get_runtime", lambda: runtime)
    monkeypatch.setattr(arrays, "get_runtime", lambda: runtime)
    monkeypatch.setattr(array_views, "get_runtime", lambda: runtime)
    import tcmlir.cache.artifacts as artifacts

    monkeypatch.setattr(artifacts, "make_cuda_runner",
                        lambda image, key, device=0: CudaRunner(image, device, runtime=runtime))
    return driver, runtime


def two_devices(monkeypatch: Any, source: str, *host_inputs: Any, peer_access: bool = True,
                devices: tuple[int, ...] = (0, 1), fake: Any = None, native: bool = False
                ) -> tuple:
    """A cuda TCFunction over the two-device fake (a new one, or ``fake``: an earlier call's
    (driver, runtime)), compiled for ``devices``; each launch runs the host build. Returns
    (function, its `SplitKernel`, driver, runtime)."""
    if fake is None:
        driver, runtime = install_two_devices(monkeypatch, peer_access, native)
    else:
        driver, runtime = fake
    fn = tc.define(source, target="cuda")
    split = fn.compile(*host_inputs, devices=list(devices), arch="sm_90")
    _simulate_at_launched_sizes(driver, split.kernels[0].runner.image, source)
    return fn, split, driver, runtime


def _simulate_at_launched_sizes(driver, image, source):
    """Launches run the host build compiled at the sizes they pass (parts of one split can
    have different sizes, and a host build at other sizes would write past a part's rows)."""
    cpu, runs = tc.define(source, target="cpu"), {}
    n_tensors, n_sizes = len(image.arg_order), len(image.sizes_order)

    def run(name, slots):
        from fake_cuda import block_slots

        key = tuple(block_slots(driver, image)[n_tensors:n_tensors + n_sizes])
        if key not in runs:
            sizes = dict(zip(image.sizes_order, key, strict=True))
            sample = [np.zeros(tuple(e.evaluate(sizes) for e in t.shape), t.dtype.numpy)
                      for t in cpu.ir.inputs]
            simulate_with_host(driver, image, cpu.compile(*sample))
            runs[key], driver.simulate = driver.simulate, run
        runs[key](name, slots)

    driver.simulate = run


def device_array_on(runtime: TwoDeviceRuntime, host: np.ndarray, device: int) -> Any:
    """A CUDA-array-interface object whose "device" memory is ``host``'s, on ``device``."""
    from fake_cuda import device_array

    return device_array(runtime.place(host, device))
