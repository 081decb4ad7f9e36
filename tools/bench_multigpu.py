"""A split call (tcmlir.multi) against a one-device call, on the GPU(s): what partitioning costs.

    python tools/bench_multigpu.py                    # devices=[0, 0]: two parts on one GPU
    python tools/bench_multigpu.py --devices 0,1      # two GPUs (inputs on device 0)
    python tools/bench_multigpu.py --quick --only matmul --json out.json
    python tools/bench_multigpu.py --host             # host µs per call only (small sizes)
    python tools/bench_multigpu.py --fake             # the same without a GPU (tests' fake driver)

``--host`` times the host side alone: ``--calls`` calls queued back to back (best of
``--runs`` batches; small sizes, so the GPU keeps up and never holds the host back), one
partition against the split, and the split's excess over two one-partition calls. ``--fake``
runs the same loop over the two-device fake driver of the tests (torch tensors faked too, no
simulation of the kernels): it reports the fake's own time per call (driver calls and fake
tensors, measured by wrapping them) and ours, the rest.

For each case (torch CUDA tensors on device 0, TF32 off), in one run:

* ``one``: ``fn(*inputs)``, the ordinary call on device 0;
* ``split``: ``fn(*inputs, devices=DEVICES)``: the plan's parts on their own streams, input
  slabs in place (same device) or copied (peer / staged), outputs gathered on device 0;
* device time per call (CUDA events on torch's current stream, which the split call makes wait
  for every part: median of ``--runs`` after a warm-up) and host time of one call without
  synchronisation (median, the enqueue cost the partitioning adds);
* ``split / one`` for both, the bytes the plan moves, and the largest relative error of the
  split result against the one-device result (they run the same kernels on the same rows).

On one GPU the parts share the device: ``split / one`` near 1 says the partitioning costs
little; on two GPUs it should approach 0.5 for compute-bound cases when inputs are spread.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

SOFTMAX = """def softmax(float(N, D) X) -> (O) {
    mx(n) max=! X(n, d)
    e(n, d) = exp(X(n, d) - mx(n))
    s(n) +=! e(n, d)
    O(n, d) = e(n, d) / s(n)
}"""
MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
BMM = "def bmm(float(B,M,K) X, float(B,K,N) Y) -> (Z) { Z(b,m,n) +=! X(b,m,k) * Y(b,k,n) }"
GCONV = """def gconv(float(N,G,C,H,W) I, float(G,F,C,KH,KW) W1) -> (O) {
    O(n,g,f,h,w) +=! I(n,g,c,h+kh,w+kw) * W1(g,f,c,kh,kw)
}"""


@dataclass
class Case:
    name: str
    source: str
    shapes: tuple[tuple[int, ...], ...]


def cases(quick: bool) -> list[Case]:
    s = 4 if quick else 1
    return [
        Case("matmul 8192^3", MATMUL, ((8192 // s, 8192 // s), (8192 // s, 8192 // s))),
        Case("matmul 16384x16384x4096", MATMUL,
             ((16384 // s, 4096 // s), (4096 // s, 16384 // s))),
        Case("batched matmul 64x1024x1024x256", BMM,
             ((64 // s, 1024, 256), (64 // s, 256, 1024))),
        Case("softmax 65536x8192", SOFTMAX, ((65536 // s, 8192),)),
        Case("grouped conv 64x32x16 16^2 3x3", GCONV,
             ((64 // s, 32, 16, 16, 16), (32, 16, 16, 3, 3))),
    ]


def small_cases(scale: int = 1) -> list[Case]:
    """Sizes at which a call's host time shows: the kernels take microseconds."""
    s = scale
    return [
        Case("matmul 256^3", MATMUL, ((256 // s, 256 // s), (256 // s, 256 // s))),
        Case("batched matmul 8x64x64x32", BMM, ((8, 64 // s, 32 // s), (8, 32 // s, 64 // s))),
        Case("softmax 512x1024", SOFTMAX, ((512 // s, 1024 // s),)),
        Case("grouped conv 8x4x4 10^2 3x3", GCONV, ((8, 4, 4, 10, 10), (4, 4, 4, 3, 3))),
    ]


def host_us(call: Any, calls: int, runs: int, sync: Any = lambda: None) -> float:
    """Host microseconds per call: best of ``runs`` batches of ``calls`` back-to-back calls."""
    for _ in range(3):
        call()
    sync()
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        best = min(best, (time.perf_counter() - start) / calls)
        sync()
    return best * 1e6


def _host_row(name: str, parts: int, one: float, split: float, fake: tuple | None = None) -> dict:
    row = {"case": name, "parts": parts, "one_host_us": one, "split_host_us": split,
           "host_ratio": split / one, "excess_over_two_us": split - 2 * one}
    text = (f"{name:30s} parts {parts}  host one {one:7.1f} us  split {split:7.1f} us  "
            f"split/one {split / one:5.2f}  split - 2*one {split - 2 * one:+7.1f} us")
    if fake is not None:
        row.update(one_fake_us=fake[0], split_fake_us=fake[1], one_ours_us=one - fake[0],
                   split_ours_us=split - fake[1])
        text += (f"  | fake driver {fake[0]:5.1f} / {fake[1]:5.1f} us, ours {one - fake[0]:6.1f}"
                 f" / {split - fake[1]:6.1f} us")
    print(text, flush=True)
    return row


def host_mode(args: Any, devices: list[int]) -> list[dict]:
    """``--host`` on the GPU: torch CUDA tensors on device 0."""
    import torch

    import tcmlir as tc

    rows = []
    for case in small_cases():
        if args.only and not any(case.name.startswith(p) for p in args.only.split(",")):
            continue
        fn = tc.define(case.source, target="cuda")
        inputs = [torch.randn(*shape, device="cuda:0") for shape in case.shapes]
        parts = len(fn.plan(*inputs, devices=devices).parts)
        one = host_us(functools.partial(fn, *inputs), args.calls, args.runs, torch.cuda.synchronize)
        split = host_us(functools.partial(fn, *inputs, devices=devices), args.calls, args.runs,
                        torch.cuda.synchronize)
        rows.append(_host_row(case.name, parts, one, split))
    return rows


def fake_mode(args: Any, devices: list[int]) -> list[dict]:
    """``--fake``: the same over the tests' two-device fake driver, no GPU needed. Each case
    runs twice: plainly (the times), and with every fake driver function and fake torch
    allocation wrapped in a timer from the start (the fake's own time, subtracted)."""
    import os

    import pytest

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    rows = []
    for case in small_cases(scale=8):
        if args.only and not any(case.name.startswith(p) for p in args.only.split(",")):
            continue
        measured = []
        for wrapped in (False, True):
            mp = pytest.MonkeyPatch()
            try:
                measured.append(_fake_run(mp, case, devices, args, wrapped))
            finally:
                mp.undo()
        (one, split, parts), (one_fake, split_fake, _) = measured
        rows.append(_host_row(case.name, parts, one, split, (one_fake, split_fake)))
    return rows


def _fake_run(mp: Any, case: Case, devices: list[int], args: Any, wrapped: bool) -> tuple:
    """(one, split, parts): host µs per call, or (``wrapped``) µs per call inside the fake."""
    import numpy as np
    from fake_cuda import FakeTensor, install_fake_torch
    from fake_multi import two_devices

    torch = install_fake_torch(mp)
    rng = np.random.default_rng(0)
    host = [rng.standard_normal(shape).astype(np.float32) for shape in case.shapes]
    fn, kernel, driver, runtime = two_devices(mp, case.source, *host, devices=tuple(devices))
    driver.simulate = None  # the kernels' results are the tests' business
    spent = [0.0]
    if wrapped:  # before any launch plan binds a driver function or torch.empty
        def timed(f: Any) -> Any:
            def wrapper(*a: Any, **k: Any) -> Any:
                start = time.perf_counter()
                try:
                    return f(*a, **k)
                finally:
                    spent[0] += time.perf_counter() - start
            return wrapper

        for name in dir(type(driver)):
            if name.startswith("cu"):
                setattr(driver, name, timed(getattr(driver, name)))
        torch.empty = timed(torch.empty)
    inputs = [FakeTensor(runtime.place(x, 0), 0) for x in host]
    out = []
    for call in (functools.partial(fn, *inputs), functools.partial(fn, *inputs, devices=devices)):
        if not wrapped:
            out.append(host_us(call, args.calls, args.runs, driver.calls.clear))
            continue
        host_us(call, 1, 1)  # warm
        best = float("inf")
        for _ in range(args.runs):  # the best batch, as `host_us` takes
            spent[0] = 0.0
            for _ in range(args.calls):
                call()
            driver.calls.clear()
            best = min(best, spent[0] / args.calls * 1e6)
        out.append(best)
    return (*out, len(kernel.plan.parts))


def time_device(torch: Any, call: Any, runs: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def time_host(torch: Any, call: Any, runs: int) -> float:
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
        torch.cuda.synchronize()
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--devices", default="0,0", help="the split's devices (default 0,0)")
    ap.add_argument("--quick", action="store_true", help="sizes divided by 4")
    ap.add_argument("--only", default="", help="comma list of case-name prefixes")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--json", default=None)
    ap.add_argument("--host", action="store_true", help="host time per call only (small sizes)")
    ap.add_argument("--fake", action="store_true",
                    help="--host without a GPU, over the tests' fake two-device driver")
    ap.add_argument("--calls", type=int, default=200, help="calls per batch (--host, --fake)")
    args = ap.parse_args(argv)
    if args.host or args.fake:
        devices = [int(d) for d in args.devices.split(",")]
        rows = (fake_mode if args.fake else host_mode)(args, devices)
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(rows, f, indent=1)
        return 0
    import torch

    import tcmlir as tc

    torch.backends.cuda.matmul.allow_tf32 = False
    devices = [int(d) for d in args.devices.split(",")]
    rows = []
    for case in cases(args.quick):
        if args.only and not any(case.name.startswith(p) for p in args.only.split(",")):
            continue
        fn = tc.define(case.source, target="cuda")
        inputs = [torch.randn(*shape, device="cuda:0") for shape in case.shapes]
        plan = fn.plan(*inputs, devices=devices)
        t0 = time.perf_counter()
        one_out = fn(*inputs)
        split_out = fn(*inputs, devices=devices)
        torch.cuda.synchronize()
        first = time.perf_counter() - t0
        err = float((split_out.double() - one_out.double()).abs().max()
                     / one_out.double().abs().max().clamp_min(1e-30))
        one_call = functools.partial(fn, *inputs)
        split_call = functools.partial(fn, *inputs, devices=devices)
        one, split = time_device(torch, one_call, args.runs), time_device(torch, split_call, args.runs)
        one_host = time_host(torch, one_call, args.runs)
        split_host = time_host(torch, split_call, args.runs)
        row = {"case": case.name, "devices": devices, "split": plan.is_split,
               "reason": plan.reason, "parts": len(plan.parts),
               "bytes_in": plan.bytes_in, "one_s": one, "split_s": split,
               "ratio": split / one, "one_host_s": one_host, "split_host_s": split_host,
               "host_ratio": split_host / one_host, "max_rel_err": err,
               "first_calls_s": first}
        rows.append(row)
        print(f"{case.name:34s} parts {len(plan.parts)}  one {one * 1e3:9.3f} ms  split "
              f"{split * 1e3:9.3f} ms  split/one {split / one:5.2f}  host {one_host * 1e6:7.1f} "
              f"/ {split_host * 1e6:7.1f} us  moved {plan.bytes_in / 2**20:8.1f} MiB  err "
              f"{err:.1e}" + ("" if plan.is_split else f"  (not split: {plan.reason})"),
              flush=True)
        del inputs, one_out, split_out, one_call, split_call
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
