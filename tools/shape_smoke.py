"""GPU: option variants for the benchmark's small and batched contractions (tmm, tbmm, grouped
convolution), each checked against torch (float64 reference) and timed beside it.

    python tools/shape_smoke.py

Used to pick defaults for these shapes (docs/perf.md). CUDA events, median of 20 runs, TF32 off.
"""

from __future__ import annotations

import statistics
import sys

CASES = {
    "tmm 128x1024x1024": (
        "def tmm(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,k) * B(n,k) }",
        lambda t: (t.randn(128, 1024, device="cuda"), t.randn(1024, 1024, device="cuda")),
        lambda a, b: a @ b.t()),
    "tbmm 500x26x26x72": (
        "def tbmm(float(B,N,K) X, float(B,M,K) Y) -> (Z) { Z(b,n,m) +=! X(b,n,k) * Y(b,m,k) }",
        lambda t: (t.randn(500, 26, 72, device="cuda"), t.randn(500, 26, 72, device="cuda")),
        lambda x, y: x @ y.transpose(1, 2)),
    "fc+bias+relu 1024x2048->1024": (
        """def fc_relu(float(B, M) I, float(N, M) W, float(N) bias) -> (O) {
            O(b, n) +=! I(b, m) * W(n, m)
            O(b, n) = fmax(O(b, n) + bias(n), 0) }""",
        lambda t: (t.randn(1024, 2048, device="cuda"), t.randn(1024, 2048, device="cuda"),
                   t.randn(1024, device="cuda")),
        lambda x, w, b: (x @ w.t() + b).clamp_min(0)),
    "mm 1024x2048x1024": (
        "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }",
        lambda t: (t.randn(1024, 2048, device="cuda"), t.randn(2048, 1024, device="cuda")),
        lambda a, b: a @ b),
    "gconv 32x32x16 16^2 3x3": (
        """def gconv(float(N,G,C,H,W) I, float(G,F,C,KH,KW) W1) -> (O) {
            O(n,g,f,h,w) +=! I(n,g,c,h+kh,w+kw) * W1(g,f,c,kh,kw) }""",
        lambda t: (t.randn(32, 32, 16, 16, 16, device="cuda"), t.randn(32, 16, 16, 3, 3, device="cuda")),
        None),
}


def variants(name: str):
    import tcmlir as tc

    MO = tc.MappingOptions
    c = MO.cuda_contraction()
    if name.startswith("tmm"):
        return {"default": None, "32x32x16 r4x4": c.tile(32, 32, 16).register_tiling(4, 4),
                "64x32x16 r4x2": c.tile(64, 32, 16).register_tiling(4, 2),
                "32x64x32 r2x4": c.tile(32, 64, 32).register_tiling(2, 4),
                "16x64x32 r2x4": c.tile(16, 64, 32).register_tiling(2, 4)}
    if name.startswith(("fc", "mm")):
        return {"default": None, "fused": c,
                "min 64x64x16 r4x4": c.tile(64, 64, 16).register_tiling(4, 4)
                .outer_schedule_fusion_strategy("min"),
                "min single-buffer": c.double_buffering(False).outer_schedule_fusion_strategy("min"),
                "min 128x128x8 r8x8": c.tile(128, 128, 8).register_tiling(8, 8)
                .outer_schedule_fusion_strategy("min")}
    if name.startswith("tbmm"):
        return {"default": None,
                "1x32x32x8 r1x4x4": c.tile(1, 32, 32, 8).register_tiling(1, 4, 4),
                "1x32x32x8 r1x2x2": c.tile(1, 32, 32, 8).register_tiling(1, 2, 2),
                "2x32x32x8 r1x4x4": c.tile(2, 32, 32, 8).register_tiling(1, 4, 4),
                "naive 1x32x32 b32x32": MO.naive().tile(1, 32, 32).map_to_threads(32, 32)}
    return {"default": None,
            "untiled-ng 16x14x14 b14x14x4 shared": MO.naive().tile(0, 0, 16, 14, 14)
            .map_to_threads(14, 14, 4).map_to_blocks(32, 32).shared_memory(True),
            "untiled-ng 16x14x14 b14x14x4": MO.naive().tile(0, 0, 16, 14, 14)
            .map_to_threads(14, 14, 4).map_to_blocks(32, 32),
            "untiled-ng 16x14x14 b14x14x2 shared": MO.naive().tile(0, 0, 16, 14, 14)
            .map_to_threads(14, 14, 2).map_to_blocks(32, 32).shared_memory(True),
            "group_convolution": MO.group_convolution()}


def time_cuda(torch, fn, runs=20):
    """CUDA-event median (bench.py's timer: warm-up, then ``runs`` timed calls)."""
    from bench import time_cuda as timer  # tools/ is this script's directory

    return timer(torch, fn, runs=runs)


def main() -> int:
    import torch

    import tcmlir as tc

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    bad = 0
    for name, (src, make, ref_fn) in CASES.items():
        torch.manual_seed(0)
        inputs = make(torch)
        if ref_fn is None:  # grouped conv through cuDNN
            def ref_fn(i, w):
                return torch.nn.functional.conv2d(i.reshape(32, 512, 16, 16), w.reshape(512, 16, 3, 3),
                                                  groups=32).reshape(32, 32, 16, 14, 14)
        t_torch = time_cuda(torch, lambda ref_fn=ref_fn, inputs=inputs: ref_fn(*inputs))
        ref = ref_fn(*[x.double() for x in inputs])
        print(f"{name}: torch {t_torch * 1e3:.4f} ms", flush=True)
        fn = tc.define(src, target="cuda")
        for label, opts in variants(name).items():
            try:
                kernel = fn.compile(*inputs, options=opts)
                out = kernel.launch(*inputs)
                torch.cuda.synchronize()
                err = float((out.double() - ref).norm() / ref.norm())
                t = statistics.median(kernel.benchmark(*inputs, runs=20))
                ok = err < 1e-5
                bad += not ok
                print(f"  {label:<38} {t * 1e3:9.4f} ms = {t_torch / t:5.2f}x torch  err {err:.1e} "
                      f"{'OK' if ok else 'WRONG'}", flush=True)
            except tc.TCError as exc:
                bad += 1
                print(f"  {label:<38} FAILED {str(exc).splitlines()[0][:120]}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
