"""Tensor-core operands with misaligned rows copied first into padded temporaries
(`passes/pad_operands.py`, `poly/operand_pad.py`, the copy kernel of `passes/map_mma.py`):
which operands are padded, the cost model's choice, the options, the PTX (16-byte cp.async
instead of element loads, wgmma assembled by ptxas), whole kernels on the host machine of
`tests/mma_emulator.py` against the reference interpreter at awkward sizes, and (GPU) results."""

from __future__ import annotations

import re
import shutil

import mma_emulator as emu
import numpy as np
import pytest
from conftest import ptxas_verbose
from tcmlir.passes import parse_pipeline

import tcmlir as tc
from tcmlir.binding import needs_zero_fill
from tcmlir.poly.contraction import contraction_plan, operand_copies
from tcmlir.poly.operand_pad import pad_saving, padded_function

needs_ptxas = pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas not installed")

NN = "def f(float16(M, K) A, float16(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }"
PROGRAMS = {
    "nn": NN,
    "nt": "def f(float16(M, K) A, float16(N, K) B) -> (C) { C(m, n) +=! A(m, k) * B(n, k) }",
    "tn": "def f(float16(K, M) A, float16(K, N) B) -> (C) { C(m, n) +=! A(k, m) * B(k, n) }",
    "bf16-f32out": NN.replace("float16", "bfloat16").replace("-> (C)", "-> (float(M, N) C)"),
    "batched": "def f(float16(Bt, N, K) X, float16(Bt, M, K) Y) -> (Z) "
               "{ Z(b, n, m) +=! X(b, n, k) * Y(b, m, k) }",
    "gram": "def f(float16(M, K) A) -> (C) { C(m, n) +=! A(m, k) * A(n, k) }",
    "linear": """def lin(float16(M, K) I, float16(N, K) W, float16(N) bias) -> (O) {
    O(b, n) +=! I(b, k) * W(n, k)
    O(b, n) = fmax(O(b, n) + bias(n), 0)
}""",
    "tf32-nn": NN.replace("float16", "float"),
    # B has no contiguous dimension (its batch index is innermost): only A is padded
    "one-gains": "def f(float16(M, K) A, float16(K, N, Bt) B) -> (C) "
                 "{ C(b, m, n) +=! A(m, k) * B(k, n, b) }",
    # an NHWC convolution: the reduction indices kh, kw, c are runs of c in I and Wt; both
    # padded along c, the contraction summing over the padding's zeros too
    "nhwc": "def conv(float16(N, H, W, C) I, float16(M, KH, KW, C) Wt) -> (O) "
            "{ O(n, h, w, m) +=! I(n, h + kh, w + kw, c) * Wt(m, kh, kw, c) }",
    # A's two reduction indices: padding K would split them (runs of K: no gain); B's N gains
    "two-k": "def f(float16(M, K0, K) A, float16(K0, K, N) B) -> (C) "
             "{ C(m, n) +=! A(m, k0, k1) * B(k0, k1, n) }",
}
MMA_SYNC = tc.MappingOptions.naive().tensor_cores((64, 32, 16), (2, 1), 3, pad=True)
WGMMA = tc.MappingOptions.naive().tensor_cores((64, 64, 64), (4, 1), 3, wgmma=True, pad=True)


def _fn(src, target="cuda"):
    return tc.define(src, target=target)


def _sizes(fn, m, n, k, batch=2):
    values = {"M": m, "N": n, "K": k, "Bt": batch, "K0": 3, "H": 6, "W": 7, "C": k, "KH": 3,
              "KW": 2}
    return {s: values[s] for s in fn.ir.sizes}


def _options(src, options):
    tf32 = src.startswith("def f(float(")
    return options.tensor_cores(options.mma_tile, options.mma_warps, options.mma_stages,
                                options.mma_wgmma, "tf32" if tf32 else "half",
                                pad=options.mma_pad_operands)


def _inputs(fn, sizes, rng):
    if any(t.dtype.name == "BFLOAT16" for t in fn.ir.inputs):
        pytest.importorskip("ml_dtypes")
    return [rng.integers(-3, 4, tuple(s.evaluate(sizes) for s in t.shape)).astype(t.dtype.numpy)
            for t in fn.ir.inputs]  # small integers: every float32 sum exact


# ---------------------------------------------------------------- which operands, and when


