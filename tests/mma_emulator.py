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

Every other kernel the cuda target emits runs too: ``shfl.sync`` (bfly/down/up/idx, i32 and
f32, warp-collective like ``ldmatrix``), ``vote.sync`` (ballot/any/all), every special register
(``tid``/``ntid``/``ctaid``/``nctaid`` in x, y, z, ``laneid``), 2-D/3-D blocks and grids,
dynamic shared memory (``tcmlir_dynamic_shared``), native atomics (real concurrency across the
OS threads: ctypes drops the GIL around the call), libdevice math (``__nv_expf`` -> the host's
``expf``) and programs of several kernels, launched in order on the same global arrays.
`run_kernel` runs a launch whose kernel reaches no barrier and no warp collective on one OS
thread, thread after thread (special registers read from memory, no Python callback: fast);
the others on one OS thread per GPU thread. It stages every array between poisoned margins
(bytes 0xFF: NaN in every float type) and names the arrays written out of bounds, poisons
shared memory before each block (reads of uninitialised shared memory show as NaN), and
reports a shuffle that reads a lane absent from its warp or from its member mask.
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
SREGS = ("tid.x", "ctaid.x", "ctaid.y", "ctaid.z",  # (the first four: `_sreg`'s old indices)
         "tid.y", "tid.z", "ntid.x", "ntid.y", "ntid.z", "nctaid.x", "nctaid.y", "nctaid.z",
         "laneid", "warpsize")
_SREGS = SREGS
SHUFFLES = ("bfly", "down", "up", "idx")
VOTES = ("ballot", "any", "all")
DYNAMIC_SHARED_BYTES = 232448  # the most an sm_90 block may have
MARGIN = 256  # poisoned bytes on each side of every array `run_kernel` stages
TIMEOUT = 120  # seconds a barrier waits for the rest of its threads (a deadlock: an error)


