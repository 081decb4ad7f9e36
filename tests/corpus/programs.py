# ruff: noqa: E741  (oracle arguments are named like the TC tensors: I, O, ...)
"""Well-formed TC programs with independent numpy oracles: the corpus every backend must pass.

Each `Case` gives the TC source, the entry to call, ``make_inputs(rng, **sizes)`` (fresh random
inputs for one size assignment) and ``expected(*inputs)`` written with numpy alone (never with
tcmlir). ``sizes`` lists size assignments, awkward ones on purpose (1, primes, not multiples of
32) but small, so the whole corpus runs on the reference interpreter in seconds.

Semantics the oracles rely on (and that are easy to get wrong) are stated in comments in the TC
source: a fresh output (none passed with ``outputs=``) starts at zero; ``+=`` without ``!``
accumulates into the output's current contents; integer ``/`` and ``%`` truncate toward zero (C);
float literals are float32 and integer literals int32, so they do not widen a float32 expression.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

__all__ = ["CASES", "Case", "case_by_name"]

F16 = np.float16
F32 = np.float32
F64 = np.float64
I32 = np.int32


@dataclass(frozen=True)
class Case:
    """One corpus program.

    ``full_write``: the program writes every element of every output and reads none of its
    outputs' initial contents, so a test may pass poisoned ``outputs=`` arrays.
    ``rtol``: relative tolerance for float outputs (of the max |expected|); None = by dtype
    (float32 1e-4, float64 1e-10, float16 1e-2).
    """

    name: str
    source: str
    entry: str | None
    make_inputs: Callable[..., tuple[np.ndarray, ...]]
    expected: Callable[..., tuple[np.ndarray, ...]]
    sizes: tuple[Mapping[str, int], ...]
    rtol: float | None = None
    tags: frozenset[str] = field(default_factory=frozenset)
    full_write: bool = True


# ---------------------------------------------------------------- input helpers


def uniform(rng, *shape, lo=-1.0, hi=1.0, dtype=F32) -> np.ndarray:
    return rng.uniform(lo, hi, size=shape).astype(dtype)


def positive(rng, *shape, dtype=F32) -> np.ndarray:
    """Values in [0.1, 2): safe for log, sqrt, rsqrt, pow bases."""
    return rng.uniform(0.1, 2.0, size=shape).astype(dtype)


def ints(rng, *shape, lo=-100, hi=100, dtype=I32) -> np.ndarray:
    """Integers in [lo, hi] (negatives included by default)."""
    return rng.integers(lo, hi, size=shape, endpoint=True).astype(dtype)


def scalar(value, dtype=F32) -> np.ndarray:
    return np.array(value, dtype=dtype)


def d(x) -> np.ndarray:
    return np.asarray(x, dtype=F64)


def c_div(a: np.ndarray, b) -> np.ndarray:
    """C integer division (truncates toward zero), computed without floats."""
    a = a.astype(np.int64)
    b = np.asarray(b, dtype=np.int64)
    q = np.abs(a) // np.abs(b)
    return np.where((a < 0) != (b < 0), -q, q)


def c_mod(a: np.ndarray, b) -> np.ndarray:
    """C remainder: same sign as the dividend."""
    return a.astype(np.int64) - c_div(a, b) * np.asarray(b, dtype=np.int64)


def conv2d(I, W, stride=1) -> np.ndarray:
    """NCHW valid convolution (cross-correlation, as TC writes it), float64."""
    I, W = d(I), d(W)
    n, c, h, w = I.shape
    f, c2, kh, kw = W.shape
    assert c == c2
    oh = (h - kh) // stride + 1
    ow = (w - kw) // stride + 1
    out = np.zeros((n, f, oh, ow))
    for a in range(kh):
        for b in range(kw):
            patch = I[:, :, a : a + stride * (oh - 1) + 1 : stride, b : b + stride * (ow - 1) + 1 : stride]
            out += np.einsum("nchw,fc->nfhw", patch, W[:, :, a, b])
    return out


def pool2d(I, k, stride, reduce) -> np.ndarray:
    I = d(I)
    n, c, h, w = I.shape
    oh = (h - k) // stride + 1
    ow = (w - k) // stride + 1
    windows = np.empty((k * k, n, c, oh, ow))
    for a in range(k):
        for b in range(k):
            windows[a * k + b] = I[:, :, a : a + stride * (oh - 1) + 1 : stride,
                                   b : b + stride * (ow - 1) + 1 : stride]
    return reduce(windows, axis=0)


_erf = np.vectorize(math.erf, otypes=[F64])

CASES: list[Case] = []


def case(name, source, *, entry=None, inputs, expected, sizes, rtol=None, tags=(),
         full_write=True) -> None:
    CASES.append(Case(name, source, entry, inputs, expected, tuple(sizes), rtol,
                      frozenset(tags), full_write))


def case_by_name(name: str) -> Case:
    return next(c for c in CASES if c.name == name)


# ---------------------------------------------------------------- linear algebra

case(
    "matmul",
    """
def matmul(float(M, K) A, float(K, N) B) -> (C) {
    C(m, n) +=! A(m, k) * B(k, n)
}
""",
    inputs=lambda rng, M, K, N: (uniform(rng, M, K), uniform(rng, K, N)),
    expected=lambda A, B: ((d(A) @ d(B)).astype(F32),),
    sizes=[dict(M=1, K=1, N=1), dict(M=7, K=13, N=5), dict(M=33, K=31, N=17)],
    tags={"reduction", "matmul"},
)

case(
    "matmul_transposed",
    """
def tmm(float(M, K) A, float(N, K) B) -> (C) {
    C(m, n) +=! A(m, k) * B(n, k)
}
""",
    inputs=lambda rng, M, K, N: (uniform(rng, M, K), uniform(rng, N, K)),
    expected=lambda A, B: ((d(A) @ d(B).T).astype(F32),),
    sizes=[dict(M=1, K=7, N=3), dict(M=13, K=5, N=31)],
    tags={"reduction", "matmul"},
)

case(
    "batch_matmul",
    """