def test_misaligned_operands_get_padded_temporaries_read_by_the_contraction():
    fn = _fn(NN)
    sizes = {"M": 33, "N": 17, "K": 21}
    before = contraction_plan(fn.ir, sizes)
    assert (before.a.copy, before.b.copy) == (1, 1)
    padded = padded_function(fn.ir, sizes)
    assert [t.name for t in padded.temporaries][-2:] == ["A_pad", "B_pad"]
    assert [str(d) for d in padded.tensor("A_pad").shape] == ["M", "24"]
    assert [str(d) for d in padded.tensor("B_pad").shape] == ["K", "24"]
    assert operand_copies(padded, sizes) == 2
    after = contraction_plan(padded, sizes)
    assert after.statement == 2 and after.cast == 3
    assert (after.a.tensor, after.a.copy, after.b.tensor, after.b.copy) == ("A_pad", 8, "B_pad", 8)


def test_only_operands_that_padding_widens_are_padded():
    fn = _fn(NN)
    # B's rows are 16 bytes apart already; A's (K = 20: 8-byte copies) are widened
    padded = padded_function(fn.ir, {"M": 33, "N": 24, "K": 20})
    assert [t.name for t in padded.temporaries if t.name.endswith("_pad")] == ["A_pad"]
    assert padded_function(fn.ir, {"M": 33, "N": 24, "K": 32}) is fn.ir
    # no contiguous dimension (the batch index is innermost): padding it does not help
    strided = _fn("def f(float16(K, M, Bt) A, float16(K, N, Bt) B) -> (C) "
                  "{ C(b, m, n) +=! A(k, m, b) * B(k, n, b) }")
    assert padded_function(strided.ir, {"K": 33, "M": 17, "N": 7, "Bt": 3}) is strided.ir
    # one tensor read as both operands: one copy
    gram = _fn(PROGRAMS["gram"])
    padded = padded_function(gram.ir, {"M": 9, "K": 13})
    assert [t.name for t in padded.temporaries if t.name.endswith("_pad")] == ["A_pad"]
    plan = contraction_plan(padded, {"M": 9, "K": 13})
    assert plan.a.tensor == plan.b.tensor == "A_pad" and plan.a.copy == 8


def test_a_convolutions_channels_are_padded_in_both_operands_and_summed_over_zeros():
    """NHWC: the steps (kh, kw, c) are runs of C channels in both operands, so padding the
    rows cannot align them; padding c in both, the contraction runs over the zeros too (the
    runtime zero-fills those temporaries: their padding is read)."""
    fn = _fn(PROGRAMS["nhwc"])
    sizes = {"N": 2, "H": 6, "W": 7, "C": 13, "M": 9, "KH": 3, "KW": 2}
    assert contraction_plan(fn.ir, sizes).a.copy == 1
    padded = padded_function(fn.ir, sizes)
    plan = contraction_plan(padded, sizes)
    assert (plan.a.tensor, plan.a.copy, plan.b.tensor, plan.b.copy) == ("I_pad", 8, "Wt_pad", 8)
    assert plan.extent(plan.k) == 3 * 2 * 16
    assert needs_zero_fill(padded, padded.tensor("I_pad"), sizes)
    big = {"N": 64, "H": 58, "W": 58, "C": 129, "M": 255, "KH": 3, "KW": 3}
    assert tc.MappingOptions.default_for(fn, "cuda", big).mma_pad_operands
    # NCHW: no padding widens its copies
    nchw = _fn("def conv(float16(N, C, H, W) I, float16(M, C, KH, KW) Wt) -> (O) "
               "{ O(n, m, h, w) +=! I(n, c, h + kh, w + kw) * Wt(m, c, kh, kw) }")
    assert padded_function(nchw.ir, sizes) is nchw.ir


def test_the_cost_model_pads_where_the_copies_cost_less_than_the_element_loads():
    fn = _fn(NN)
    odd = {"M": 4095, "N": 4097, "K": 4093}
    tile = (128, 256, 64)
    assert pad_saving(fn.ir, odd, tile) > 500e-6  # ~1 ms of element loads, ~70 us of copies
    # 8-byte copies of A lose ~28 us on an H100; copying 64 MB costs more
    assert pad_saving(fn.ir, {"M": 4096, "N": 4096, "K": 4092}, tile) < 0
    assert pad_saving(fn.ir, {"M": 4096, "N": 4096, "K": 4096}, tile) == 0
    assert pad_saving(fn.ir, {"M": 255, "N": 257, "K": 253}, tile) < 0  # a launch is more
    defaults = tc.MappingOptions.default_for(fn, "cuda", odd)
    assert defaults.mma_pad_operands and defaults.mma_tile
    assert defaults.to_pipeline("cuda").startswith("pad-operands,schedule{")
    small = tc.MappingOptions.default_for(fn, "cuda", {"M": 255, "N": 257, "K": 253})
    assert small.mma_tile and not small.mma_pad_operands


