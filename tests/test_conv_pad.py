"""Reductions under an affine guard (``cond ? x : 0``): padded convolutions and stencils.

`affine.domain_guard` moves the guard into the statement's domain (`poly.scop`), the scheduler
schedules the boxes (`poly.scheduler`), the code generators emit the unguarded arm; sema puts
the reduction loops in the order of the reads (`lang.sema`), so a guard written first does
not put the window loops outside the channel loop. Checked against the reference interpreter
on the host (cpu target) and, for the cuda mapping, on the emulator (`tests/mma_emulator.py`).
"""

from __future__ import annotations

import re

import mma_emulator as emu
import numpy as np
import pytest
from test_gpu_emulated import emulate

import tcmlir as tc
from tcmlir.affine import domain_guard, statement_rhs

CONV_PAD = """def conv_pad(float(N,C,H,W) I, float(F,C,3,3) W1) -> (O) {
    O(n, f, h, w) +=! (h + kh >= 1 && h + kh <= H && w + kw >= 1 && w + kw <= W)
        ? I(n, c, h + kh - 1, w + kw - 1) * W1(f, c, kh, kw) : 0
        where h in 0:H, w in 0:W, kh in 0:3, kw in 0:3
}"""

CONV_PAD_TEMP = """def conv_pad_t(float(N,C,H,W) I, float(F,C,3,3) W1) -> (O) {
    P(n, c, h, w) = (h >= 1 && h <= H && w >= 1 && w <= W) ? I(n, c, h - 1, w - 1) : 0
        where h in 0:H+2, w in 0:W+2
    O(n, f, h, w) +=! P(n, c, h + kh, w + kw) * W1(f, c, kh, kw)
}"""

STENCIL = """def stencil(float(N) A, float(K) B) -> (O) {
    O(i) +=! (i + k >= 2 && i + k < N + 2) ? A(i + k - 2) * B(k) : 0 where i in 0:N, k in 0:K
}"""


def _conv_inputs(n, c, h, w, f, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((n, c, h, w)).astype(np.float32),
            rng.standard_normal((f, c, 3, 3)).astype(np.float32)]


def _statement(src):
    return tc.define(src, target="numpy").ir.statements[-1]


# ---------------------------------------------------------------- which statements qualify


def test_domain_guard_takes_a_padded_convolution():
    st = _statement(CONV_PAD)
    guard = domain_guard(st)
    assert guard is not None
    cond, rhs = guard
    assert "kh" in cond and "H" in cond
    assert rhs is st.rhs.then and statement_rhs(st) is rhs


@pytest.mark.parametrize("src", [
    # the other arm is not the reduction's identity
    "def f(float(N) A) -> (O) { O(i) +=! (i + k < N) ? A(i + k) : 1 where i in 0:N, k in 0:3 }",
    # a guard that is not affine (it reads a tensor)
    "def f(float(N) A) -> (O) { O(i) +=! (A(k) > 0) ? A(k) : 0 where i in 0:N, k in 0:N }",
    # max= : max(x, -inf) is not x for every x the select could give
    "def f(float(N) A) -> (O) { O(i) max=! (i + k < N) ? A(i + k) : -1.0 where i in 0:N, k in 0:3 }",
    # not a reduction: the zeros are written
    "def f(float(N) A) -> (O) { O(i) = (i >= 1) ? A(i - 1) : 0 where i in 0:N }",
])
def test_domain_guard_leaves_others_alone(src):
    st = _statement(src)
    assert domain_guard(st) is None and statement_rhs(st) is st.rhs


def test_domain_guard_swapped_arms_and_products():
    st = _statement("def f(float(N) A) -> (O) { O(i) +=! (i + k >= N) ? 0 : A(i + k) "
                    "where i in 0:N, k in 0:3 }")
    cond, rhs = domain_guard(st)
    assert rhs is st.rhs.orelse and "<" in cond  # the negated condition
    st = _statement("def f(float(N) A) -> (O) { O(i) *=! (i + k < N) ? A(i + k) : 1 "
                    "where i in 0:N, k in 0:3 }")
    assert domain_guard(st) is not None


def test_reduction_indices_follow_the_reads():
    """The guard names kh and kw first; the loops still run c, kh, kw (as in a valid conv)."""
    assert _statement(CONV_PAD).index_names == ("n", "f", "h", "w", "c", "kh", "kw")


# ---------------------------------------------------------------- results


@pytest.mark.parametrize("dims", [(2, 3, 7, 9, 5), (1, 1, 1, 1, 1), (1, 1, 5, 6, 16),
                                  (2, 2, 1, 4, 3), (1, 2, 3, 1, 2)])
def test_conv_pad_on_the_host(dims):
    inputs = _conv_inputs(*dims)
    got = tc.define(CONV_PAD, target="cpu")(*inputs)
    want = tc.define(CONV_PAD, target="numpy")(*inputs)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dims", [(2, 3, 7, 9, 5), (1, 1, 1, 1, 1), (1, 1, 5, 6, 16),
                                  (1, 2, 16, 15, 16)])
def test_conv_pad_emulated(dims):
    emulate(CONV_PAD, _conv_inputs(*dims))


def test_conv_pad_temp_emulated():
    emulate(CONV_PAD_TEMP, _conv_inputs(1, 2, 6, 7, 3))


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_stencil_padding_does_not_leak_inf(target):
    """B(0) is Inf: O(0) and O(1) multiply it only by the padding, which the guard skips
    (the reference gives finite values there); every other output is Inf as in the reference.
    cuda: the kernel runs on the emulator."""
    a = np.arange(1, 12, dtype=np.float32)
    b = np.array([np.inf, 1.0, 2.0, 3.0, 4.0], np.float32)
    want = tc.define(STENCIL, target="numpy")(a, b)
    assert np.isfinite(want[:2]).all() and np.isinf(want[2:]).all()
    if target == "cpu":
        got = tc.define(STENCIL, target="cpu")(a, b)
    else:
        kernel = tc.define(STENCIL, target="cuda").compile(a, b, target="cuda", arch="sm_90")
        arrays = {"A": a.copy(), "B": b.copy(), "O": np.full(a.shape, np.nan, np.float32)}
        emu.run_kernel(kernel, arrays, {"N": a.size, "K": b.size})
        got = arrays["O"]
    np.testing.assert_array_equal(got, want)


def test_stencil_on_the_host_at_awkward_sizes():
    for n, k in ((1, 5), (3, 5), (2, 1), (17, 4)):
        rng = np.random.default_rng(n)
        a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(k).astype(np.float32)
        np.testing.assert_allclose(tc.define(STENCIL, target="cpu")(a, b),
                                   tc.define(STENCIL, target="numpy")(a, b), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- the generated code


def test_conv_pad_kernel_is_a_register_tiled_valid_conv():
    """At the benchmark's size: the input tile in shared memory, the accumulators in registers
    (no local-memory depot: a border column's register index is a switch, not an address),
    the window's bounds as loop bounds, fused multiply-adds (no select per product)."""
    i = np.zeros((16, 64, 56, 56), np.float32)
    w = np.zeros((64, 64, 3, 3), np.float32)
    kernel = tc.define(CONV_PAD, target="cuda").compile(i, w, target="cuda", arch="sm_90")
    assert "I_sh0" in kernel.loops and "cpinit_O_reg0" in kernel.loops
    assert re.search(r"for \(int c\d+ = max\(0, ", kernel.loops)  # kh from the guard
    assert ".local" not in kernel.ptx
    assert "fma.rn.f32" in kernel.ptx and "mul.f32" not in kernel.ptx
