"""Binding a call's inputs to a TC definition: validation, size binding, output allocation.

Checks what DESIGN.md §3 asks of a call (count, rank, dtype, sizes consistent across
tensors, the program's size constraints) and raises `CallError`s that name the tensor, the
dimension and both values. Host arrays only; device arrays are bound by the CUDA backend
through `tcmlir.runtime.arrays`.
"""

from __future__ import annotations

import functools
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import islpy as isl
import numpy as np

from . import ir
from .array_kinds import array_library, convert_hint, torch_numpy
from .dtypes import DType
from .errors import CallError
from .lang.ranges import SIZE_LIMIT
from .signature import ArgSpec, Signature
from .zero_fill import needs_zero_fill

__all__ = ["BoundCall", "bind_host_inputs", "bind_sizes", "buffer_view", "host_signature",
           "host_views", "is_cuda_dlpack", "needs_zero_fill", "output_shapes", "scalar_array"]


@dataclass(frozen=True)
class BoundCall:
    """Inputs as C-contiguous numpy arrays (scalars 0-d), the size values and the signature."""

    arrays: dict[str, np.ndarray]
    sizes: dict[str, int]
    signature: Signature


def _describe(x: Any) -> str:
    return f"{type(x).__module__}.{type(x).__qualname__}"


def _size_name(fn: ir.Function, extent: ir.SizeExpr) -> str | None:
    text = str(extent)
    return text if text in fn.sizes else None


def bind_sizes(fn: ir.Function, shapes: Sequence[tuple[int, ...]], *,
               allow_empty: bool = False) -> dict[str, int]:
    """Size values from input shapes; CallError on rank or size conflicts or a violated context
    (``allow_empty``: sizes with a 0 skip the context, for `empty_call`)."""
    sizes: dict[str, int] = {}
    bound_by: dict[str, tuple[str, int]] = {}
    for tensor, shape in zip(fn.inputs, shapes, strict=True):
        if len(shape) != tensor.rank:
            what = "a scalar" if tensor.rank == 0 else f"rank {tensor.rank}"
            raise CallError(
                f"{fn.name}: input {tensor.name} must be {what} "
                f"({_format_decl(tensor)}), got rank {len(shape)} with shape {tuple(shape)}")
        for d, (extent, actual) in enumerate(zip(tensor.shape, shape, strict=True)):
            name = _size_name(fn, extent)
            if name is None:
                expected = extent.evaluate({})
                if actual != expected:
                    raise CallError(
                        f"{fn.name}: input {tensor.name} dimension {d} must be {expected} "
                        f"(declared constant), got {actual}")
                continue
            if name in sizes and sizes[name] != actual:
                other, other_dim = bound_by[name]
                raise CallError(
                    f"{fn.name}: size {name} is {sizes[name]} from {other} dimension {other_dim} "
                    f"but {actual} from {tensor.name} dimension {d}")
            sizes[name] = int(actual)
            bound_by[name] = (tensor.name, d)
    missing = [s for s in fn.sizes if s not in sizes]
    if missing:  # sizes only used by outputs cannot be bound from inputs
        raise CallError(f"{fn.name}: size(s) {', '.join(missing)} are not determined by any input")
    if allow_empty and 0 in sizes.values():
        return sizes
    _check_context(fn, sizes)
    return sizes


def _check_context(fn: ir.Function, sizes: Mapping[str, int]) -> None:
    big = [f"{n}={v}" for n, v in sizes.items() if v >= SIZE_LIMIT]
    if big:  # the bounds and overflow proofs of the definition assume smaller sizes
        raise CallError(f"{fn.name}: size {', '.join(big)} is too large (sizes must be "
                        f"below 2^31, as TC's int32 sizes)")
    names = _context_params(fn.context)
    if not _context_admits(fn.context, tuple(sizes.get(n, 0) for n in names)):
        given = ", ".join(f"{n}={sizes[n]}" for n in names if n in sizes)
        broken = [c for c in fn.preconditions if not _context_admits(
            _precondition_set(names, c), tuple(sizes.get(n, 0) for n in names))]
        if broken:
            raise CallError(f"{fn.name}: sizes {given} violate the precondition "
                            f"{' and '.join(broken)} (needed to keep every access in bounds)")
        raise CallError(
            f"{fn.name}: sizes {given} violate the program's constraints {fn.context} "
            "(every size and every inferred extent must be at least 1)")


