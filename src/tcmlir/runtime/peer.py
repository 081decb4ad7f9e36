"""Copies between devices and the streams of a split call (used by `tcmlir.multi.execute`).

Place: below `multi.execute`, beside `launch_plan`; everything goes through the driver binding
of `cuda_memory`, each call checked. A copy of ``nbytes`` from one device's memory to another's
is queued on a stream of the destination:

* same device: ``cuMemcpyDtoDAsync`` (a device-local copy);
* devices that can access each other (``cuDeviceCanAccessPeer``; access is enabled once per
  pair with ``cuCtxEnablePeerAccess``): ``cuMemcpyPeerAsync``, device to device over
  NVLink/PCIe without touching the host;
* otherwise staged through page-locked host memory: the host waits for the source's event,
  copies device to host synchronously, and queues the host-to-device copy on the stream (the
  staging buffer must then live until that stream has passed the copy).
"""

from __future__ import annotations

from typing import Any

from .cuda_memory import check, driver

__all__ = ["PeerAccess", "copy_device_to_device", "record_event", "stage_through_host",
           "wait_event"]


class PeerAccess:
    """Which device pairs can copy directly, asked once per pair and enabled when they can."""

    def __init__(self, runtime: Any):
        self._runtime = runtime
        self._pairs: dict[tuple[int, int], bool] = {}

    def direct(self, src: int, dst: int) -> bool:
        """Whether ``dst`` can read ``src``'s memory directly (True for one device)."""
        if src == dst:
            return True
        key = (src, dst)
        found = self._pairs.get(key)
        if found is None:
            found = self._pairs[key] = self._enable(src, dst)
        return found

    def _enable(self, src: int, dst: int) -> bool:
        dst_dev = check(driver.cuDeviceGet(dst), f"cuDeviceGet({dst})")
        src_dev = check(driver.cuDeviceGet(src), f"cuDeviceGet({src})")
        can = bool(check(driver.cuDeviceCanAccessPeer(dst_dev, src_dev),
                         f"cuDeviceCanAccessPeer({dst}, {src})"))
        if not can:
            return False
        src_ctx = self._runtime.context(src)
        self._runtime.context(dst)  # current: the context that gains access
        result = driver.cuCtxEnablePeerAccess(src_ctx.handle, 0)
        err = result[0] if isinstance(result, tuple) else result
        already = getattr(driver.CUresult, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED", None)
        if err != driver.CUresult.CUDA_SUCCESS and err != already:
            check(result, f"cuCtxEnablePeerAccess(device {dst} -> device {src})")
        return True


def copy_device_to_device(dst: int, dst_device: int, dst_context: Any, src: int,
                          src_device: int, src_context: Any, nbytes: int, stream: int) -> str:
    """Queue a copy on ``stream`` (a stream of the current context, which must be the
    destination's or the source's); returns the driver call used."""
    if nbytes == 0:
        return "none"
    if src_device == dst_device:
        check(driver.cuMemcpyDtoDAsync(dst, src, nbytes, stream),
              f"cuMemcpyDtoDAsync({nbytes} bytes)", context=f"device {dst_device}")
        return "cuMemcpyDtoDAsync"
    check(driver.cuMemcpyPeerAsync(dst, dst_context.handle, src, src_context.handle, nbytes,
                                   stream),
          f"cuMemcpyPeerAsync({nbytes} bytes)", context=f"device {src_device} -> {dst_device}")
    return "cuMemcpyPeerAsync"


def stage_through_host(dst: int, src: int, nbytes: int, pinned: Any, ready: Any,
                       src_context: Any, dst_context: Any, stream: int | None) -> None:
    """Copy through ``pinned`` (page-locked, at least ``nbytes``): the host waits for the
    source's ``ready`` event, reads synchronously, and queues the write on ``stream`` (a
    stream of the destination's context; None: writes synchronously)."""
    if nbytes == 0:
        return
    src_context.activate()
    if ready is not None:
        check(driver.cuEventSynchronize(ready), "cuEventSynchronize", context="staging a copy")
    check(driver.cuMemcpyDtoH(pinned.address, src, nbytes), f"cuMemcpyDtoH({nbytes} bytes)",
          context="staging a copy between devices without peer access")
    dst_context.activate()
    if stream is None:
        check(driver.cuMemcpyHtoD(dst, pinned.address, nbytes), f"cuMemcpyHtoD({nbytes} bytes)",
              context="staging a copy between devices")
        return
    check(driver.cuMemcpyHtoDAsync(dst, pinned.address, nbytes, stream),
          f"cuMemcpyHtoDAsync({nbytes} bytes)", context="staging a copy between devices")


def record_event(event: Any, stream: int) -> None:
    check(driver.cuEventRecord(event, stream), "cuEventRecord", context=f"stream {stream:#x}")


def wait_event(stream: int, event: Any) -> None:
    """Make ``stream`` wait for ``event`` (on any device) without blocking the host."""
    check(driver.cuStreamWaitEvent(stream, event, 0), "cuStreamWaitEvent",
          context=f"stream {stream:#x}")
