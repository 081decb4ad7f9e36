"""Benchmark ``target="cpu"`` against numpy and torch CPU doing the same work, through the public API.

    python tools/bench_cpu.py [--repeat R] [--small] [--threads 1,0] [--only NAME,...]

Kernels (float32): two fused elementwise chains over 4M elements (arithmetic only, and one with
exp/tanh), a row softmax 4096x1024 (4 statements) and a layernorm 4096x1024 with scale and
shift (4 statements), matmuls 512^3, 1024^3 and 2048^3, a batched matmul 16x256^3
(``np.matmul``) and a 3x3 convolution 8x64x56x56 with 64 filters (no padding). The reference
("ref") is numpy doing the same work with its separate operations (``A @ B`` for matmul), or
torch on the CPU where torch has the operation (``torch.softmax``,
``torch.nn.functional.layer_norm``, ``conv2d``; those rows are skipped without torch). Each
kernel is defined with ``tc.define(src, target="cpu")`` and compiled with
``fn.compile(*inputs, options=...)`` under the default options (what a call without
``options=`` uses) and under hand-picked "best" options. Timing: after a warm-up, ``--repeat``
interleaved rounds, each running the reference, then every tcmlir variant, each twice in a
row with the second timed (``Kernel.benchmark(..., runs=1)``: the warm call a user's repeated
call makes; see `interleaved`; with several threads after a 50 ms pause, so that the previous
library's threads have stopped spinning); a column is the minimum over the rounds, so a machine shared with other work (the header prints the load
average) slows the columns alike rather than one of them. ``torch-in`` is the default kernel's
warm call on torch CPU tensors (the same memory), beside the numpy-input call (ratio
torch-in / numpy-in: the issue asks for at most 1.5).
``OPENBLAS_CORETYPE`` and ``OPENBLAS_L2_SIZE`` are removed from this process's environment
before numpy loads, and the header names the OpenBLAS kernel that runs. The table gives
milliseconds and the ratio reference / tcmlir (> 1: tcmlir is faster), for each thread count of
``--threads`` (0 = all cores; numpy's BLAS and torch get the same count). Then the warm call of
a small ``add`` (1024 floats) with numpy and with torch inputs, and the median time from source
to a callable kernel (``tc.define`` + ``compile``) for the 512^3 matmul, default options.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

# numpy's BLAS picks its kernel for this CPU itself: an OPENBLAS_CORETYPE or OPENBLAS_L2_SIZE
# inherited from the environment (set elsewhere to work around a CPU) would pin another one.
# Dropped for this process only, before numpy loads OpenBLAS; the header names the kernel.
UNSET = {v: os.environ.pop(v) for v in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
         if v in os.environ}

import numpy as np  # noqa: E402

# Measure this compiler, not kernels an earlier version left in the on-disk cache (its key
# does not cover the pass pipeline), and time source -> kernel cold. TCMLIR_ALWAYS_COMPILE=0
# in the environment keeps the cache.
os.environ.setdefault("TCMLIR_ALWAYS_COMPILE", "1")

import tcmlir as tc  # noqa: E402

CHAIN_ARITH = ("def chain(float(N) A, float(N) B, float(N) C) -> (O) "
               "{ O(i) = A(i) * B(i) + C(i) * 0.5 - A(i) }")
CHAIN_MATH = ("def chainm(float(N) A, float(N) B) -> (O) "
              "{ O(i) = tanh(A(i)) * B(i) + exp(-A(i)) }")
SOFTMAX = """def softmax(float(N, M) X) -> (Y) {
  mx(n) max=! X(n, m)
  e(n, m) = exp(X(n, m) - mx(n))
  s(n) +=! e(n, m)
  Y(n, m) = e(n, m) / s(n)
}"""
LAYERNORM = """def layernorm(float(T, D) I, float(D) G, float(D) Bt) -> (O) {
  mean(t) +=! I(t, d) / D
  c(t, d) = I(t, d) - mean(t)
  var(t) +=! c(t, d) * c(t, d) / D
  O(t, d) = c(t, d) * rsqrt(var(t) + 1e-5) * G(d) + Bt(d)
}"""
ADD = "def add(float(N) A, float(N) B) -> (C) { C(i) = A(i) + B(i) }"
MATMUL = "def matmul(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }"
BMM = ("def bmm(float(B, M, K) X, float(B, K, N) Y) -> (Z) "
       "{ Z(b, m, n) +=! X(b, m, k) * Y(b, k, n) }")
CONV = ("def conv(float(N, C, H, W) I, float(F, C, KH, KW) W1) -> (O) "
        "{ O(n, f, h, w) +=! I(n, c, h + kh, w + kw) * W1(f, c, kh, kw) }")


def default_options(fn, inputs) -> tc.MappingOptions:
    """What ``fn(*inputs)`` uses on target cpu without options (see TCFunction.compile)."""
    return tc.MappingOptions.default_for(fn.ir, "cpu", fn.size_values(*inputs))


def best_options(kind: str) -> tc.MappingOptions:
    """Hand-picked options per kernel kind (found with this script)."""
    base = tc.MappingOptions.naive()
    if kind == "elementwise":
        return base.tile(0).outer_schedule_fusion_strategy("max")
    if kind in ("softmax", "layernorm"):
        return base.tile(0).outer_schedule_fusion_strategy("max")
    if kind == "batched":
        return base.tile(0, 32, 32, 32)
    if kind == "conv":
        return base
    return base.tile(16, 256, 64)


def _torch():
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is optional
        return None
    return torch


def cases(small: bool):
    """(name, source, inputs, reference, reference name, kind) per kernel."""
    rng = np.random.default_rng(0)
    n = 1 << (18 if small else 22)
    rows, cols = (512, 256) if small else (4096, 1024)
    f32 = np.float32
    A, B, C = (rng.standard_normal(n, dtype=f32) for _ in range(3))
    X = rng.standard_normal((rows, cols), dtype=f32)

    def np_chain():
        return A * B + C * f32(0.5) - A

    def np_chainm():
        return np.tanh(A) * B + np.exp(-A)

    def np_softmax():
        e = np.exp(X - X.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    out = [
        (f"chain arith {n >> 20}M" if n >= 1 << 20 else "chain arith", CHAIN_ARITH, (A, B, C),
         np_chain, "numpy", "elementwise"),
        (f"chain exp/tanh {n >> 20}M" if n >= 1 << 20 else "chain exp/tanh", CHAIN_MATH, (A, B),
         np_chainm, "numpy", "elementwise"),
        (f"softmax {rows}x{cols}", SOFTMAX, (X,), np_softmax, "numpy", "softmax"),
    ]
    torch = _torch()
    if torch is not None:
        G = rng.standard_normal(cols, dtype=f32)
        Bt = rng.standard_normal(cols, dtype=f32)
        tx, tg, tb = (torch.from_numpy(a) for a in (X, G, Bt))
        out.append((f"softmax {rows}x{cols}", SOFTMAX, (X,),
                    lambda: torch.softmax(tx, 1).numpy(), "torch", "softmax"))
        out.append((f"layernorm {rows}x{cols}", LAYERNORM, (X, G, Bt),
                    lambda: torch.nn.functional.layer_norm(tx, (cols,), tg, tb, eps=1e-5).numpy(),
                    "torch", "layernorm"))
    for mm in ((128,) if small else (512, 1024, 2048)):
        P = rng.standard_normal((mm, mm), dtype=f32)
        Q = rng.standard_normal((mm, mm), dtype=f32)
        out.append((f"matmul {mm}^3", MATMUL, (P, Q), lambda P=P, Q=Q: P @ Q, "numpy", "matmul"))
    nb, mb = (4, 64) if small else (16, 256)
    P = rng.standard_normal((nb, mb, mb), dtype=f32)
    Q = rng.standard_normal((nb, mb, mb), dtype=f32)
    out.append((f"bmm {nb}x{mb}^3", BMM, (P, Q), lambda: np.matmul(P, Q), "numpy", "batched"))
    if torch is None:
        return out
    n_img, chans, side = (2, 16, 20) if small else (8, 64, 56)
    img = rng.standard_normal((n_img, chans, side, side), dtype=f32)
    wts = rng.standard_normal((chans, chans, 3, 3), dtype=f32)
    ti, tw = torch.from_numpy(img), torch.from_numpy(wts)
    out.append((f"conv3x3 {n_img}x{chans}x{side}^2", CONV, (img, wts),
                lambda: torch.nn.functional.conv2d(ti, tw).numpy(), "torch", "conv"))
    return out


def openblas_lib():
    """numpy's OpenBLAS as a ctypes library (None when numpy's BLAS is not OpenBLAS)."""
    import ctypes

    with open(f"/proc/{os.getpid()}/maps") as maps:
        libs = sorted({line.split()[-1] for line in maps if "openblas" in line.lower()})
    return ctypes.CDLL(libs[0]) if libs else None


def blas_kernel() -> str:
    """Which BLAS, and which of its kernels, numpy's ``@`` runs on this CPU."""
    import ctypes

    lib = openblas_lib()
    if lib is None:
        return "not OpenBLAS"
    parts = []
    for sym in ("scipy_openblas_get_config64_", "openblas_get_config64_", "openblas_get_config"):
        if hasattr(lib, sym):
            getattr(lib, sym).restype = ctypes.c_char_p
            parts.append(getattr(lib, sym)().decode())
            break
    for sym in ("scipy_openblas_get_corename64_", "openblas_get_corename64_",
                "openblas_get_corename"):
        if hasattr(lib, sym):
            getattr(lib, sym).restype = ctypes.c_char_p
            parts.append(f"kernel {getattr(lib, sym)().decode()}")
            break
    return ", ".join(parts) or "OpenBLAS"