class Block:
    """The threads of the block being run: who is who, and the barriers they meet at.

    ``dims``: the block's extents (default: ``threads`` along x), ``grid``: the grid's. Warps
    are runs of 32 linear thread ids (x fastest); the last may be partial."""

    def __init__(self, threads: int, ctaid: tuple[int, int, int] = (0, 0, 0),
                 dims: tuple[int, int, int] | None = None, grid: tuple[int, int, int] = (1, 1, 1)):
        self.threads, self.ctaid, self.grid = threads, ctaid, grid
        self.dims = dims or (threads, 1, 1)
        assert self.dims[0] * self.dims[1] * self.dims[2] == threads, (self.dims, threads)
        self.tid: dict[int, int] = {}  # OS thread -> thread of the block
        self.barrier = threading.Barrier(threads, timeout=TIMEOUT)
        warps = max(1, -(-threads // 32))
        # (the last lane in runs the collective's computation: one wait per collective)
        self.warp_barriers = [threading.Barrier(min(32, threads - 32 * w), self._action(w),
                                                timeout=TIMEOUT) for w in range(warps)]
        self.inputs: list[list[Any]] = [[None] * 32 for _ in range(warps)]
        self.outputs: list[list[Any]] = [[None] * 32 for _ in range(warps)]
        self.computes: list[Callable[[list[Any]], list[Any]] | None] = [None] * warps

    def _action(self, warp: int) -> Callable[[], None]:
        def action() -> None:
            compute = self.computes[warp]
            assert compute is not None
            self.outputs[warp] = compute(self.inputs[warp])
        return action

    def me(self) -> int:
        return self.tid[threading.get_ident()]

    def sregs(self, t: int) -> list[int]:
        """Thread ``t``'s special registers, in `_SREGS` order."""
        bx, by, _ = self.dims
        tx, ty, tz = t % bx, t // bx % by, t // (bx * by)
        return [tx, *self.ctaid, ty, tz, *self.dims, *self.grid, t % 32, 32]

    def collective(self, value: Any, compute: Callable[[list[Any]], list[Any]]) -> Any:
        """Hand ``value`` in for this lane; once the warp's lanes are in, the last computes
        every lane's result from them; return this lane's. (A lane reads its result before it
        can enter the next collective, whose computation waits for every lane: one wait.)"""
        warp, lane = divmod(self.me(), 32)
        self.inputs[warp][lane] = value
        self.computes[warp] = compute
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
    return block.sregs(block.me())[which]


def _lane_of(kind: int, lane: int, b: int, c: int) -> int:
    """The source lane of ``shfl.sync`` mode ``SHUFFLES[kind]`` (PTX ISA: ``c`` packs the clamp
    value, bits 0-4, and the segment mask, bits 8-12); the lane itself when out of range."""
    clamp, seg = c & 0x1F, (c >> 8) & 0x1F
    top, bottom = (lane & seg) | (clamp & ~seg), lane & seg
    j = (lane ^ b, lane + b, lane - b, bottom | (b & ~seg))[kind]
    ok = j >= top if kind == 2 else j <= top
    return j if ok else lane


def _shfl(kind: int, mask: int, value: int, b: int, c: int) -> int:
    def compute(lanes: list[Any]) -> list[Any]:
        out: list[Any] = []
        for lane, mine in enumerate(lanes):
            if mine is None:
                out.append(None)
                continue
            j = _lane_of(kind, lane, mine[2], mine[3])
            if lanes[j] is None or not (mine[0] >> j) & 1 or not (mine[0] >> lane) & 1:
                VIOLATIONS.append(("shfl", SHUFFLES[kind], lane, j, mine[0]))
            out.append((lanes[j] or mine)[1])
        return out

    return STATE["block"].collective((mask & 0xFFFFFFFF, value, b, c), compute)


def _vote(kind: int, mask: int, pred: int) -> int:
    def compute(lanes: list[Any]) -> list[int]:
        bits = sum(1 << lane for lane, x in enumerate(lanes)
                   if x is not None and x[1] and (x[0] >> lane) & 1)
        members = [x for lane, x in enumerate(lanes) if x is not None and (x[0] >> lane) & 1]
        value = (bits, int(bits != 0), int(all(x[1] for x in members)))[kind]
        return [value] * 32

    return ctypes.c_int32(STATE["block"].collective((mask & 0xFFFFFFFF, pred), compute)).value


def _barrier() -> None:
    STATE["block"].barrier.wait()


_VOID3 = ctypes.CFUNCTYPE(None, ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p)
_CALLBACKS: dict[str, Any] = {
    "emu_ldsm_cb": _VOID3(_ldsm), "emu_mma_cb": _VOID3(_mma),
    "emu_sreg_cb": ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_int32)(_sreg),
    "emu_barrier_cb": ctypes.CFUNCTYPE(None)(_barrier),
    "emu_shfl_cb": ctypes.CFUNCTYPE(ctypes.c_int32, *[ctypes.c_int32] * 5)(_shfl),
    "emu_vote_cb": ctypes.CFUNCTYPE(ctypes.c_int32, *[ctypes.c_int32] * 3)(_vote),
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
    for i, reg in enumerate(_SREGS):  # from memory on one OS thread (`run_kernel`), else asked
        name = f"llvm.nvvm.read.ptx.sreg.{reg}"
        out[name] = (f'define i32 @"emu.{name}"() {{\n  %m = load i32, ptr @"emu.sequential"\n'
                     "  %s = icmp ne i32 %m, 0\n  br i1 %s, label %mem, label %ask\nmem:\n"
                     f'  %p = getelementptr [{len(_SREGS)} x i32], ptr @"emu.sregs", i32 0, i32 {i}\n'
                     "  %v = load i32, ptr %p\n  ret i32 %v\nask:\n"
                     f"  %r = call i32 @emu_sreg_cb(i32 {i})\n  ret i32 %r\n}}")
    for i, mode in enumerate(SHUFFLES):
        for ty in ("i32", "f32"):
            name, lt = f"llvm.nvvm.shfl.sync.{mode}.{ty}", "float" if ty == "f32" else "i32"
            out[name] = (f'define {lt} @"emu.{name}"(i32 %m, {lt} %v, i32 %b, i32 %c) {{\n'
                         f"  %x = bitcast {lt} %v to i32\n"
                         f"  %r = call i32 @emu_shfl_cb(i32 {i}, i32 %m, i32 %x, i32 %b, i32 %c)\n"
                         f"  %y = bitcast i32 %r to {lt}\n  ret {lt} %y\n}}")
    for i, mode in enumerate(VOTES):
        name, rt = f"llvm.nvvm.vote.{mode}.sync", "i32" if mode == "ballot" else "i1"
        out[name] = (f'define {rt} @"emu.{name}"(i32 %m, i1 %p) {{\n  %x = zext i1 %p to i32\n'
                     f"  %r = call i32 @emu_vote_cb(i32 {i}, i32 %m, i32 %x)\n"
                     + ("  ret i32 %r\n}" if rt == "i32" else
                        "  %t = trunc i32 %r to i1\n  ret i1 %t\n}"))
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
            name = f"llvm.nvvm.cp.async.{cache}.shared.global.{w}"  # the whole width
            out[name] = (f'define void @"emu.{name}"(ptr %d, ptr %s) {{\n'
                         f"  call void @emu_cp_async_cb_{w}(ptr %d, ptr %s, i32 {w})\n  ret void\n}}")
    return out


_DEFINITIONS = _definitions()
_CALLBACK_DECLS = ["declare void @emu_ldsm_cb(i32, ptr, ptr)", "declare void @emu_mma_cb(i32, ptr, ptr)",
                   "declare i32 @emu_sreg_cb(i32)", "declare void @emu_barrier_cb()",
                   "declare i32 @emu_shfl_cb(i32, i32, i32, i32, i32)",
                   "declare i32 @emu_vote_cb(i32, i32, i32)",
                   '@"emu.sequential" = global i32 0',
                   f'@"emu.sregs" = global [{len(_SREGS)} x i32] zeroinitializer',
                   *[f"declare void @emu_cp_async_cb_{w}(ptr, ptr, i32)" for w in COPY_WIDTHS]]


def host_ir(text: str) -> str:
    """NVPTX IR as host IR (see the module docstring); shared-memory globals made external
    so that they can be found by name."""
    text = re.sub(r" addrspace\(\d\)", "", text)
    text = re.sub(r"addrspacecast (ptr [^ ]+) to ptr", r"bitcast \1 to ptr", text)
    text = text.replace("ptx_kernel ", "").replace("internal global", "global")
    assert " asm " not in text, "inline assembly (wgmma) is not emulated"
    text = re.sub(r'^(@"?tcmlir_dynamic_shared"?) = external global \[0 x \w+\]',
                  rf"\1 = global [{DYNAMIC_SHARED_BYTES} x i8] zeroinitializer", text, flags=re.M)
    libdevice = sorted(set(re.findall(r'@"?__nv_(\w+)"?\(', text)))
    if libdevice:
        host_target_machine()  # (loads libm)
    for name in libdevice:  # libdevice's functions: the host's libm
        assert llvm.address_of_symbol(name), f"libdevice's __nv_{name} has no host function {name}"
        text = re.sub(rf'@"?__nv_{name}"?\(', f'@"{name}"(', text)
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
_SYNC = re.compile(r"llvm\.nvvm\.(?:barrier0|shfl\.|vote\.|ldmatrix\.|mma\.)")
_SHARED = re.compile(r'^@"?([\w.$]+)"? = (?:\w+ )*addrspace\(3\) global \[(\d+) x (\w+)\]', re.M)
_BYTES = {"i8": 1, "i16": 2, "half": 2, "bfloat": 2, "i32": 4, "float": 4, "i64": 8, "double": 8}


def needs_threads(text: str, kernel: str) -> bool:
    """Whether kernel ``kernel`` of NVPTX IR ``text`` reaches a barrier or a warp collective
    (then its threads must run at once, one OS thread each)."""
    bodies = {m.group(1): m.group(0) for m in
              re.finditer(r'^define [^@\n]*@"?([\w.$]+)"?\(.*?^\}', text, re.M | re.S)}
    seen, todo = set(), [kernel]
    while todo:
        name = todo.pop()
        if name in seen or name not in bodies:
            continue
        seen.add(name)
        if _SYNC.search(bodies[name]):
            return True
        todo += re.findall(r'@"?([\w.$]+)"?\(', bodies[name])
    return False


class Staged:
    """A copy of ``array`` between `MARGIN` poisoned bytes each side, at the same address
    modulo 256 (the kernel may rely on the alignment the call had)."""

    def __init__(self, name: str, array: np.ndarray):
        assert array.flags.c_contiguous, f"array {name} is not C-contiguous"
        self.name, self.array, self.size = name, array, array.nbytes
        self.buf = np.full(self.size + 2 * MARGIN + 256, 0xFF, np.uint8)
        self.at = MARGIN + (array.ctypes.data - self.buf.ctypes.data - MARGIN) % 256
        self.buf[self.at:self.at + self.size] = array.reshape(-1).view(np.uint8)
        self.address = self.buf.ctypes.data + self.at

    def finish(self) -> str | None:
        """Copy back; what was written out of bounds, if anything."""
        self.array.reshape(-1).view(np.uint8)[:] = self.buf[self.at:self.at + self.size]
        hit = np.flatnonzero(self.buf != 0xFF)
        hit = hit[(hit < self.at) | (hit >= self.at + self.size)] - self.at
        if not hit.size:
            return None
        return (f"{self.name} ({self.size} bytes) written out of bounds at bytes "
                f"{hit[0]}..{hit[-1]} ({hit.size} bytes)")


def stage_arrays(fn_ir: Any, kernel: Any, inputs: Any, sizes: Mapping[str, int]
                 ) -> dict[str, np.ndarray]:
    """The arrays `run_kernel` takes for a call of ``kernel`` (compiled from ``fn_ir``) on
    ``inputs``: copies of the inputs, and every output and temporary the kernel keeps in
    global memory (those of ``kernel.compiled_ir``: split-K's partial sums, padded operands)
    zeroed where the runtime zeroes it (`binding.needs_zero_fill`), else poisoned (NaN in a
    float type, 0x5A bytes in an integer one), so an element nothing writes shows."""
    from tcmlir.binding import needs_zero_fill

    arrays = {t.name: np.array(x, copy=True) for t, x in zip(fn_ir.inputs, inputs, strict=True)}
    on_chip = set(kernel.runner.image.on_chip)
    compiled = kernel.compiled_ir or fn_ir
    for t in compiled.tensors:
        if t.name in arrays or t.name in on_chip:
            continue
        shape = tuple(s.evaluate(sizes) for s in t.shape)
        if needs_zero_fill(compiled, t, sizes):
            arrays[t.name] = np.zeros(shape, t.dtype.numpy)
        elif np.issubdtype(t.dtype.numpy, np.floating):
            arrays[t.name] = np.full(shape, np.nan, t.dtype.numpy)
        else:
            arrays[t.name] = np.full(shape, 0x5A5A5A5A, np.int64).astype(t.dtype.numpy)
    return arrays


def run_kernel(kernel: Any, arrays: Mapping[str, np.ndarray], sizes: Mapping[str, int],
               threaded: bool | None = None) -> None:
    """Every launch of a compiled CUDA ``kernel`` (`tcmlir.Kernel`), in order, block after
    block, on ``arrays`` (every tensor a kernel takes, by name: inputs, outputs, temporaries;
    written back in place). ``threaded``: one OS thread per GPU thread even for a launch that
    reaches no barrier or collective (False: never; None: as it needs). Fails on a missing
    array, an error the kernel reports (a gather out of bounds), a write out of bounds, a
    misaligned ``cp.async``, a shuffle from an absent lane."""
    text = kernel.llvm_ir
    host = host_ir(text)
    engine = jit(host)
    signatures = {name: params for name, params in _KERNEL.findall(text)}
    shared = [(engine.get_global_value_address(n), int(c) * _BYTES[t])
              for n, c, t in _SHARED.findall(text)]
    if "tcmlir_dynamic_shared" in text:
        shared.append((engine.get_global_value_address("tcmlir_dynamic_shared"),
                       DYNAMIC_SHARED_BYTES))
    sequential = ctypes.c_int32.from_address(engine.get_global_value_address("emu.sequential"))
    regs = (ctypes.c_int32 * len(_SREGS)).from_address(engine.get_global_value_address("emu.sregs"))
    err = np.zeros(4, np.int32)
    staged = {"err": Staged("err", err)}
    on_chip = set(getattr(kernel.runner.image, "on_chip", ()))
    del VIOLATIONS[:]
    try:
        for launch in kernel.runner.image.kernels:
            assert launch.shared_bytes <= DYNAMIC_SHARED_BYTES, launch
            params = re.findall(r'(ptr|i64|i32)[^%]*%"?([\w.]+)"?', signatures[launch.name])
            types, values = [], []
            for ty, name in params:
                if ty == "ptr":
                    if name not in staged and name in on_chip and name not in arrays:
                        # no buffer (a null pointer on the GPU): any write is out of bounds
                        staged[name] = Staged(f"{name} (on chip)", np.zeros(0, np.uint8))
                    assert name in arrays or name in staged, \
                        f"kernel {launch.name} takes tensor {name}: not in arrays"
                    if name not in staged:
                        staged[name] = Staged(name, arrays[name])
                    types.append(ctypes.c_void_p)
                    values.append(staged[name].address)
                else:
                    types.append(ctypes.c_int64 if ty == "i64" else ctypes.c_int32)
                    values.append(sizes[name])
            entry = ctypes.CFUNCTYPE(None, *types)(engine.get_function_address(launch.name))
            threads = launch.block[0] * launch.block[1] * launch.block[2]
            together = needs_threads(text, launch.name) if threaded is None else threaded
            sequential.value = 0 if together else 1
            gx, gy, gz = launch.grid
            for z in range(gz):
                for y in range(gy):
                    for x in range(gx):
                        for at, nbytes in shared:  # (uninitialised: NaN where read)
                            ctypes.memset(at, 0xFF, nbytes)
                        block = Block(threads, (x, y, z), tuple(launch.block), (gx, gy, gz))
                        if together:
                            run_threads(block, lambda _t, f=entry, v=values: f(*v))
                            continue
                        for t in range(threads):
                            regs[:] = block.sregs(t)
                            entry(*values)
    finally:
        sequential.value = 0
        out_of_bounds = [m for m in (s.finish() for s in staged.values()) if m]
    assert not out_of_bounds, "out-of-bounds writes: " + "; ".join(out_of_bounds)
    assert not err.any(), f"the kernel reported an error: {err}"
    assert not VIOLATIONS, f"misaligned or oversized cp.async, or bad shuffles: {VIOLATIONS[:4]}"
