"""Exact work counts (tcmlir.profile.counts): hand-worked counts, symbolic formulas at several
sizes, and the reference interpreter's own instance counts."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tcmlir as tc
from tcmlir import reference
from tcmlir.profile.counts import count_work, evaluate, op_counts

MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
SOFTMAX = """def softmax(float(N, D) X) -> (Y) {
  mx(n) max=! X(n, d)
  e(n, d) = exp(X(n, d) - mx(n))
  s(n) +=! e(n, d)
  Y(n, d) = e(n, d) / s(n)
}"""
LAYERNORM = """def layernorm(float(N, D) X, float(D) G, float(D) B, float inv) -> (Y) {
  mu(n) +=! X(n, d) * inv
  xc(n, d) = X(n, d) - mu(n)
  v(n) +=! xc(n, d) * xc(n, d) * inv
  Y(n, d) = xc(n, d) * rsqrt(v(n) + 1e-5) * G(d) + B(d)
}"""
CONV = """def conv(float(N, C, H, W) I, float(F, C, KH, KW) Wt) -> (O) {
  O(n, f, h, w) +=! I(n, c, h + kh, w + kw) * Wt(f, c, kh, kw)
}"""
GATHER = "def gather(float(V, D) E, int32(N) idx) -> (O) { O(i, j) = E(idx(i), j) }"
WINDOW = "def window(float(N) A) -> (B) { B(i) +=! A(i + k) where i in 0:N-2, k in 0:3 }"
EVEN = "def even(float(N) A) -> (B) { B(i) = A(2 * i) where i in 0:N/2 }"


def work(src: str, **sizes: int):
    return count_work(tc.define(src).ir, sizes)


@pytest.mark.parametrize("M,K,N", [(3, 5, 7), (64, 48, 40), (1, 1, 1)])
def test_matmul_flops_and_bytes(M, K, N):
    w = work(MATMUL, M=M, K=K, N=N)
    assert w.flops == 2 * M * N * K
    assert w.op_values() == {"fma": M * N * K}
    assert w.bytes == 4 * (M * K + K * N + M * N)
    assert w.bytes_read == 4 * (M * K + K * N) and w.bytes_written == 4 * M * N
    assert w.exact


def test_matmul_formulas_are_symbolic():
    w = work(MATMUL, M=3, K=5, N=7)
    poly = w.flops_count.symbolic
    assert poly is not None and w.bytes_formula() is not None
    for M, K, N in [(2, 3, 4), (100, 1, 37), (512, 512, 512)]:
        assert evaluate(poly, {"M": M, "K": K, "N": N}) == 2 * M * N * K


def test_softmax_by_hand():
    # per (n, d): max, subtract, exp, add, divide; X read once, Y written once (the
    # temporaries mx, e, s stay on chip in the ideal)
    N, D = 3, 5
    w = work(SOFTMAX, N=N, D=D)
    assert w.op_values() == {"minmax": N * D, "add": 2 * N * D, "special": N * D, "div": N * D}
    assert w.flops == 5 * N * D
    assert w.bytes == 4 * N * D + 4 * N * D


def test_layernorm_by_hand():
    # mu += X*inv: fma; xc = X - mu: add; v += (xc*xc)*inv: mul + fma;
    # Y = (xc * rsqrt(v + eps)) * G + B: mul, add, rsqrt, fma
    N, D = 4, 6
    w = work(LAYERNORM, N=N, D=D)
    assert w.op_values() == {"fma": 3 * N * D, "mul": 2 * N * D, "add": 2 * N * D,
                             "special": N * D}
    assert w.flops == 11 * N * D
    assert w.bytes == 4 * (N * D + D + D + 1) + 4 * N * D


def test_convolution_by_hand():
    s = dict(N=2, C=3, H=7, W=6, F=4, KH=3, KW=2)
    w = work(CONV, **s)
    ho, wo = s["H"] - s["KH"] + 1, s["W"] - s["KW"] + 1
    assert w.flops == 2 * s["N"] * s["F"] * ho * wo * s["C"] * s["KH"] * s["KW"]
    # every input element is inside some window: the footprint is all of I
    assert w.bytes == 4 * (s["N"] * s["C"] * s["H"] * s["W"] + s["F"] * s["C"] * s["KH"] * s["KW"]
                           + s["N"] * s["F"] * ho * wo)
    assert w.bytes_formula() is not None
    poly = w.flops_count.symbolic
    s2 = dict(N=1, C=2, H=9, W=9, F=3, KH=5, KW=1)
    assert evaluate(poly, s2) == 2 * 1 * 3 * 5 * 9 * 2 * 5 * 1


def test_gather_bytes_are_a_bound():
    w = work(GATHER, V=10, D=4, N=3)
    traffic = {t.tensor: t for t in w.traffic}
    assert traffic["idx"].read.value == 3 and traffic["idx"].read.exact
    # at most one row of E per index: min(V*D, N*D) elements
    assert traffic["E"].read.value == 3 * 4 and not traffic["E"].read.exact
    assert traffic["O"].written.value == 12
    assert w.bytes == 4 * (3 + 12 + 12) and not w.exact and w.flops == 0
    few = work(GATHER, V=2, D=4, N=30)
    assert {t.tensor: t for t in few.traffic}["E"].read.value == 2 * 4


def test_where_ranges_by_hand():
    w = work(WINDOW, N=9)
    assert w.instances["S0"].value == 3 * 7 and w.op_values() == {"add": 21}
    assert w.bytes == 4 * (9 + 7)   # A(i + k) covers 0..N-1; B has N-2 elements
    assert evaluate(w.flops_count.symbolic, {"N": 100}) == 3 * 98


def test_non_box_footprint_is_counted_at_the_sizes():
    w = work(EVEN, N=9)
    a = {t.tensor: t for t in w.traffic}["A"]
    assert a.read.value == 4 and a.read.symbolic is None   # {2i : 0 <= i < 4}
    assert w.bytes_formula() is None and w.bytes == 4 * (4 + 4)
    assert w.instances["S0"].formula is not None  # the domain is still a box


def test_plain_accumulation_reads_its_output():
    w = work("def acc(float(N) A) -> (B) { B(i) += A(i) }", N=5)
    b = {t.tensor: t for t in w.traffic}["B"]
    assert b.read.value == 5 and b.written.value == 5   # += without ! reads B's old values


def test_op_classes():
    fn = tc.define("""def ops(float(N) A, int32(N) I) -> (B, J, C) {
      B(i) = fmax(A(i), 0.0) + (A(i) > 0.5 ? tanh(A(i)) : fabs(A(i)))
      J(i) = I(i) * 3 + 1
      C(i) +=! A(i) * A(i) where i in 0:N
    }""").ir
    first, second, third = (op_counts(s) for s in fn.statements)
    assert first == {"minmax": 1, "add": 1, "select": 1, "compare": 1, "special": 1}
    assert second == {"int": 2}
    assert third == {"fma": 1}


PROGRAMS = [(MATMUL, ["M", "K", "N"]), (SOFTMAX, ["N", "D"]), (LAYERNORM, ["N", "D"]),
            (CONV, ["N", "C", "H", "W", "F", "KH", "KW"]), (WINDOW, ["N"])]


@pytest.mark.parametrize("src,names", PROGRAMS)
def test_symbolic_instances_match_the_reference_interpreter(src, names, monkeypatch):
    fn = tc.define(src, target="numpy")
    counted: dict[int, int] = {}
    current: list[int] = [-1]
    execute, chunks = reference._Statement.execute, reference._chunks

    def counting_execute(self):
        current[0] = fn.ir.statements.index(self.stmt)
        execute(self)

    def counting_chunks(box, limit):
        for b in chunks(box, limit):
            counted[current[0]] = counted.get(current[0], 0) + math.prod(hi - lo for lo, hi in b)
            yield b

    monkeypatch.setattr(reference._Statement, "execute", counting_execute)
    monkeypatch.setattr(reference, "_chunks", counting_chunks)
    monkeypatch.setattr(reference, "CHUNK_ELEMENTS", 1 << 40)  # one box per statement
    rng = np.random.default_rng(1)
    symbolic = count_work(fn.ir, dict.fromkeys(names, 4)).instances
    for trial in range(3):
        sizes = {n: int(v) for n, v in zip(names, rng.integers(1, 6, len(names)), strict=True)}
        if "H" in sizes:
            sizes["H"] += sizes["KH"]
            sizes["W"] += sizes["KW"]
        if "N" in sizes and src is WINDOW:
            sizes["N"] += 2
        inputs = [np.asarray(rng.random(tuple(e.evaluate(sizes) for e in t.shape)),
                             dtype=t.dtype.numpy) for t in fn.ir.inputs]
        counted.clear()
        fn(*inputs)
        for k in range(len(fn.ir.statements)):
            poly = symbolic[f"S{k}"].symbolic
            assert poly is not None
            assert evaluate(poly, sizes) == counted.get(k, 0), (trial, k, sizes)


def test_union_of_disjoint_boxes_is_symbolic():
    src = "def gaps(float(L) A, float(N) Z) -> (C) { C(i) = A(i) + A(i + 2 * N) + Z(i) }"
    fn = tc.define(src).ir
    w = count_work(fn, {"L": 30, "N": 10})
    a = {t.tensor: t for t in w.traffic}["A"]
    assert a.read.value == 20 and a.read.symbolic is not None   # [0, N) and [2N, 3N)
    assert evaluate(a.read.symbolic, {"L": 99, "N": 33}) == 66
