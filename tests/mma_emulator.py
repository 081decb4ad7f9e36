"""A host machine for tensor-core kernels (a test helper): the LLVM IR the NVPTX code generator
emits, run on the CPU.

`host_ir(text)` turns NVPTX IR into host IR: address spaces dropped, the ``nvvm`` intrinsics the
tensor-core kernels use replaced by definitions that call back into Python — special registers
(``tid``, ``ctaid``), ``bar.sync``, ``cp.async`` (a synchronous copy that checks its alignment
and zero-fills past its source size; commit and wait do nothing), ``ldmatrix`` and ``mma``
(warp-collective: every lane waits for the 32 lanes of its warp, then gets its registers by
the layouts `codegen/mma_layout.py` documents), ``cvt.rna.tf32``. `run_threads` runs a JIT-ed
function once per thread of a block, each on an OS thread (the barriers and the warps'
instructions need them all at once); `run_kernel` runs a compiled `Kernel` block after block.
Inline assembly (wgmma) is not emulated: the mma.sync form only.
"""

from __future__ import annotations

import ctypes
import re
import threading
from collections.abc import Callable, Mapping
from typing import Any

import llvmlite.binding as llvm
import numpy as np

from tcmlir.codegen.host import host_target_machine
from tcmlir.codegen.mma_layout import (
    a_element,
    a_element_tf32,
    b_element,
    b_element_tf32,
    c_element,
    ldmatrix_element,
)

VIOLATIONS: list[tuple[int, int, int, int]] = []  # cp.async calls misaligned or oversized
COPY_WIDTHS = (4, 8, 16)
_S4I, _S4F = "{i32, i32, i32, i32}", "{float, float, float, float}"
_COLLECTIVE = {  # intrinsic -> (callback, its first argument)
    "llvm.nvvm.ldmatrix.sync.aligned.m8n8.x4.b16": ("emu_ldsm_cb", 0),
    "llvm.nvvm.ldmatrix.sync.aligned.m8n8.x4.trans.b16": ("emu_ldsm_cb", 1),
    "llvm.nvvm.mma.m16n8k16.row.col.f32.f32": ("emu_mma_cb", 0),
    "llvm.nvvm.mma.m16n8k16.row.col.bf16": ("emu_mma_cb", 1),
    "llvm.nvvm.mma.m16n8k8.row.col.tf32": ("emu_mma_cb", 2),
}
_SREGS = ("tid.x", "ctaid.x", "ctaid.y", "ctaid.z")


class Block:
    """The threads of the block being run: who is who, and the barriers they meet at."""

    def __init__(self, threads: int, ctaid: tuple[int, int, int] = (0, 0, 0)):
        self.threads, self.ctaid = threads, ctaid
        self.tid: dict[int, int] = {}  # OS thread -> thread of the block
        self.barrier = threading.Barrier(threads, timeout=120)
        warps = max(1, threads // 32)
        self.warp_barriers = [threading.Barrier(32, timeout=120) for _ in range(warps)]
        self.inputs: list[list[Any]] = [[None] * 32 for _ in range(warps)]
        self.outputs: list[list[Any]] = [[None] * 32 for _ in range(warps)]

    def me(self) -> int:
        return self.tid[threading.get_ident()]

    def collective(self, value: Any, compute: Callable[[list[Any]], list[Any]]) -> Any:
        """Hand ``value`` in for this lane; once the warp's 32 are in, lane 0 computes every
        lane's result from them; return this lane's."""
        warp, lane = divmod(self.me(), 32)
        self.inputs[warp][lane] = value
        self.warp_barriers[warp].wait()
        if lane == 0:
            self.outputs[warp] = compute(self.inputs[warp])
        self.warp_barriers[warp].wait()
        return self.outputs[warp][lane]


STATE: dict[str, Block] = {}


def _copy(width: int):
    def copy(dst: int, src: int, nbytes: int) -> None:
        if dst % width or src % width or not 0 <= nbytes <= width:
            VIOLATIONS.append((dst, src, nbytes, width))
        ctypes.memset(dst, 0, width)
        if nbytes:
            ctypes.memmove(dst, src, nbytes)
    return copy


def _ldsm(trans: int, addr: int, out: int) -> None:
    def compute(addrs: list[int]) -> list[list[int]]:
        res = []
        for lane in range(32):
            regs = []
            for j in range(4):
                halves = []
                for e in range(2):
                    r, c = ldmatrix_element(lane, e, bool(trans))
                    halves.append(ctypes.c_uint16.from_address(addrs[8 * j + r] + 2 * c).value)
                regs.append(halves[0] | halves[1] << 16)
            res.append(regs)
        return res

    (ctypes.c_uint32 * 4).from_address(out)[:] = STATE["block"].collective(addr, compute)


def _f32(bits: int) -> float:
    return float(np.array([bits], np.uint32).view(np.float32)[0])


def _halves(bits: int, kind: int) -> list[float]:
    pair = np.array([bits & 0xFFFF, bits >> 16], np.uint16)
    if kind == 0:
        return [float(x) for x in pair.view(np.float16)]
    return [float(x) for x in (pair.astype(np.uint32) << 16).view(np.float32)]


def _mma(kind: int, args: int, out: int) -> None:
    words = list((ctypes.c_uint32 * 10).from_address(args))

    def compute(lanes: list[list[int]]) -> list[list[float]]:
        k = 8 if kind == 2 else 16
        a, b, c = np.zeros((16, k)), np.zeros((k, 8)), np.zeros((16, 8))
        for lane, w in enumerate(lanes):
            for i in range(4):
                if kind == 2:
                    a[a_element_tf32(lane, i)] = _f32(w[i])
                else:
                    for e, v in enumerate(_halves(w[i], kind)):
                        a[a_element(lane, i, e)] = v
            for i in range(2):
                if kind == 2:
                    b[b_element_tf32(lane, i)] = _f32(w[4 + i])
                else:
                    for e, v in enumerate(_halves(w[4 + i], kind)):
                        b[b_element(lane, i, e)] = v
            for i in range(4):
                c[c_element(lane, i)] = _f32(w[6 + i])
        d = (a @ b + c).astype(np.float32)
        return [[float(d[c_element(lane, i)]) for i in range(4)] for lane in range(32)]

    (ctypes.c_float * 4).from_address(out)[:] = STATE["block"].collective(words, compute)


def _sreg(which: int) -> int:
    block = STATE["block"]
    return block.me() if which == 0 else block.ctaid[which - 1]


def _barrier() -> None:
    STATE["block"].barrier.wait()


_VOID3 = ctypes.CFUNCTYPE(None, ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p)
_CALLBACKS: dict[str, Any] = {
    "emu_ldsm_cb": _VOID3(_ldsm), "emu_mma_cb": _VOID3(_mma),
    "emu_sreg_cb": ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_int32)(_sreg),
    "emu_barrier_cb": ctypes.CFUNCTYPE(None)(_barrier),
    **{f"emu_cp_async_cb_{w}": ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p,
                                                 ctypes.c_int32)(_copy(w)) for w in COPY_WIDTHS},
}
for _name, _cb in _CALLBACKS.items():
    llvm.add_symbol(_name, ctypes.cast(_cb, ctypes.c_void_p).value)


