"""Host cost of each piece of a warm tcmlir CUDA call, beside torch's (needs a GPU and torch).

    python tools/host_costs.py [--calls 20000]

Each row is the median over 5 loops of ``--calls`` calls, in microseconds per call, with no
synchronisation inside a loop (like `tools/bench_launch.py`'s enqueue figure, but a tight loop
rather than individually timed calls). The rows: torch's own ``x + y`` and ``out=`` calls and
its allocation and tensor-attribute primitives; the driver calls (the launch thunk's one call,
``cuLaunchKernel`` and ``cuCtxGetCurrent`` through ctypes); tcmlir's layers for
``z(i) = x(i) + y(i)`` on 1024 floats: the whole call, the guarded entry
(`runtime.torch_fast`), the call key, the plan's calls. The difference between two rows is
what a layer costs; docs/perf.md keeps the figures.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

ADD = "def add(float(N) x, float(N) y) -> (z) { z(i) = x(i) + y(i) }"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=20000)
    args = ap.parse_args(argv)
    import torch

    import tcmlir as tc
    from tcmlir.config import hot_path_token
    from tcmlir.runtime.fast_driver import _libcuda
    from tcmlir.signature import call_key

    if not torch.cuda.is_available():
        sys.exit("host_costs: no CUDA device")

    def row(name: str, f: Callable[[], Any]) -> None:
        for _ in range(1000):
            f()
        runs = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(args.calls):
                f()
            runs.append((time.perf_counter() - start) / args.calls * 1e6)
        torch.cuda.synchronize()
        print(f"{name:<40} {statistics.median(runs):7.2f} us", flush=True)

    x, y = torch.randn(1024, device="cuda"), torch.randn(1024, device="cuda")
    z = torch.empty_like(x)
    row("torch x + y", lambda: x + y)
    row("torch.add(x, y, out=z)", lambda: torch.add(x, y, out=z))
    row("torch.empty_like(x)", lambda: torch.empty_like(x))
    row("torch.empty((1024,), ...)", lambda: torch.empty((1024,), dtype=torch.float32,
                                                         device="cuda"))
    for name, f in (("x.data_ptr()", x.data_ptr), ("x.stride()", x.stride),
                    ("x.get_device()", x.get_device)):
        row(name, f)
    row("x.shape", lambda: x.shape)
    row("torch's current raw stream", lambda: torch._C._cuda_getCurrentRawStream(0))
    lock = threading.Lock()

    def locked() -> None:
        with lock:
            pass

    row("a threading.Lock", locked)
    fn = tc.define(ADD, target="cuda")
    fn(x, y)
    torch.cuda.synchronize()
    row("tcmlir fn(x, y)", lambda: fn(x, y))
    row("tcmlir fn(x, y, outputs=z)", lambda: fn(x, y, outputs=z))
    key = call_key((x, y))
    _, plan_call, plain, into = fn._plans[key]
    plan = plan_call.__self__
    if fn._fast is not None:
        row("the guarded entry (fn._fast)", lambda: fn._fast((x, y)))
    row("call_key((x, y))", lambda: call_key((x, y)))
    row("hot_path_token()", hot_path_token)
    if plain is not None:
        row("the plan's torch call", lambda: plain((x, y)))
    if into is not None:
        row("the plan's call into z", lambda: into((x, y), z))
    stream = torch._C._cuda_getCurrentRawStream(0)
    record = plan._record
    if record is not None:
        record.words[5] = stream
        row("the launch thunk's one call", lambda: record.fn(record.arg))
    row("context.activate() (cuCtxGetCurrent)", plan.context.activate)
    lib = _libcuda()
    direct = plan._direct
    if lib is not None and direct is not None:
        f = direct.pointer(int(plan._kernels[0][0]))
        dims = plan._kernels[0][1:]
        st, params = direct.stream(stream), direct.pointer(plan.block.address)
        row("cuLaunchKernel through ctypes", lambda: direct.launch(f, *dims, 0, st, params, None))
        out = ctypes.c_void_p()
        row("cuCtxGetCurrent through ctypes", lambda: direct.get_current(ctypes.byref(out)))
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