def batch_matmul(float(Bt, M, K) X, float(Bt, K, N) Y) -> (Z) {
    Z(b, m, n) +=! X(b, m, k) * Y(b, k, n)
}
""",
    inputs=lambda rng, Bt, M, K, N: (uniform(rng, Bt, M, K), uniform(rng, Bt, K, N)),
    expected=lambda X, Y: (np.matmul(d(X), d(Y)).astype(F32),),
    sizes=[dict(Bt=1, M=2, K=3, N=1), dict(Bt=3, M=7, K=5, N=13)],
    tags={"reduction", "matmul"},
)

case(
    "batch_matmul_transposed",
    """
def tbmm(float(Bt, N, K) X, float(Bt, M, K) Y) -> (Z) {
    Z(b, n, m) +=! X(b, n, k) * Y(b, m, k)
}
""",
    inputs=lambda rng, Bt, N, M, K: (uniform(rng, Bt, N, K), uniform(rng, Bt, M, K)),
    expected=lambda X, Y: (np.einsum("bnk,bmk->bnm", d(X), d(Y)).astype(F32),),
    sizes=[dict(Bt=2, N=3, M=1, K=7), dict(Bt=5, N=13, M=7, K=3)],
    tags={"reduction", "matmul"},
)

case(
    "matvec",
    """
def mv(float(R, C) A, float(C) x) -> (y) {
    y(i) +=! A(i, j) * x(j)
}
""",
    inputs=lambda rng, R, C: (uniform(rng, R, C), uniform(rng, C)),
    expected=lambda A, x: ((d(A) @ d(x)).astype(F32),),
    sizes=[dict(R=1, C=1), dict(R=31, C=7), dict(R=5, C=67)],
    tags={"reduction"},
)

case(
    "float64_matmul_and_exp",
    """
def matmul64(double(M, K) A, float64(K, N) B) -> (C, E) {
    C(m, n) +=! A(m, k) * B(k, n)
    # a float literal does not narrow a float64 expression: E is float64
    E(m, k) = exp(A(m, k)) * 0.5
}
""",
    inputs=lambda rng, M, K, N: (uniform(rng, M, K, dtype=F64), uniform(rng, K, N, dtype=F64)),
    expected=lambda A, B: (A @ B, np.exp(A) * 0.5),
    sizes=[dict(M=1, K=2, N=3), dict(M=13, K=7, N=11)],
    rtol=1e-12,
    tags={"reduction", "float64", "builtin"},
)

case(
    "annotated_outputs",
    """
def annotated(float(M, K) A, float(K, N) B) -> (float(M, N) C, float(M) rs) {
    C(m, n) +=! A(m, k) * B(k, n)
    rs(m) +=! C(m, n)          # an output may be read by a later statement
}
""",
    inputs=lambda rng, M, K, N: (uniform(rng, M, K), uniform(rng, K, N)),
    expected=lambda A, B: ((d(A) @ d(B)).astype(F32), (d(A) @ d(B)).sum(axis=1).astype(F32)),
    sizes=[dict(M=1, K=1, N=2), dict(M=7, K=13, N=3)],
    tags={"reduction", "annotated", "multi-output"},
)

case(
    "constant_dims",
    """
def const_dims(float(3, N) A, float(N, 2) B) -> (O, S) {
    O(r, c) +=! A(r, k) * B(k, c)
    S(j) +=! A(r, j)
}
""",
    inputs=lambda rng, N: (uniform(rng, 3, N), uniform(rng, N, 2)),
    expected=lambda A, B: ((d(A) @ d(B)).astype(F32), d(A).sum(axis=0).astype(F32)),
    sizes=[dict(N=1), dict(N=13)],
    tags={"reduction", "constant-dims", "multi-output"},
)

case(
    "transpose",
    """
def transpose(float(M, N) A) -> (O) {
    O(j, i) = A(i, j)
}
""",
    inputs=lambda rng, M, N: (uniform(rng, M, N),),
    expected=lambda A: (np.ascontiguousarray(A.T),),
    sizes=[dict(M=1, N=1), dict(M=7, N=33), dict(M=31, N=2)],
    tags={"pointwise"},
)

case(
    "outer_product",
    """
def outer(float(M) x, float(N) y) -> (O) {
    O(i, j) = x(i) * y(j)
}
""",
    inputs=lambda rng, M, N: (uniform(rng, M), uniform(rng, N)),
    expected=lambda x, y: (np.outer(d(x), d(y)).astype(F32),),
    sizes=[dict(M=1, N=5), dict(M=13, N=31)],
    tags={"pointwise"},
)

# ---------------------------------------------------------------- convolutions and pooling

case(
    "conv2d",
    """
def conv2d(float(N, C, H, W) I, float(F, C, KH, KW) W1) -> (O) {
    # output range inferred: h in [0, H - KH + 1), w in [0, W - KW + 1)
    O(n, f, h, w) +=! I(n, c, h + kh, w + kw) * W1(f, c, kh, kw)
}
""",
    inputs=lambda rng, N, C, H, W, F, KH, KW: (uniform(rng, N, C, H, W), uniform(rng, F, C, KH, KW)),
    expected=lambda I, W1: (conv2d(I, W1).astype(F32),),
    sizes=[
        dict(N=1, C=1, H=3, W=3, F=1, KH=3, KW=3),
        dict(N=2, C=3, H=7, W=5, F=4, KH=2, KW=3),
        dict(N=1, C=2, H=13, W=11, F=3, KH=3, KW=1),
    ],
    tags={"reduction", "conv"},
)

case(
    "conv2d_bias",
    """
def convolution(float(N, C, H, W) I, float(M, C, KH, KW) W1, float(M) B) -> (O) {
    O(n, m, h, w) +=! I(n, c, h + kh, w + kw) * W1(m, c, kh, kw)
    O(n, m, h, w) = O(n, m, h, w) + B(m)
}
""",
    inputs=lambda rng, N, C, H, W, M, KH, KW: (
        uniform(rng, N, C, H, W), uniform(rng, M, C, KH, KW), uniform(rng, M)),
    expected=lambda I, W1, B: ((conv2d(I, W1) + d(B)[None, :, None, None]).astype(F32),),
    sizes=[dict(N=1, C=2, H=5, W=7, M=3, KH=3, KW=2), dict(N=2, C=1, H=4, W=4, M=1, KH=1, KW=1)],
    tags={"reduction", "conv", "multi-statement"},
)

case(
    "group_conv",
    """
