"""The parameters of a CUDA launch: one block of 8-byte slots per plan, each kernel its own view.

`launch_plan.CudaPlan` keeps one `ParamBlock` per plan (`multi.prepared` one per part of a
split call): a slot per tensor of the function, per size and for the error flag. A call
writes the pointers into the slots once; each kernel, which takes only the tensors and sizes
it reads or writes (`codegen.nvptx_abi.KernelLaunch`), reads its slots through a ``void*`` array
of its own, the ``kernelParams`` of its ``cuLaunchKernel``.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

__all__ = ["ParamBlock", "kernel_layouts"]


class ParamBlock:
    """``kernelParams`` for the tcmlir CUDA ABI, where every parameter is 8 bytes (tensor
    pointers, i64 sizes, the error flag's pointer): ``values[k]`` is slot k (the function's
    tensors in `CudaKernelImage.arg_order`, its sizes, the flag) and ``address`` the ``void*[n]``
    array of every slot's address. Each kernel takes only some of the slots (``layouts[i]``:
    kernel i's, in its parameter order): ``kernel_addresses[i]`` is its own ``void*`` array
    that ``cuLaunchKernel`` reads, pointing into the same ``values``, so a call writes each
    pointer once whatever the number of kernels that take it."""

    def __init__(self, count: int, layouts: Sequence[Sequence[int]] | None = None):
        self.count = count
        self.values = (ctypes.c_uint64 * max(1, count))()
        base = ctypes.addressof(self.values)
        self._pointers = (ctypes.c_void_p * max(1, count))(*(base + 8 * k for k in range(count)))
        self.address = ctypes.addressof(self._pointers) if count else 0
        self.layouts = tuple(tuple(layout) for layout in (layouts or ()))
        everything = tuple(range(count))
        arrays, addresses = [], []
        for layout in self.layouts:
            if any(not 0 <= k < count for k in layout):
                raise ValueError(f"a kernel's parameter slots {layout} outside 0..{count - 1}")
            if layout == everything:
                addresses.append(self.address)
                continue
            array = (ctypes.c_void_p * max(1, len(layout)))(*(base + 8 * k for k in layout))
            arrays.append(array)
            addresses.append(ctypes.addressof(array) if layout else 0)
        self._kernel_pointers = arrays
        self.kernel_addresses = tuple(addresses)

    def blank(self) -> ParamBlock:
        """A new block of the same slots and kernel layouts, its values zero."""
        return ParamBlock(self.count, self.layouts)

    def slots(self, kernel: int | None = None) -> list[int]:
        """The parameter values as the driver will read them (through the pointer array): every
        slot, or those kernel ``kernel`` takes."""
        address, count = ((self.address, self.count) if kernel is None else
                          (self.kernel_addresses[kernel], len(self.layouts[kernel])))
        pointers = (ctypes.c_void_p * count).from_address(address)
        return [ctypes.c_uint64.from_address(p).value for p in pointers]


def kernel_layouts(image: Any) -> tuple[tuple[int, ...], ...]:
    """Per kernel of ``image`` (a `CudaKernelImage`) the slots of its parameters in a
    `ParamBlock` of the image's tensors, sizes and flag: its tensors, its sizes, the flag."""
    n_tensors = len(image.arg_order)
    tensor_slot = {name: k for k, name in enumerate(image.arg_order)}
    size_slot = {name: n_tensors + j for j, name in enumerate(image.sizes_order)}
    flag = n_tensors + len(image.sizes_order)
    return tuple((*(tensor_slot[t] for t in k.tensors), *(size_slot[s] for s in k.sizes), flag)
                 for k in image.kernels)
