"""GPU check of the memory-hierarchy mappings on matmul: correctness at awkward sizes and speed.

    python tools/promo_smoke.py [--sizes 4096] [--variants all]

For each option variant (register tiles, shared/private promotion), compiles the matmul, checks
it against a float64 torch reference at awkward sizes (primes, 1, sizes tiles do not divide) on
fresh random inputs with NaN-poisoned outputs, and times it at 4096³ beside torch (TF32 off),
with CUDA events, median of 20 runs. Needs a GPU and torch.
"""

from __future__ import annotations

import argparse
import statistics
import sys

MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"


def variants():
    import tcmlir as tc

    MO = tc.MappingOptions
    base = MO.cuda_contraction()
    return {
        "default": MO.default_for(tc.define(MM), "cuda"),
        "128x128x8 r8x8": base,
        "128x128x8 r8x8 db": base.double_buffering(),
        "128x64x8 r8x4": base.tile(128, 64, 8).register_tiling(8, 4),
        "128x64x8 r8x4 db": base.tile(128, 64, 8).register_tiling(8, 4).double_buffering(),
        "128x64x16 r8x4 db": base.tile(128, 64, 16).register_tiling(8, 4).double_buffering(),
        "64x128x8 r4x8 db": base.tile(64, 128, 8).register_tiling(4, 8).double_buffering(),
        "64x256x8 r8x8 db": base.tile(64, 256, 8).double_buffering(),
        "128x128x8 r8x4 db": base.tile(128, 128, 8).register_tiling(8, 4).double_buffering(),
        "64x64x8 r4x4 db": base.tile(64, 64, 8).register_tiling(4, 4).double_buffering(),
        "naive+shared": MO.naive().shared_memory(True),
    }


def time_cuda(torch, fn, runs=20):
    """CUDA-event median (bench.py's timer: warm-up, then ``runs`` timed calls)."""
    from bench import time_cuda as timer  # tools/ is this script's directory

    return timer(torch, fn, runs=runs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--only", default="")
    args = ap.parse_args(argv)
    import torch

    import tcmlir as tc

    torch.backends.cuda.matmul.allow_tf32 = False
    fn = tc.define(MM, target="cuda")
    n = args.size
    a, b = torch.randn(n, n, device="cuda"), torch.randn(n, n, device="cuda")
    t_torch = time_cuda(torch, lambda: a @ b)
    print(f"torch {n}^3: {t_torch * 1e3:.3f} ms = {2 * n ** 3 / t_torch / 1e12:.1f} TFLOP/s", flush=True)
    bad = 0
    for label, opts in variants().items():
        if args.only and args.only not in label:
            continue
        errs = []
        try:
            for (m, k, nn) in ((1, 1, 1), (129, 65, 17), (1000, 517, 333), (257, 1031, 130)):
                x = torch.randn(m, k, device="cuda")
                y = torch.randn(k, nn, device="cuda")
                out = torch.full((m, nn), float("nan"), device="cuda")
                fn(x, y, options=opts, outputs=(out,))
                torch.cuda.synchronize()
                ref = (x.double() @ y.double())
                e = float((out.double() - ref).norm() / ref.norm().clamp_min(1e-30))
                errs.append(e if e == e else float("inf"))
            kernel = fn.compile(a, b, options=opts)
            c = kernel.launch(a, b)
            torch.cuda.synchronize()
            ref = a.double() @ b.double()
            errs.append(float((c.double() - ref).norm() / ref.norm()))
            t = statistics.median(kernel.benchmark(a, b, runs=20))
            ok = all(e < 1e-5 for e in errs)
            bad += not ok
            print(f"{label:<28} {t * 1e3:8.3f} ms = {t_torch / t:5.2f}x torch  "
                  f"{2 * n ** 3 / t / 1e12:5.1f} TFLOP/s  max err {max(errs):.1e} {'OK' if ok else 'WRONG'}",
                  flush=True)
        except tc.TCError as exc:
            bad += 1
            print(f"{label:<28} FAILED {str(exc).splitlines()[0]}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