def group_convolution(float(N, G, C, H, W) I, float(G, F, C, KH, KW) W1, float(G, F) B)
-> (O)
{
    O(n, g, f, h, w) +=! I(n, g, c, h + kh, w + kw) * W1(g, f, c, kh, kw)
    O(n, g, f, h, w) = O(n, g, f, h, w) + B(g, f)
}
""",
    inputs=lambda rng, N, G, C, H, W, F, KH, KW: (
        uniform(rng, N, G, C, H, W), uniform(rng, G, F, C, KH, KW), uniform(rng, G, F)),
    expected=lambda I, W1, B: (
        (np.stack([conv2d(I[:, g], W1[g]) for g in range(I.shape[1])], axis=1)
         + d(B)[None, :, :, None, None]).astype(F32),),
    sizes=[
        dict(N=1, G=2, C=1, H=3, W=3, F=1, KH=3, KW=3),
        dict(N=2, G=3, C=2, H=7, W=6, F=2, KH=3, KW=2),
    ],
    tags={"reduction", "conv", "multi-statement"},
)

case(
    "strided_conv_inferred",
    """
def strided_conv(float(N, C, H, W) I, float(F, C, KH, KW) W1) -> (O) {
    # kh, kw get their ranges from W1 first; then 2*h + kh < H for every kh in [0, KH)
    # gives h in [0, (H - KH) / 2 + 1) (floor division), and likewise w
    O(n, f, h, w) +=! I(n, c, 2 * h + kh, 2 * w + kw) * W1(f, c, kh, kw)
}
""",
    inputs=lambda rng, N, C, H, W, F, KH, KW: (uniform(rng, N, C, H, W), uniform(rng, F, C, KH, KW)),
    expected=lambda I, W1: (conv2d(I, W1, stride=2).astype(F32),),
    sizes=[
        dict(N=1, C=1, H=3, W=3, F=1, KH=3, KW=3),
        dict(N=2, C=3, H=7, W=8, F=2, KH=3, KW=2),
        dict(N=1, C=1, H=13, W=5, F=3, KH=2, KW=1),
    ],
    tags={"reduction", "conv", "strided"},
)

case(
    "strided_conv_where",
    """
def strided_conv_where(float(N, C, H, W) I, float(F, C, KH, KW) W1) -> (O) {
    O(n, f, h, w) +=! I(n, c, 2 * h + kh, 2 * w + kw) * W1(f, c, kh, kw)
        where h in 0:(H - KH) / 2 + 1, w in 0:(W - KW) / 2 + 1
}
""",
    inputs=lambda rng, N, C, H, W, F, KH, KW: (uniform(rng, N, C, H, W), uniform(rng, F, C, KH, KW)),
    expected=lambda I, W1: (conv2d(I, W1, stride=2).astype(F32),),
    sizes=[dict(N=1, C=2, H=7, W=6, F=2, KH=3, KW=3), dict(N=2, C=1, H=2, W=9, F=1, KH=1, KW=2)],
    tags={"reduction", "conv", "strided", "where"},
)

case(
    "maxpool",
    """
def maxpool(float(N, C, H, W) I) -> (O) {
    # 2x2 window, stride 2; kh, kw are bounded only by the where clause
    O(n, c, h, w) max=! I(n, c, 2 * h + kh, 2 * w + kw) where kh in 0:2, kw in 0:2
}
""",
    inputs=lambda rng, N, C, H, W: (uniform(rng, N, C, H, W),),
    expected=lambda I: (pool2d(I, 2, 2, np.max).astype(F32),),
    sizes=[dict(N=1, C=1, H=2, W=2), dict(N=2, C=3, H=7, W=13), dict(N=1, C=2, H=8, W=5)],
    tags={"reduction", "pooling", "where"},
)

case(
    "avgpool",
    """
def avgpool(float(N, C, H, W) I) -> (O) {
    # 3x3 window, stride 1; an int literal divisor promotes to float
    O(n, c, h, w) +=! I(n, c, h + kh, w + kw) / 9 where kh in 0:3, kw in 0:3
}
""",
    inputs=lambda rng, N, C, H, W: (uniform(rng, N, C, H, W),),
    expected=lambda I: (pool2d(I, 3, 1, np.mean).astype(F32),),
    sizes=[dict(N=1, C=1, H=3, W=3), dict(N=2, C=2, H=7, W=11)],
    tags={"reduction", "pooling", "where"},
)

case(
    "conv1d",
    """
def conv1d(float(N) A, float(K) Wt) -> (O) {
    O(i) +=! A(i + k) * Wt(k)     # i in [0, N - K + 1)
}
""",
    inputs=lambda rng, N, K: (uniform(rng, N), uniform(rng, K)),
    expected=lambda A, Wt: (np.correlate(d(A), d(Wt), mode="valid").astype(F32),),
    sizes=[dict(N=1, K=1), dict(N=13, K=3), dict(N=31, K=31)],
    tags={"reduction", "conv"},
)

case(
    "stencil_offsets",
    """
def stencil(float(N) A) -> (O) {
    # i's range is inferred as [0, N - 2): the largest range keeping A(i + 2) in bounds
    O(i) = A(i) + A(i + 1) + A(i + 2)
}
""",
    inputs=lambda rng, N: (uniform(rng, N),),
    expected=lambda A: ((d(A)[:-2] + d(A)[1:-1] + d(A)[2:]).astype(F32),),
    sizes=[dict(N=3), dict(N=7), dict(N=31)],
    tags={"pointwise", "stencil"},
)

case(
    "stencil_negative_offset",
    """
