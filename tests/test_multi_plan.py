"""Split plans (tcmlir.multi.plan): chunks, exact footprints and bytes to move, against values
worked out by hand; programs that cannot be split; the options field and the dump flag.

Everything here runs without a GPU: a plan is isl work on the call's sizes.
"""

from __future__ import annotations

import islpy as isl
import numpy as np
import pytest
from fake_cuda import FakeTensor

import tcmlir as tc
from tcmlir.errors import OptionsError, TCError
from tcmlir.multi import make_plan

MATMUL = "def matmul(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }"
BMM = """def bmm(float(Bt, M, K) X, float(Bt, K, N) Y) -> (Z) {
    Z(b, m, n) +=! X(b, m, k) * Y(b, k, n) }"""
CONV = """def conv2d(float(N, C, H, W) I, float(F, C, KH, KW) W1) -> (O) {
    O(n, f, h, w) +=! I(n, c, h + kh, w + kw) * W1(f, c, kh, kw) }"""
SOFTMAX = """def softmax(float(N, D) I) -> (O) {
    mx(n) max=! I(n, d)
    e(n, d) = exp(I(n, d) - mx(n))
    s(n) +=! e(n, d)
    O(n, d) = e(n, d) / s(n) }"""
STENCIL = "def stencil(float(N) A) -> (O) { O(i) = A(i) + A(i + 1) }"
F32 = np.float32


def _same(text: str, expected: str) -> bool:
    """isl equality of two set texts (the plan's text, a hand-written set)."""
    return isl.Set(text).is_equal(isl.Set(expected))


def _plan(source, *shapes, devices=(0, 1)):
    fn = tc.define(source, target="cpu")
    return fn.plan(*(np.zeros(s, F32) for s in shapes), devices=list(devices))


def test_matmul_rows_of_A_and_C_per_device_B_whole():
    plan = _plan(MATMUL, (100, 30), (30, 20))
    assert plan.is_split and plan.reason is None
    assert [p.chunk for p in plan.parts] == [(0, 50), (50, 100)]
    assert [p.device for p in plan.parts] == [0, 1] and plan.output_device == 0
    assert plan.sliced == {"A", "C"}
    for p, (lo, hi) in zip(plan.parts, [(0, 49), (50, 99)], strict=True):
        assert _same(p.footprints["A"], f"{{ A[i, k] : {lo} <= i <= {hi} and 0 <= k <= 29 }}")
        assert _same(p.footprints["B"], "{ B[k, j] : 0 <= k <= 29 and 0 <= j <= 19 }")
        assert _same(p.footprints["C"], f"{{ C[i, j] : {lo} <= i <= {hi} and 0 <= j <= 19 }}")
        assert dict(p.sizes) == {"M": 50, "K": 30, "N": 20}
        assert isl.UnionSet(p.domain).is_equal(isl.UnionSet(
            f"{{ S0[m, n, k] : {lo} <= m <= {hi} and 0 <= n < 20 and 0 <= k < 30;"
            f"  S0_init[m, n] : {lo} <= m <= {hi} and 0 <= n < 20 }}"))
    # numpy inputs: each device receives its 50 rows of A (50*30*4) and all of B (30*20*4);
    # device 1 sends its 50 rows of C (50*20*4) to device 0
    assert [p.bytes_in for p in plan.parts] == [8400, 8400]
    assert [p.bytes_out for p in plan.parts] == [0, 4000]
    assert plan.covered == {"C": True}


def test_uneven_and_three_way_chunks_are_balanced():
    plan = _plan(MATMUL, (7, 3), (3, 2))
    assert [p.chunk for p in plan.parts] == [(0, 3), (3, 7)]
    assert [p.sizes["M"] for p in plan.parts] == [3, 4]
    plan = _plan(MATMUL, (10, 3), (3, 2), devices=(0, 1, 2))
    assert [p.chunk for p in plan.parts] == [(0, 3), (3, 6), (6, 10)]
    assert [p.slabs["A"] for p in plan.parts] == [(0, 3), (3, 6), (6, 10)]
    plan = _plan(MATMUL, (2, 3), (3, 2), devices=(0, 1, 2))  # fewer rows than devices
    assert [p.chunk for p in plan.parts] == [(0, 1), (1, 2)]


def test_inputs_already_on_a_device_are_not_counted():
    fn = tc.define(MATMUL, target="cpu")
    A, B = np.zeros((100, 30), F32), np.zeros((30, 20), F32)
    plan = fn.plan(FakeTensor(A, 1), FakeTensor(B, 0), devices=[0, 1])
    assert dict(plan.locations) == {"A": 1, "B": 0}
    # device 0 needs rows 0..49 of A (from device 1); device 1 needs all of B (from device 0)
    assert [p.bytes_in for p in plan.parts] == [50 * 30 * 4, 30 * 20 * 4]
    same = fn.plan(FakeTensor(A, 0), FakeTensor(B, 0), devices=[0, 0])
    assert [p.bytes_in for p in same.parts] == [0, 0] and [p.bytes_out for p in same.parts] == [0, 0]