def _definitions() -> dict[str, str]:
    """intrinsic -> its host definition (IR text)."""
    out: dict[str, str] = {}
    for name, (cb, kind) in _COLLECTIVE.items():
        if cb == "emu_ldsm_cb":
            out[name] = (f'define {_S4I} @"emu.{name}"(ptr %p) {{\n  %o = alloca {_S4I}\n'
                         f"  call void @emu_ldsm_cb(i32 {kind}, ptr %p, ptr %o)\n"
                         f"  %r = load {_S4I}, ptr %o\n  ret {_S4I} %r\n}}")
            continue
        reg = "<2 x half>" if kind == 0 else "i32"
        params = [f"{reg} %a{i}" for i in range(6)] + [f"float %c{i}" for i in range(4)]
        body = ["  %in = alloca [10 x i32]"]
        for i in range(10):
            ty, v = (reg, f"%a{i}") if i < 6 else ("float", f"%c{i - 6}")
            body += [f"  %x{i} = bitcast {ty} {v} to i32",
                     f"  %p{i} = getelementptr [10 x i32], ptr %in, i32 0, i32 {i}",
                     f"  store i32 %x{i}, ptr %p{i}"]
        body += [f"  %o = alloca {_S4F}", f"  call void @emu_mma_cb(i32 {kind}, ptr %in, ptr %o)",
                 f"  %r = load {_S4F}, ptr %o", f"  ret {_S4F} %r"]
        out[name] = f'define {_S4F} @"emu.{name}"({", ".join(params)}) {{\n' + "\n".join(body) + "\n}"
    # cvt.rna.tf32.f32: round to nearest, ties away, to 10 mantissa bits
    out["llvm.nvvm.f2tf32.rna"] = ('define i32 @"emu.llvm.nvvm.f2tf32.rna"(float %x) {\n'
                                   "  %b = bitcast float %x to i32\n  %r = add i32 %b, 4096\n"
                                   "  %t = and i32 %r, -8192\n  ret i32 %t\n}")
    for i, reg in enumerate(_SREGS):
        name = f"llvm.nvvm.read.ptx.sreg.{reg}"
        out[name] = (f'define i32 @"emu.{name}"() {{\n  %r = call i32 @emu_sreg_cb(i32 {i})\n'
                     "  ret i32 %r\n}")
    out["llvm.nvvm.barrier0"] = ('define void @"emu.llvm.nvvm.barrier0"() {\n'
                                 "  call void @emu_barrier_cb()\n  ret void\n}")
    out["llvm.nvvm.cp.async.commit.group"] = ('define void @"emu.llvm.nvvm.cp.async.commit.group"()'
                                              " {\n  ret void\n}")
    out["llvm.nvvm.cp.async.wait.group"] = ('define void @"emu.llvm.nvvm.cp.async.wait.group"(i32 %n)'
                                            " {\n  ret void\n}")
    for cache in ("cg", "ca"):
        for w in COPY_WIDTHS:
            name = f"llvm.nvvm.cp.async.{cache}.shared.global.{w}.s"
            out[name] = (f'define void @"emu.{name}"(ptr %d, ptr %s, i32 %n) {{\n'
                         f"  call void @emu_cp_async_cb_{w}(ptr %d, ptr %s, i32 %n)\n  ret void\n}}")
    return out