def _precondition_set(names: tuple[str, ...], condition: str) -> str:
    return f"[{', '.join(names)}] -> {{ : {condition} }}"


# Both are on every call's path: parse each context once, test each size tuple once.
@functools.lru_cache(maxsize=256)
def _context_params(context: str) -> tuple[str, ...]:
    s = isl.Set.read_from_str(isl.Context(), context)
    return tuple(s.get_dim_name(isl.dim_type.param, i) for i in range(s.dim(isl.dim_type.param)))


@functools.lru_cache(maxsize=4096)
def _context_admits(context: str, values: tuple[int, ...]) -> bool:
    ctx = isl.Context()
    point = isl.Set.read_from_str(ctx, context)
    for pos, value in enumerate(values):
        point = point.fix_val(isl.dim_type.param, pos, isl.Val.int_from_si(ctx, value))
    return not point.is_empty()


def _format_decl(t: ir.Tensor) -> str:
    return f"{t.dtype}({', '.join(map(str, t.shape))}) {t.name}" if t.shape else f"{t.dtype} {t.name}"


def scalar_array(fn_name: str, tensor: ir.Tensor, value: bool | int | float | np.generic
                 ) -> np.ndarray:
    """A Python or numpy scalar as the 0-d array of ``tensor``'s dtype, or a `CallError` naming
    the parameter when the conversion would lose information: a non-integral or non-finite
    value for an integer type, a value outside the type's range, a finite value that
    overflows a float type, anything but 0/1 for bool."""
    dt = tensor.dtype
    what = f"{fn_name}: scalar {tensor.name} ({dt})"
    if isinstance(value, np.generic) and not isinstance(value, np.bool_ | np.number):
        raise CallError(f"{what} must be a number, got {type(value).__name__}")
    py = value.item() if isinstance(value, np.generic) else value
    if isinstance(py, complex):
        raise CallError(f"{what} must be a real number, got {value!r}")
    if dt is DType.BOOL:
        if py not in (0, 1) or (isinstance(py, float) and not float(py).is_integer()):
            raise CallError(f"{what} must be True or False (or 0/1), got {value!r}")
        return np.asarray(bool(py), dtype=dt.numpy)
    if dt.is_int:
        if isinstance(py, float):
            if not math.isfinite(py) or not py.is_integer():
                raise CallError(f"{what} must be an integer, got {value!r} (converting it "
                                "would lose information)")
            py = int(py)
        info = np.iinfo(dt.numpy)
        if not info.min <= int(py) <= info.max:
            raise CallError(f"{what} must be in [{info.min}, {info.max}], got {value!r}")
        return np.asarray(int(py), dtype=dt.numpy)
    with np.errstate(over="ignore"):
        arr = np.asarray(py, dtype=dt.numpy)
    if math.isfinite(float(py)) and not np.isfinite(arr):
        raise CallError(f"{what}: {value!r} overflows {dt} (its largest value is "
                        f"{float(np.finfo(dt.numpy).max):g})")
    return arr


def _as_host_array(fn: ir.Function, tensor: ir.Tensor, value: Any) -> np.ndarray:
    """``value`` as a numpy array of ``tensor``'s dtype, checked, not copied yet."""
    if tensor.rank == 0 and isinstance(value, bool | int | float | np.generic):
        return scalar_array(fn.name, tensor, value)
    if hasattr(value, "__cuda_array_interface__") or is_cuda_dlpack(value):
        raise CallError(
            f"{fn.name}: input {tensor.name} lives on a GPU; this target runs on the host "
            "(use target='cuda', or copy the input to the host"
            + (f": {tensor.name}.cpu())" if array_library(value) == "torch" else ")"))
    if isinstance(value, np.ndarray):
        arr = value
    elif array_library(value) == "torch" and getattr(value, "device", None) is not None \
            and value.device.type == "cpu":
        arr = torch_numpy(value)
    elif hasattr(value, "__array__") or hasattr(value, "__dlpack__"):
        try:
            arr = np.asarray(value)
        except Exception as exc:  # noqa: BLE001 - foreign array types raise anything
            raise CallError(f"{fn.name}: input {tensor.name}: cannot view {_describe(value)} "
                            f"as an array ({exc})") from None
    elif (view := buffer_view(value)) is not None:  # array.array, memoryview, bytearray
        try:
            arr = np.asarray(view)
        except (TypeError, ValueError) as exc:  # a format numpy does not read
            raise CallError(f"{fn.name}: input {tensor.name}: cannot view {_describe(value)} "
                            f"as an array ({exc})") from None
    elif tensor.rank == 0:
        raise CallError(f"{fn.name}: scalar {tensor.name} ({tensor.dtype}) must be a number, "
                        f"got {_describe(value)}")
    else:
        raise CallError(f"{fn.name}: input {tensor.name} must be an array, got {_describe(value)}")
    got = DType.from_numpy(arr.dtype)
    if got is not tensor.dtype:
        raise CallError(
            f"{fn.name}: input {tensor.name} must have dtype {tensor.dtype}, got {arr.dtype} "
            f"(convert it, e.g. {convert_hint(value, tensor.dtype, tensor.name)})")
    check_byte_order(f"{fn.name}: input {tensor.name}", arr)
    return arr


