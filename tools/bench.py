"""GPU benchmark: tcmlir (naive, default and hand-picked options) beside PyTorch eager, in one run.

    python tools/bench.py [--quick] [--only NAME,...] [--json OUT.json]

Times with CUDA events after warm-up (median of many runs), inputs as torch CUDA tensors (no
host copies), and prints each kernel's time, its ratio to PyTorch and its fraction of the
roofline ceiling built from the ceilings measured on the H200 (DESIGN.md §8): device copy
4.21 TB/s (read + write) and fp32 SGEMM 51 TFLOP/s. Needs a GPU, torch and tcmlir's cuda target.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

COPY_BW = 4.21e12  # bytes/s, read + write
FP32_FLOPS = 51e12


@dataclass
class Case:
    name: str
    tc: str
    make: Any  # (torch, quick) -> inputs
    torch_fn: Any  # (torch, *inputs) -> output
    flops: float
    bytes: float
    # MappingOptions factory (options found by tuning, kept for the "tuned" column), or None; the
    # hand-picked options of earlier sessions were dropped once the defaults beat them all
    tuned: Any


def cases(quick: bool) -> list[Case]:
    s = 4 if quick else 1
    M = N = K = 4096 // s
    R, D = 32768 // s, 4096
    T = 8192 // s
    B, IN, OUT = 1024 // s, 2048, 1024
    return [
        Case("matmul 4096^3", "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }",
             lambda t: (t.randn(M, K, device="cuda"), t.randn(K, N, device="cuda")),
             lambda t, a, b: a @ b, 2.0 * M * N * K, 4.0 * (M * K + K * N + M * N), None),
        Case("tmm 128x1024x1024", "def tmm(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,k) * B(n,k) }",
             lambda t: (t.randn(128, 1024, device="cuda"), t.randn(1024, 1024, device="cuda")),
             lambda t, a, b: a @ b.t(), 2.0 * 128 * 1024 * 1024, 4.0 * (128 * 1024 * 2 + 1024 * 1024),
             None),
        Case("tbmm 500x26x26x72", """def tbmm(float(B,N,K) X, float(B,M,K) Y) -> (Z) {
                Z(b,n,m) +=! X(b,n,k) * Y(b,m,k)
            }""", lambda t: (t.randn(500, 26, 72, device="cuda"), t.randn(500, 26, 72, device="cuda")),
             lambda t, x, y: t.bmm(x, y.transpose(1, 2)), 2.0 * 500 * 26 * 26 * 72,
             4.0 * 500 * (2 * 26 * 72 + 26 * 26), None),
        Case("grouped conv 32x32x16 16^2 3x3", """def gconv(float(N,G,C,H,W) I, float(G,F,C,KH,KW) W1) -> (O) {
                O(n,g,f,h,w) +=! I(n,g,c,h+kh,w+kw) * W1(g,f,c,kh,kw)
            }""", lambda t: (t.randn(32, 32, 16, 16, 16, device="cuda"),
                             t.randn(32, 16, 16, 3, 3, device="cuda")),
             lambda t, i, w: t.nn.functional.conv2d(i.reshape(32, 512, 16, 16), w.reshape(512, 16, 3, 3),
                                                    groups=32).reshape(32, 32, 16, 14, 14),
             2.0 * 32 * 32 * 16 * 14 * 14 * 16 * 9, 4.0 * (32 * 512 * 256 + 512 * 144 + 32 * 512 * 196),
             None),
        Case("elementwise chain 2^28", "def chain(float(N) X) -> (O) { O(i) = ((X(i) * 2 + 1) * X(i) - 3) * 0.5 }",
             lambda t: (t.randn((1 << 28) // s, device="cuda"),),
             lambda t, x: ((x * 2 + 1) * x - 3) * 0.5, 5.0 * (1 << 28) / s, 8.0 * (1 << 28) / s, None),
        Case("softmax 32768x4096", """def softmax(float(N, D) X) -> (O) {
                mx(n) max=! X(n, d)
                e(n, d) = exp(X(n, d) - mx(n))
                s(n) +=! e(n, d)
                O(n, d) = e(n, d) / s(n)
            }""", lambda t: (t.randn(R, D, device="cuda"),),
             lambda t, x: t.softmax(x, dim=1), 4.0 * R * D, 4.0 * 2 * R * D, None),
        Case("row sum 32768x4096", "def rowsum(float(N, D) X) -> (S) { S(n) +=! X(n, d) }",
             lambda t: (t.randn(R, D, device="cuda"),), lambda t, x: x.sum(dim=1),
             1.0 * R * D, 4.0 * R * D, None),
        Case("layernorm 32768x4096", """def layernorm(float(N, D) X) -> (O) {
                mean(n) +=! X(n, d) / D
                c(n, d) = X(n, d) - mean(n)
                var(n) +=! c(n, d) * c(n, d) / D
                O(n, d) = c(n, d) * rsqrt(var(n) + 1e-5)
            }""", lambda t: (t.randn(R, D, device="cuda"),),
             lambda t, x: t.nn.functional.layer_norm(x, (x.shape[1],), eps=1e-5), 8.0 * R * D,
             4.0 * 2 * R * D, None),
        Case("full sum 2^28", "def full(float(N) X) -> (s) { s +=! X(i) }",
             lambda t: (t.randn((1 << 28) // s, device="cuda"),), lambda t, x: x.sum(),
             float((1 << 28) // s), 4.0 * ((1 << 28) // s), None),
        Case("column sum 4096x32768", "def colsum(float(N, D) X) -> (S) { S(d) +=! X(n, d) }",
             lambda t: (t.randn(4096 // s, 32768, device="cuda"),), lambda t, x: x.sum(dim=0),
             4096.0 * 32768 / s, 4.0 * 4096 * 32768 / s, None),
        Case("transpose 8192^2", "def tr(float(N, M) A) -> (B) { B(m, n) = A(n, m) }",
             lambda t: (t.randn(T, T, device="cuda"),), lambda t, a: a.t().contiguous(),
             0.0, 8.0 * T * T, None),
        Case("bias+relu 1024x2048->1024", """def fc_relu(float(B, M) I, float(N, M) W, float(N) bias) -> (O) {
                O(b, n) +=! I(b, m) * W(n, m)
                O(b, n) = fmax(O(b, n) + bias(n), 0)
            }""", lambda t: (t.randn(B, IN, device="cuda"), t.randn(OUT, IN, device="cuda"),
                              t.randn(OUT, device="cuda")),
             lambda t, x, w, b: t.relu(t.nn.functional.linear(x, w, b)), 2.0 * B * IN * OUT,
             4.0 * (B * IN + OUT * IN + B * OUT), None),
    ]


def time_cuda(torch: Any, fn: Any, warmup: int = 3, runs: int = 20) -> float:
    """Median seconds per call. Like `Kernel.benchmark`, a sample is the mean of up to 10 calls
    queued back to back (one for calls of a millisecond or more), after one untimed lead call:
    the host queues the timed calls while the GPU still runs the lead, so their enqueue time
    overlaps the GPU's work instead of counting as idle GPU time (the start event fires when
    the lead ends). torch and tcmlir are timed the same way."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    inner = max(1, min(10, int(1.0 / max(start.elapsed_time(end), 1e-6))))
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        fn()  # the lead call
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / inner)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes")
    ap.add_argument("--only", default="", help="comma list of case-name prefixes")
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    args = ap.parse_args(argv)
    import torch

    import tcmlir as tc

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False  # fp32 convolutions too (cuDNN defaults to TF32)
    rows = []
    t0 = time.perf_counter()

    def step(what: str) -> None:  # progress on stderr: where the time goes
        print(f"[{time.perf_counter() - t0:7.2f}s] {what}", file=sys.stderr, flush=True)

    for case in cases(args.quick):
        if args.only and not any(case.name.startswith(p) for p in args.only.split(",")):
            continue
        torch.manual_seed(0)
        step(f"{case.name}: inputs")
        inputs = case.make(torch)
        ceiling = max(case.flops / FP32_FLOPS, case.bytes / COPY_BW)
        t_torch = time_cuda(torch, lambda case=case, inputs=inputs: case.torch_fn(torch, *inputs))
        ref = case.torch_fn(torch, *inputs)
        step(f"{case.name}: torch timed")
        fn = tc.define(case.tc, target="cuda")
        row = {"case": case.name, "torch_ms": t_torch * 1e3, "ceiling_ms": ceiling * 1e3}
        # default: what a call without options gets (MappingOptions.default_for)
        if not args.no_compile:
            try:
                compiled = torch.compile(lambda *a, case=case: case.torch_fn(torch, *a))
                compiled(*inputs)
                row["compile_ms"] = time_cuda(torch, lambda c=compiled, x=inputs: c(*x)) * 1e3
                step(f"{case.name}: torch.compile timed")
            except Exception as exc:  # noqa: BLE001 - report, go on with the row
                row["compile_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
        labelled = [("naive", tc.MappingOptions.naive()), ("default", None)]
        if case.tuned is not None:
            labelled.append(("tuned", case.tuned()))
        for label, opts in labelled:
            try:
                kernel = fn.compile(*inputs, options=opts)
                step(f"{case.name}: {label} compiled")
                out = kernel.launch(*inputs)
                torch.cuda.synchronize()
                step(f"{case.name}: {label} launched")
                err = float((out - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
                t = statistics.median(kernel.benchmark(*inputs, runs=20))
                row[f"{label}_ms"] = t * 1e3
                row[f"{label}_err"] = err
            except tc.TCError as exc:
                row[f"{label}_ms"] = None
                row[f"{label}_error"] = str(exc).splitlines()[0]
        rows.append(row)
        print(_format_row(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


def _format_row(r: dict) -> str:
    parts = [f"{r['case']:<28} torch {r['torch_ms']:8.3f} ms ({r['ceiling_ms'] / r['torch_ms']:5.0%} of ceiling)"]
    if "compile_ms" in r:
        parts.append(f"torch.compile {r['compile_ms']:8.3f} ms ({r['ceiling_ms'] / r['compile_ms']:5.0%})")
    for label in ("naive", "default", "tuned"):
        if f"{label}_ms" not in r:
            continue
        t = r.get(f"{label}_ms")
        if t is None:
            parts.append(f"{label}: FAILED {r.get(f'{label}_error', '')}")
        else:
            vs_compile = f", {r['compile_ms'] / t:5.2f}x compile" if "compile_ms" in r else ""
            parts.append(f"{label} {t:9.3f} ms = {r['torch_ms'] / t:6.2f}x torch{vs_compile}, "
                         f"{r['ceiling_ms'] / t:5.0%} of ceiling, err {r[f'{label}_err']:.1e}")
    return " | ".join(parts)


if __name__ == "__main__":
    sys.exit(main())
