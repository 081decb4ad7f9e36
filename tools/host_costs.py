"""Host cost of each piece of a warm tcmlir CUDA call, beside torch's (needs a GPU and torch).

    python tools/host_costs.py [--calls 20000]
    python tools/host_costs.py --cpu-call [--calls 2000]   # the cpu target, no GPU (`cpu_call`)

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
SOFTMAX = """def softmax(float(N, D) X) -> (Y, mx, s) {
    mx(n) max=! X(n, d)
    Y(n, d) = exp(X(n, d) - mx(n))
    s(n) +=! Y(n, d)
    Y(n, d) = Y(n, d) / s(n)
}"""


def _timer(calls: int, sync: Callable[[], Any] = lambda: None) -> Callable[..., None]:
    def row(name: str, f: Callable[[], Any], calls: int = calls) -> None:
        for _ in range(max(1, min(1000, calls // 2))):
            f()
        runs = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(calls):
                f()
            runs.append((time.perf_counter() - start) / calls * 1e6)
        sync()
        print(f"{name:<40} {statistics.median(runs):9.2f} us", flush=True)

    return row


def cpu_call(calls: int) -> int:
    """``--cpu-call``: a warm call on the cpu target with numpy inputs, with torch CPU
    tensors and torch's own op, in µs per call (median of 5 loops of ``calls`` calls; softmax
    ``calls // 20``), one torch thread. Measured on the 2-core dev machine, shared (load
    average ~4), two runs each, before = main at 21baa41 (``PYTHONPATH=<main>/src``), after =
    branch i34call:

    ========================================  ===============  ===============
    row                                       before           after
    ========================================  ===============  ===============
    add 1024 floats, numpy inputs             4.5 / 11.0       4.9 / 7.0
    add 1024 floats, torch CPU inputs         204 / 294        5.6 / 8.9
    torch.add                                 1.4 / 1.4        1.5 / 1.4
    add: kernel.benchmark(ta, tb) median      130 / 64 (a      7.0 / 3.7 (the
                                              slow path)       warm call)
    softmax 128x1024, numpy inputs            120 / 145        122 / 126
    softmax 128x1024, torch CPU inputs        353 / 531        127 / 145
    torch.softmax(x, 1)                       80 / 91          80 / 93
    ========================================  ===============  ===============

    Before, a call with torch CPU tensors bound in full every time (numpy views, size
    binding, the host memory check, the options' JSON); now it takes the prepared host plan
    (`tcmlir.runtime.host_calls`: ``data_ptr()`` addresses, outputs back through
    ``torch.from_numpy``), within 1.1-1.3x of the numpy-input call; ``kernel.benchmark``
    times that warm call (its ``path``) instead of `HostKernel.run`'s per-call packing.
    """
    import numpy as np
    import torch

    import tcmlir as tc
    from tcmlir.signature import call_key

    torch.set_num_threads(1)
    row = _timer(calls)
    add = tc.define(ADD, target="cpu")
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(1024).astype(np.float32) for _ in range(2))
    ta, tb = torch.from_numpy(a.copy()), torch.from_numpy(b.copy())
    add(a, b)
    add(ta, tb)
    row("add: numpy a + b", lambda: a + b)
    row("add: tcmlir fn(a, b), numpy", lambda: add(a, b))
    row("add: tcmlir fn(ta, tb), torch CPU", lambda: add(ta, tb))
    row("add: torch.add(ta, tb)", lambda: torch.add(ta, tb))
    row("call_key((ta, tb))", lambda: call_key((ta, tb)))
    hit = add._plans.get(call_key((ta, tb)))
    if hit is not None and hit[2] is not None:
        row("the plan's torch call", lambda: hit[2]((ta, tb)))
    kernel = add.compile(ta, tb)
    bench = kernel.benchmark(ta, tb, runs=max(5, calls // 10))
    print(f"{'add: kernel.benchmark(ta, tb) median':<40} {bench.median * 1e6:9.2f} us  "
          f"({getattr(bench, 'path', '') or 'path not reported'})")
    sm = tc.define(SOFTMAX, target="cpu")
    x = rng.standard_normal((128, 1024)).astype(np.float32)
    tx = torch.from_numpy(x.copy())
    sm(x)
    sm(tx)
    few = max(1, calls // 20)
    row("softmax 128x1024: fn(x), numpy", lambda: sm(x), few)
    row("softmax 128x1024: fn(tx), torch CPU", lambda: sm(tx), few)
    row("softmax 128x1024: torch.softmax(tx, 1)", lambda: torch.softmax(tx, 1), few)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--cpu-call", action="store_true",
                    help="the cpu target's warm call: numpy vs torch CPU inputs vs torch "
                         "(no GPU needed; see cpu_call)")
    args = ap.parse_args(argv)
    if args.cpu_call:
        return cpu_call(min(args.calls, 2000))
    import torch

    import tcmlir as tc
    from tcmlir.config import hot_path_token
    from tcmlir.runtime.fast_driver import _libcuda
    from tcmlir.signature import call_key

    if not torch.cuda.is_available():
        sys.exit("host_costs: no CUDA device")

    row = _timer(args.calls, torch.cuda.synchronize)

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
        # a plan's kernel: (function, grid x y z, block x y z, dynamic shared bytes)
        function, gx, gy, gz, bx, by, bz, shared = plan._kernels[0]
        f = direct.pointer(int(function))
        st, params = direct.stream(stream), direct.pointer(plan.block.kernel_addresses[0])
        row("cuLaunchKernel through ctypes",
            lambda: direct.launch(f, gx, gy, gz, bx, by, bz, shared, st, params, None))
        out = ctypes.c_void_p()
        row("cuCtxGetCurrent through ctypes", lambda: direct.get_current(ctypes.byref(out)))
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