def test_the_padding_is_neither_zero_filled_nor_read():
    """A padded temporary's padding is never read: its buffer needs no zero fill (a 33 MB
    memset per call at 4095x4097x4093). A temporary read outside what its first statement
    writes keeps it."""
    import dataclasses

    from tcmlir.binding import needs_zero_fill

    sizes = {"M": 33, "N": 17, "K": 21}
    padded = padded_function(_fn(NN).ir, sizes)
    assert not needs_zero_fill(padded, padded.tensor("A_pad"), sizes)
    assert not needs_zero_fill(padded, padded.tensor("B_pad"), sizes)
    copy = padded.statements[0]  # now copying one column too few: the contraction reads it
    r = copy.ranges[-1]
    short = dataclasses.replace(copy, ranges=(copy.ranges[0], tc.ir.IndexRange(
        r.name, r.lo, tc.ir.SizeExpr.constant(20))))
    broken = dataclasses.replace(padded, statements=(short, *padded.statements[1:]))
    assert needs_zero_fill(broken, broken.tensor("A_pad"), sizes)
    # an output written in part keeps its zeros, whoever reads it
    out = dataclasses.replace(padded.tensor("A_pad"), role=tc.ir.Role.OUTPUT)
    assert needs_zero_fill(padded, out, sizes)


def test_the_option_round_trips_and_leaves_other_keys_alone():
    opts = tc.MappingOptions.naive().tensor_cores((64, 64, 32), (2, 2), 3, pad=True)
    assert opts.mma_pad_operands
    assert tc.MappingOptions.from_json(opts.to_json()) == opts
    off = opts.tensor_cores((64, 64, 32), (2, 2), 3)
    assert "mma_pad_operands" not in off.to_json()  # the cache keys of before
    assert "pad-operands" not in off.to_pipeline("cuda")
    tf32 = opts.tensor_cores((64, 64, 32), (2, 2), 3, precision="tf32", pad=True)
    assert [p.name for p in parse_pipeline(tf32.to_pipeline("cuda"))][:2] == ["pad-operands", "schedule"]
    assert parse_pipeline(tf32.to_pipeline("cuda"))[0].tf32
    assert not opts.tensor_cores(()).mma_pad_operands
    from tcmlir.tune.space import space_for

    space = space_for(_fn(NN).ir, "cuda", sizes={"M": 33, "N": 17, "K": 21})
    assert "mma_pad_operands" in space.fields


def test_the_copies_are_one_kernel_before_the_tensor_core_kernel(rng):
    fn = _fn(NN)
    sizes = {"M": 33, "N": 17, "K": 21}
    kernel = fn.compile(*_inputs(fn, sizes, rng), target="cuda", arch="sm_90", options=MMA_SYNC)
    assert [t.name for t in kernel.compiled_ir.temporaries][-2:] == ["A_pad", "B_pad"]
    marks = re.findall(r'mark: "(kernel [^"]*|mma [^"]*)"', kernel.schedule)
    assert marks == ["kernel grid=1,33,1 block=256,1,1",
                     "kernel grid=1,1,1 block=64,1,1", "mma S2 tile=64,32,16 warps=2,1 stages=3 grid=1,1,1"]
    launches = kernel.runner.image.kernels
    assert [k.tensors for k in launches] == [("A", "B", "A_pad", "B_pad"),
                                             ("C", "C_acc", "A_pad", "B_pad")]
    assert "C_acc" in kernel.runner.image.on_chip and "A_pad" not in kernel.runner.image.on_chip


