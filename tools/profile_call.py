"""Where the host time of a cached call goes: cProfile over many calls of one small kernel.

    python tools/profile_call.py [--target cuda|cpu] [--calls 5000] [--top 30]

Kernel: ``z(i) = x(i) + y(i)`` on 1024 float32 (torch CUDA tensors on cuda, numpy on cpu). The
call is warmed up first (compile, plan); then ``--calls`` calls run under cProfile and the
functions with the largest own time are printed, with the mean host time per call without the
profiler beside it. Used to shorten the launch path (issue: at most 10 us per cached call).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time

ADD = "def add(float(N) x, float(N) y) -> (z) { z(i) = x(i) + y(i) }"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args(argv)
    import tcmlir as tc

    fn = tc.define(ADD, target=args.target)
    if args.target == "cuda":
        import torch

        x, y = torch.randn(1024, device="cuda"), torch.randn(1024, device="cuda")
        sync = torch.cuda.synchronize
    else:
        import numpy as np

        x, y = np.ones(1024, np.float32), np.ones(1024, np.float32)
        sync = lambda: None  # noqa: E731
    for _ in range(50):
        fn(x, y)
    sync()
    t0 = time.perf_counter()
    for _ in range(args.calls):
        fn(x, y)
    t = (time.perf_counter() - t0) / args.calls
    sync()
    print(f"{args.target}: {t * 1e6:.2f} us per cached call (enqueue, no profiler)")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.calls):
        fn(x, y)
    prof.disable()
    sync()
    pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
