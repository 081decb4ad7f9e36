"""Autotune on the GPU(s): matmul 1024³ and softmax 32768×4096, generations=5, population=20.

    python tools/tune_gpu.py [--generations 5 --population 20] [--fault] [--json OUT.json]
    python tools/tune_gpu.py --only "matmul 4096" --generations 3 --population 8
    python tools/tune_gpu.py --only "matmul 1024" --generations 2 --population 8 --gpus 1 \
        --compile-workers 0      # against the default: the compile workers' speed-up

``--compile-workers N`` sets `TunerConfig.compile_workers` (0: each GPU worker compiles its
candidates, as before compile workers existed). Every tuning run gets a fresh artifact cache
(``TCMLIR_CACHE_DIR``), so no candidate comes compiled from an earlier run and the wall
times compare.

``--only "matmul 4096"`` tunes matmul 4096³ instead (issue 9's tuned target), whose rows also
give cuBLAS's time (``torch.matmul``, fp32, TF32 off, CUDA events, same process) and the
default options' time, so the ratios are measured side by side.

For each kernel: the naive time, then a tuning run on GPU 0 and, when there are two GPUs, on
GPUs 0 and 1 (same seed), with the wall time of each tuning run, the best time found, its
options, the number of candidates evaluated and of worker restarts. ``--fault`` makes every
candidate with unroll_factor=8 crash its worker (tcmlir's TCMLIR_TUNE_FAULT test hook), to show
that a faulting candidate does not stop the tuner.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--generations", type=int, default=5)
    ap.add_argument("--population", type=int, default=20)
    ap.add_argument("--fault", action="store_true")
    ap.add_argument("--only", default="", help="a kernel-name prefix (matmul, softmax)")
    ap.add_argument("--gpus", default="", help="only these GPU counts, e.g. 2 (default: 1 and 2)")
    ap.add_argument("--compile-workers", type=int, default=None,
                    help="TunerConfig.compile_workers (default: one per free core; 0: none)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.fault:
        os.environ["TCMLIR_TUNE_FAULT"] = "crash:unroll_factor=8"
    import numpy as np

    import tcmlir as tc
    from tcmlir.runtime.cuda import get_runtime
    from tcmlir.tune.autotune import tune

    ngpu = get_runtime().device_count()
    rng = np.random.default_rng(0)
    problems = {
        "matmul 1024^3": ("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }",
                          [rng.standard_normal((1024, 1024), dtype=np.float32),
                           rng.standard_normal((1024, 1024), dtype=np.float32)]),
        "softmax 32768x4096": ("""def softmax(float(N, D) X) -> (O) {
            mx(n) max=! X(n, d)
            e(n, d) = exp(X(n, d) - mx(n))
            s(n) +=! e(n, d)
            O(n, d) = e(n, d) / s(n)
        }""", [rng.standard_normal((32768, 4096), dtype=np.float32)]),
    }
    if args.only.startswith("matmul 4096"):
        problems = {"matmul 4096^3": (problems["matmul 1024^3"][0],
                                      [rng.standard_normal((4096, 4096), dtype=np.float32),
                                       rng.standard_normal((4096, 4096), dtype=np.float32)])}
    rows = []
    for name, (src, inputs) in problems.items():
        if args.only and not name.startswith(args.only):
            continue
        fn = tc.define(src, target="cuda")
        naive = statistics.median(fn.compile(*inputs, options=tc.MappingOptions.naive())
                                  .benchmark(*inputs, runs=10))
        for devices in ([0], [0, 1])[: 2 if ngpu >= 2 else 1]:
            if args.gpus and str(len(devices)) not in args.gpus.split(","):
                continue
            config = tc.TunerConfig(generations=args.generations, population=args.population,
                                    seed=0, devices=tuple(devices), runs=5,
                                    compile_workers=args.compile_workers)
            fresh = tempfile.TemporaryDirectory(prefix="tcmlir-tune-gpu-")
            os.environ["TCMLIR_CACHE_DIR"] = fresh.name
            start = time.perf_counter()
            result = tune(fn, inputs, config=config, target="cuda", progress=False)
            wall = time.perf_counter() - start
            best = result.best
            check = statistics.median(fn.compile(*inputs, options=best.options)
                                      .benchmark(*inputs, runs=10))
            failed = sum(1 for e in result.evaluated.values() if not e.ok)
            row = {"kernel": name, "devices": devices, "tune_s": wall, "naive_ms": naive * 1e3,
                   "best_ms": check * 1e3, "speedup": naive / check,
                   **_beside_torch(fn, inputs, check, name),
                   "evaluated": len(result.evaluated), "failed": failed,
                   "stats": result.stats, "best_options": best.options.to_json()}
            rows.append(row)
            print(json.dumps(row), flush=True)
            fresh.cleanup()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


def _beside_torch(fn, inputs, best_s: float, name: str) -> dict:
    """For matmul: the default options' time and torch.matmul's (cuBLAS, TF32 off), and the
    tuned kernel's ratio to it; nothing without torch or for other kernels."""
    if not name.startswith("matmul"):
        return {}
    try:
        import torch
    except ImportError:
        return {}
    import tcmlir as tc

    torch.backends.cuda.matmul.allow_tf32 = False
    a, b = (torch.from_numpy(x).cuda() for x in inputs)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(12):
        torch.matmul(a, b)  # an untimed lead call, as tools/bench.py times
        start.record()
        torch.matmul(a, b)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    cublas = statistics.median(times[2:])
    options = tc.MappingOptions.default_for(fn.ir, "cuda", fn.size_values(*inputs))
    default = statistics.median(fn.compile(*inputs, options=options).benchmark(*inputs, runs=10))
    return {"torch_ms": cublas * 1e3, "default_ms": default * 1e3,
            "tuned_vs_torch": cublas / best_s, "default_vs_torch": cublas / default}


if __name__ == "__main__":
    sys.exit(main())