def test_the_coverage_proof_takes_the_tensor_core_kernel_per_block_and_the_copies_per_thread():
    """The copies' kernel brings ``_tx`` into the tree; the contraction's statements, below
    the ``mma`` mark, are its block's (the proof leaves ``_tx`` out for them only): without
    the mark they would run once per thread."""
    import islpy as isl

    from tcmlir.compiler import lower
    from tcmlir.poly.gpu_mapping import check_coverage
    from tcmlir.poly.tree import mark_name

    fn = _fn(NN)
    sizes = {"M": 33, "N": 17, "K": 21}
    state = lower(fn.ir, sizes, MMA_SYNC, "cuda")
    check_coverage(state.proof_schedule, state.scop.domain, state.scop.context)

    def renamed(schedule, old, new):
        def visit(node):
            name = mark_name(node)
            if name is not None and name.startswith(old):
                node = node.delete().insert_mark(isl.Id(new + name[len(old):], context=node.get_ctx()))
                return node, True
            for i in range(node.n_children()):
                child, done = visit(node.child(i))
                if done:
                    return child, True
            return node, False

        node, done = visit(schedule.get_root())
        assert done
        return node.get_schedule()

    no_mark = renamed(state.proof_schedule, "mma ", "not-mma ")
    with pytest.raises(AssertionError, match="more than once"):
        check_coverage(no_mark, state.scop.domain, state.scop.context)


# ---------------------------------------------------------------- PTX


def _entries(ptx):
    return {e.split("(")[0]: e for e in re.split(r"\.visible \.entry ", ptx)[1:]}


@needs_ptxas
@pytest.mark.parametrize("options", [MMA_SYNC, WGMMA], ids=["mma.sync", "wgmma"])
def test_the_padded_kernel_copies_16_bytes_at_once(options, tmp_path, rng):
    """Unpadded, odd rows are loaded element by element; padded, the tensor-core kernel has
    only 16-byte cp.async (the temporaries are 16-byte aligned: the kernel's parameters say
    so), and the copy kernel the element loads."""
    fn = _fn(NN)
    sizes = {"M": 130, "N": 67, "K": 77}
    inputs = _inputs(fn, sizes, rng)
    plain = fn.compile(*inputs, target="cuda", arch="sm_90", options=options.tensor_cores(
        options.mma_tile, options.mma_warps, options.mma_stages, options.mma_wgmma))
    assert "ld.global.nc.b16" in plain.ptx and not re.search(r"cp\.async\.c[ag]", plain.ptx)
    kernel = fn.compile(*inputs, target="cuda", arch="sm_90", options=options)
    copies, mma = _entries(kernel.ptx).values()
    # a thread of the copy kernel copies 8 adjacent halves of a row of each operand
    assert not re.search(r"cp\.async\.c[ag]", copies)
    assert len(re.findall(r"ld\.global\.nc\.b16", copies)) == 16
    assert not re.search(r"ld\.global(\.nc)?\.b16", mma)
    assert re.search(r"cp\.async\.cg\.shared\.global \[[^]]+\], \[[^]]+\], 16", mma)
    assert "cp.async.ca" not in mma  # no narrower copies
    if options.mma_wgmma:
        assert "wgmma.mma_async" in mma
    info = ptxas_verbose(tmp_path, kernel.ptx, "padded", arch="sm_90a" if options.mma_wgmma else "sm_90")
    assert " 0 bytes spill stores" in info


@needs_ptxas
@pytest.mark.parametrize("options", [MMA_SYNC, WGMMA], ids=["mma.sync", "wgmma"])
def test_a_padded_convolution_assembles(options, tmp_path, rng):
    fn = _fn(PROGRAMS["nhwc"])
    sizes = {"N": 2, "H": 10, "W": 9, "C": 13, "M": 33, "KH": 3, "KW": 3}
    kernel = fn.compile(*_inputs(fn, sizes, rng), target="cuda", arch="sm_90", options=options)
    _, mma = _entries(kernel.ptx).values()
    assert not re.search(r"ld\.global(\.nc)?\.b16", mma) and "cp.async.cg" in mma
    info = ptxas_verbose(tmp_path, kernel.ptx, "conv", arch="sm_90a" if options.mma_wgmma else "sm_90")
    assert " 0 bytes spill stores" in info


# ---------------------------------------------------------------- on the host machine