_DEFINITIONS = _definitions()
_CALLBACK_DECLS = ["declare void @emu_ldsm_cb(i32, ptr, ptr)", "declare void @emu_mma_cb(i32, ptr, ptr)",
                   "declare i32 @emu_sreg_cb(i32)", "declare void @emu_barrier_cb()",
                   *[f"declare void @emu_cp_async_cb_{w}(ptr, ptr, i32)" for w in COPY_WIDTHS]]


def host_ir(text: str) -> str:
    """NVPTX IR as host IR (see the module docstring); shared-memory globals made external
    so that they can be found by name."""
    text = re.sub(r" addrspace\(\d\)", "", text)
    text = re.sub(r"addrspacecast (ptr [^ ]+) to ptr", r"bitcast \1 to ptr", text)
    text = text.replace("ptx_kernel ", "").replace("internal global", "global")
    lines = [line for line in text.splitlines()
             if not line.startswith(("target triple", "target datalayout"))]
    used = []
    for name in _DEFINITIONS:
        if f'@"{name}"' in text:
            used.append(name)
            lines = [line for line in lines
                     if not (line.startswith("declare") and f'@"{name}"(' in line)]
    text = "\n".join(lines)
    for name in used:
        text = text.replace(f'@"{name}"(', f'@"emu.{name}"(')
    left = set(re.findall(r'@"?(llvm\.nvvm\.[\w.]+)"?\(', text))
    assert not left, f"intrinsics the host machine does not emulate: {sorted(left)}"
    return "\n".join([text, *_CALLBACK_DECLS, *(_DEFINITIONS[n] for n in used)]) + "\n"


def jit(text: str):
    """An MCJIT engine of host IR ``text`` (kept alive by the caller)."""
    module = llvm.parse_assembly(text)
    module.verify()
    engine = llvm.create_mcjit_compiler(module, host_target_machine())
    engine.finalize_object()
    return engine


def run_threads(block: Block, body: Callable[[int], None]) -> None:
    """``body(tid)`` on one OS thread per thread of ``block``, all at once."""
    STATE["block"] = block
    errors: list[BaseException] = []

    def thread(t: int) -> None:
        block.tid[threading.get_ident()] = t
        try:
            body(t)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
            block.barrier.abort()
            for b in block.warp_barriers:
                b.abort()

    pool = [threading.Thread(target=thread, args=(t,)) for t in range(block.threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(300)
    assert not any(t.is_alive() for t in pool), "a thread of the block never finished"
    assert not errors, errors[:2]


_KERNEL = re.compile(r'^define (?:ptx_kernel )?void @"(\w+)"\((.*)\)', re.M)


def run_kernel(kernel: Any, arrays: Mapping[str, np.ndarray], sizes: Mapping[str, int]) -> None:
    """Every launch of a compiled CUDA ``kernel`` (`tcmlir.Kernel`), block after block, on
    ``arrays`` (every tensor of the function, by name: inputs, outputs, temporaries)."""
    engine = jit(host_ir(kernel.llvm_ir))
    signatures = {name: params for name, params in _KERNEL.findall(kernel.llvm_ir)}
    err = np.zeros(4, np.int64)
    del VIOLATIONS[:]
    for launch in kernel.runner.image.kernels:
        params = re.findall(r'(ptr|i64|i32)[^%]*%"?([\w.]+)"?', signatures[launch.name])
        types, values = [], []
        for ty, name in params:
            if ty == "ptr":
                types.append(ctypes.c_void_p)
                values.append(arrays[name].ctypes.data if name in arrays else err.ctypes.data)
            else:
                types.append(ctypes.c_int64 if ty == "i64" else ctypes.c_int32)
                values.append(sizes[name])
        entry = ctypes.CFUNCTYPE(None, *types)(engine.get_function_address(launch.name))
        threads = launch.block[0] * launch.block[1] * launch.block[2]
        gx, gy, gz = launch.grid
        for z in range(gz):
            for y in range(gy):
                for x in range(gx):
                    run_threads(Block(threads, (x, y, z)), lambda _t, f=entry, v=values: f(*v))
    assert not err.any(), f"the kernel reported an error: {err}"
    assert not VIOLATIONS, f"misaligned or oversized cp.async: {VIOLATIONS[:4]}"