def centered(float(N) A) -> (O) {
    # i in [1, N - 1); O's size is the range's upper bound, N - 1, and O(0) is never
    # written: a fresh output starts at zero, so O(0) == 0
    O(i) = A(i - 1) - A(i + 1)
}
""",
    inputs=lambda rng, N: (uniform(rng, N),),
    expected=lambda A: (np.concatenate([[0.0], d(A)[:-2] - d(A)[2:]]).astype(F32),),
    sizes=[dict(N=3), dict(N=13)],
    tags={"pointwise", "stencil", "partial-write"},
    full_write=False,
)

case(
    "fused_diagonal_stencil",
    """
def diagonal(float(N, M) A) -> (O, P) {
    # fused (fusion=max), the three statements need a skewed schedule (i + j) to stay tilable
    T(i, j) = A(i, j) * 2.0
    O(i, j) = T(i + 1, j) - T(i, j + 1) where i in 0:N-1, j in 0:M-1
    P(i, j) = O(i + 1, j) + O(i, j + 1) where i in 0:N-2, j in 0:M-2
}
""",
    inputs=lambda rng, N, M: (uniform(rng, N, M),),
    expected=lambda A: _diagonal(A),
    sizes=[dict(N=3, M=3), dict(N=9, M=14)],
    tags={"pointwise", "stencil", "temporary", "skew"},
)


def _diagonal(A):
    T = A * F32(2)
    O = T[1:, :-1] - T[:-1, 1:]
    return O, O[1:, :-1] + O[:-1, 1:]


case(
    "reversed_temporary",
    """
def reversed(float(N, M) A) -> (O) {
    # fused, the consumer runs backwards in i: a negative schedule coefficient
    T(i, j) = A(i, j) * 2.0
    O(i, j) = T(N - 1 - i, j) + T(N - 1 - i, M - 1 - j)
}
""",
    inputs=lambda rng, N, M: (uniform(rng, N, M),),
    expected=lambda A: ((A * F32(2))[::-1, :] + (A * F32(2))[::-1, ::-1],),
    sizes=[dict(N=1, M=1), dict(N=9, M=11)],
    tags={"pointwise", "temporary", "orthant"},
)

# ---------------------------------------------------------------- normalisations

case(
    "softmax_outputs",
    """
def softmax(float(N, D) I) -> (O, expsum, maxVal) {
    maxVal(n) max=! I(n, d)
    expsum(n) +=! exp(I(n, d) - maxVal(n))
    O(n, d) = exp(I(n, d) - maxVal(n)) / expsum(n)
}
""",
    inputs=lambda rng, N, D: (uniform(rng, N, D, lo=-4, hi=4),),
    expected=lambda I: (
        (np.exp(d(I) - d(I).max(1, keepdims=True))
         / np.exp(d(I) - d(I).max(1, keepdims=True)).sum(1, keepdims=True)).astype(F32),
        np.exp(d(I) - d(I).max(1, keepdims=True)).sum(1).astype(F32),
        I.max(1),
    ),
    sizes=[dict(N=1, D=1), dict(N=7, D=33), dict(N=13, D=5)],
    tags={"reduction", "builtin", "multi-output"},
)

case(
    "softmax_temporaries",
    """
def softmax_tmp(float(N, D) I) -> (O) {
    mx(n) max=! I(n, d)            # mx, e and s are temporaries
    e(n, d) = exp(I(n, d) - mx(n))
    s(n) +=! e(n, d)
    O(n, d) = e(n, d) / s(n)
}
""",
    inputs=lambda rng, N, D: (uniform(rng, N, D, lo=-4, hi=4),),
    expected=lambda I: (
        (np.exp(d(I) - d(I).max(1, keepdims=True))
         / np.exp(d(I) - d(I).max(1, keepdims=True)).sum(1, keepdims=True)).astype(F32),),
    sizes=[dict(N=1, D=2), dict(N=5, D=31)],
    tags={"reduction", "builtin", "temporary"},
)


def _layernorm(I, eps):
    I = d(I)
    mean = I.mean(axis=1, keepdims=True)
    var = ((I - mean) ** 2).mean(axis=1, keepdims=True)
    return ((I - mean) / np.sqrt(var + float(eps))).astype(F32)


case(
    "layernorm",
    """
def layernorm(float(T, D) I, float eps) -> (O) {
    mean(t) +=! I(t, d) / D         # a size name is an integer value
    c(t, d) = I(t, d) - mean(t)
    var(t) +=! c(t, d) * c(t, d) / D
    O(t, d) = c(t, d) * rsqrt(var(t) + eps)
}
""",
    inputs=lambda rng, T, D: (uniform(rng, T, D, lo=-3, hi=3), scalar(1e-5)),
    expected=lambda I, eps: (_layernorm(I, eps),),
    sizes=[dict(T=1, D=2), dict(T=7, D=13), dict(T=3, D=64)],
    rtol=2e-4,
    tags={"reduction", "temporary", "scalar", "builtin"},
)

case(
    "row_normalize_temporary",
    """
def normalize(float(M, N) A) -> (O) {
    S(i) +=! A(i, j) * A(i, j)      # S is written and read, not returned
    O(i, j) = A(i, j) * rsqrt(S(i) + 1)
}
""",
    inputs=lambda rng, M, N: (uniform(rng, M, N),),
    expected=lambda A: ((d(A) / np.sqrt((d(A) ** 2).sum(1, keepdims=True) + 1)).astype(F32),),
    sizes=[dict(M=1, N=1), dict(M=13, N=7)],
    tags={"reduction", "temporary", "builtin"},
)

case(
    "fc_bias_relu",
    """
def fcrelu(float(B, M) I, float(N, M) W1, float(N) B1) -> (O1) {
    O1(b, n) +=! I(b, m) * W1(n, m)
    O1(b, n) = O1(b, n) + B1(n)
    O1(b, n) = fmax(O1(b, n), 0)
}
""",
    inputs=lambda rng, B, M, N: (uniform(rng, B, M), uniform(rng, N, M), uniform(rng, N)),
    expected=lambda I, W1, B1: (np.maximum(d(I) @ d(W1).T + d(B1), 0).astype(F32),),
    sizes=[dict(B=1, M=1, N=1), dict(B=7, M=13, N=31)],
    tags={"reduction", "multi-statement", "builtin"},
)

case(
    "mlp2_temporary",
    """
