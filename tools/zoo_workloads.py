"""The workload zoo's data: TC programs from real models, their inputs and PyTorch references.

A measuring instrument for `tools/zoo.py` (timings beside torch eager and torch.compile),
`tools/cliffs.py` (the static check for grid and serial-work cliffs) and tests/test_zoo.py
(every program against its reference on the cpu target at the ``tiny`` size class). Nothing
here tunes anything: the zoo measures what the default options give on programs nobody picked
the defaults for.

Each `Workload` has a name, a category (``CATEGORIES``), TC source, its inputs in order
written as shapes over size names or integers (``"M,K"``: normal random floats;
``"idx:B,L<V"``: int32 indices in ``[0, V)``; ``"pos:C"``: floats in ``[0.5, 1.5)``), the
size names' values per size class (``SIZE_CLASSES``: ``tiny`` for CI, then small, medium,
large, with sizes that no tile divides), a PyTorch reference on the same tensors, and
flags: ``grad`` (time forward + backward through `tcmlir.torch.op`), ``dtype`` (float32,
or a half type for the few half-precision contractions, reported apart). ``QUICK`` names
the subset that `zoo.py --quick` runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

F = torch.nn.functional

SIZE_CLASSES = ("tiny", "small", "medium", "large")
CATEGORIES = ("contraction", "conv", "pooling", "reduction", "broadcast", "permutation", "gather",
              "norm", "softmax", "attention", "elementwise", "grad")
HALF_DTYPES = ("float16", "bfloat16")


def sizes(*classes: str) -> dict[str, dict[str, int]]:
    """``sizes("M=7 K=5", ...)``: one ``name=value`` string per size class, in SIZE_CLASSES order."""
    assert len(classes) == len(SIZE_CLASSES), classes
    return {c: {k: int(v) for k, v in (kv.split("=") for kv in s.split())}
            for c, s in zip(SIZE_CLASSES, classes, strict=True)}


@dataclass(frozen=True)
class Workload:
    name: str
    category: str
    tc: str
    inputs: tuple[str, ...]
    ref: Callable[..., Any]
    size_classes: dict[str, dict[str, int]]
    grad: bool = False
    dtype: str = "float32"
    tol: float = 1e-4           # max |out - ref| / max |ref|
    notes: str = field(default="", compare=False)

    @property
    def quick(self) -> bool:
        """In the ``--quick`` subset of tools/zoo.py (``QUICK``)."""
        return self.name in QUICK

    @property
    def half(self) -> bool:
        return self.dtype in HALF_DTYPES

    def dims(self, size: str) -> dict[str, int]:
        return self.size_classes[size]

    def make(self, size: str, device: str = "cpu", seed: int = 0) -> tuple[torch.Tensor, ...]:
        """The inputs at size class ``size`` on ``device`` (fresh random values, fixed seed)."""
        dims = self.dims(size)
        gen = torch.Generator(device=device).manual_seed(seed)
        dtype = getattr(torch, self.dtype)
        out = []
        for spec in self.inputs:
            kind, _, rest = spec.rpartition(":")
            shape_text, _, hi = rest.partition("<")
            shape = tuple(dims[d] if d in dims else int(d) for d in shape_text.split(",") if d)
            if kind == "idx":
                t = torch.randint(0, dims[hi], shape, generator=gen, device=device, dtype=torch.int32)
            elif kind == "pos":
                t = (torch.rand(shape, generator=gen, device=device) + 0.5).to(dtype)
            else:
                t = torch.randn(shape, generator=gen, device=device).to(dtype)
            out.append(t)
        return tuple(out)


ZOO: list[Workload] = []


def add(*args: Any, **kwargs: Any) -> None:
    ZOO.append(Workload(*args, **kwargs))


MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
MM_IN = ("M,K", "K,N")

# ---------------------------------------------------------------- contractions
add("mm_square", "contraction", MM, MM_IN, lambda a, b: a @ b,
    sizes("M=9 K=7 N=5", "M=512 K=512 N=512", "M=2048 K=2048 N=2048", "M=4096 K=4096 N=4096"),
    tol=1e-3)
add("mm_odd", "contraction", MM, MM_IN, lambda a, b: a @ b,
    sizes("M=13 K=11 N=7", "M=300 K=100 N=200", "M=3000 K=1000 N=2000", "M=5003 K=2003 N=4001"),
    tol=1e-3)
add("mm_skinny", "contraction", MM, MM_IN, lambda a, b: a @ b,
    sizes("M=3 K=17 N=11", "M=16 K=1024 N=1024", "M=16 K=4096 N=4096", "M=16 K=8192 N=8192"),
    tol=1e-3)
add("mm_tall", "contraction", MM, MM_IN, lambda a, b: a @ b,
    sizes("M=37 K=5 N=3", "M=16384 K=128 N=32", "M=65536 K=256 N=64", "M=262144 K=256 N=64"),
    tol=1e-3)
add("mm_small_k", "contraction", MM, MM_IN, lambda a, b: a @ b,
    sizes("M=9 K=2 N=11", "M=1024 K=16 N=1024", "M=4096 K=16 N=4096", "M=8192 K=8 N=8192"))
add("mm_tn", "contraction", "def mm_tn(float(K,M) A, float(K,N) B) -> (C) { C(m,n) +=! A(k,m) * B(k,n) }",
    ("K,M", "K,N"), lambda a, b: a.t() @ b,
    sizes("M=6 K=9 N=7", "M=500 K=300 N=400", "M=2000 K=1000 N=1500", "M=4096 K=4096 N=4096"), tol=1e-3)
add("tmm_nt", "contraction", "def tmm(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,k) * B(n,k) }",
    ("M,K", "N,K"), lambda a, b: a @ b.t(),
    sizes("M=5 K=8 N=6", "M=128 K=256 N=256", "M=128 K=1024 N=1024", "M=1024 K=4096 N=4096"),
    tol=1e-3)
add("mm_tt", "contraction", "def mm_tt(float(K,M) A, float(N,K) B) -> (C) { C(m,n) +=! A(k,m) * B(n,k) }",
    ("K,M", "N,K"), lambda a, b: a.t() @ b.t(),
    sizes("M=7 K=4 N=5", "M=300 K=200 N=100", "M=1500 K=1000 N=2000", "M=4001 K=3001 N=2001"), tol=1e-3)
add("matvec", "contraction", "def mv(float(M,K) A, float(K) x) -> (y) { y(m) +=! A(m,k) * x(k) }",
    ("M,K", "K"), lambda a, x: a @ x,
    sizes("M=11 K=13", "M=1000 K=1000", "M=8192 K=4096", "M=16384 K=16384"), tol=1e-3)
add("vecmat", "contraction", "def vm(float(K) x, float(K,N) A) -> (y) { y(n) +=! x(k) * A(k,n) }",
    ("K", "K,N"), lambda x, a: x @ a,
    sizes("K=13 N=11", "K=1000 N=1000", "K=4096 N=8192", "K=16384 N=16384"), tol=1e-3)
add("bmm", "contraction",
    "def bmm(float(B,N,K) X, float(B,K,M) Y) -> (Z) { Z(b,n,m) +=! X(b,n,k) * Y(b,k,m) }",
    ("B,N,K", "B,K,M"), torch.bmm,
    sizes("B=3 N=5 K=4 M=6", "B=16 N=128 K=64 M=128", "B=64 N=512 K=128 M=512",
          "B=128 N=1024 K=128 M=1024"), tol=1e-3)
add("tbmm", "contraction",
    "def tbmm(float(B,N,K) X, float(B,M,K) Y) -> (Z) { Z(b,n,m) +=! X(b,n,k) * Y(b,m,k) }",
    ("B,N,K", "B,M,K"), lambda x, y: torch.bmm(x, y.transpose(1, 2)),
    sizes("B=2 N=5 K=7 M=3", "B=100 N=26 K=72 M=26", "B=500 N=26 K=72 M=26", "B=2000 N=26 K=72 M=26"),
    tol=1e-3)
add("bmm_scores", "contraction",
    "def scores(float(B,S,D) Q, float(B,D,T) K) -> (P) { P(b,i,j) +=! Q(b,i,d) * K(b,d,j) }",
    ("B,S,D", "B,D,T"), torch.bmm,
    sizes("B=3 S=7 D=4 T=7", "B=64 S=128 D=64 T=128", "B=256 S=256 D=64 T=256",
          "B=512 S=512 D=64 T=512"), tol=1e-3)
add("linear3d", "contraction",
    "def linear3d(float(B,S,K) X, float(K,N) Wt) -> (Y) { Y(b,s,n) +=! X(b,s,k) * Wt(k,n) }",
    ("B,S,K", "K,N"), lambda x, w: x @ w,
    sizes("B=2 S=5 K=6 N=3", "B=8 S=128 K=256 N=256", "B=32 S=128 K=768 N=768",
          "B=64 S=512 K=1024 N=1024"), tol=1e-3)
add("bmm_batch_last", "contraction",
    "def bl(float(M,K,B) A, float(K,N,B) Bm) -> (C) { C(m,n,b) +=! A(m,k,b) * Bm(k,n,b) }",
    ("M,K,B", "K,N,B"), lambda a, b: torch.einsum("mkb,knb->mnb", a, b),
    sizes("M=4 K=5 N=3 B=2", "M=64 K=64 N=64 B=32", "M=128 K=128 N=128 B=64",
          "M=256 K=256 N=256 B=64"), tol=1e-3)
add("bilinear", "contraction",
    "def bilinear(float(B,I) X, float(O,I,J) Wt, float(B,J) Y) -> (Z) "
    "{ Z(b,o) +=! X(b,i) * Wt(o,i,j) * Y(b,j) }",
    ("B,I", "O,I,J", "B,J"), lambda x, w, y: torch.einsum("bi,oij,bj->bo", x, w, y),
    sizes("B=3 I=4 J=5 O=2", "B=64 I=32 J=32 O=64", "B=128 I=64 J=64 O=128",
          "B=256 I=128 J=128 O=128"), tol=1e-3)
KRON = {
    "kron3_1": ("XW(m,n0,n1,d2) +=! X(m,n0,n1,r) * Wt(d2,r)", "M,N0,N1,N2", "D,N2",
                lambda x, w: torch.einsum("abcr,dr->abcd", x, w)),
    "kron3_2": ("XW(m,n0,d1,n2) +=! X(m,n0,r,n2) * Wt(d1,r)", "M,N0,N1,N2", "D,N1",
                lambda x, w: torch.einsum("abrc,dr->abdc", x, w)),
    "kron3_3": ("XW(m,d0,n1,n2) +=! X(m,r,n1,n2) * Wt(d0,r)", "M,N0,N1,N2", "D,N0",
                lambda x, w: torch.einsum("arbc,dr->adbc", x, w)),
}
for _name, (_stmt, _x, _w, _ref) in KRON.items():
    add(_name, "contraction", f"def {_name}(float({_x}) X, float({_w}) Wt) -> (XW) {{ {_stmt} }}",
        (_x, _w), _ref,
        sizes("M=3 N0=4 N1=3 N2=5 D=2", "M=64 N0=32 N1=32 N2=32 D=32",
              "M=256 N0=32 N1=32 N2=32 D=32", "M=1024 N0=32 N1=32 N2=32 D=32"),
        tol=1e-3)

# ---------------------------------------------------------------- convolutions
CONV_SIZES = sizes("N=1 C=3 H=7 W=6 F=2 KH=3 KW=3", "N=8 C=32 H=28 W=28 F=32 KH=3 KW=3",
                   "N=16 C=64 H=56 W=56 F=64 KH=3 KW=3", "N=32 C=64 H=56 W=56 F=64 KH=3 KW=3")
add("conv2d_valid", "conv", """def conv(float(N,C,H,W) I, float(F,C,KH,KW) W1) -> (O) {
    O(n, f, h, w) +=! I(n, c, h + kh, w + kw) * W1(f, c, kh, kw)
}""", ("N,C,H,W", "F,C,KH,KW"), F.conv2d, CONV_SIZES, tol=1e-3)
add("conv2d_pad_select", "conv", """def conv_pad(float(N,C,H,W) I, float(F,C,3,3) W1) -> (O) {
    O(n, f, h, w) +=! (h + kh >= 1 && h + kh <= H && w + kw >= 1 && w + kw <= W)
        ? I(n, c, h + kh - 1, w + kw - 1) * W1(f, c, kh, kw) : 0
        where h in 0:H, w in 0:W, kh in 0:3, kw in 0:3
}""", ("N,C,H,W", "F,C,3,3"), lambda i, w: F.conv2d(i, w, padding=1), CONV_SIZES,
    tol=1e-3)
add("conv2d_pad_temp", "conv", """def conv_pad_t(float(N,C,H,W) I, float(F,C,3,3) W1) -> (O) {
    P(n, c, h, w) = (h >= 1 && h <= H && w >= 1 && w <= W) ? I(n, c, h - 1, w - 1) : 0
        where h in 0:H+2, w in 0:W+2
    O(n, f, h, w) +=! P(n, c, h + kh, w + kw) * W1(f, c, kh, kw)
}""", ("N,C,H,W", "F,C,3,3"), lambda i, w: F.conv2d(i, w, padding=1), CONV_SIZES, tol=1e-3)
add("conv2d_stride2", "conv", """def conv_s2(float(N,C,H,W) I, float(F,C,KH,KW) W1) -> (O) {
    O(n, f, h, w) +=! I(n, c, 2 * h + kh, 2 * w + kw) * W1(f, c, kh, kw)
        where h in 0:(H - KH) / 2 + 1, w in 0:(W - KW) / 2 + 1
}""", ("N,C,H,W", "F,C,KH,KW"), lambda i, w: F.conv2d(i, w, stride=2), CONV_SIZES, tol=1e-3)
add("conv2d_dilated", "conv", """def conv_d2(float(N,C,H,W) I, float(F,C,KH,KW) W1) -> (O) {
    O(n, f, h, w) +=! I(n, c, h + 2 * kh, w + 2 * kw) * W1(f, c, kh, kw)
}""", ("N,C,H,W", "F,C,KH,KW"), lambda i, w: F.conv2d(i, w, dilation=2), CONV_SIZES, tol=1e-3)
add("group_conv", "conv", """def gconv(float(N,G,C,H,W) I, float(G,F,C,KH,KW) W1) -> (O) {
    O(n, g, f, h, w) +=! I(n, g, c, h + kh, w + kw) * W1(g, f, c, kh, kw)
}""", ("N,G,C,H,W", "G,F,C,KH,KW"),
    lambda i, w: F.conv2d(i.flatten(1, 2), w.flatten(0, 1), groups=i.shape[1]).unflatten(
        1, (i.shape[1], w.shape[1])),
    sizes("N=1 G=2 C=3 H=6 W=5 F=2 KH=3 KW=3", "N=8 G=16 C=8 H=16 W=16 F=8 KH=3 KW=3",
          "N=32 G=32 C=16 H=16 W=16 F=16 KH=3 KW=3", "N=32 G=32 C=32 H=28 W=28 F=32 KH=3 KW=3"),
    tol=1e-3)
add("depthwise_conv", "conv", """def dwconv(float(N,C,H,W) I, float(C,KH,KW) W1) -> (O) {
    O(n, c, h, w) +=! I(n, c, h + kh, w + kw) * W1(c, kh, kw)
}""", ("N,C,H,W", "C,KH,KW"), lambda i, w: F.conv2d(i, w.unsqueeze(1), groups=i.shape[1]),
    sizes("N=1 C=3 H=7 W=6 KH=3 KW=3", "N=8 C=64 H=56 W=56 KH=3 KW=3",
          "N=32 C=128 H=56 W=56 KH=3 KW=3", "N=64 C=256 H=56 W=56 KH=5 KW=5"), tol=1e-3)
add("conv1x1", "conv", """def conv1x1(float(N,C,H,W) I, float(F,C) W1) -> (O) {
    O(n, f, h, w) +=! I(n, c, h, w) * W1(f, c)
}""", ("N,C,H,W", "F,C"), lambda i, w: F.conv2d(i, w[:, :, None, None]),
    sizes("N=2 C=5 H=3 W=4 F=3", "N=8 C=64 H=28 W=28 F=128", "N=32 C=256 H=28 W=28 F=128",
          "N=64 C=512 H=14 W=14 F=1024"), tol=1e-3)
add("conv2d_nhwc", "conv", """def conv_nhwc(float(N,H,W,C) I, float(KH,KW,C,F) W1) -> (O) {
    O(n, h, w, f) +=! I(n, h + kh, w + kw, c) * W1(kh, kw, c, f)
}""", ("N,H,W,C", "KH,KW,C,F"),
    lambda i, w: F.conv2d(i.permute(0, 3, 1, 2), w.permute(3, 2, 0, 1)).permute(0, 2, 3, 1),
    CONV_SIZES, tol=1e-3)
add("conv1d_seq", "conv", """def conv1d(float(N,C,T) I, float(F,C,K) W1) -> (O) {
    O(n, f, t) +=! I(n, c, t + k) * W1(f, c, k)
}""", ("N,C,T", "F,C,K"), F.conv1d,
    sizes("N=2 C=3 T=11 F=4 K=3", "N=16 C=64 T=1000 F=64 K=5", "N=32 C=256 T=1000 F=256 K=5",
          "N=64 C=512 T=2000 F=512 K=7"), tol=1e-3)

# ---------------------------------------------------------------- pooling
POOL_SIZES = sizes("N=1 C=2 H=7 W=9", "N=16 C=64 H=56 W=56", "N=64 C=64 H=112 W=112",
                   "N=128 C=128 H=112 W=112")
add("maxpool2x2", "pooling", """def maxpool(float(N,C,H,W) I) -> (O) {
    O(n, c, h, w) max=! I(n, c, 2 * h + kh, 2 * w + kw) where kh in 0:2, kw in 0:2
}""", ("N,C,H,W",), lambda i: F.max_pool2d(i, 2), POOL_SIZES)
add("avgpool2x2", "pooling", """def avgpool(float(N,C,H,W) I) -> (O) {
    O(n, c, h, w) +=! I(n, c, 2 * h + kh, 2 * w + kw) / 4 where kh in 0:2, kw in 0:2
}""", ("N,C,H,W",), lambda i: F.avg_pool2d(i, 2), POOL_SIZES)
add("maxpool3x3s2", "pooling", """def maxpool3(float(N,C,H,W) I) -> (O) {
    O(n, c, h, w) max=! I(n, c, 2 * h + kh, 2 * w + kw)
        where kh in 0:3, kw in 0:3, h in 0:(H - 3) / 2 + 1, w in 0:(W - 3) / 2 + 1
}""", ("N,C,H,W",), lambda i: F.max_pool2d(i, 3, 2), POOL_SIZES)
add("global_avgpool", "pooling", """def gap(float(N,C,H,W) I) -> (O) {
    O(n, c) +=! I(n, c, h, w) / (H * W)
}""", ("N,C,H,W",), lambda i: i.mean(dim=(2, 3)), POOL_SIZES)

# ---------------------------------------------------------------- reductions
ROWS = sizes("N=7 D=13", "N=1000 D=1000", "N=8192 D=3000", "N=32768 D=4096")
add("row_sum", "reduction", "def rs(float(N,D) X) -> (S) { S(n) +=! X(n,d) }", ("N,D",),
    lambda x: x.sum(1), ROWS, tol=1e-4)
add("col_sum", "reduction", "def cs(float(N,D) X) -> (S) { S(d) +=! X(n,d) }", ("N,D",),
    lambda x: x.sum(0), ROWS, tol=1e-4)
add("mid_axis_sum", "reduction", "def ms(float(A,B,C) X) -> (S) { S(a,c) +=! X(a,b,c) }",
    ("A,B,C",), lambda x: x.sum(1),
    sizes("A=3 B=5 C=7", "A=64 B=100 C=128", "A=256 B=512 C=256", "A=512 B=1000 C=512"),
    tol=1e-4)
add("first_axis_sum3d", "reduction", "def fs(float(A,B,C) X) -> (S) { S(b,c) +=! X(a,b,c) }",
    ("A,B,C",), lambda x: x.sum(0),
    sizes("A=5 B=3 C=7", "A=100 B=64 C=128", "A=512 B=256 C=256", "A=1000 B=512 C=512"), tol=1e-4)
FULL = sizes("N=17", "N=1000000", "N=16777216", "N=268435456")
add("full_sum_scalar", "reduction", "def fsum(float(N) X) -> (s) { s +=! X(i) }", ("N",),
    lambda x: x.sum(), FULL, tol=1e-4)
add("full_sum_where", "reduction", "def fsumw(float(N) X) -> (S) { S(z) +=! X(i) where z in 0:1 }",
    ("N",), lambda x: x.sum().reshape(1), FULL, tol=1e-4)
add("full_sum_2d", "reduction", "def fsum2(float(N,D) X) -> (s) { s +=! X(n,d) }", ("N,D",),
    lambda x: x.sum(), ROWS, tol=1e-4)
add("full_max", "reduction", "def fmaxr(float(N) X) -> (m) { m max=! X(i) }", ("N",),
    lambda x: x.max(), FULL)
add("row_max", "reduction", "def rmax(float(N,D) X) -> (M) { M(n) max=! X(n,d) }", ("N,D",),
    lambda x: x.amax(1), ROWS)
add("row_min_3d", "reduction", "def rmin(float(A,B,C) X) -> (M) { M(a,b) min=! X(a,b,c) }",
    ("A,B,C",), lambda x: x.amin(2),
    sizes("A=3 B=5 C=7", "A=64 B=100 C=128", "A=256 B=512 C=256", "A=512 B=1000 C=512"))
add("row_sumsq", "reduction", "def ssq(float(N,D) X) -> (S) { S(n) +=! X(n,d) * X(n,d) }",
    ("N,D",), lambda x: (x * x).sum(1), ROWS, tol=1e-4)
add("row_mean", "reduction", "def rmean(float(N,D) X) -> (S) { S(n) +=! X(n,d) / D }", ("N,D",),
    lambda x: x.mean(1), ROWS, tol=1e-4)

# ---------------------------------------------------------------- broadcasts
add("add_row_bias", "broadcast", "def arb(float(N,D) X, float(D) b) -> (O) { O(n,d) = X(n,d) + b(d) }",
    ("N,D", "D"), lambda x, b: x + b, ROWS)
add("add_col_bias", "broadcast", "def acb(float(N,D) X, float(N) c) -> (O) { O(n,d) = X(n,d) + c(n) }",
    ("N,D", "N"), lambda x, c: x + c[:, None], ROWS)
add("outer_product", "broadcast", "def outer(float(M) a, float(N) b) -> (C) { C(m,n) = a(m) * b(n) }",
    ("M", "N"), torch.outer, sizes("M=7 N=5", "M=1000 N=1000", "M=8192 N=3000", "M=16384 N=16384"))
add("channel_affine", "broadcast", """def caff(float(N,C,H,W) X, float(C) s, float(C) t) -> (O) {
    O(n, c, h, w) = X(n, c, h, w) * s(c) + t(c)
}""", ("N,C,H,W", "C", "C"), lambda x, s, t: x * s[:, None, None] + t[:, None, None], POOL_SIZES)
add("mask_3d", "broadcast", """def mask(float(B,S,D) X, float(B,S) Mk) -> (O) {
    O(b, s, d) = X(b, s, d) * Mk(b, s)
}""", ("B,S,D", "B,S"), lambda x, m: x * m[:, :, None],
    sizes("B=2 S=5 D=3", "B=16 S=128 D=768", "B=64 S=512 D=768", "B=128 S=1000 D=1024"))

# ---------------------------------------------------------------- permutations
add("transpose2d", "permutation", "def tr(float(N,M) A) -> (B) { B(m,n) = A(n,m) }", ("N,M",),
    lambda a: a.t().contiguous(), sizes("N=7 M=5", "N=1000 M=1000", "N=3000 M=8192", "N=8192 M=8192"))
add("perm3_cab", "permutation", "def p3(float(A,B,C) X) -> (Y) { Y(c,a,b) = X(a,b,c) }", ("A,B,C",),
    lambda x: x.permute(2, 0, 1).contiguous(),
    sizes("A=3 B=4 C=5", "A=64 B=100 C=128", "A=256 B=512 C=256", "A=512 B=1000 C=512"))
add("perm3_batched_t", "permutation", "def bt(float(B,S,D) X) -> (Y) { Y(b,d,s) = X(b,s,d) }",
    ("B,S,D",), lambda x: x.transpose(1, 2).contiguous(),
    sizes("B=2 S=5 D=3", "B=16 S=128 D=768", "B=64 S=512 D=768", "B=128 S=1000 D=1024"))
add("perm4_heads", "permutation", "def heads(float(B,H,S,D) X) -> (Y) { Y(b,s,h,d) = X(b,h,s,d) }",
    ("B,H,S,D",), lambda x: x.permute(0, 2, 1, 3).contiguous(),
    sizes("B=2 H=3 S=5 D=4", "B=8 H=12 S=128 D=64", "B=32 H=16 S=512 D=64", "B=64 H=16 S=1024 D=64"),
    )
add("perm4_nchw_nhwc", "permutation", "def tohwc(float(N,C,H,W) X) -> (Y) { Y(n,h,w,c) = X(n,c,h,w) }",
    ("N,C,H,W",), lambda x: x.permute(0, 2, 3, 1).contiguous(), POOL_SIZES)
add("perm5", "permutation",
    "def p5(float(A,B,C,D,E) X) -> (Y) { Y(a,d,b,e,c) = X(a,b,c,d,e) }", ("A,B,C,D,E",),
    lambda x: x.permute(0, 3, 1, 4, 2).contiguous(),
    sizes("A=2 B=3 C=2 D=4 E=3", "A=4 B=16 C=16 D=16 E=32", "A=8 B=32 C=32 D=32 E=64",
          "A=16 B=64 C=32 D=32 E=64"))

# ---------------------------------------------------------------- gathers
EMB = sizes("V=11 D=5 B=3 L=4", "V=10000 D=128 B=256 L=16", "V=100000 D=256 B=1024 L=32",
            "V=1000000 D=256 B=4096 L=64")
add("embedding", "gather", "def emb(float(V,D) E, int32(B,L) idx) -> (O) { O(b,l,d) = E(idx(b,l),d) }",
    ("V,D", "idx:B,L<V"), lambda e, i: e[i.long()], EMB)
add("embedding_bag_sum", "gather",
    "def bag(float(V,D) E, int32(B,L) idx) -> (O) { O(b,d) +=! E(idx(b,l),d) }",
    ("V,D", "idx:B,L<V"), lambda e, i: F.embedding_bag(i.long(), e, mode="sum"), EMB)
add("embedding_bag_mean", "gather",
    "def bagm(float(V,D) E, int32(B,L) idx) -> (O) { O(b,d) +=! E(idx(b,l),d) / L }",
    ("V,D", "idx:B,L<V"), lambda e, i: F.embedding_bag(i.long(), e, mode="mean"), EMB)
add("index_select_cols", "gather",
    "def isel(float(N,D) X, int32(J) idx) -> (O) { O(n,j) = X(n,idx(j)) }",
    ("N,D", "idx:J<D"), lambda x, i: x[:, i.long()],
    sizes("N=5 D=9 J=4", "N=1000 D=1000 J=500", "N=8192 D=3000 J=1000", "N=32768 D=4096 J=2048"))

# ---------------------------------------------------------------- normalisations
LN = """def layernorm(float(T,D) I, float(D) G, float(D) Bt) -> (O) {
    mean(t) +=! I(t, d) / D
    c(t, d) = I(t, d) - mean(t)
    var(t) +=! c(t, d) * c(t, d) / D
    O(t, d) = c(t, d) * rsqrt(var(t) + 1e-5) * G(d) + Bt(d)
}"""
LN_REF = lambda x, g, b: F.layer_norm(x, (x.shape[-1],), g, b, eps=1e-5)  # noqa: E731
add("layernorm_768", "norm", LN, ("T,D", "D", "D"), LN_REF,
    sizes("T=5 D=7", "T=1024 D=768", "T=16384 D=768", "T=65536 D=768"), tol=1e-3)
add("layernorm_1000", "norm", LN, ("T,D", "D", "D"), LN_REF,
    sizes("T=3 D=11", "T=1000 D=1000", "T=8191 D=1000", "T=32768 D=4096"), tol=1e-3)
add("rmsnorm", "norm", """def rmsnorm(float(T,D) I, float(D) G) -> (O) {
    ms(t) +=! I(t, d) * I(t, d) / D
    O(t, d) = I(t, d) * rsqrt(ms(t) + 1e-6) * G(d)
}""", ("T,D", "D"), lambda x, g: x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * g,
    sizes("T=5 D=7", "T=1024 D=1024", "T=16384 D=4096", "T=65536 D=4096"), tol=1e-3)
add("groupnorm", "norm", """def groupnorm(float(N,G,C,S) I, float(G,C) Gm, float(G,C) Bt) -> (O) {
    mean(n, g) +=! I(n, g, c, s) / (C * S)
    d(n, g, c, s) = I(n, g, c, s) - mean(n, g)
    var(n, g) +=! d(n, g, c, s) * d(n, g, c, s) / (C * S)
    O(n, g, c, s) = d(n, g, c, s) * rsqrt(var(n, g) + 1e-5) * Gm(g, c) + Bt(g, c)
}""", ("N,G,C,S", "G,C", "G,C"),
    lambda x, g, b: F.group_norm(x.flatten(1, 2), x.shape[1], g.flatten(), b.flatten(),
                                 eps=1e-5).unflatten(1, (x.shape[1], x.shape[2])),
    sizes("N=2 G=3 C=2 S=5", "N=8 G=32 C=4 S=784", "N=16 G=32 C=8 S=3136", "N=32 G=32 C=16 S=3136"),
    tol=1e-3)
add("batchnorm_infer", "norm", """def bn_infer(float(N,C,H,W) X, float(C) M, float(C) V, float(C) G, float(C) Bt) -> (O) {
    O(n, c, h, w) = (X(n, c, h, w) - M(c)) * rsqrt(V(c) + 1e-5) * G(c) + Bt(c)
}""", ("N,C,H,W", "C", "pos:C", "C", "C"),
    lambda x, m, v, g, b: F.batch_norm(x, m, v, g, b, training=False, eps=1e-5), POOL_SIZES, tol=1e-3)
add("batchnorm_train", "norm", """def bn_train(float(N,C,H,W) X, float(C) G, float(C) Bt) -> (O) {
    mean(c) +=! X(n, c, h, w) / (N * H * W)
    d(n, c, h, w) = X(n, c, h, w) - mean(c)
    var(c) +=! d(n, c, h, w) * d(n, c, h, w) / (N * H * W)
    O(n, c, h, w) = d(n, c, h, w) * rsqrt(var(c) + 1e-5) * G(c) + Bt(c)
}""", ("N,C,H,W", "C", "C"),
    lambda x, g, b: F.batch_norm(x, None, None, g, b, training=True, eps=1e-5), POOL_SIZES, tol=1e-3)

# ---------------------------------------------------------------- softmax
SOFTMAX = """def softmax(float(N,D) X) -> (O) {
    mx(n) max=! X(n, d)
    e(n, d) = exp(X(n, d) - mx(n))
    s(n) +=! e(n, d)
    O(n, d) = e(n, d) / s(n)
}"""
LOGSOFTMAX = """def log_softmax(float(N,D) X) -> (O) {
    mx(n) max=! X(n, d)
    s(n) +=! exp(X(n, d) - mx(n))
    O(n, d) = X(n, d) - mx(n) - log(s(n))
}"""
for _d, _rows in ((128, "N=5 D=3"), (1000, "N=3 D=11"), (4096, "N=2 D=9")):
    _s = sizes(_rows, f"N=4096 D={_d}", f"N={8 * 1048576 // _d} D={_d}", f"N={64 * 1048576 // _d} D={_d}")
    add(f"softmax_{_d}", "softmax", SOFTMAX, ("N,D",), lambda x: torch.softmax(x, -1), _s)
    add(f"log_softmax_{_d}", "softmax", LOGSOFTMAX, ("N,D",), lambda x: torch.log_softmax(x, -1), _s,
        tol=1e-4)
add("softmax_cols", "softmax", """def softmax_cols(float(N,D) X) -> (O) {
    mx(d) max=! X(n, d)
    e(n, d) = exp(X(n, d) - mx(d))
    s(d) +=! e(n, d)
    O(n, d) = e(n, d) / s(d)
}""", ("N,D",), lambda x: torch.softmax(x, 0), ROWS)

# ---------------------------------------------------------------- attention pieces
ATT = sizes("B=2 H=2 S=5 D=3", "B=4 H=8 S=128 D=64", "B=16 H=12 S=256 D=64", "B=32 H=16 S=512 D=64")
add("attn_scores_scaled", "attention", """def scores(float(B,H,S,D) Q, float(B,H,S,D) K) -> (P) {
    P(b, h, i, j) +=! Q(b, h, i, d) * K(b, h, j, d) * 0.125
}""", ("B,H,S,D", "B,H,S,D"), lambda q, k: q @ k.transpose(-1, -2) * 0.125, ATT, tol=1e-3)
add("attn_pv", "attention", """def pv(float(B,H,S,S) P, float(B,H,S,D) V) -> (O) {
    O(b, h, i, d) +=! P(b, h, i, j) * V(b, h, j, d)
}""", ("B,H,S,S", "B,H,S,D"), lambda p, v: p @ v, ATT, tol=1e-3)
add("causal_softmax", "attention", """def causal_softmax(float(B,S,S) X) -> (O) {
    mx(b, i) max=! j <= i ? X(b, i, j) : -1e30
    e(b, i, j) = j <= i ? exp(X(b, i, j) - mx(b, i)) : 0
    s(b, i) +=! e(b, i, j)
    O(b, i, j) = e(b, i, j) / s(b, i)
}""", ("B,S,S",),
    lambda x: torch.softmax(x.masked_fill(torch.ones(x.shape[-2:], dtype=torch.bool, device=x.device)
                                          .triu(1), float("-inf")), -1),
    sizes("B=2 S=5", "B=64 S=128", "B=192 S=512", "B=512 S=1024"), tol=1e-4)
add("attention_fused", "attention", """def attention(float(B,S,D) Q, float(B,S,D) K, float(B,S,D) V) -> (O) {
    P(b, i, j) +=! Q(b, i, d) * K(b, j, d) * 0.125
    mx(b, i) max=! P(b, i, j)
    e(b, i, j) = exp(P(b, i, j) - mx(b, i))
    s(b, i) +=! e(b, i, j)
    O(b, i, d) +=! e(b, i, j) * V(b, j, d) / s(b, i)
}""", ("B,S,D", "B,S,D", "B,S,D"),
    lambda q, k, v: torch.softmax(q @ k.transpose(-1, -2) * 0.125, -1) @ v,
    sizes("B=2 S=5 D=3", "B=32 S=128 D=64", "B=128 S=256 D=64", "B=256 S=512 D=64"),
    tol=1e-3)

# ---------------------------------------------------------------- elementwise chains, epilogues
VEC = sizes("N=37", "N=1000003", "N=16777216", "N=268435456")
add("chain_poly", "elementwise", "def chain(float(N) X) -> (O) { O(i) = ((X(i) * 2 + 1) * X(i) - 3) * 0.5 }",
    ("N",), lambda x: ((x * 2 + 1) * x - 3) * 0.5, VEC)
add("gelu_tanh", "elementwise", """def gelu(float(N) X) -> (O) {
    O(i) = 0.5 * X(i) * (1 + tanh(0.7978845608 * (X(i) + 0.044715 * X(i) * X(i) * X(i))))
}""", ("N",), lambda x: F.gelu(x, approximate="tanh"), VEC)
add("silu", "elementwise", "def silu(float(N) X) -> (O) { O(i) = X(i) / (1 + exp(-X(i))) }", ("N",),
    F.silu, VEC)
add("swiglu", "elementwise", """def swiglu(float(N,D) A, float(N,D) Bg) -> (O) {
    O(n, d) = A(n, d) / (1 + exp(-A(n, d))) * Bg(n, d)
}""", ("N,D", "N,D"), lambda a, b: F.silu(a) * b, ROWS)
add("residual_scale", "elementwise", """def resid(float(N,D) X, float(N,D) Y) -> (O) {
    O(n, d) = X(n, d) + 0.5 * Y(n, d)
}""", ("N,D", "N,D"), lambda x, y: x + 0.5 * y, ROWS)
LINEAR = sizes("B=5 M=7 N=3", "B=256 M=512 N=512", "B=1024 M=2048 N=1024", "B=4096 M=4096 N=4096")
add("linear_bias_relu", "elementwise", """def fc_relu(float(B,M) I, float(N,M) Wt, float(N) bias) -> (O) {
    O(b, n) +=! I(b, m) * Wt(n, m)
    O(b, n) = fmax(O(b, n) + bias(n), 0)
}""", ("B,M", "N,M", "N"), lambda x, w, b: torch.relu(F.linear(x, w, b)), LINEAR, tol=1e-3)
add("linear_bias_gelu", "elementwise", """def fc_gelu(float(B,M) I, float(N,M) Wt, float(N) bias) -> (O) {
    Y(b, n) +=! I(b, m) * Wt(n, m)
    O(b, n) = 0.5 * (Y(b, n) + bias(n)) * (1 + tanh(0.7978845608 * ((Y(b, n) + bias(n))
              + 0.044715 * (Y(b, n) + bias(n)) * (Y(b, n) + bias(n)) * (Y(b, n) + bias(n)))))
}""", ("B,M", "N,M", "N"), lambda x, w, b: F.gelu(F.linear(x, w, b), approximate="tanh"), LINEAR,
    tol=1e-3)
add("mlp2", "elementwise", """def mlp2(float(B,M) I, float(N,M) W1, float(N) B1, float(P,N) W2, float(P) B2) -> (O) {
    H(b, n) +=! I(b, m) * W1(n, m)
    R(b, n) = fmax(H(b, n) + B1(n), 0)
    O(b, p) +=! R(b, n) * W2(p, n)
    O(b, p) = fmax(O(b, p) + B2(p), 0)
}""", ("B,M", "N,M", "N", "P,N", "P"),
    lambda x, w1, b1, w2, b2: torch.relu(F.linear(torch.relu(F.linear(x, w1, b1)), w2, b2)),
    sizes("B=5 M=7 N=3 P=4", "B=256 M=512 N=512 P=256", "B=1024 M=1024 N=4096 P=1024",
          "B=4096 M=1024 N=4096 P=1024"), tol=1e-3)

# ---------------------------------------------------------------- forward + backward
add("grad_matmul", "grad", MM, MM_IN, lambda a, b: a @ b,
    sizes("M=5 K=4 N=3", "M=512 K=512 N=512", "M=2048 K=2048 N=2048", "M=4096 K=4096 N=4096"),
    grad=True, tol=1e-3)
add("grad_softmax", "grad", SOFTMAX, ("N,D",), lambda x: torch.softmax(x, -1),
    sizes("N=4 D=7", "N=4096 D=1000", "N=16384 D=1024", "N=32768 D=4096"), grad=True,
    tol=1e-3)
add("grad_layernorm", "grad", LN, ("T,D", "D", "D"), LN_REF,
    sizes("T=4 D=6", "T=1024 D=768", "T=16384 D=768", "T=16384 D=4096"), grad=True,
    tol=1e-3)
add("grad_conv2d", "grad", """def conv(float(N,C,H,W) I, float(F,C,KH,KW) W1) -> (O) {
    O(n, f, h, w) +=! I(n, c, h + kh, w + kw) * W1(f, c, kh, kw)
}""", ("N,C,H,W", "F,C,KH,KW"), F.conv2d,
    sizes("N=1 C=2 H=5 W=4 F=2 KH=3 KW=3", "N=8 C=32 H=28 W=28 F=32 KH=3 KW=3",
          "N=16 C=64 H=56 W=56 F=64 KH=3 KW=3", "N=32 C=64 H=56 W=56 F=64 KH=3 KW=3"),
    grad=True, tol=1e-3)

# ---------------------------------------------------------------- half precision (reported apart)
add("mm_fp16", "contraction", MM.replace("float(", "float16("), MM_IN, lambda a, b: a @ b,
    sizes("M=9 K=7 N=5", "M=1024 K=1024 N=1024", "M=4096 K=4096 N=4096", "M=8192 K=8192 N=8192"),
    dtype="float16", tol=2e-2)
add("bmm_scores_bf16", "contraction",
    "def scores(bfloat16(B,S,D) Q, bfloat16(B,D,T) K) -> (P) { P(b,i,j) +=! Q(b,i,d) * K(b,d,j) }",
    ("B,S,D", "B,D,T"), torch.bmm,
    sizes("B=3 S=7 D=4 T=7", "B=64 S=256 D=64 T=256", "B=512 S=512 D=64 T=512",
          "B=1024 S=512 D=64 T=512"), dtype="bfloat16", tol=3e-2)
add("linear_bias_relu_fp16", "elementwise", """def fc_relu(float16(B,M) I, float16(N,M) Wt, float16(N) bias) -> (O) {
    O(b, n) +=! I(b, m) * Wt(n, m)
    O(b, n) = fmax(O(b, n) + bias(n), 0)
}""", ("B,M", "N,M", "N"), lambda x, w, b: torch.relu(F.linear(x, w, b)), LINEAR,
    dtype="float16", tol=2e-2)


# the --quick subset: the shapes the issue measured outside the project, one or more per category
QUICK = ("mm_square", "mm_odd", "mm_skinny", "tbmm", "bmm_scores", "kron3_1", "conv2d_valid",
         "conv2d_pad_select", "group_conv", "maxpool2x2", "mid_axis_sum", "full_sum_scalar",
         "full_sum_where", "add_row_bias", "perm4_heads", "embedding_bag_sum", "layernorm_768",
         "softmax_128", "softmax_1000", "attention_fused", "chain_poly", "linear_bias_relu", "mlp2",
         "grad_matmul", "grad_softmax", "grad_layernorm", "mm_fp16", "bmm_scores_bf16",
         "linear_bias_relu_fp16")


def by_name(name: str) -> Workload:
    for w in ZOO:
        if w.name == name:
            return w
    raise KeyError(f"no zoo workload {name!r}")


def select(only: str = "", quick: bool = False, half: bool = True) -> list[Workload]:
    """The workloads whose names contain one of the comma-separated substrings of ``only``
    (all when empty), only the ``quick`` ones with ``quick``, without half precision unless
    ``half``."""
    parts = [p for p in only.split(",") if p]
    return [w for w in ZOO if (not parts or any(p in w.name for p in parts))
            and (not quick or w.quick) and (half or not w.half)]
