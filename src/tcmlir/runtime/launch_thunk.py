"""One native call per cached launch: a host function, JIT-compiled once per process with
llvmlite, that makes every driver call of a plan's warm launch.

Place: `launch_plan.CudaPlan` builds a `LaunchRecord` per plan (when `fast_driver.direct_calls`
found ``libcuda``) and calls `LaunchRecord.run` instead of calling ``cuLaunchKernel`` through
ctypes once per kernel. The record is a block of 64-bit words the thunk reads:

====  =====================================================================================
word  meaning
====  =====================================================================================
0-3   addresses of ``cuCtxGetCurrent``, ``cuLaunchKernel``, ``cuMemsetD32Async``,
      ``cuMemsetD8Async`` (from ``libcuda`` through ctypes; tests give fakes)
4     the plan's context: the thunk launches nothing unless it is current on this thread
5     the stream (written per call)
6     the plan's `ParamBlock` address (``void*[n]``, one pointer per slot): the fills read it
7, 8  how many zero fills, how many kernels
9..   per fill: the parameter slot holding the buffer's pointer, its bytes (``cuMemsetD32Async``
      when a multiple of 4, else ``cuMemsetD8Async``), queued before the launches
then  per kernel: the ``CUfunction``, grid x, y, z, block x, y, z, dynamic shared bytes, its
      ``kernelParams`` (`ParamBlock.kernel_addresses`: its own slots, by default word 6)
====  =====================================================================================

`LaunchRecord.run` returns 0, or a code: ``STAGE_CONTEXT`` (the context is not current — the
caller makes it current and runs again), ``STAGE_FILL`` / ``STAGE_LAUNCH`` with the index of
the fill or kernel and the ``CUresult`` (`decode`).

Why: ctypes converts each argument of each foreign call in Python. A warm call used to make a
``cuCtxGetCurrent`` call and one 11-argument ``cuLaunchKernel`` per kernel (plus one
cuda-python memset per zero-filled buffer); through the thunk it is one call with one prebuilt
argument, and the per-call work in Python is writing the pointers into the `ParamBlock` and the
stream into word 5.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from collections.abc import Sequence
from typing import Any

from llvmlite import ir

__all__ = ["STAGE_CONTEXT", "STAGE_FILL", "STAGE_LAUNCH", "LaunchRecord", "decode", "thunk"]

STAGE_CONTEXT, STAGE_FILL, STAGE_LAUNCH = 1, 2, 3
_HEADER = 9
_KERNEL_WORDS = 9
_FILL_WORDS = 2
_lock = threading.Lock()


def decode(code: int) -> tuple[int, int, int]:
    """(stage, index of the fill or kernel, CUresult) of a nonzero `LaunchRecord.run` code."""
    return code >> 40, (code >> 32) & 0xFF, code & 0xFFFFFFFF


def _build() -> ir.Module:
    i8, i32, i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
    ptr = ir.PointerType(i8)
    mod = ir.Module(name="tcmlir_launch_thunk")
    fnty = ir.FunctionType(i64, [ir.PointerType(i64)])
    fn = ir.Function(mod, fnty, name="tcmlir_launch")
    rec = fn.args[0]
    rec.add_attribute("noalias")
    get_current_t = ir.FunctionType(i32, [ir.PointerType(ptr)])
    launch_t = ir.FunctionType(i32, [ptr, i32, i32, i32, i32, i32, i32, i32, ptr,
                                     ir.PointerType(ptr), ir.PointerType(ptr)])
    memset32_t = ir.FunctionType(i32, [i64, i32, i64, ptr])
    memset8_t = ir.FunctionType(i32, [i64, i8, i64, ptr])

    entry = fn.append_basic_block("entry")
    b = ir.IRBuilder(entry)

    def word(index: Any) -> Any:
        at = index if isinstance(index, ir.Value) else ir.Constant(i64, index)
        return b.load(b.gep(rec, [at]))

    def code(stage: int, index: Any, err: Any) -> Any:
        return b.or_(b.or_(ir.Constant(i64, stage << 40), b.shl(index, ir.Constant(i64, 32))),
                     b.zext(err, i64))

    # the context check
    slot = b.alloca(ptr)
    get_current = b.inttoptr(word(0), ir.PointerType(get_current_t))
    err = b.call(get_current, [slot])
    current = b.ptrtoint(b.load(slot), i64)
    bad = b.or_(b.icmp_unsigned("!=", err, ir.Constant(i32, 0)),
                b.icmp_unsigned("!=", current, word(4)))
    fail_ctx = fn.append_basic_block("context")
    fills_head = fn.append_basic_block("ready")
    with b.goto_block(fail_ctx):
        b.ret(code(STAGE_CONTEXT, ir.Constant(i64, 0), err))
    b.cbranch(bad, fail_ctx, fills_head)

    b.position_at_end(fills_head)
    stream = b.inttoptr(word(5), ptr)
    n_fills, n_kernels = word(7), word(8)
    params_words = b.inttoptr(word(6), ir.PointerType(ir.PointerType(i64)))
    zero32 = ir.Constant(i32, 0)

    def counted(name: str, count: Any, stage: int, emit: Any) -> None:
        """``for i in range(count): err = emit(i); if err: return code(stage, i, err)``,
        leaving the builder after the loop."""
        before = b.block
        head, body = fn.append_basic_block(name), fn.append_basic_block(f"{name}_body")
        fail, after = fn.append_basic_block(f"{name}_fail"), fn.append_basic_block(f"{name}_done")
        b.branch(head)
        b.position_at_end(head)
        i = b.phi(i64)
        i.add_incoming(ir.Constant(i64, 0), before)
        b.cbranch(b.icmp_unsigned("<", i, count), body, after)
        b.position_at_end(body)
        err = emit(i)
        i.add_incoming(b.add(i, ir.Constant(i64, 1)), b.block)
        b.cbranch(b.icmp_unsigned("!=", err, zero32), fail, head)
        b.position_at_end(fail)
        b.ret(code(stage, i, err))
        b.position_at_end(after)

    def fill(i: Any) -> Any:
        """memset(*params[slot], 0, nbytes, stream): 32-bit words when nbytes allows."""
        base = b.add(ir.Constant(i64, _HEADER), b.mul(i, ir.Constant(i64, _FILL_WORDS)))
        k, nbytes = word(base), word(b.add(base, ir.Constant(i64, 1)))
        dst = b.load(b.load(b.gep(params_words, [k])))
        by4 = b.icmp_unsigned("==", b.and_(nbytes, ir.Constant(i64, 3)), ir.Constant(i64, 0))
        m32 = b.inttoptr(word(2), ir.PointerType(memset32_t))
        m8 = b.inttoptr(word(3), ir.PointerType(memset8_t))
        wide, narrow = fn.append_basic_block("fill32"), fn.append_basic_block("fill8")
        join = fn.append_basic_block("filled")
        b.cbranch(by4, wide, narrow)
        b.position_at_end(wide)
        e32 = b.call(m32, [dst, zero32, b.lshr(nbytes, ir.Constant(i64, 2)), stream])
        b.branch(join)
        b.position_at_end(narrow)
        e8 = b.call(m8, [dst, ir.Constant(i8, 0), nbytes, stream])
        b.branch(join)
        b.position_at_end(join)
        err = b.phi(i32)
        err.add_incoming(e32, wide)
        err.add_incoming(e8, narrow)
        return err

    first = b.add(ir.Constant(i64, _HEADER), b.mul(n_fills, ir.Constant(i64, _FILL_WORDS)))
    launch_fn = b.inttoptr(word(1), ir.PointerType(launch_t))
    null = ir.Constant(ir.PointerType(ptr), None)

    def launch(j: Any) -> Any:
        """cuLaunchKernel(f, grid, block, shared, stream, its params, NULL) of kernel j."""
        at = b.add(first, b.mul(j, ir.Constant(i64, _KERNEL_WORDS)))
        f = b.inttoptr(word(at), ptr)
        dims = [b.trunc(word(b.add(at, ir.Constant(i64, d))), i32) for d in range(1, 8)]
        params = b.inttoptr(word(b.add(at, ir.Constant(i64, 8))), ir.PointerType(ptr))
        return b.call(launch_fn, [f, *dims, stream, params, null])

    counted("fills", n_fills, STAGE_FILL, fill)
    counted("launches", n_kernels, STAGE_LAUNCH, launch)
    b.ret(ir.Constant(i64, 0))
    return mod


@functools.cache
def thunk() -> tuple[Any, Any]:
    """(the ctypes function ``int64 tcmlir_launch(uint64 *record)``, the engine it lives in);
    built once per process."""
    from ..codegen.host import jit

    with _lock:
        module = jit(_build())
        address = module.address("tcmlir_launch")
        proto = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p)
        return proto(address), module


class LaunchRecord:
    """The words `thunk` reads for one plan (see the module docstring).

    ``functions``: the four driver entry points' addresses; ``params``: the `ParamBlock`'s
    address (every slot); ``kernels``: per kernel (CUfunction, gx, gy, gz, bx, by, bz[,
    dynamic shared bytes]); ``fills``: (parameter slot, bytes) zeroed before the launches on
    every `run`; ``kernel_params``: per kernel its ``kernelParams`` (default ``params``).
    ``fn(arg)`` is the thunk's call itself, for a caller that has written the stream into
    ``words[5]`` (the generated warm calls, `torch_fast`)."""

    def __init__(self, functions: Sequence[int], context: int, params: int,
                 kernels: Sequence[Sequence[int]], fills: Sequence[tuple[int, int]] = (),
                 kernel_params: Sequence[int] | None = None):
        if kernel_params is None:
            kernel_params = [params] * len(kernels)
        if len(kernel_params) != len(kernels):
            raise ValueError(f"{len(kernel_params)} parameter arrays for {len(kernels)} kernels")
        words = [*functions, context, 0, params, len(fills), len(kernels)]
        for k, nbytes in fills:
            words += [k, nbytes]
        for (f, gx, gy, gz, bx, by, bz, *shared), own in zip(kernels, kernel_params, strict=True):
            words += [int(f), gx, gy, gz, bx, by, bz, shared[0] if shared else 0, own]
        self.words = (ctypes.c_uint64 * len(words))(*words)
        self.arg = ctypes.c_void_p(ctypes.addressof(self.words))
        self.fn = thunk()[0]

    def run(self, stream: int) -> int:
        """Queue the fills and the launches on ``stream``; 0, or a code for `decode`."""
        self.words[5] = stream
        return self.fn(self.arg)

    def with_params(self, params: int, kernel_params: Sequence[int] | None = None) -> LaunchRecord:
        """A copy launching with another parameter block (and no fills): ``params`` its
        address, ``kernel_params`` per kernel its own array (default ``params``)."""
        copy = LaunchRecord.__new__(LaunchRecord)
        n_fills, n_kernels = self.words[7], self.words[8]
        if kernel_params is None:
            kernel_params = [params] * n_kernels
        if len(kernel_params) != n_kernels:
            raise ValueError(f"{len(kernel_params)} parameter arrays for {n_kernels} kernels")
        words = list(self.words)
        head, kernels = words[:_HEADER], words[_HEADER + _FILL_WORDS * n_fills:]
        for j, own in enumerate(kernel_params):
            kernels[j * _KERNEL_WORDS + 8] = own
        head[6], head[7] = params, 0
        copy.words = (ctypes.c_uint64 * (len(head) + len(kernels)))(*head, *kernels)
        copy.arg = ctypes.c_void_p(ctypes.addressof(copy.words))
        copy.fn = self.fn
        return copy