def mlp2(float(B, M) I, float(N, M) W1, float(N) B1, float(P, N) W2, float(P) B2) -> (O2) {
    O1(b, n) +=! I(b, m) * W1(n, m)
    O1(b, n) = fmax(O1(b, n) + B1(n), 0)     # O1: a temporary updated in place
    O2(b, p) +=! O1(b, n) * W2(p, n)
    O2(b, p) = O2(b, p) + B2(p)
}
""",
    inputs=lambda rng, B, M, N, P: (uniform(rng, B, M), uniform(rng, N, M), uniform(rng, N),
                                    uniform(rng, P, N), uniform(rng, P)),
    expected=lambda I, W1, B1, W2, B2: (
        (np.maximum(d(I) @ d(W1).T + d(B1), 0) @ d(W2).T + d(B2)).astype(F32),),
    sizes=[dict(B=1, M=2, N=3, P=1), dict(B=5, M=7, N=13, P=3)],
    tags={"reduction", "temporary", "multi-statement"},
)

# ---------------------------------------------------------------- reductions

case(
    "reduce_sum_rows_cols",
    """
def sums(float(M, N) A) -> (R, Cs) {
    R(i) +=! A(i, j)
    Cs(j) +=! A(i, j)
}
""",
    inputs=lambda rng, M, N: (uniform(rng, M, N),),
    expected=lambda A: (d(A).sum(1).astype(F32), d(A).sum(0).astype(F32)),
    sizes=[dict(M=1, N=1), dict(M=7, N=31), dict(M=33, N=3)],
    tags={"reduction", "multi-output"},
)

case(
    "reduce_prod",
    """
def prod(float(M, N) A) -> (P) {
    P(i) *=! A(i, j)             # the ! form starts from 1
}
""",
    inputs=lambda rng, M, N: (uniform(rng, M, N, lo=0.5, hi=1.5),),
    expected=lambda A: (np.prod(d(A), axis=1).astype(F32),),
    sizes=[dict(M=1, N=1), dict(M=7, N=13)],
    tags={"reduction"},
)

case(
    "reduce_min",
    """
def rmin(float(M, N) A) -> (Mn) {
    Mn(i) min=! A(i, j)          # the ! form starts from +inf
}
""",
    inputs=lambda rng, M, N: (uniform(rng, M, N, lo=5, hi=9),),
    expected=lambda A: (A.min(1),),
    sizes=[dict(M=1, N=1), dict(M=13, N=7)],
    tags={"reduction"},
)

case(
    "reduce_max",
    """
def rmax(float(M, N) A) -> (Mx) {
    Mx(i) max=! A(i, j)          # the ! form starts from -inf
}
""",
    inputs=lambda rng, M, N: (uniform(rng, M, N, lo=-9, hi=-5),),
    expected=lambda A: (A.max(1),),
    sizes=[dict(M=1, N=1), dict(M=5, N=31)],
    tags={"reduction"},
)

case(
    "reduce_int32",
    """
def int_reduce(int32(M, N) A) -> (S, Mn, Mx, P) {
    S(i) +=! A(i, j)
    Mn(i) min=! A(i, j)
    Mx(i) max=! A(i, j)
    # factors -2, -1, 1, 2 (C remainders, 0 replaced by 1): never 0, |P| <= 2^13
    P(i) *=! (A(i, j) % 3 == 0) ? 1 : A(i, j) % 3
}
""",
    inputs=lambda rng, M, N: (ints(rng, M, N, lo=-1000, hi=1000),),
    expected=lambda A: (
        A.sum(1, dtype=np.int64).astype(I32), A.min(1), A.max(1),
        np.prod(np.where(c_mod(A, 3) == 0, 1, c_mod(A, 3)), axis=1).astype(I32),
    ),
    sizes=[dict(M=1, N=1), dict(M=7, N=13)],
    tags={"reduction", "int32", "multi-output"},
)

case(
    "init_then_accumulate",
    """
def init_then_accumulate(float(M, N) A, float(M) Bias) -> (O, Mx, Pr) {
    # `=` initialises; the following reduction without `!` accumulates onto that value
    O(i) = Bias(i)
    O(i) += A(i, j)
    Mx(i) = A(i, 0)
    Mx(i) max= A(i, j)
    Pr(i) = Bias(i)
    Pr(i) *= A(i, j) + 1.5
}
""",
    inputs=lambda rng, M, N: (uniform(rng, M, N, lo=-0.5, hi=0.5), uniform(rng, M)),
    expected=lambda A, Bias: (
        (d(Bias) + d(A).sum(1)).astype(F32), A.max(1),
        (d(Bias) * np.prod(d(A) + 1.5, axis=1)).astype(F32)),
    sizes=[dict(M=1, N=1), dict(M=7, N=5), dict(M=2, N=13)],
    tags={"reduction", "multi-statement", "accumulate"},
)

case(
    "accumulate_into_fresh_output",
    """
def accumulate(float(M, N) A) -> (O) {
    # `+=` without `!` accumulates into O's current contents; a fresh output starts at zero
    O(i) += A(i, j)
}
""",
    inputs=lambda rng, M, N: (uniform(rng, M, N),),
    expected=lambda A: (d(A).sum(1).astype(F32),),
    sizes=[dict(M=1, N=3), dict(M=13, N=7)],
    tags={"reduction", "accumulate"},
    full_write=False,
)

case(
    "where_subrange_reduction",
    """
def skip_first(float(M, N) A) -> (O) {
    # all columns but the first; for N == 1 the range is empty and the ! form leaves 0
    O(i) +=! A(i, j) where j in 1:N
}
""",
    inputs=lambda rng, M, N: (uniform(rng, M, N),),
    expected=lambda A: (d(A)[:, 1:].sum(1).astype(F32),),
    sizes=[dict(M=1, N=1), dict(M=3, N=2), dict(M=7, N=13)],
    tags={"reduction", "where"},
)

# ---------------------------------------------------------------- gathers

case(
    "embedding_gather",
    """