def buffer_view(value: Any) -> memoryview | None:
    """A memoryview of an object exposing the buffer protocol (``array.array``,
    ``memoryview``, ``bytearray``, ``mmap``, ...), or None for one that does not. numpy
    reads it without copying (``np.asarray(view)``: its shape, strides and format)."""
    if isinstance(value, str | memoryview):
        return value if isinstance(value, memoryview) else None
    try:
        return memoryview(value)
    except (TypeError, ValueError, BufferError):  # (ValueError: a format it cannot export)
        return None


def check_byte_order(what: str, arr: np.ndarray) -> None:
    """Byte-swapped arrays (``>f4`` on a little-endian host) are refused by every target: the
    kernels read memory in the machine's order, and a silent conversion would be a copy the
    user did not ask for (and, for ``outputs=``, writes the user would not see)."""
    if not arr.dtype.isnative:
        raise CallError(f"{what} has byte-swapped elements (dtype {arr.dtype.str}); tcmlir reads "
                        f"arrays in the machine's byte order: pass "
                        f"x.astype(x.dtype.newbyteorder('='))")


def contiguous_copy(what: str, arr: np.ndarray) -> np.ndarray:
    """``arr`` itself when C-contiguous, else a C-contiguous copy; a `CallError` before
    allocating when the copy would not fit in the host memory available (a broadcast view
    of a few bytes can stand for terabytes)."""
    if arr.flags.c_contiguous:
        return arr
    check_copy_fits(what, arr)
    # np.ascontiguousarray would turn a 0-d array into shape (1,)
    return np.ascontiguousarray(arr).reshape(arr.shape)


def check_copy_fits(what: str, arr: np.ndarray) -> None:
    """A `CallError` saying how large the copy would be when a contiguous copy of the
    non-contiguous ``arr`` needs more host memory than is available."""
    if arr.flags.c_contiguous:
        return
    nbytes = arr.size * arr.itemsize
    available = host_memory_available()
    if available is not None and nbytes > available:
        kind = ("a broadcast (zero-stride) view" if any(s == 0 and n > 1 for s, n in
                                                          zip(arr.strides, arr.shape, strict=True))
                else "a non-contiguous view")
        raise CallError(
            f"{what} is {kind} (shape {arr.shape}, byte strides {arr.strides}); tcmlir copies "
            f"such inputs into contiguous memory, which would take {format_bytes(nbytes)}, more "
            f"than the {format_bytes(available)} of memory available: pass a smaller or a "
            "contiguous array (kernels do not take strides)")