def _run_on_host(name, mnk, rng, options=MMA_SYNC, batch=2):
    """Compile for sm_90, run every launch on the host machine (the padded temporaries
    filled with NaN: a read of their padding or of a row not copied shows), compare with
    the reference interpreter in float64."""
    src = PROGRAMS[name]
    fn = _fn(src)
    sizes = _sizes(fn, *mnk, batch=batch)
    inputs = _inputs(fn, sizes, rng)
    kernel = fn.compile(*inputs, target="cuda", arch="sm_90", options=_options(src, options))
    compiled = kernel.compiled_ir
    assert compiled is not None and operand_copies(compiled, sizes) >= 1, "padded"
    arrays = {t.name: x for t, x in zip(fn.ir.inputs, inputs, strict=True)}
    for t in compiled.tensors:  # (the runtime zero-fills a temporary whose padding is summed)
        shape = tuple(s.evaluate(sizes) for s in t.shape)
        fill = 0 if needs_zero_fill(compiled, t, sizes) else np.nan
        arrays.setdefault(t.name, np.full(shape, fill, t.dtype.numpy))
    emu.run_kernel(kernel, arrays, sizes)
    want = tc.define(src, target="numpy")(*inputs)
    out = fn.ir.outputs[0].name
    np.testing.assert_array_equal(arrays[out].astype(np.float64), np.asarray(want, np.float64),
                                  err_msg=f"{name} at {mnk}")
    return kernel


@pytest.mark.parametrize("name, mnk, pads", [
    ("nn", (33, 17, 21), "A B"),    # K odd, N odd, M odd
    ("nn", (7, 9, 5), "A B"),       # K < BK, one partial tile everywhere
    ("nn", (70, 40, 37), "A"),      # several tiles along m and n, three k steps; B aligned
    ("nt", (17, 13, 19), "A B"),
    ("tn", (19, 23, 11), "A B"),    # A stored k-major: its rows are m
    ("bf16-f32out", (33, 17, 21), "A B"),
    ("batched", (9, 11, 13), "X Y"),
    ("gram", (9, 9, 13), "A"),      # one tensor, both operands: one copy
    ("linear", (13, 21, 19), "I W"),  # a fused epilogue reading an input of its own
    ("tf32-nn", (17, 9, 7), "A B"),   # float32: rows padded to 16 bytes = 4 elements
    ("one-gains", (9, 7, 11), "A"),
    ("two-k", (9, 7, 11), "B"),
    ("nhwc", (9, 2, 3), "I Wt"),
    ("nhwc", (17, 3, 13), "I Wt"),
])
def test_padded_kernels_on_the_host_machine(name, mnk, pads, rng):
    kernel = _run_on_host(name, mnk, rng)
    padded = [t.name for t in kernel.compiled_ir.temporaries if t.name.endswith("_pad")]
    assert padded == [f"{t}_pad" for t in pads.split()]


# ---------------------------------------------------------------- on the GPU


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["nn", "nt", "tn", "bf16-f32out", "batched", "linear", "nhwc"])
@pytest.mark.parametrize("mnk", [(33, 17, 21), (7, 9, 5), (255, 257, 253)])
@pytest.mark.parametrize("options", [MMA_SYNC, WGMMA], ids=["mma.sync", "wgmma"])
def test_padded_kernels_on_gpu(name, mnk, options, rng):
    src = PROGRAMS[name]
    fn = _fn(src)
    sizes = _sizes(fn, *mnk)
    inputs = _inputs(fn, sizes, rng)
    opts = _options(src, options)
    kernel = fn.compile(*inputs, options=opts)
    assert operand_copies(kernel.compiled_ir, sizes) >= 1
    got = fn(*inputs, options=opts)
    want = tc.define(src, target="numpy")(*inputs)
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64),
                               rtol=1e-2 if np.asarray(got).dtype != np.float32 else 1e-6)


@pytest.mark.gpu
def test_the_default_pads_the_odd_matmul_on_gpu(rng):
    fn = _fn(NN)
    sizes = {"M": 4095, "N": 4097, "K": 4093}
    inputs = _inputs(fn, sizes, rng)
    opts = tc.MappingOptions.default_for(fn, "cuda", sizes)
    assert opts.mma_pad_operands
    got = np.asarray(fn(*inputs), np.float64)
    want = inputs[0].astype(np.float64) @ inputs[1].astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1)


def test_the_dump_shows_the_padded_program(tmp_path):
    import contextlib

    from tcmlir.dump import main

    path = tmp_path / "mm.tc"
    path.write_text(NN)
    out = tmp_path / "out.txt"
    with out.open("w") as f, contextlib.redirect_stdout(f):
        main([str(path), "--sizes", "M=4095,N=4097,K=4093", "--target", "cuda", "--stage", "ir"])
    text = out.read_text()
    assert "after pad-operands:" in text and "temporary float16(M, 4096) A_pad" in text
    assert "C_acc(m, n) +=! (A_pad(m, k) * B_pad(k, n))" in text
