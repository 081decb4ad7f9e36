"""Tensor-core contractions beside cuBLAS (torch) and torch.compile, one run on the GPU.

    python tools/bench_mma.py [--quick]

Prints per case: tcmlir (default options: `MappingOptions.default_for`, tensor cores) ms, torch
eager ms (cuBLAS), torch.compile ms, the ratio eager/tcmlir (>1: tcmlir faster) and TFLOP/s,
after checking tcmlir's result against torch's (relative error). Timing: CUDA events around
`reps` calls after a warm-up, median of 5 such batches, inputs resident on the device.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import tcmlir as tc

torch = None  # imported in main (not for --check-only)

_MM = "def mm(float16(M, K) A, float16(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }"


def _padded(src: str, sizes: dict[str, int], pad: bool) -> tc.MappingOptions:
    """The default options of ``src`` at ``sizes`` with operand padding ``pad``."""
    o = tc.MappingOptions.default_for(tc.define(src, target="cuda"), "cuda", sizes)
    return o.tensor_cores(o.mma_tile, o.mma_warps, o.mma_stages, o.mma_wgmma, pad=pad)


CASES = [
    # name, source, inputs maker, torch reference
    ("matmul f16 4096^3", "def mm(float16(M, K) A, float16(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }",
     lambda: (torch.randn(4096, 4096, dtype=torch.float16), torch.randn(4096, 4096, dtype=torch.float16)),
     lambda a, b: a @ b),
    ("matmul bf16 4096^3", "def mm(bfloat16(M, K) A, bfloat16(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }",
     lambda: (torch.randn(4096, 4096, dtype=torch.bfloat16), torch.randn(4096, 4096, dtype=torch.bfloat16)),
     lambda a, b: a @ b),
    ("matmul f16 8192^3", "def mm(float16(M, K) A, float16(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }",
     lambda: (torch.randn(8192, 8192, dtype=torch.float16), torch.randn(8192, 8192, dtype=torch.float16)),
     lambda a, b: a @ b),
    ("matmul f16 A.B^T 4096^3", "def mm(float16(M, K) A, float16(N, K) B) -> (C) { C(m, n) +=! A(m, k) * B(n, k) }",
     lambda: (torch.randn(4096, 4096, dtype=torch.float16), torch.randn(4096, 4096, dtype=torch.float16)),
     lambda a, b: a @ b.T),
    ("matmul f16 3000x2000x1000", "def mm(float16(M, K) A, float16(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }",
     lambda: (torch.randn(3000, 1000, dtype=torch.float16), torch.randn(1000, 2000, dtype=torch.float16)),
     lambda a, b: a @ b),
    ("attention scores f16 512x512x64x512", "def s(float16(Bt, M, K) Q, float16(Bt, N, K) Kt) -> (S) "
     "{ S(b, m, n) +=! Q(b, m, k) * Kt(b, n, k) }",
     lambda: (torch.randn(512, 512, 64, dtype=torch.float16), torch.randn(512, 512, 64, dtype=torch.float16)),
     lambda q, k: torch.bmm(q, k.transpose(1, 2))),
    ("linear+bias+relu f16 4096x4096->4096", "def lin(float16(B, K) I, float16(N, K) W, float16(N) bias) -> (O) "
     "{ O(b, n) +=! I(b, k) * W(n, k)\n O(b, n) = O(b, n) + bias(n)\n O(b, n) = fmax(O(b, n), 0) }",
     lambda: (torch.randn(4096, 4096, dtype=torch.float16), torch.randn(4096, 4096, dtype=torch.float16) * 0.02,
              torch.randn(4096, dtype=torch.float16)),
     lambda x, w, b: torch.relu(torch.nn.functional.linear(x, w, b))),
    ("skinny f16 16x4096x4096", "def mm(float16(M, K) A, float16(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }",
     lambda: (torch.randn(16, 4096, dtype=torch.float16), torch.randn(4096, 4096, dtype=torch.float16)),
     lambda a, b: a @ b),
    # sizes and strides no tile divides: narrower copies / element loads (before: the FMA path)
    ("matmul f16 4095x4097x4093", "def mm(float16(M, K) A, float16(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }",
     lambda: (torch.randn(4095, 4093, dtype=torch.float16), torch.randn(4093, 4097, dtype=torch.float16)),
     lambda a, b: a @ b),
    ("matmul f16 4096x4096x4092", "def mm(float16(M, K) A, float16(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }",
     lambda: (torch.randn(4096, 4092, dtype=torch.float16), torch.randn(4092, 4096, dtype=torch.float16)),
     lambda a, b: a @ b),
    # the same with operand padding (pad-operands) the other way round from the default's
    # cost model: padded at 4095x4097x4093, not at 4096x4096x4092
    ("... 4095x4097x4093 unpadded", _MM,
     lambda: (torch.randn(4095, 4093, dtype=torch.float16), torch.randn(4093, 4097, dtype=torch.float16)),
     lambda a, b: a @ b, {"options": lambda: _padded(_MM, {"M": 4095, "N": 4097, "K": 4093}, False)}),
    ("... 4096x4096x4092 padded", _MM,
     lambda: (torch.randn(4096, 4092, dtype=torch.float16), torch.randn(4092, 4096, dtype=torch.float16)),
     lambda a, b: a @ b, {"options": lambda: _padded(_MM, {"M": 4096, "N": 4096, "K": 4092}, True)}),
    # index groups: three row indices, two reduction indices, each one dimension
    ("grouped rows f16 16x16x16x1024->1024", "def xw(float16(M, N0, N1, R) X, float16(D, R) W) -> (XW) "
     "{ XW(m, n0, n1, d) +=! X(m, n0, n1, r) * W(d, r) }",
     lambda: (torch.randn(16, 16, 16, 1024, dtype=torch.float16), torch.randn(1024, 1024, dtype=torch.float16)),
     lambda x, w: x @ w.T),
    ("two-index reduction f16 4096x(64x64)x4096", "def mm(float16(M, K0, K1) A, float16(K0, K1, N) B) -> (C) "
     "{ C(m, n) +=! A(m, k0, k1) * B(k0, k1, n) }",
     lambda: (torch.randn(4096, 64, 64, dtype=torch.float16), torch.randn(64, 64, 4096, dtype=torch.float16)),
     lambda a, b: a.reshape(4096, -1) @ b.reshape(-1, 4096), {"k": 4096}),
    # TF32 on request, beside cuBLAS with allow_tf32
    ("matmul tf32 4096^3", "def mm(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }",
     lambda: (torch.randn(4096, 4096), torch.randn(4096, 4096)), lambda a, b: a @ b,
     {"options": lambda: tc.MappingOptions.naive().tensor_cores((128, 128, 32), (4, 2), 3,
                                                                precision="tf32")}),
]


def _time(f, reps: int) -> float:
    f()
    torch.cuda.synchronize()
    out = []
    for _ in range(5):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(reps):
            f()
        e.record()
        torch.cuda.synchronize()
        out.append(s.elapsed_time(e) / reps)
    return statistics.median(out)


def _check_small() -> int:
    """numpy inputs only (torch's driver probes read as errors under compute-sanitizer)."""
    import ml_dtypes
    import numpy as np

    forms = {
        "nn": ("def f(float16(M, K) A, float16(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }",
               lambda a, b: a @ b, (200, 40), (40, 136), np.float16),
        "tt": ("def f(bfloat16(K, M) A, bfloat16(N, K) B) -> (C) { C(m, n) +=! A(k, m) * B(n, k) }",
               lambda a, b: a.T @ b.T, (40, 200), (136, 40), ml_dtypes.bfloat16),
        "batched": ("def f(float16(Bt, M, K) A, float16(Bt, N, K) B) -> (C) "
                    "{ C(b, m, n) +=! A(b, m, k) * B(b, n, k) }",
                    lambda a, b: a @ b.transpose(0, 2, 1), (3, 72, 24), (3, 264, 24), np.float16),
    }
    forms.update({  # any size and stride, index groups, TF32 (issue 29)
        "odd": ("def f(float16(M, K) A, float16(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }",
                lambda a, b: a @ b, (7, 17), (17, 15), np.float16),
        "k30": ("def f(float16(M, K) A, float16(N, K) B) -> (C) { C(m, n) +=! A(m, k) * B(n, k) }",
                lambda a, b: a @ b.T, (100, 30), (33, 30), np.float16),
        "rows": ("def f(float16(M, N0, N1, R) X, float16(D, R) W) -> (XW) "
                 "{ XW(m, n0, n1, d) +=! X(m, n0, n1, r) * W(d, r) }",
                 lambda x, w: x @ w.T, (3, 5, 7, 24), (33, 24), np.float16),
        "two-k": ("def f(float16(M, K0, K1) A, float16(K0, K1, N) B) -> (C) "
                  "{ C(m, n) +=! A(m, k0, k1) * B(k0, k1, n) }",
                  lambda a, b: np.tensordot(a, b, 2), (33, 3, 17), (3, 17, 15), np.float16),
        "tf32": ("def f(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }",
                 lambda a, b: a @ b, (100, 33), (33, 17), np.float32),
        # operands copied into padded temporaries first (pad-operands): two kernels
        "odd-padded": (_MM, lambda a, b: a @ b, (130, 77), (77, 67), np.float16),
    })
    tf32 = tc.MappingOptions.naive().tensor_cores((64, 64, 32), (2, 2), 3, precision="tf32")
    padded = tc.MappingOptions.naive().tensor_cores((64, 64, 32), (2, 2), 3, pad=True)
    rng = np.random.default_rng(0)
    bad = 0
    for name, (src, ref, sa, sb, dt) in forms.items():
        a = rng.standard_normal(sa).astype(dt)
        b = rng.standard_normal(sb).astype(dt)
        opts = {"tf32": tf32, "odd-padded": padded}.get(name)
        got = np.asarray(tc.define(src, target="cuda")(a, b, options=opts), np.float64)
        want = ref(a.astype(np.float64), b.astype(np.float64))
        err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
        print(f"{name}: rel err {err:.1e}", "ok" if err < 1e-2 else "WRONG")
        bad += err >= 1e-2
    return 1 if bad else 0


VARIANTS = [((128, 128, 32), (2, 2), 3), ((128, 128, 32), (2, 2), 4), ((64, 128, 32), (2, 2), 4),
            ((128, 128, 64), (8, 1), 3, True), ((128, 128, 64), (8, 1), 4, True),
            ((128, 128, 64), (8, 1), 5, True), ((128, 256, 64), (8, 1), 3, True),
            ((128, 256, 64), (8, 1), 4, True), ((64, 128, 64), (4, 1), 4, True),
            ((64, 256, 64), (4, 1), 4, True), ((128, 64, 64), (8, 1), 6, True)]


def _variants(reps: int) -> int:
    nn = CASES[0][1]
    nt = "def mm(float16(M, K) A, float16(N, K) B) -> (C) { C(m, n) +=! A(m, k) * B(n, k) }"
    for size in (4096,):
        a = torch.randn(size, size, dtype=torch.float16).cuda()
        b = torch.randn(size, size, dtype=torch.float16).cuda()
        t_eager = _time(lambda a=a, b=b: a @ b, reps)
        for tile, warps, stages, *wg in VARIANTS:
            fn = tc.define(nt if wg else nn, target="cuda")  # wgmma: operands contiguous along k
            opts = tc.MappingOptions.naive().tensor_cores(tile, warps, stages, wgmma=bool(wg))
            if wg:
                got = fn(a, b, options=opts)
                err = ((got.float() - (a @ b.T).float()).norm() / (a @ b.T).float().norm()).item()
                if err > 1e-2:
                    print(f"{size} {tile} {warps} {stages} wgmma: WRONG, rel err {err:.2e}")
                    continue
            try:
                fn(a, b, options=opts)
                t = _time(lambda o=opts, f=fn, a=a, b=b: f(a, b, options=o), reps)
            except tc.TCError as e:
                print(f"{size} {tile} {warps} {stages}: {str(e).splitlines()[0]}")
                continue
            print(f"{size} tile={tile} warps={warps} stages={stages}{' wgmma' if wg else ''}: {t:.4f} ms, "
                  f"eager {t_eager:.4f} ms, {t_eager / t:.3f}x, {2 * size**3 / t / 1e9:.1f} TFLOP/s",
                  flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the 4096^3 cases only")
    ap.add_argument("--reps", type=int, default=20, help="calls per timed batch")
    ap.add_argument("--check-only", action="store_true",
                    help="small shapes of every layout, results checked, nothing timed (sanitizers)")
    ap.add_argument("--variants", action="store_true",
                    help="matmul f16 4096^3 under several tensor-core options (tile, warps, stages)")
    args = ap.parse_args()
    if args.check_only:
        return _check_small()
    global torch
    import torch
    if args.variants:
        return _variants(args.reps)
    print(f"device: {torch.cuda.get_device_name()}")
    print(f"{'case':38s} {'tcmlir':>9s} {'eager':>9s} {'compile':>9s} {'eager/tc':>9s} {'TFLOP/s':>8s} err")
    for name, src, make, ref, *extra in CASES:
        if args.quick and "4096^3" not in name:
            continue
        more = extra[0] if extra else {}
        opts = more["options"]() if "options" in more else None
        torch.backends.cuda.matmul.allow_tf32 = "tf32" in name  # cuBLAS in the same precision
        ins = [x.cuda() for x in make()]
        fn = tc.define(src, target="cuda")
        got = fn(*ins, options=opts)
        want = ref(*ins)
        err = ((got.float() - want.float()).norm() / want.float().norm()).item()
        t_tc = _time(lambda f=fn, x=ins, o=opts: f(*x, options=o), args.reps)
        t_eager = _time(lambda r=ref, x=ins: r(*x), args.reps)
        compiled = torch.compile(ref)
        t_comp = _time(lambda c=compiled, x=ins: c(*x), args.reps)
        # (K: the first input's last extent unless the case says)
        flops = 2 * want.numel() * more.get("k", ins[0].shape[-1])
        print(f"{name:38s} {t_tc:9.4f} {t_eager:9.4f} {t_comp:9.4f} {t_eager / t_tc:9.3f} "
              f"{flops / t_tc / 1e9:8.1f} {err:.1e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