def blas_threads_setter():
    """A function setting numpy's OpenBLAS thread count (None if not found: BLAS keeps its own)."""
    import ctypes

    with open(f"/proc/{os.getpid()}/maps") as maps:
        libs = {line.split()[-1] for line in maps if "openblas" in line.lower()}
    for path in libs:
        lib = ctypes.CDLL(path)
        for sym in ("scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_",
                    "openblas_set_num_threads"):
            if hasattr(lib, sym):
                return getattr(lib, sym)
    return None


def seconds(f) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def interleaved(calls, rounds: int, settle: float = 0.0) -> list[float]:
    """Minimum seconds of each of ``calls`` (functions returning their own time) over
    ``rounds`` rounds, after one warm-up round. A round runs every call twice and keeps the
    second time: the first call after another library's pays for the memory that one
    returned to the system (numpy's softmax frees 16 MiB arrays; the fresh 16 MiB output of
    the call after it is then faulted in anew, doubling its time). ``settle``: seconds of
    sleep before each call's pair, so that another library's idle threads have stopped
    spinning (torch's OpenMP workers spin for milliseconds after a parallel region and take
    the core a thread of the next call wanted: tcmlir's 2-thread softmax right after
    torch.softmax ran at its 1-thread time)."""
    for c in calls:
        c()
    best = [float("inf")] * len(calls)
    for _ in range(rounds):
        for i, c in enumerate(calls):
            if settle:
                time.sleep(settle)
            c()
            best[i] = min(best[i], c())
    return best


