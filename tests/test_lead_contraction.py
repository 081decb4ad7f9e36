"""Contractions with leading output indices (`tcmlir.contraction_shape`) on the register-tiled
matmul mapping: which programs take it, and their results against the reference through the
GPU simulator at sizes no tile divides (PTX compiles checked by ptxas where it is installed)."""

from __future__ import annotations

import numpy as np
import pytest

import tcmlir as tc
from tcmlir.codegen.ptx_tools import find_ptxas
from tcmlir.contraction_shape import lead_contraction
from tcmlir.options import MappingOptions as MO
from tcmlir.reference import run as run_reference
from tcmlir.simulate import simulate_call

BMM = "def bmm(float(B,S,D) Q, float(B,D,T) K) -> (P) { P(b,i,j) +=! Q(b,i,d) * K(b,d,j) }"
KRON = ("def kron(float(M,N0,N1,N2) X, float(D,N2) Wt) -> (XW) "
        "{ XW(m,n0,n1,d) +=! X(m,n0,n1,r) * Wt(d,r) }")
LINEAR3D = ("def lin(float(B,S,K) X, float(K,N) Wt, float(N) bias) -> (Y) {\n"
            "  Y(b,s,n) +=! X(b,s,k) * Wt(k,n) * 0.5\n"
            "  Y(b,s,n) = fmax(Y(b,s,n) + bias(n), 0)\n}")
BATCH_LAST = ("def bl(float(M,K,B) A, float(K,N,B) Bm) -> (C) "
              "{ C(m,n,b) +=! A(m,k,b) * Bm(k,n,b) }")


@pytest.mark.parametrize("src,sizes,lead", [
    (BMM, {"B": 3, "S": 64, "D": 64, "T": 96}, 1),
    (KRON, {"M": 4, "N0": 2, "N1": 32, "N2": 16, "D": 32}, 2),
    (LINEAR3D, {"B": 2, "S": 40, "K": 24, "N": 33}, 1),
    (BATCH_LAST, {"M": 64, "K": 8, "N": 64, "B": 4}, None),  # n and b last: not (m, n)
    (BMM, {"B": 3, "S": 16, "D": 64, "T": 96}, None),        # a 16-row output: too small
], ids=["bmm", "kron", "linear3d", "batch-last", "small"])
def test_which_programs_are_lead_contractions(src, sizes, lead):
    shape = lead_contraction(tc.define(src).ir, sizes)
    assert (shape.lead if shape else None) == lead
    opts = MO.default_for(tc.define(src), "cuda", sizes)
    assert bool(opts.register_tile) == (lead is not None)
    if lead is not None:
        assert opts.tile_sizes[:lead] == (0,) * lead and opts.use_shared_memory


@pytest.mark.parametrize("src,sizes", [
    (BMM, {"B": 3, "S": 33, "D": 19, "T": 47}),
    (KRON, {"M": 3, "N0": 1, "N1": 33, "N2": 7, "D": 35}),
    (LINEAR3D, {"B": 2, "S": 37, "K": 21, "N": 34}),
], ids=["bmm", "kron", "linear3d"])
def test_lead_contractions_match_the_reference(src, sizes, rng):
    fn = tc.define(src)
    opts = MO.default_for(fn, "cuda", sizes)
    assert opts.register_tile
    inputs = [rng.standard_normal([sizes[str(d)] for d in t.shape]).astype(np.float32)
              for t in fn.ir.inputs]
    got = simulate_call(fn.ir, inputs, opts)
    want = run_reference(fn.ir, {t.name: x for t, x in zip(fn.ir.inputs, inputs, strict=True)}, sizes)
    for g, w in zip(got, want.values(), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    if find_ptxas() is not None:
        kernel = fn.compile(*inputs, target="cuda", arch="sm_90")
        assert ".reg" in kernel.ptx


@pytest.mark.gpu
@pytest.mark.parametrize("src,sizes", [
    (BMM, {"B": 5, "S": 130, "D": 67, "T": 200}),
    (KRON, {"M": 9, "N0": 4, "N1": 32, "N2": 32, "D": 33}),
    (LINEAR3D, {"B": 3, "S": 100, "K": 77, "N": 129}),
], ids=["bmm", "kron", "linear3d"])
def test_lead_contractions_on_gpu(src, sizes, rng):
    fn = tc.define(src, target="cuda")
    inputs = [rng.standard_normal([sizes[str(d)] for d in t.shape]).astype(np.float32)
              for t in fn.ir.inputs]
    got = fn(*inputs)
    got = got if isinstance(got, tuple) else (got,)
    want = run_reference(fn.ir, {t.name: x for t, x in zip(fn.ir.inputs, inputs, strict=True)}, sizes)
    for g, w in zip(got, want.values(), strict=True):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=1e-3)