def embedding(float(V, D) E, int32(L) idx) -> (O) {
    O(i, j) = E(idx(i), j)
}
""",
    inputs=lambda rng, V, D, L: (uniform(rng, V, D), ints(rng, L, lo=0, hi=V - 1)),
    expected=lambda E, idx: (E[idx],),
    sizes=[dict(V=1, D=1, L=1), dict(V=13, D=7, L=31), dict(V=5, D=33, L=3)],
    tags={"gather", "int32"},
)

case(
    "embedding_bag",
    """
def embedding_bag(float(V, D) E, int32(Bt, L) idx) -> (O) {
    O(b, d) +=! E(idx(b, l), d)
}
""",
    inputs=lambda rng, V, D, Bt, L: (uniform(rng, V, D), ints(rng, Bt, L, lo=0, hi=V - 1)),
    expected=lambda E, idx: (d(E)[idx].sum(axis=1).astype(F32),),
    sizes=[dict(V=2, D=3, Bt=1, L=1), dict(V=17, D=5, Bt=7, L=4)],
    tags={"gather", "reduction", "int32"},
)

# ---------------------------------------------------------------- pointwise, ternaries, built-ins

case(
    "relu_ternary",
    """
def relu(float(N) A) -> (O) {
    O(i) = A(i) > 0 ? A(i) : 0       # the int literal 0 becomes float: O is float32
}
""",
    inputs=lambda rng, N: (uniform(rng, N),),
    expected=lambda A: (np.where(A > 0, A, F32(0)),),
    sizes=[dict(N=1), dict(N=31), dict(N=100)],
    tags={"pointwise", "ternary"},
)

case(
    "leaky_relu",
    """
def leaky_relu(float(M, N) A) -> (O) {
    O(i, j) = A(i, j) > 0 ? A(i, j) : 0.01 * A(i, j)
}
""",
    inputs=lambda rng, M, N: (uniform(rng, M, N),),
    expected=lambda A: (np.where(A > 0, d(A), 0.01 * d(A)).astype(F32),),
    sizes=[dict(M=1, N=1), dict(M=7, N=13)],
    tags={"pointwise", "ternary"},
)

case(
    "ternary_chain_precedence",
    """
def precedence(float(N) A, float(N) B) -> (O, P) {
    O(i) = A(i) + B(i) * 2 - A(i) / 4 * 3           # * / bind tighter; left-associative
    P(i) = -A(i) * B(i) > 0 ? 1.0 : A(i) < B(i) ? 2.0 : 3.0   # ?: is right-associative
}
""",
    inputs=lambda rng, N: (uniform(rng, N), uniform(rng, N)),
    expected=lambda A, B: (
        (d(A) + d(B) * 2 - d(A) / 4 * 3).astype(F32),
        np.where(-d(A) * d(B) > 0, 1.0, np.where(A < B, 2.0, 3.0)).astype(F32)),
    sizes=[dict(N=1), dict(N=31)],
    tags={"pointwise", "ternary", "precedence"},
)

case(
    "lower_triangle_index_compare",
    """
def tril(float(N, N) A) -> (O) {
    O(i, j) = i >= j ? A(i, j) : 0     # indices compared as integers
}
""",
    inputs=lambda rng, N: (uniform(rng, N, N),),
    expected=lambda A: (np.tril(A),),
    sizes=[dict(N=1), dict(N=7), dict(N=13)],
    tags={"pointwise", "ternary", "index-value"},
)

case(
    "unary_builtins",
    """
def unary_builtins(float(N) A, float(N) P) -> (E1, E2, E3, E4, E5, E6, E7, E8) {
    E1(i) = exp(A(i))
    E2(i) = log(P(i))                 # P > 0
    E3(i) = tanh(A(i))
    E4(i) = sqrt(P(i))
    E5(i) = rsqrt(P(i))
    E6(i) = fabs(A(i))
    E7(i) = erf(A(i))
    E8(i) = 1 / (1 + exp(-A(i)))      # sigmoid
}
""",
    inputs=lambda rng, N: (uniform(rng, N, lo=-3, hi=3), positive(rng, N)),
    expected=lambda A, P: tuple(x.astype(F32) for x in (
        np.exp(d(A)), np.log(d(P)), np.tanh(d(A)), np.sqrt(d(P)), 1 / np.sqrt(d(P)),
        np.abs(d(A)), _erf(d(A)), 1 / (1 + np.exp(-d(A))))),
    sizes=[dict(N=1), dict(N=37)],
    tags={"pointwise", "builtin", "multi-output"},
)

case(
    "binary_builtins",
    """
def binary_builtins(float(N) A, float(N) B, float(N) P) -> (O1, O2, O3, O4, O5, O6) {
    O1(i) = fmax(A(i), B(i))
    O2(i) = fmin(A(i), B(i))
    O3(i) = pow(P(i), A(i))          # P > 0
    O4(i) = min(A(i), 0.25)
    O5(i) = max(A(i), B(i)) - min(A(i), B(i))
    O6(i) = atan2(A(i), B(i))
}
""",
    inputs=lambda rng, N: (uniform(rng, N), uniform(rng, N), positive(rng, N)),
    expected=lambda A, B, P: tuple(x.astype(F32) for x in (
        np.fmax(d(A), d(B)), np.fmin(d(A), d(B)), np.power(d(P), d(A)),
        np.minimum(d(A), 0.25), np.abs(d(A) - d(B)), np.arctan2(d(A), d(B)))),
    sizes=[dict(N=1), dict(N=29)],
    tags={"pointwise", "builtin", "multi-output"},
)

case(
    "elementwise_chain",
    """
def chain(float(M, N) A, float(M, N) B, float(M, N) C) -> (O) {
    O(i, j) = tanh((A(i, j) + B(i, j)) * C(i, j) - A(i, j) / (1 + B(i, j) * B(i, j)))
}
""",
    inputs=lambda rng, M, N: (uniform(rng, M, N), uniform(rng, M, N), uniform(rng, M, N)),
    expected=lambda A, B, C: (
        np.tanh((d(A) + d(B)) * d(C) - d(A) / (1 + d(B) ** 2)).astype(F32),),
    sizes=[dict(M=1, N=1), dict(M=13, N=33)],
    tags={"pointwise", "builtin"},
)

case(
    "scalar_inputs",
    """