def test_batched_matmul_splits_the_batch():
    plan = _plan(BMM, (5, 7, 3), (5, 3, 4))
    assert [p.chunk for p in plan.parts] == [(0, 2), (2, 5)]
    assert plan.sliced == {"X", "Y", "Z"}
    p1 = plan.parts[1]
    assert _same(p1.footprints["X"], "{ X[b, m, k] : 2 <= b <= 4 and 0 <= m <= 6 and 0 <= k <= 2 }")
    assert _same(p1.footprints["Y"], "{ Y[b, k, n] : 2 <= b <= 4 and 0 <= k <= 2 and 0 <= n <= 3 }")
    assert _same(p1.footprints["Z"], "{ Z[b, m, n] : 2 <= b <= 4 and 0 <= m <= 6 and 0 <= n <= 3 }")
    assert dict(p1.sizes) == {"Bt": 3, "M": 7, "K": 3, "N": 4}
    assert [p.bytes_in for p in plan.parts] == [2 * (21 + 12) * 4, 3 * (21 + 12) * 4]
    assert plan.parts[1].bytes_out == 3 * 28 * 4


def test_convolution_splits_the_batch_and_replicates_the_weights():
    plan = _plan(CONV, (4, 3, 7, 5), (2, 3, 2, 3))
    assert [p.chunk for p in plan.parts] == [(0, 2), (2, 4)]
    assert plan.sliced == {"I", "O"}
    p0 = plan.parts[0]
    # O is 4 x 2 x (7-2+1) x (5-3+1); I(n, c, h+kh, w+kw) reads every row and column
    assert _same(p0.footprints["I"], "{ I[n, c, h, w] : 0 <= n <= 1 and 0 <= c <= 2 and "
                                     "0 <= h <= 6 and 0 <= w <= 4 }")
    assert _same(p0.footprints["W1"], "{ W1[f, c, a, b] : 0 <= f <= 1 and 0 <= c <= 2 and "
                                      "0 <= a <= 1 and 0 <= b <= 2 }")
    assert _same(p0.footprints["O"], "{ O[n, f, h, w] : 0 <= n <= 1 and 0 <= f <= 1 and "
                                     "0 <= h <= 5 and 0 <= w <= 2 }")
    assert p0.bytes_in == (2 * 3 * 7 * 5 + 2 * 3 * 2 * 3) * 4
    assert plan.parts[1].bytes_out == 2 * 2 * 6 * 3 * 4


def test_softmax_splits_rows_and_keeps_temporaries_per_part():
    plan = _plan(SOFTMAX, (7, 33))
    assert [p.chunk for p in plan.parts] == [(0, 3), (3, 7)]
    p1 = plan.parts[1]
    assert set(p1.footprints) == {"I", "O"}  # temporaries stay inside each part
    assert _same(p1.footprints["I"], "{ I[n, d] : 3 <= n <= 6 and 0 <= d <= 32 }")
    assert _same(p1.footprints["O"], "{ O[n, d] : 3 <= n <= 6 and 0 <= d <= 32 }")
    assert [p.bytes_in for p in plan.parts] == [3 * 33 * 4, 4 * 33 * 4]
    assert "S3[n, d]" in p1.domain and "S0_init[n]" in p1.domain


def test_stencil_parts_get_a_halo_row():
    plan = _plan(STENCIL, (10,))
    assert [p.chunk for p in plan.parts] == [(0, 4), (4, 9)]     # O has N - 1 = 9 elements
    assert [p.slabs["A"] for p in plan.parts] == [(0, 5), (4, 10)]  # row 4 goes to both
    assert [p.slabs["O"] for p in plan.parts] == [(0, 4), (4, 9)]
    assert [p.sizes["N"] for p in plan.parts] == [5, 6]
    assert _same(plan.parts[1].footprints["A"], "{ A[i] : 4 <= i <= 9 }")
    assert [p.bytes_in for p in plan.parts] == [20, 24]


@pytest.mark.parametrize(("source", "shapes", "why"), [
    ("def total(float(N) A) -> (s) { s +=! A(i) }", [(8,)], "writes the scalar s"),
    ("def tr(float(M, N) A) -> (O) { O(j, i) = A(i, j) }", [(4, 6)],
     "A is indexed by the split index outside its leading dimension"),
    ("""def rev(float(N) A) -> (O) {
        t(i) = A(i) * 2
        O(i) = t(N - 1 - i) }""", [(8,)], "a dependence crosses"),
    ("def iota(float(N) A) -> (O) { O(i) = A(i) + i }", [(8,)], "uses the split index i as a value"),
    ("def scale(float(N) A) -> (O) { O(i) = A(i) / N }", [(8,)], "uses the size N as a value"),
    ("def one(float(N) A) -> (O) { O(i) = A(i) }", [(1,)], "has 1 value(s)"),
])
def test_programs_that_cannot_be_split_run_on_the_first_device_and_say_why(source, shapes, why):
    plan = _plan(source, *shapes, devices=(1, 0))
    assert not plan.is_split and why in plan.reason
    (part,) = plan.parts
    assert part.device == 1 and plan.output_device == 1
    assert part.bytes_in == sum(4 * int(np.prod(s)) for s in shapes)
    assert "not split: " + plan.reason in str(plan)
    assert "part 0 on device 1: the whole call" in str(plan)