def host_memory_available() -> int | None:
    """Bytes of host memory available now (Linux: MemAvailable + SwapFree), None if unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            fields = {k: v for k, _, v in (line.partition(":") for line in f)}
        return sum(int(fields[k].split()[0]) * 1024 for k in ("MemAvailable", "SwapFree")
                   if k in fields) or None
    except (OSError, ValueError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def format_bytes(n: int) -> str:
    for unit, scale in (("EiB", 2**60), ("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30),
                        ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def check_host_memory(fn: ir.Function, sizes: Mapping[str, int],
                      extra: Sequence[tuple[str, int]] = ()) -> None:
    """A `CallError` when the outputs and temporaries of ``fn`` at ``sizes``, plus the
    ``extra`` (name, bytes) allocations, need more host memory than is available (checked
    before anything is allocated)."""
    parts = [*extra, *((f"{t.role.value} {t.name}",
                        math.prod(e.evaluate(sizes) for e in t.shape) * t.dtype.itemsize)
                       for t in (*fn.outputs, *fn.temporaries))]
    need = sum(n for _, n in parts)
    available = host_memory_available()
    if available is not None and need > available:
        listed = ", ".join(f"{name} {format_bytes(n)}" for name, n in parts if n)
        raise CallError(f"{fn.name}: at sizes {', '.join(f'{k}={v}' for k, v in sizes.items())} "
                        f"the arrays need {format_bytes(need)} of host memory ({listed}), more "
                        f"than the {format_bytes(available)} available")


def is_cuda_dlpack(value: Any) -> bool:
    dev = getattr(value, "__dlpack_device__", None)
    if dev is None:
        return False
    try:
        kind, _ = dev()
    except Exception:  # noqa: BLE001
        return False
    return int(kind) in (2, 3, 13)  # kDLCUDA, kDLCUDAHost, kDLCUDAManaged


def host_views(fn: ir.Function, inputs: Sequence[Any], *,
               allow_empty: bool = False) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """The host inputs as numpy arrays (views of numpy arrays and torch CPU tensors, nothing
    copied) and the size values; `CallError` for device arrays (see `bind_host_inputs`)."""
    if len(inputs) != len(fn.inputs):
        names = ", ".join(t.name for t in fn.inputs)
        raise CallError(f"{fn.name} takes {len(fn.inputs)} input(s) ({names}), got {len(inputs)}")
    arrays: dict[str, np.ndarray] = {}
    for tensor, value in zip(fn.inputs, inputs, strict=True):
        if tensor.rank > 0 and isinstance(value, bool | int | float):
            raise CallError(f"{fn.name}: input {tensor.name} must be an array of rank "
                            f"{tensor.rank}, got a Python scalar")
        arrays[tensor.name] = _as_host_array(fn, tensor, value)
    sizes = bind_sizes(fn, [arrays[t.name].shape for t in fn.inputs], allow_empty=allow_empty)
    return arrays, sizes


def host_signature(fn: ir.Function, arrays: Mapping[str, np.ndarray]) -> Signature:
    """The signature host ``arrays`` bind to: their own strides when C-contiguous, else those
    of the contiguous copy a call makes (computed, not copied)."""
    def strides(a: np.ndarray) -> tuple[int, ...]:
        if a.flags.c_contiguous:
            return tuple(s // max(1, a.itemsize) for s in a.strides)
        out, step = [], 1
        for extent in reversed(a.shape):
            out.append(step)
            step *= max(extent, 1)
        return tuple(reversed(out))

    return Signature(tuple(ArgSpec(tuple(a.shape), str(fn.tensor(name).dtype), strides(a))
                           for name, a in arrays.items()))


def bind_host_inputs(fn: ir.Function, inputs: Sequence[Any], *,
                     allow_empty: bool = False) -> BoundCall:
    """Validate host inputs against ``fn`` and bind its sizes (``allow_empty``: see
    `bind_sizes`); shapes are checked before any non-contiguous input is copied, and the
    copies, outputs and temporaries must fit in the host memory available."""
    arrays, sizes = host_views(fn, inputs, allow_empty=allow_empty)
    check_host_memory(fn, sizes, [(f"copy of input {name}", a.size * a.itemsize)
                                  for name, a in arrays.items() if not a.flags.c_contiguous])
    arrays = {name: contiguous_copy(f"{fn.name}: input {name}", a) for name, a in arrays.items()}
    return BoundCall(arrays, sizes, host_signature(fn, arrays))


def output_shapes(fn: ir.Function, sizes: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
    return {t.name: tuple(e.evaluate(sizes) for e in t.shape) for t in fn.outputs}


def check_outputs(fn: ir.Function, sizes: Mapping[str, int], outputs: Sequence[Any] | None,
                  inputs: Sequence[Any] = ()) -> dict[str, np.ndarray] | None:
    """Validate user-given output arrays (shape, dtype, byte order, contiguity, writability,
    no memory shared with an input or another output): numpy arrays or torch CPU tensors
    (written through a numpy view of their memory; one that requires grad is refused).
    Returns the numpy arrays (views) to write, by output name."""
    if outputs is None:
        return None
    if not isinstance(outputs, list | tuple):
        outputs = (outputs,)
    if len(outputs) != len(fn.outputs):
        raise CallError(f"{fn.name} has {len(fn.outputs)} output(s), got {len(outputs)} in outputs=")
    shapes = output_shapes(fn, sizes)
    result: dict[str, np.ndarray] = {}
    for tensor, given in zip(fn.outputs, outputs, strict=True):
        arr = _host_memory_of(given)
        if arr is None:
            raise CallError(f"{fn.name}: output {tensor.name} must be a numpy array or a torch "
                            f"CPU tensor here, got {_describe(given)}")
        if getattr(given, "requires_grad", False):
            raise CallError(f"{fn.name}: output {tensor.name} requires grad; outputs= writes "
                            "it in place, which autograd would not see (as torch refuses out= "
                            f"for such tensors): pass {tensor.name}.detach() or a tensor "
                            "without grad")
        if tuple(arr.shape) != shapes[tensor.name]:
            raise CallError(f"{fn.name}: output {tensor.name} must have shape "
                            f"{shapes[tensor.name]}, got {tuple(arr.shape)}")
        if DType.from_numpy(arr.dtype) is not tensor.dtype:
            raise CallError(f"{fn.name}: output {tensor.name} must have dtype {tensor.dtype}, "
                            f"got {arr.dtype}")
        check_byte_order(f"{fn.name}: output {tensor.name}", arr)
        if not arr.flags.c_contiguous or not arr.flags.writeable:
            raise CallError(f"{fn.name}: output {tensor.name} must be a writable C-contiguous array")
        result[tensor.name] = arr
    named_inputs = [(f"input {t.name}", a) for t, x in zip(fn.inputs, inputs, strict=False)
                    if (a := _host_memory_of(x)) is not None]
    check_no_overlap(fn.name, [(f"output {n}", a) for n, a in result.items()], named_inputs)
    return result


def check_no_overlap(fn_name: str, outputs: Sequence[tuple[str, Any]],
                     inputs: Sequence[tuple[str, Any]],
                     overlap: Callable[[Any, Any], bool] | None = None) -> None:
    """A `CallError` naming both when an output array shares memory with an input or with
    another output (``overlap``: `arrays_overlap` for numpy arrays; the CUDA binder passes one
    for device views). Kernels read inputs while they write outputs, in an order no target
    promises, so an overlap would give results that differ between targets; tcmlir refuses
    it rather than copy (a copy would hide the cost, and for outputs lose the writes)."""
    overlap = overlap or arrays_overlap
    for i, (out_name, out) in enumerate(outputs):
        for other_name, other in (*outputs[:i], *inputs):
            if overlap(out, other):
                raise CallError(
                    f"{fn_name}: {out_name} (given with outputs=) shares memory with "
                    f"{other_name}; kernels read inputs while writing outputs, so the result "
                    f"would depend on the order of the writes: pass separate arrays (e.g. a "
                    f"copy of the {other_name.split()[0]})")


#: Work limit of the exact overlap test (``np.shares_memory``); past it, overlapping byte
#: bounds count as sharing (refused: when in doubt, do not race).
_OVERLAP_WORK = 100_000


_TOO_HARD = getattr(np, "exceptions", np).TooHardError


def arrays_overlap(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two host arrays share an element's bytes (exactly, within a work limit)."""
    if a.size == 0 or b.size == 0 or not np.may_share_memory(a, b):
        return False
    try:
        return bool(np.shares_memory(a, b, max_work=_OVERLAP_WORK))
    except _TOO_HARD:
        return True


def _host_memory_of(x: Any) -> np.ndarray | None:
    """The numpy view of a user's host array (numpy, torch CPU tensor) without copying it,
    or None for anything else (scalars, device arrays)."""
    if isinstance(x, np.ndarray):
        return x
    if array_library(x) == "torch" and getattr(getattr(x, "device", None), "type", None) == "cpu" \
            and getattr(x, "layout", None) is getattr(sys.modules.get("torch"), "strided", 0):
        return torch_numpy(x)
    return None


def allocate_outputs(fn: ir.Function, sizes: Mapping[str, int]) -> dict[str, np.ndarray]:
    """Fresh outputs start at zero (so `+=` without `!` accumulates onto zeros); an output its
    first statement sets entirely (`needs_zero_fill` is False) is left uninitialised."""
    shapes = output_shapes(fn, sizes)
    return {t.name: (np.zeros if needs_zero_fill(fn, t, sizes) else np.empty)(
        shapes[t.name], dtype=t.dtype.numpy) for t in fn.outputs}