def rel_err(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want)) / max(1e-30, float(np.max(np.abs(want)))))


def set_threads(set_blas, thr: int) -> None:
    """numpy's BLAS and torch limited to ``thr`` threads (0: all cores)."""
    n = thr or os.cpu_count() or 1
    if set_blas is not None:
        set_blas(n)
    torch = _torch()
    if torch is not None:
        torch.set_num_threads(n)


def kernel_call(kernel, inputs):
    """One warm call of ``kernel`` on ``inputs``, returning its seconds (`Kernel.benchmark`)."""
    return lambda: kernel.benchmark(*inputs, runs=1)[0]


def small_add_line(rounds: int) -> str:
    """The warm call ``fn(a, b)`` of ``add`` on 1024 floats with numpy and with torch CPU
    inputs (the call a user repeats: call key, prepared plan, fresh output)."""
    torch = _torch()
    a = np.arange(1024, dtype=np.float32)
    fn = tc.define(ADD, target="cpu")
    # TCMLIR_ALWAYS_COMPILE (set above for the compile times) would compile on every call
    saved = os.environ.pop("TCMLIR_ALWAYS_COMPILE", None)
    try:
        calls = [lambda: seconds(lambda: fn(a, a))]
        if torch is not None:
            t = torch.from_numpy(a)
            calls += [lambda: seconds(lambda: fn(t, t)), lambda: seconds(lambda: torch.add(t, t))]
        best = interleaved(calls, max(rounds, 200))
    finally:
        if saved is not None:
            os.environ["TCMLIR_ALWAYS_COMPILE"] = saved
    line = f"add 1024 floats, warm call fn(a, b): numpy inputs {best[0] * 1e6:.1f} us"
    if torch is not None:
        line += (f", torch CPU inputs {best[1] * 1e6:.1f} us (x{best[1] / best[0]:.2f} of numpy "
                 f"inputs); torch.add {best[2] * 1e6:.1f} us")
    return line


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=10, help="interleaved rounds (minimum taken)")
    ap.add_argument("--small", action="store_true", help="smaller sizes (a quick check)")
    ap.add_argument("--threads", default="1,0", help="comma-separated thread counts (0: all)")
    ap.add_argument("--only", default="", help="comma-separated name prefixes to run")
    ap.add_argument("--no-best", action="store_true", help="skip the hand-picked options")
    args = ap.parse_args()
    only = [s for s in args.only.split(",") if s]
    set_blas = blas_threads_setter()
    threads = [int(t) for t in args.threads.split(",")]
    torch = _torch()
    load = os.getloadavg()
    print(f"# cores {os.cpu_count()}, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, "
          f"min of {args.repeat} interleaved rounds; ref: numpy or torch CPU (ref column)")
    print(f"# numpy BLAS: {blas_kernel()}"
          + (f" (unset here: {', '.join(f'{k}={v}' for k, v in UNSET.items())})" if UNSET else ""))
    print(f"{'kernel':<22}{'thr':>4}{'ref':>6}{'ref ms':>9}{'default ms':>12}{'ratio':>7}"
          f"{'best ms':>10}{'ratio':>7}{'torch-in ms':>13}{'/np-in':>7}  best options")
    for name, src, inputs, ref, ref_name, kind in cases(args.small):
        if only and not any(name.startswith(o) for o in only):
            continue
        fn = tc.define(src, target="cpu")
        want = ref()
        for thr in threads:
            set_threads(set_blas, thr)
            variants = [default_options(fn, inputs)] + ([] if args.no_best else [best_options(kind)])
            kernels = []
            for opts in variants:
                kernel = fn.compile(*inputs, options=opts.with_threads(thr))
                err = rel_err(kernel.launch(*inputs), want)
                assert err < 1e-3, f"{name}: relative error {err:g}"
                kernels.append(kernel)
            calls = [lambda ref=ref: seconds(ref)] + [kernel_call(k, inputs) for k in kernels]
            if torch is not None:
                calls.append(kernel_call(kernels[0], tuple(torch.from_numpy(a) for a in inputs)))
            best = interleaved(calls, args.repeat, settle=0.05 if thr != 1 else 0.0)
            t_ref, times = best[0], best[1:1 + len(kernels)]
            row = f"{name:<22}{thr or os.cpu_count():>4}{ref_name:>6}{t_ref * 1e3:>9.2f}"
            for i, t in enumerate(times):
                row += f"{t * 1e3:>{12 if i == 0 else 10}.2f}{t_ref / t:>7.2f}"
            if torch is not None:
                row += f"{best[-1] * 1e3:>13.2f}{best[-1] / times[0]:>7.2f}"
            if not args.no_best:
                row += f"  {best_options(kind).to_pipeline('cpu')}"
            print(row, flush=True)

    print(small_add_line(args.repeat))
    mm = 128 if args.small else 512
    rng = np.random.default_rng(1)
    P = rng.standard_normal((mm, mm), dtype=np.float32)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        tc.define(MATMUL, target="cpu").compile(P, P)
        times.append(time.perf_counter() - t0)
    print(f"matmul {mm}^3 source -> callable kernel (define + compile, default options): "
          f"median {statistics.median(times) * 1e3:.1f} ms of 5")


if __name__ == "__main__":
    main()