def axpby(float alpha, float(M, N) X, float beta, float(M, N) Y) -> (O) {
    O(i, j) = alpha * X(i, j) + beta * Y(i, j)
}
""",
    inputs=lambda rng, M, N: (scalar(rng.uniform(-2, 2)), uniform(rng, M, N),
                              scalar(rng.uniform(-2, 2)), uniform(rng, M, N)),
    expected=lambda alpha, X, beta, Y: ((d(alpha) * d(X) + d(beta) * d(Y)).astype(F32),),
    sizes=[dict(M=1, N=1), dict(M=7, N=31)],
    tags={"pointwise", "scalar"},
)

# ---------------------------------------------------------------- integer, bool, narrow types


def _int_arith(A, B, Dv):
    return (c_div(A, 3).astype(I32), c_mod(A, 3).astype(I32), (A * B - A + 7).astype(I32),
            c_div(A, Dv).astype(I32), c_mod(A, Dv).astype(I32))


case(
    "int32_arithmetic",
    """
def int_arith(int32(N) A, int32(N) B, int32(N) Dv) -> (Q, R, S, Q2, R2) {
    # integer / and % follow C: truncation toward zero (-7 / 3 == -2, -7 % 3 == -1)
    Q(i) = A(i) / 3
    R(i) = A(i) % 3
    S(i) = A(i) * B(i) - A(i) + 7
    Q2(i) = A(i) / Dv(i)              # Dv is never 0, either sign
    R2(i) = A(i) % Dv(i)
}
""",
    inputs=lambda rng, N: (
        ints(rng, N), ints(rng, N),
        (ints(rng, N, lo=1, hi=9) * rng.choice(np.array([-1, 1], dtype=I32), size=N)).astype(I32)),
    expected=_int_arith,
    sizes=[dict(N=1), dict(N=64)],
    tags={"pointwise", "int32", "multi-output"},
)

case(
    "casts",
    """
def casts(int32(N) X, float(N) A) -> (O, T) {
    O(i) = float(X(i)) / 2        # float division after the cast: 7 -> 3.5
    T(i) = int32(A(i) * 10)       # float -> int truncates toward zero
}
""",
    inputs=lambda rng, N: (ints(rng, N), uniform(rng, N, lo=-5, hi=5)),
    expected=lambda X, A: ((d(X) / 2).astype(F32), np.trunc(A * F32(10)).astype(I32)),
    sizes=[dict(N=1), dict(N=31)],
    tags={"pointwise", "cast", "int32"},
)

case(
    "bool_outputs",
    """
def compare(float(N) A, float(N) B, int32(N) X, int32(N) Y) -> (GT, EQ, BOTH, NEG) {
    GT(i) = A(i) > B(i)               # comparisons give bool tensors
    EQ(i) = X(i) == Y(i)
    BOTH(i) = A(i) > 0 && X(i) <= Y(i)
    NEG(i) = !(A(i) > B(i)) || X(i) != Y(i)
}
""",
    inputs=lambda rng, N: (uniform(rng, N), uniform(rng, N), ints(rng, N, lo=0, hi=2),
                           ints(rng, N, lo=0, hi=2)),
    expected=lambda A, B, X, Y: (A > B, X == Y, (A > 0) & (X <= Y), ~(A > B) | (X != Y)),
    sizes=[dict(N=1), dict(N=41)],
    tags={"pointwise", "bool", "multi-output"},
)

case(
    "bool_input_select",
    """
def select_mask(bool(N) Mk, float(N) A) -> (O) {
    O(i) = Mk(i) ? A(i) : -A(i)
}
""",
    inputs=lambda rng, N: (rng.integers(0, 2, size=N).astype(np.bool_), uniform(rng, N)),
    expected=lambda Mk, A: (np.where(Mk, A, -A),),
    sizes=[dict(N=1), dict(N=33)],
    tags={"pointwise", "bool", "ternary"},
)

case(
    "uint8",
    """
def u8(uint8(N) A, uint8(N) B) -> (uint8(N) O, M) {
    O(i) = A(i) + B(i)            # inputs < 128: no wraparound either way
    M(i) = max(A(i), B(i))        # bare output: uint8
}
""",
    inputs=lambda rng, N: (ints(rng, N, lo=0, hi=127, dtype=np.uint8),
                           ints(rng, N, lo=0, hi=127, dtype=np.uint8)),
    expected=lambda A, B: ((A + B).astype(np.uint8), np.maximum(A, B)),
    sizes=[dict(N=1), dict(N=37)],
    tags={"pointwise", "uint8", "annotated"},
)

case(
    "float16",
    """
def half(float16(N) A, float16(N) B) -> (O) {
    # computed in float32 (half types are storage types) and stored as float16: a bare
    # output takes the operands' type, as `half * half` does in CUDA
    O(i) = A(i) * B(i) + A(i)
}
""",
    inputs=lambda rng, N: (uniform(rng, N, dtype=F16), uniform(rng, N, dtype=F16)),
    expected=lambda A, B: ((A.astype(F32) * B.astype(F32) + A.astype(F32)).astype(F16),),
    sizes=[dict(N=1), dict(N=33)],
    rtol=2e-3,
    tags={"pointwise", "float16"},
)

case(
    "float16_annotated",
    """
def half_annotated(float16(M, N) A, float16(N) B) -> (float16(M, N) O, float(M) S) {
    O(i, j) = A(i, j) * B(j) - 0.5
    S(i) +=! A(i, j)              # float32 output: the sum is not rounded to half
}
""",
    inputs=lambda rng, M, N: (uniform(rng, M, N, dtype=F16), uniform(rng, N, dtype=F16)),
    expected=lambda A, B: ((A.astype(F32) * B.astype(F32) - F32(0.5)).astype(F16),
                           A.astype(F64).sum(1).astype(F32)),
    sizes=[dict(M=1, N=1), dict(M=5, N=33)],
    rtol=2e-3,
    tags={"pointwise", "reduction", "float16", "annotated"},
)



def bf16():
    """numpy's bfloat16 (from ml_dtypes, in the test extras), imported when a case needs it."""
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