def test_one_device_is_one_part():
    plan = _plan(MATMUL, (4, 3), (3, 2), devices=(0,))
    assert plan.reason == "one device" and len(plan.parts) == 1


def test_str_lists_parts_footprints_and_bytes():
    text = str(_plan(MATMUL, (100, 30), (30, 20)))
    assert text.splitlines()[0] == ("plan for matmul on devices [0, 1] (M=100, K=30, N=20), "
                                    "outputs on device 0")
    assert "part 1 on device 1: chunk [50, 100), sizes M=50, K=30, N=20; 8400 bytes in, " \
           "4000 bytes out" in text
    assert "A: rows [50, 100) { A[i0, i1] : 50 <= i0 <= 99 and 0 <= i1 <= 29 }" in text
    assert "B: whole { B[i0, i1] : 0 <= i0 <= 29 and 0 <= i1 <= 19 }" in text


@pytest.mark.parametrize("bad", [[], [-1], "0,1", [0, 1.5], [True]])
def test_devices_must_be_a_list_of_ordinals(bad):
    fn = tc.define(MATMUL, target="cpu")
    with pytest.raises(TCError, match="devices="):
        fn.plan(np.zeros((2, 2), F32), np.zeros((2, 2), F32), devices=bad)


def test_make_plan_with_explicit_locations_and_output_device():
    fn = tc.define(MATMUL, target="cpu").ir
    plan = make_plan(fn, {"M": 8, "K": 2, "N": 3}, [0, 1], {"A": 0, "B": None}, output_device=1)
    assert plan.output_device == 1
    assert [p.bytes_in for p in plan.parts] == [2 * 3 * 4, 4 * 2 * 4 + 2 * 3 * 4]
    assert [p.bytes_out for p in plan.parts] == [4 * 3 * 4, 0]


def test_options_devices_field_round_trips_and_stays_out_of_default_keys():
    opts = tc.MappingOptions.naive().on_devices(0, 1)
    assert opts.devices == (0, 1)
    assert tc.MappingOptions.from_json(opts.to_json()) == opts
    assert opts.on_devices().devices == ()
    assert "devices" not in tc.MappingOptions.naive().to_json()  # compile keys unchanged
    assert opts.to_pipeline("cuda") == tc.MappingOptions.naive().to_pipeline("cuda")
    with pytest.raises(OptionsError, match="devices"):
        tc.MappingOptions(devices=(-1,))
    with pytest.raises(OptionsError, match="devices"):
        tc.MappingOptions.from_json('{"devices": [0, "1"]}')


def test_compile_with_devices_gives_each_part_its_kernel_without_a_gpu():
    fn = tc.define(MATMUL, target="cuda")
    A, B = np.zeros((64, 16), F32), np.zeros((16, 8), F32)
    split = fn.compile(A, B, devices=[0, 0], arch="sm_90")
    assert split.plan.is_split and len(split.kernels) == 2
    assert split.kernels[0] is split.kernels[1]  # equal chunks: one kernel of M=32
    assert split.kernels[0].sizes == {"M": 32, "K": 16, "N": 8}
    assert ".entry matmul" in split.kernels[0].ptx
    assert split.kernels[0].options.devices == ()
    one = fn.compile(np.zeros((32, 16), F32), B, arch="sm_90")
    assert one.ptx == split.kernels[0].ptx  # the single-device kernel of the chunk's size
    with_opts = fn.compile(A, B, options=tc.MappingOptions.naive().on_devices(0, 1), arch="sm_90")
    assert [k.options for k in with_opts.kernels] == [tc.MappingOptions.naive()] * 2


def test_dump_devices_prints_the_plan(tmp_path, capsys):
    from tcmlir.dump import main

    path = tmp_path / "mm.tc"
    path.write_text(MATMUL)
    assert main([str(path), "--sizes", "M=100,K=30,N=20", "--devices", "0,1"]) == 0
    out = capsys.readouterr().out
    assert out == str(_plan(MATMUL, (100, 30), (30, 20))) + "\n"
    assert main([str(path), "--sizes", "M=100", "--devices", "0,1"]) == 2
    assert "--devices needs every size" in capsys.readouterr().err
    assert main([str(path), "--sizes", "M=4,K=3,N=2", "--devices", "0,x"]) == 2
    assert "--devices" in capsys.readouterr().err
