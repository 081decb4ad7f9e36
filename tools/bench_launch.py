"""Host time of a cached tcmlir call, beside torch (and Triton when installed), and cold compiles.

    python tools/bench_launch.py                 # target cuda, torch CUDA tensors (needs a GPU)
    python tools/bench_launch.py --target cpu    # target cpu, numpy inputs, N=1
    python tools/bench_launch.py --json out.json

Kernels: ``add`` (one statement, three tensor arguments: ``z(i) = x(i) + y(i)`` on 1024
floats) and ``softmax`` (four statements, on 128 x 1024 floats). Rows: tcmlir's call, the
same writing a preallocated output (``outputs=``), torch (``x + y``, ``torch.add(..., out=)``,
``torch.softmax``) and Triton. For each, in one run:

* ``enqueue``: host time of one call, median over ``--calls`` calls after a warm-up, with no
  synchronisation inside the timed loop (the way torch and Triton launch overheads are
  measured); the device is synchronised once after the loop;
* ``synced``: the same with ``torch.cuda.synchronize()`` after every call (host time of a call
  that waits for its result);
* ``cold compile``: the first call of a fresh definition with an empty cache directory
  (parse, polyhedral pipeline, LLVM, PTX, JIT link, module load, plan, launch, sync), after a
  throwaway kernel has paid the process's one-time start-up (CUDA context, LLVM and libdevice
  initialisation), which is reported on its own as ``process start-up``.

The cpu mode times ``fn(x, y)`` on numpy arrays of one element (and numpy's own ``x + y``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

WARMUP = "def warmup(float(N) x) -> (z) { z(i) = exp(x(i)) * 2 }"
ADD = "def add(float(N) x, float(N) y) -> (z) { z(i) = x(i) + y(i) }"
SOFTMAX = """
def softmax(float(N, D) I) -> (O) {
    mx(n) max=! I(n, d)
    e(n, d) = exp(I(n, d) - mx(n))
    s(n) +=! e(n, d)
    O(n, d) = e(n, d) / s(n)
}"""


def median_us(call: Callable[[], Any], calls: int, after: Callable[[], Any] | None = None,
              warmup: int = 20) -> float:
    """Median host time of ``call`` in microseconds; ``after`` runs inside each timed call."""
    for _ in range(warmup):
        call()
        if after is not None:
            after()
    times = []
    clock = time.perf_counter_ns
    for _ in range(calls):
        start = clock()
        call()
        if after is not None:
            after()
        times.append(clock() - start)
    return statistics.median(times) / 1e3


def cold_compile_s(source: str, target: str, inputs: tuple, sync: Callable[[], Any]) -> float:
    import tcmlir as tc

    saved = os.environ.get("TCMLIR_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="tcmlir-bench-cold-") as cache:
        os.environ["TCMLIR_CACHE_DIR"] = cache
        try:
            start = time.perf_counter()
            fn = tc.define(source, target=target)
            fn(*inputs)
            sync()
            return time.perf_counter() - start
        finally:
            if saved is None:
                os.environ.pop("TCMLIR_CACHE_DIR", None)
            else:
                os.environ["TCMLIR_CACHE_DIR"] = saved


def triton_kernels() -> dict[str, Callable[..., Any]] | None:
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None
    import torch

    @triton.jit
    def add_kernel(x_ptr, y_ptr, z_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(z_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask),
                 mask=mask)

    @triton.jit
    def softmax_kernel(out_ptr, in_ptr, cols, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        x = tl.load(in_ptr + row * cols + offs, mask=offs < cols, other=-float("inf"))
        e = tl.exp(x - tl.max(x, axis=0))
        tl.store(out_ptr + row * cols + offs, e / tl.sum(e, axis=0), mask=offs < cols)

    def add(x: Any, y: Any) -> Any:
        z = torch.empty_like(x)
        add_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, z, x.numel(), BLOCK=1024)
        return z

    def softmax(x: Any) -> Any:
        out = torch.empty_like(x)
        softmax_kernel[(x.shape[0],)](out, x, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
        return out

    return {"add": add, "softmax": softmax}


def bench_cuda(calls: int) -> dict[str, Any]:
    import torch

    import tcmlir as tc

    if not torch.cuda.is_available():
        sys.exit("bench_launch: no CUDA device (use --target cpu)")
    sync = torch.cuda.synchronize
    x, y = torch.randn(1024, device="cuda"), torch.randn(1024, device="cuda")
    X = torch.randn(128, 1024, device="cuda")
    z, Z = torch.empty_like(x), torch.empty_like(X)
    cases = {"add": (ADD, (x, y), lambda: x + y, z, lambda: torch.add(x, y, out=z)),
             "softmax": (SOFTMAX, (X,), lambda: torch.softmax(X, 1), Z, None)}
    triton = triton_kernels()
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(), "calls": calls, "kernels": {},
                              "startup_s": cold_compile_s(WARMUP, "cuda", (x,), sync)}
    for name, (source, inputs, torch_call, out, torch_into) in cases.items():
        cold = cold_compile_s(source, "cuda", inputs, sync)
        fn = tc.define(source, target="cuda")
        fn(*inputs)
        sync()
        rows = {"tcmlir": lambda fn=fn, inputs=inputs: fn(*inputs), "torch": torch_call,
                "tcmlir outputs=": lambda fn=fn, inputs=inputs, out=out: fn(*inputs, outputs=out)}
        if torch_into is not None:
            rows["torch out="] = torch_into
        if triton is not None:
            rows["triton"] = lambda k=triton[name], inputs=inputs: k(*inputs)
        result: dict[str, Any] = {"cold_compile_s": cold}
        for who, call in rows.items():
            enqueue = median_us(call, calls)
            sync()
            result[who] = {"enqueue_us": enqueue, "synced_us": median_us(call, calls, sync)}
        report["kernels"][name] = result
    if triton is None:
        report["note"] = "triton is not installed: its rows are skipped"
    return report


def bench_cpu(calls: int) -> dict[str, Any]:
    import numpy as np

    import tcmlir as tc

    x, y = np.ones(1, np.float32), np.ones(1, np.float32)
    X = np.random.default_rng(0).standard_normal((1, 8)).astype(np.float32)
    cases = {"add": (ADD, (x, y), lambda: x + y),
             "softmax": (SOFTMAX, (X,), lambda: np.exp(X - X.max(1, keepdims=True)))}
    report: dict[str, Any] = {"device": "host", "calls": calls, "kernels": {},
                              "startup_s": cold_compile_s(WARMUP, "cpu", (x,), lambda: None)}
    for name, (source, inputs, numpy_call) in cases.items():
        cold = cold_compile_s(source, "cpu", inputs, lambda: None)
        fn = tc.define(source, target="cpu")
        fn(*inputs)
        report["kernels"][name] = {
            "cold_compile_s": cold,
            "tcmlir": {"call_us": median_us(lambda fn=fn, inputs=inputs: fn(*inputs), calls)},
            "numpy": {"call_us": median_us(numpy_call, calls)}}
    return report


def print_report(report: dict[str, Any]) -> None:
    print(f"device: {report['device']}   calls per median: {report['calls']}   "
          f"process start-up: {report['startup_s']:.3f} s")
    for name, result in report["kernels"].items():
        print(f"\n{name}: cold compile {result['cold_compile_s']:.3f} s")
        for who, row in result.items():
            if who == "cold_compile_s":
                continue
            cells = "   ".join(f"{k.removesuffix('_us')} {v:8.2f} us" for k, v in row.items())
            print(f"  {who:16s} {cells}")
    if "note" in report:
        print(f"\n{report['note']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--calls", type=int, default=500, help="calls per median (>= 200)")
    parser.add_argument("--json", help="also write the report to this file")
    args = parser.parse_args(argv)
    calls = max(200, args.calls)
    report = bench_cuda(calls) if args.target == "cuda" else bench_cpu(calls)
    print_report(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
