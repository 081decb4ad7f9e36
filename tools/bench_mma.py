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
    rng = np.random.default_rng(0)
    bad = 0
    for name, (src, ref, sa, sb, dt) in forms.items():
        a = rng.standard_normal(sa).astype(dt)
        b = rng.standard_normal(sb).astype(dt)
        got = np.asarray(tc.define(src, target="cuda")(a, b), np.float64)
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
    for name, src, make, ref in CASES:
        if args.quick and "4096^3" not in name:
            continue
        ins = [x.cuda() for x in make()]
        fn = tc.define(src, target="cuda")
        got = fn(*ins)
        want = ref(*ins)
        err = ((got.float() - want.float()).norm() / want.float().norm()).item()
        t_tc = _time(lambda f=fn, x=ins: f(*x), args.reps)
        t_eager = _time(lambda r=ref, x=ins: r(*x), args.reps)
        compiled = torch.compile(ref)
        t_comp = _time(lambda c=compiled, x=ins: c(*x), args.reps)
        flops = 2 * want.numel() * ins[0].shape[-1]  # (K is the first input's last extent)
        print(f"{name:38s} {t_tc:9.4f} {t_eager:9.4f} {t_comp:9.4f} {t_eager / t_tc:9.3f} "
              f"{flops / t_tc / 1e9:8.1f} {err:.1e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
