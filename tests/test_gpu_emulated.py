"""The default cuda mapping of every mapping class, run on the host (`tests/mma_emulator.py`)
against the reference interpreter, without a GPU.

Each program is compiled with ``fn.compile(..., target="cuda")`` and the default options at
tiny awkward sizes; every kernel of it runs on the host machine (one OS thread per GPU thread
where the kernel has barriers or warp shuffles), on arrays staged between poisoned margins
(a write out of bounds fails), outputs and temporaries starting as the runtime leaves them
(zeros where `binding.needs_zero_fill` says so, else NaN: a read before the write shows). The
classes: elementwise, transposes, row reductions (softmax, layernorm), column reductions,
mixed row/column programs, full reductions, register-tiled fp32 matmuls, split-K, batched and
lead contractions (tbmm, Kronecker factors), convolutions, group/batch norms, gathers. Then
the emulator's own pieces: shuffles of every mode, votes, 2-D blocks, atomics across OS
threads, out-of-bounds writes, dynamic shared memory.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from types import SimpleNamespace

import mma_emulator as emu
import numpy as np
import pytest
import torch

import tcmlir as tc
from tcmlir import cuda_defaults
from tcmlir.binding import bind_sizes
from tcmlir.codegen.nvptx import KernelLaunch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
import zoo_workloads

ZOO = {w.name: w for w in zoo_workloads.ZOO}


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setenv("TCMLIR_ALWAYS_COMPILE", "1")  # this compile, not a cached kernel


def emulate(src: str, inputs: list[np.ndarray], *, rtol: float = 1e-5, threaded=None):
    """The default cuda mapping of ``src`` at the inputs' sizes, run on the host, against the
    reference; returns the compiled kernel. ``rtol``: of the largest reference magnitude
    (float32 sums in another order)."""
    fn = tc.define(src, target="cuda")
    kernel = fn.compile(*inputs, target="cuda", arch="sm_90")
    sizes = bind_sizes(fn.ir, [x.shape for x in inputs])
    arrays = emu.stage_arrays(fn.ir, kernel, inputs, sizes)
    emu.run_kernel(kernel, arrays, sizes, threaded=threaded)
    for t, x in zip(fn.ir.inputs, inputs, strict=True):
        np.testing.assert_array_equal(arrays[t.name], x, err_msg=f"input {t.name} was written")
    want = tc.define(src, target="numpy")(*inputs)
    want = want if isinstance(want, tuple) else (want,)
    for t, w in zip(fn.ir.outputs, want, strict=True):
        w = np.asarray(w, np.float64)
        got = arrays[t.name].astype(np.float64)
        scale = float(np.abs(w).max()) if w.size else 0.0
        np.testing.assert_allclose(got, w, rtol=rtol, atol=rtol * max(scale, 1e-30),
                                   err_msg=f"{t.name} of {fn.ir.name} at {sizes}")
    return kernel


def _zoo_inputs(name: str, dims: dict[str, int] | None = None) -> tuple[str, list[np.ndarray]]:
    w = ZOO[name]
    if dims:
        w = dataclasses.replace(w, size_classes={"tiny": dims})
    inputs = [t.numpy() if t.dtype in (torch.float32, torch.int32) else t.float().numpy()
              for t in w.make("tiny")]
    if w.half:
        dtype = tc.define(w.tc).ir.inputs[0].dtype.numpy
        inputs = [x.astype(dtype) if x.dtype == np.float32 else x for x in inputs]
    return w.tc, inputs


# ---------------------------------------------------------------- the mapping classes

# (zoo name, sizes or None for its tiny ones): each a class of the default mapping
CASES = [
    ("chain_poly", None), ("gelu_tanh", None), ("swiglu", None), ("add_col_bias", None),
    ("outer_product", None),                                   # elementwise, broadcasts
    ("transpose2d", {"N": 37, "M": 33}), ("perm4_heads", None),  # transposes
    ("softmax_1000", {"N": 3, "D": 45}), ("log_softmax_128", None),  # row reductions
    ("layernorm_1000", {"T": 3, "D": 70}), ("rmsnorm", None), ("row_min_3d", None),
    ("col_sum", {"N": 37, "D": 13}), ("first_axis_sum3d", None),  # column reductions
    ("mid_axis_sum", {"A": 5, "B": 37, "C": 33}),               # (outer outputs on blockIdx.z)
    ("softmax_cols", None),                                     # column softmax (mixed)
    ("full_sum_scalar", {"N": 1003}), ("full_max", None), ("full_sum_2d", None),
    ("mm_odd", {"M": 37, "K": 19, "N": 35}), ("mm_tn", None), ("mm_small_k", None),
    ("matvec", None), ("vecmat", None),                         # contractions
    ("tbmm", None), ("bmm_batch_last", None), ("bilinear", None),  # batched / lead
    ("kron3_1", None), ("kron3_2", None), ("kron3_3", None),    # Kronecker factors
    ("conv2d_valid", None), ("conv2d_pad_select", None), ("depthwise_conv", None),
    ("conv1x1", None), ("maxpool3x3s2", None), ("global_avgpool", None),
    ("groupnorm", None), ("batchnorm_train", None), ("batchnorm_infer", None),
    ("embedding", None), ("embedding_bag_mean", None), ("index_select_cols", None),  # gathers
    ("causal_softmax", None), ("mlp2", None), ("linear_bias_gelu", None),
]


# the mark each case's schedule must carry (so that a case keeps covering its class)
ROWS_MARK, COLUMNS_MARK = r"rows threads=\d+", r"accumulate S\d+ atomic"
FULL_MARK = r"reduction S\d+ threads=\d+ atomic"
MARKS = {
    **dict.fromkeys(["softmax_1000", "log_softmax_128", "layernorm_1000", "rmsnorm", "row_min_3d",
                     "matvec", "global_avgpool", "groupnorm", "batchnorm_train",
                     "causal_softmax"], ROWS_MARK),
    **dict.fromkeys(["col_sum", "first_axis_sum3d", "mid_axis_sum", "vecmat"], COLUMNS_MARK),
    **dict.fromkeys(["full_sum_scalar", "full_max", "full_sum_2d"], FULL_MARK),
    "softmax_cols": r"reduction S\d+ threads=\d+",
}


@pytest.mark.parametrize("name, dims", CASES, ids=[c[0] for c in CASES])
def test_default_mapping_on_the_host_machine(name, dims):
    src, inputs = _zoo_inputs(name, dims)
    kernel = emulate(src, inputs, rtol=2e-5)
    if name in MARKS:
        assert re.search(MARKS[name], kernel.schedule), (name, MARKS[name])


# ---------------------------------------------------------------- mixed rows and columns

LAYERNORM_GB = """def layernorm(float(N, D) X, float(D) G, float(D) Bt) -> (O) {
    mean(n) +=! X(n, d) / D
    c(n, d) = X(n, d) - mean(n)
    var(n) +=! c(n, d) * c(n, d) / D
    O(n, d) = c(n, d) * rsqrt(var(n) + 1e-5) * G(d) + Bt(d)
}"""
ROW_AND_COLUMN = "def rc(float(N, D) X) -> (R, C) {\n R(n) +=! X(n, d)\n C(d) max=! X(n, d)\n}"
CENTER = """def center(float(N, D) X) -> (O, S, M) {
    S(d) +=! X(n, d)
    O(n, d) = X(n, d) - S(d) / N
    M(n) max=! O(n, d)
}"""
# test_mixed_rows.test_a_column_reductions_temporary_on_gpu
COLUMN_TEMPORARY = """def p(float(N) X, float(N, N) Y) -> (T1, T2) {
    T0(i) min=! Y(r, i) + X(r) where r in 0:N
    T1(i) min=! Y(i, r) * X(r) where r in 0:N
    T2(i) max=! Y(r, i) * T0(i) where r in 0:1
}"""


def _gradient() -> str:
    from tcmlir.grad import derive

    return derive(tc.define(LAYERNORM_GB).ir).source


@pytest.mark.parametrize("which, n, d", [
    ("grad", 3, 33), ("grad", 5, 64), ("grad", 3, 128), ("layernorm", 7, 5),
    ("row-and-column", 7, 5), ("row-and-column", 3, 96), ("center", 3, 33), ("center", 5, 64)])
def test_mixed_rows_and_columns_on_the_host_machine(which, n, d, rng):
    src = {"grad": _gradient, "layernorm": lambda: LAYERNORM_GB,
           "row-and-column": lambda: ROW_AND_COLUMN, "center": lambda: CENTER}[which]()
    fn = tc.define(src)
    shapes = {"X": (n, d), "O_grad": (n, d), "G": (d,), "Bt": (d,)}
    inputs = [rng.uniform(-2, 2, shapes[t.name]).astype(np.float32) for t in fn.ir.inputs]
    emulate(src, inputs, rtol=1e-4 if which == "grad" else 2e-5)


def test_a_column_reductions_temporary_on_the_host_machine(rng):
    x, y = rng.standard_normal(5).astype(np.float32), rng.standard_normal((5, 5)).astype(np.float32)
    emulate(COLUMN_TEMPORARY, [x, y])
    x, y = rng.standard_normal(37).astype(np.float32), rng.standard_normal((37, 37)).astype(np.float32)
    emulate(COLUMN_TEMPORARY, [x, y])


TRIANGULAR = """def matmul(float(M, K) L, float(K, M) U) -> (LU) {
    LU(m1, m2) +=! (r_k >= m1 && r_k <= m2) ? L(m1, r_k) * U(r_k, m2) : 0
}"""


@pytest.mark.parametrize("m, k", [(70, 20), (130, 3)], ids=str)
def test_a_guarded_reduction_fills_the_tiles_it_never_updates(m, k, rng):
    """TC's triangular product where a block of rows lies past K: the reduction is empty there,
    yet its registers start at zero and are written back (the H100 found the rows past 64 left
    as garbage when the initialisation was filtered out above the copies' extension)."""
    emulate(TRIANGULAR, [rng.uniform(-1, 1, (m, k)).astype(np.float32),
                         rng.uniform(-1, 1, (k, m)).astype(np.float32)], rtol=1e-4)


RANK6_ROWS = """def r6(float(A, B, C, D, E, F) X) -> (S) {
    S(a, b, c, d, e) +=! X(a, b, c, d, e, f)
}"""


@pytest.mark.parametrize("shape", [(2, 3, 1, 2, 3, 5), (3, 2, 2, 2, 2, 40)], ids=str)
def test_rows_of_many_indices_on_the_host_machine(shape, rng):
    """Six row indices: the last four share the blocks, the outer ones are walked by each
    block (over all of them isl took 45 s to build a rank-15 reduction's AST, fuzz)."""
    emulate(RANK6_ROWS, [rng.standard_normal(shape).astype(np.float32)], rtol=1e-5)


# ---------------------------------------------------------------- split-K


def test_split_k_on_the_host_machine(monkeypatch, rng):
    """The default split-K choice (`cuda_defaults.split_k_choice`) with its thresholds scaled
    down and launches free in the contraction model, so that it splits at sizes the host
    machine runs in a second: the partial sums (a temporary of the compiled function) and
    their sum, two kernels."""
    monkeypatch.setattr(cuda_defaults, "SPLIT_K_MIN_EXTENT", 64)
    monkeypatch.setattr(cuda_defaults, "SPLIT_K_MIN_CHUNK", 16)
    monkeypatch.setattr(cuda_defaults, "MODEL_GPU", dataclasses.replace(cuda_defaults.MODEL_GPU,
                                                                        launch_s=0.0))
    for m, n, k in ((32, 33, 64), (64, 40, 96)):
        src, _ = _zoo_inputs("mm_odd", {"M": m, "K": k, "N": n})
        assert cuda_defaults.split_k_choice(tc.define(src).ir, {"M": m, "N": n, "K": k})
        inputs = [rng.standard_normal((m, k)).astype(np.float32),
                  rng.standard_normal((k, n)).astype(np.float32)]
        kernel = emulate(src, inputs)
        assert len(kernel.runner.image.kernels) == 2 and kernel.compiled_ir is not None


def test_atomic_column_reductions_with_every_thread_at_once(rng):
    """Column reductions fold into their outputs with atomics: run with one OS thread per GPU
    thread all the same (LLVM's atomicrmw on the host, really concurrent)."""
    src, inputs = _zoo_inputs("col_sum", {"N": 9, "D": 70})
    kernel = emulate(src, inputs, threaded=True)
    assert "atomic" in kernel.schedule


# ---------------------------------------------------------------- the emulator's own pieces

HEAD = "declare i32 @\"llvm.nvvm.read.ptx.sreg.tid.x\"()\n"


def _fake_kernel(text: str, *launches: KernelLaunch) -> SimpleNamespace:
    image = SimpleNamespace(kernels=launches, on_chip=())
    return SimpleNamespace(llvm_ir=text, runner=SimpleNamespace(image=image))


def _shuffle_ir(mode: str, ty: str, b: int, c: int) -> str:
    lt = "float" if ty == "f32" else "i32"
    value = ("  %v = sitofp i32 %t to float\n" if ty == "f32" else "  %v = add i32 %t, 0\n")
    back = ("  %w = fptosi float %r to i32\n" if ty == "f32" else "  %w = add i32 %r, 0\n")
    return (HEAD + f'declare {lt} @"llvm.nvvm.shfl.sync.{mode}.{ty}"(i32, {lt}, i32, i32)\n'
            f'define ptx_kernel void @"k"(ptr addrspace(1) %out, ptr addrspace(1) %err) {{\n'
            '  %t = call i32 @"llvm.nvvm.read.ptx.sreg.tid.x"()\n' + value +
            f'  %r = call {lt} @"llvm.nvvm.shfl.sync.{mode}.{ty}"(i32 -1, {lt} %v, i32 {b}, i32 {c})\n'
            + back + "  %p = getelementptr i32, ptr addrspace(1) %out, i32 %t\n"
            "  store i32 %w, ptr addrspace(1) %p\n  ret void\n}\n")


SHUFFLES = [  # (mode, b, c, expected source lane of lane l) as CUDA's __shfl_*_sync give them
    ("bfly", 5, 0x1F, lambda lane: lane ^ 5),
    ("down", 3, 0x1F, lambda lane: lane + 3 if lane + 3 < 32 else lane),
    ("up", 3, 0, lambda lane: lane - 3 if lane >= 3 else lane),
    ("idx", 7, 0x1F, lambda lane: 7),
    ("down", 3, 24 << 8 | 0x1F, lambda lane: lane + 3 if lane % 8 + 3 < 8 else lane),  # width 8
    ("up", 2, 24 << 8, lambda lane: lane - 2 if lane % 8 >= 2 else lane),
    ("idx", 13, 24 << 8 | 0x1F, lambda lane: lane - lane % 8 + 5),
    ("bfly", 2, 28 << 8 | 0x1F, lambda lane: lane ^ 2),  # width 4
]


@pytest.mark.parametrize("ty", ["i32", "f32"])
@pytest.mark.parametrize("mode, b, c, source", SHUFFLES)
def test_shuffles_of_every_mode(mode, b, c, source, ty):
    out = np.full(64, -1, np.int32)
    emu.run_kernel(_fake_kernel(_shuffle_ir(mode, ty, b, c), KernelLaunch("k", (1, 1, 1), (64, 1, 1))),
                   {"out": out}, {})
    want = [32 * (t // 32) + source(t % 32) for t in range(64)]
    np.testing.assert_array_equal(out, want)


def test_a_shuffle_from_a_lane_the_warp_lacks_is_caught():
    """48 threads: the second warp has 16 lanes, and lane 0's butterfly partner 16 is absent."""
    kernel = _fake_kernel(_shuffle_ir("bfly", "i32", 16, 0x1F), KernelLaunch("k", (1, 1, 1), (48, 1, 1)))
    with pytest.raises(AssertionError, match="bad shuffles"):
        emu.run_kernel(kernel, {"out": np.zeros(48, np.int32)}, {})
    emu.run_kernel(_fake_kernel(_shuffle_ir("bfly", "i32", 8, 0x1F),
                                KernelLaunch("k", (1, 1, 1), (48, 1, 1))),
                   {"out": np.zeros(48, np.int32)}, {})


def test_votes():
    text = (HEAD + 'declare i32 @"llvm.nvvm.vote.ballot.sync"(i32, i1)\n'
            'declare i1 @"llvm.nvvm.vote.any.sync"(i32, i1)\ndeclare i1 @"llvm.nvvm.vote.all.sync"(i32, i1)\n'
            'define ptx_kernel void @"k"(ptr addrspace(1) %out, ptr addrspace(1) %err) {\n'
            '  %t = call i32 @"llvm.nvvm.read.ptx.sreg.tid.x"()\n  %o = and i32 %t, 1\n'
            "  %odd = icmp ne i32 %o, 0\n  %big = icmp uge i32 %t, 30\n  %pos = icmp uge i32 %t, 0\n"
            '  %b = call i32 @"llvm.nvvm.vote.ballot.sync"(i32 -1, i1 %odd)\n'
            '  %a = call i1 @"llvm.nvvm.vote.any.sync"(i32 -1, i1 %big)\n'
            '  %l = call i1 @"llvm.nvvm.vote.all.sync"(i32 -1, i1 %pos)\n'
            '  %n = call i1 @"llvm.nvvm.vote.all.sync"(i32 -1, i1 %odd)\n'
            "  %a32 = zext i1 %a to i32\n  %l32 = zext i1 %l to i32\n  %n32 = zext i1 %n to i32\n"
            "  %i = mul i32 %t, 4\n"
            + "".join(f"  %i{j} = add i32 %i, {j}\n  %p{j} = getelementptr i32, ptr addrspace(1) %out, "
                      f"i32 %i{j}\n  store i32 {v}, ptr addrspace(1) %p{j}\n"
                      for j, v in enumerate(("%b", "%a32", "%l32", "%n32")))
            + "  ret void\n}\n")
    out = np.zeros((32, 4), np.int32)
    emu.run_kernel(_fake_kernel(text, KernelLaunch("k", (1, 1, 1), (32, 1, 1))), {"out": out}, {})
    np.testing.assert_array_equal(out, [[np.int32(-0x55555556), 1, 1, 0]] * 32)


_SREG_IR = "".join(f'declare i32 @"llvm.nvvm.read.ptx.sreg.{r}"()\n' for r in emu.SREGS[:12]) + (
    'define ptx_kernel void @"k"(ptr addrspace(1) %out, ptr addrspace(1) %err) {\n'
    + "".join(f'  %r{i} = call i32 @"llvm.nvvm.read.ptx.sreg.{r}"()\n' for i, r in enumerate(emu.SREGS[:12]))
    # linear id: ((ctaid.z * nctaid.y + ctaid.y) * nctaid.x + ctaid.x) * threads + tid
    + "  %t0 = mul i32 %r3, %r10\n  %t1 = add i32 %t0, %r2\n  %t2 = mul i32 %t1, %r9\n"
    "  %t3 = add i32 %t2, %r1\n  %n0 = mul i32 %r6, %r7\n  %n1 = mul i32 %n0, %r8\n"
    "  %t4 = mul i32 %t3, %n1\n  %u0 = mul i32 %r5, %r7\n  %u1 = add i32 %u0, %r4\n"
    "  %u2 = mul i32 %u1, %r6\n  %u3 = add i32 %u2, %r0\n  %id = add i32 %t4, %u3\n"
    "  %at = mul i32 %id, 12\n"
    + "".join(f"  %a{i} = add i32 %at, {i}\n  %p{i} = getelementptr i32, ptr addrspace(1) %out, "
              f"i32 %a{i}\n  store i32 %r{i}, ptr addrspace(1) %p{i}\n" for i in range(12))
    + "  ret void\n}\n")


@pytest.mark.parametrize("threaded", [False, True])
def test_special_registers_of_3d_blocks_and_grids(threaded):
    grid, block = (2, 3, 2), (4, 3, 2)
    out = np.full((2, 3, 2, 2, 3, 4, 12), -1, np.int32)  # [cz][cy][cx][tz][ty][tx]
    emu.run_kernel(_fake_kernel(_SREG_IR, KernelLaunch("k", grid, block)), {"out": out}, {},
                   threaded=threaded)
    for index in np.ndindex(out.shape[:6]):
        cz, cy, cx, tz, ty, tx = index
        assert list(out[index]) == [tx, cx, cy, cz, ty, tz, *block, *grid], index


def test_atomics_across_os_threads():
    """256 OS threads each add 1 two hundred times: integer atomicrmw, float atomicrmw, and a
    compare-and-swap loop, all exact."""
    text = ('define ptx_kernel void @"k"(ptr addrspace(1) %out, ptr addrspace(1) %err) {\n'
            "entry:\n  %f = getelementptr i32, ptr addrspace(1) %out, i32 1\n"
            "  %c = getelementptr i32, ptr addrspace(1) %out, i32 2\n  br label %loop\n"
            "loop:\n  %i = phi i32 [0, %entry], [%j, %cas]\n"
            "  %x = atomicrmw add ptr addrspace(1) %out, i32 1 monotonic\n"
            "  %y = atomicrmw fadd ptr addrspace(1) %f, float 1.0 monotonic\n"
            "  %old = load atomic i32, ptr addrspace(1) %c monotonic, align 4\n  br label %cas\n"
            "cas:\n  %seen = phi i32 [%old, %loop], [%now, %cas]\n  %new = add i32 %seen, 1\n"
            "  %pair = cmpxchg ptr addrspace(1) %c, i32 %seen, i32 %new monotonic monotonic\n"
            "  %now = extractvalue {i32, i1} %pair, 0\n  %ok = extractvalue {i32, i1} %pair, 1\n"
            "  %j = add i32 %i, 1\n  %more = icmp ult i32 %j, 200\n  %go = and i1 %ok, %more\n"
            "  br i1 %ok, label %next, label %cas\n"
            "next:\n  br i1 %more, label %loop, label %done\n"
            "done:\n  ret void\n}\n")
    text = text.replace("[%j, %cas]", "[%j, %next]")
    out = np.zeros(3, np.int32)
    emu.run_kernel(_fake_kernel(text, KernelLaunch("k", (2, 1, 1), (256, 1, 1))), {"out": out}, {},
                   threaded=True)
    assert out[0] == out[2] == 2 * 256 * 200
    assert out[1:2].view(np.float32)[0] == 2 * 256 * 200


def test_an_out_of_bounds_write_is_caught():
    """A write one element past the end of an output names that output (the class of bugs
    that end as CUDA_ERROR_ILLEGAL_ADDRESS); here the column sums of a compiled kernel
    written into a buffer one column short, and a kernel storing at its thread id."""
    src, inputs = _zoo_inputs("col_sum", {"N": 5, "D": 13})
    fn = tc.define(src, target="cuda")
    kernel = fn.compile(*inputs, target="cuda", arch="sm_90")
    with pytest.raises(AssertionError, match=r"out-of-bounds writes: S \(48 bytes\)"):
        emu.run_kernel(kernel, {"X": inputs[0], "S": np.zeros(12, np.float32)}, {})
    text = (HEAD + 'define ptx_kernel void @"k"(ptr addrspace(1) %out, ptr addrspace(1) %err) {\n'
            '  %t = call i32 @"llvm.nvvm.read.ptx.sreg.tid.x"()\n'
            "  %p = getelementptr i32, ptr addrspace(1) %out, i32 %t\n"
            "  store i32 %t, ptr addrspace(1) %p\n  ret void\n}\n")
    with pytest.raises(AssertionError, match=r"out \(28 bytes\) written out of bounds at bytes 28..31"):
        emu.run_kernel(_fake_kernel(text, KernelLaunch("k", (1, 1, 1), (8, 1, 1))),
                       {"out": np.zeros(7, np.int32)}, {})


def test_dynamic_shared_memory_on_the_host_machine(rng):
    """A tensor-core ring above 48 KB lives in dynamic shared memory (``tcmlir_dynamic_shared``)."""
    src = "def f(float16(M, K) A, float16(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }"
    opts = tc.MappingOptions.naive().tensor_cores((128, 128, 32), (2, 2), 4)
    a = rng.integers(-3, 4, (33, 40)).astype(np.float16)
    b = rng.integers(-3, 4, (40, 17)).astype(np.float16)
    kernel = tc.define(src, target="cuda").compile(a, b, target="cuda", arch="sm_90", options=opts)
    assert kernel.runner.image.kernels[0].shared_bytes > 48 * 1024
    c = np.full((33, 17), np.nan, np.float16)
    emu.run_kernel(kernel, {"A": a, "B": b, "C": c}, {})
    np.testing.assert_array_equal(c, (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16))


def test_a_wrong_butterfly_in_the_warp_reduction_is_caught(monkeypatch):
    """A planted bug: the last step of the warp shuffle reduction exchanges with lane ^ 16
    again instead of lane ^ 1, so each lane sums half its warp twice."""
    from tcmlir.codegen import gpu_reduce

    real = gpu_reduce._shfl
    monkeypatch.setattr(gpu_reduce, "_shfl", lambda b, value, lane, mask:
                        real(b, value, 16 if lane == 1 else lane, mask))
    src, inputs = _zoo_inputs("softmax_1000", {"N": 3, "D": 45})
    with pytest.raises(AssertionError, match="Not equal to tolerance"):
        emulate(src, inputs)


def test_a_wrong_block_index_is_caught(monkeypatch):
    """A planted bug: kernels read ``ctaid.y`` for ``_bx`` (grid 5 x 2: blocks 2-4 redo the
    work of blocks 0-1, the rest is never written): the sync-free path reads its special
    registers from memory, and must give each its own. (A bug that writes far past an array
    cannot be caught: it may corrupt the process before the margins are checked.)"""
    from tcmlir.codegen import nvptx

    monkeypatch.setitem(nvptx._SREG, "_bx", "ctaid.y")
    src, inputs = _zoo_inputs("perm4_heads", None)
    assert tc.define(src).compile(*inputs, target="cuda").runner.image.kernels[0].grid == (5, 2, 1)
    with pytest.raises(AssertionError, match="Not equal to tolerance"):
        emulate(src, inputs)


def test_a_gather_out_of_bounds_is_reported(rng):
    """An index past the table: the kernel sets the error flag (gather site 1), nothing is
    written out of bounds; in bounds it runs clean."""
    src, (table, idx) = _zoo_inputs("embedding", None)
    emulate(src, [table, idx])
    idx = idx.copy()
    idx[1, 2] = table.shape[0]
    fn = tc.define(src, target="cuda")
    kernel = fn.compile(table, idx, target="cuda", arch="sm_90")
    out = np.zeros((*idx.shape, table.shape[1]), np.float32)
    with pytest.raises(AssertionError, match=r"the kernel reported an error: \[1 0 0 0\]"):
        emu.run_kernel(kernel, {"E": table, "idx": idx, "O": out}, {})