case(
    "bfloat16",
    """
def brain(bfloat16(N) A, bfloat16(N) B) -> (O, float(N) W) {
    # computed in float32 and stored rounded to nearest even; a bare output takes bfloat16
    O(i) = A(i) * B(i) + A(i)
    W(i) = A(i) - B(i)            # float32 output: exact for bfloat16 operands this close
}
""",
    inputs=lambda rng, N: (uniform(rng, N).astype(bf16()), uniform(rng, N).astype(bf16())),
    expected=lambda A, B: ((A.astype(F32) * B.astype(F32) + A.astype(F32)).astype(bf16()),
                           A.astype(F32) - B.astype(F32)),
    sizes=[dict(N=1), dict(N=37)],
    rtol=1e-2,
    tags={"pointwise", "bfloat16", "annotated"},
)

case(
    "bfloat16_row_sum",
    """
def brain_sum(bfloat16(M, N) X) -> (float(M) S, bfloat16(M) Mx) {
    S(i) +=! X(i, j)              # float32 output: the sum is not rounded to bfloat16
    Mx(i) max=! X(i, j)
}
""",
    inputs=lambda rng, M, N: (uniform(rng, M, N, lo=-4, hi=4).astype(bf16()),),
    expected=lambda X: (X.astype(F64).sum(1).astype(F32), X.max(1)),
    sizes=[dict(M=1, N=1), dict(M=6, N=41)],
    tags={"reduction", "bfloat16", "annotated"},
)

# ---------------------------------------------------------------- language features


case(
    "lets",
    """
def lets(float(N) A, float(N) B) -> (O) {
    O(i) = x * x + y where x = A(i) + B(i), y = A(i) * B(i), i in 0:N
}
""",
    inputs=lambda rng, N: (uniform(rng, N), uniform(rng, N)),
    expected=lambda A, B: (((d(A) + d(B)) ** 2 + d(A) * d(B)).astype(F32),),
    sizes=[dict(N=1), dict(N=13)],
    tags={"pointwise", "let", "where"},
)

case(
    "exists_fill",
    """
def fill(float(N) A) -> (O, Z) {
    # the values do not read A: `exists` only gives i its range [0, N)
    O(i) = 2.5 where exists A(i)      # a float literal is float32
    Z(i) = 7 where exists A(i)        # an int literal is int32
}
""",
    inputs=lambda rng, N: (uniform(rng, N),),
    expected=lambda A: (np.full(A.shape, 2.5, dtype=F32), np.full(A.shape, 7, dtype=I32)),
    sizes=[dict(N=1), dict(N=13)],
    tags={"pointwise", "exists", "literal-typing"},
)

case(
    "dim_ref",
    """
def rowmean(float(M, N) A) -> (O, W) {
    O(i) +=! A(i, j) / A.1        # A.1 is the size of A's dimension 1 (N)
    W(i) = A(i, 0) * A.0          # A.0 is M
}
""",
    inputs=lambda rng, M, N: (uniform(rng, M, N),),
    expected=lambda A: (d(A).mean(1).astype(F32), (d(A)[:, 0] * A.shape[0]).astype(F32)),
    sizes=[dict(M=1, N=1), dict(M=7, N=13)],
    tags={"reduction", "dim-ref"},
)

case(
    "sizes_and_indices_as_values",
    """
def iota(float(M, N) A) -> (O, P) {
    O(i, j) = A(i, j) + i * N + j     # index and size names are integer values
    P(i) = A(i, 0) * (M - i)
}
""",
    inputs=lambda rng, M, N: (uniform(rng, M, N),),
    expected=lambda A: (
        (d(A) + np.arange(A.shape[0])[:, None] * A.shape[1] + np.arange(A.shape[1])[None, :]).astype(F32),
        (d(A)[:, 0] * (A.shape[0] - np.arange(A.shape[0]))).astype(F32)),
    sizes=[dict(M=1, N=1), dict(M=7, N=5)],
    tags={"pointwise", "index-value", "size-value"},
)

case(
    "multi_def_entry",
    """
# three definitions in one source; the test calls the second
def scale(float(N) A) -> (O) {
    O(i) = A(i) * 2
}

def shift_scale(float(N) A, float(N) B) -> (O) {
    O(i) = A(i) * 3 + B(i)
}

def unused(float(N, M) A) -> (O) {
    O(i) +=! A(i, j)
}
""",
    entry="shift_scale",
    inputs=lambda rng, N: (uniform(rng, N), uniform(rng, N)),
    expected=lambda A, B: ((d(A) * 3 + d(B)).astype(F32),),
    sizes=[dict(N=1), dict(N=17)],
    tags={"pointwise", "multi-def"},
)

case(
    "comments_everywhere",
    """# a comment before the definition
def commented(   # the signature
    float(N) A,  # first input
    float(N) B   # second input
) -> (           # outputs
    O
) {              # body
    # a full-line comment
    O(i) = A(i) - B(i)   # a trailing comment with symbols: +=! -> ( } #
    # a comment before the closing brace
}
# a comment at the end""",
    inputs=lambda rng, N: (uniform(rng, N), uniform(rng, N)),
    expected=lambda A, B: (A - B,),
    sizes=[dict(N=1), dict(N=9)],
    tags={"pointwise", "comments"},
)

case(
    "partial_write_annotated",
    """
def partial(float(N) A) -> (float(N) O) {
    # only O(0 .. N-2) is written; a fresh output starts at zero, so O(N-1) == 0
    O(i) = A(i) * 2 where i in 0:N-1
}
""",
    inputs=lambda rng, N: (uniform(rng, N),),
    expected=lambda A: (np.concatenate([d(A)[:-1] * 2, [0.0]]).astype(F32),),
    sizes=[dict(N=2), dict(N=13)],
    tags={"pointwise", "where", "partial-write", "annotated"},
    full_write=False,
)
