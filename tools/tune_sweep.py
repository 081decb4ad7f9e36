"""Tune at one size, serve a sweep of others: options reuse across sizes, measured (issue 28).

    python tools/tune_sweep.py --target cpu                      # this machine
    python tools/tune_sweep.py --target cuda --json sweep.json   # the GPU machine
    python tools/tune_sweep.py --target cpu --kernel softmax --generations 2 --population 4
    python tools/tune_sweep.py --tiny                            # a smoke test (seconds)

For each kernel (a matmul and a softmax; ``--kernel`` picks one):

1. **Tuning at the base size**, as a user runs it: ``generations`` × ``population`` (default
   3 × 8), a fresh options cache and artifact cache, so nothing comes compiled from an earlier
   run. Reported: the wall time, candidates evaluated, and the seconds until the search's best
   so far was within 5% of the best of a *long* search (``--long-generations`` ×
   ``--long-population``, default 10 × 20, run at the same size with another seed; 0 skips it),
   for the short search and for the long one itself (`tcmlir.tune.time_to_within`).
2. **The sweep**: six other sizes (smaller, larger, not divisible by any tile). At each, three
   options timed side by side in this process, interleaved (``--rounds`` rounds of
   `Kernel.benchmark` with ``--runs`` runs each; the median of the rounds' medians):
   * *default*: what a call without options gets (`MappingOptions.default_for` at that size);
   * *served*: what `tc.make_load_from_cache_options_factory` gives a call there when the cache
     holds only the base size's tuning (the nearest size's options, re-verified on first use);
   * *tuned here*: a tuning at that very size (the same budget, its own fresh cache).

   Ratios: served / tuned here (the target: within 10%, i.e. tuned-here time / served time
   >= 0.9), and default / served (>= 1.0: serving borrowed options never loses to the default).

Inputs: numpy arrays on the cpu target; torch CUDA tensors on cuda (numpy where torch has no
CUDA). One JSON object per kernel on stdout (``--json`` writes all of them to a file too), and
a table per kernel on stderr. Timings on a shared machine are noisy: compare ratios from one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
SOFTMAX = """def softmax(float(N, D) X) -> (O) {
    mx(n) max=! X(n, d)
    e(n, d) = exp(X(n, d) - mx(n))
    s(n) +=! e(n, d)
    O(n, d) = e(n, d) / s(n)
}"""

# (base size, sweep sizes): matmul sizes are (M, K, N), softmax (N, D). Six others each:
# smaller, larger, and sizes no tile divides (primes and near-powers of two).
SIZES: dict[str, dict[str, tuple[tuple[int, ...], list[tuple[int, ...]]]]] = {
    "cuda": {
        "matmul": ((2048, 2048, 2048), [(512, 512, 512), (1000, 1000, 1000), (1536, 2048, 1536),
                                        (3000, 1000, 2000), (4096, 4096, 4096),
                                        (2047, 2049, 2051)]),
        "softmax": ((4096, 1024), [(1024, 1024), (1000, 1000), (8192, 512), (4096, 4000),
                                   (16384, 2048), (333, 4097)]),
    },
    "cpu": {
        "matmul": ((256, 256, 256), [(64, 64, 64), (100, 100, 100), (192, 256, 192),
                                     (300, 200, 250), (512, 512, 512), (257, 255, 253)]),
        "softmax": ((1024, 512), [(256, 512), (1000, 500), (2048, 256), (1024, 1000),
                                  (4096, 1024), (333, 517)]),
    },
    "tiny": {
        "matmul": ((16, 16, 16), [(8, 8, 8), (17, 15, 13)]),
        "softmax": ((32, 16), [(16, 16), (33, 17)]),
    },
}
SOURCES = {"matmul": MATMUL, "softmax": SOFTMAX}


def _inputs(kernel: str, size: tuple[int, ...], target: str, seed: int) -> list[Any]:
    import numpy as np

    rng = np.random.default_rng(seed)
    if kernel == "matmul":
        m, k, n = size
        arrays = [rng.standard_normal((m, k), dtype=np.float32),
                  rng.standard_normal((k, n), dtype=np.float32)]
    else:
        arrays = [rng.standard_normal(size, dtype=np.float32)]
    if target != "cuda":
        return arrays
    try:
        import torch
    except ImportError:
        return arrays
    return [torch.from_numpy(a).cuda() for a in arrays] if torch.cuda.is_available() else arrays


def _tune(fn: Any, inputs: list[Any], target: str, generations: int, population: int,
          seed: int, db: str) -> tuple[Any, float]:
    """A tuning as a user runs it, recorded in the options cache at ``db``."""
    import tcmlir as tc
    from tcmlir.tune.autotune import tune

    config = tc.TunerConfig(generations=generations, population=population, seed=seed)
    start = time.perf_counter()
    result = tune(fn, inputs, config=config, target=target, cache=db, progress=False)
    return result, time.perf_counter() - start


def _side_by_side(fn: Any, inputs: list[Any], options: dict[str, Any], rounds: int,
                  runs: int) -> dict[str, float]:
    """Seconds per call of each options, interleaved rounds: the median of the rounds'
    medians (a kernel compiled once per distinct options)."""
    kernels = {name: fn.compile(*inputs, options=o) for name, o in options.items()}
    samples: dict[str, list[float]] = {name: [] for name in options}
    for _ in range(rounds):
        for name, kernel in kernels.items():
            samples[name].append(kernel.benchmark(*inputs, runs=runs).median)
    return {name: statistics.median(s) for name, s in samples.items()}


def _row(kernel: str, target: str, args: argparse.Namespace, table: dict) -> dict:
    import tcmlir as tc
    from tcmlir.tune import time_to_within

    base, sweep = table[kernel]
    fn = tc.define(SOURCES[kernel], target=target)
    work = tempfile.mkdtemp(prefix="tcmlir-sweep-")
    base_db = os.path.join(work, "base.db")
    inputs = _inputs(kernel, base, target, 0)
    short, short_wall = _tune(fn, inputs, target, args.generations, args.population, 0, base_db)
    row: dict[str, Any] = {
        "kernel": kernel, "target": target, "base": list(base),
        "generations": args.generations, "population": args.population,
        "tune_s": short_wall, "evaluated": len(short.evaluated),
        "best_ms": short.best.time_s * 1e3,
        "default_ms": short.final_default.time_s * 1e3 if short.final_default else None,
        "best_options": short.best.options.to_json(),
    }
    if args.long_generations > 0:
        long, long_wall = _tune(fn, inputs, target, args.long_generations,
                                args.long_population, 1, os.path.join(work, "long.db"))
        # the searches' own timings (the final side-by-side re-measurement is another run)
        goal = min(short.progress[-1][1], long.progress[-1][1])
        row.update({"long_tune_s": long_wall, "long_evaluated": len(long.evaluated),
                    "long_best_ms": long.best.time_s * 1e3, "goal_ms": goal * 1e3,
                    "short_to_5pct_s": time_to_within(short, goal),
                    "long_to_5pct_s": time_to_within(long, goal)})
    factory = tc.make_load_from_cache_options_factory(base_db)
    sizes = []
    for i, size in enumerate(sweep):
        here = _inputs(kernel, size, target, 10 + i)
        served = factory(fn, here)
        tuned, tuned_wall = _tune(fn, here, target, args.generations, args.population, 0,
                                  os.path.join(work, f"size{i}.db"))
        default = tc.MappingOptions.default_for(fn.ir, target, fn.size_values(*here))
        t = _side_by_side(fn, here, {"default": default, "served": served,
                                     "tuned": tuned.best.options}, args.rounds, args.runs)
        sizes.append({"size": list(size), "default_ms": t["default"] * 1e3,
                      "served_ms": t["served"] * 1e3, "tuned_ms": t["tuned"] * 1e3,
                      "tuned_over_served": t["tuned"] / t["served"],
                      "default_over_served": t["default"] / t["served"],
                      "tune_here_s": tuned_wall,
                      "served_is_default": served == default})
    row["sweep"] = sizes
    return row


def _table(row: dict) -> str:
    head = (f"{row['kernel']} ({row['target']}): tuned at {'x'.join(map(str, row['base']))} in "
            f"{row['tune_s']:.1f} s ({row['generations']}x{row['population']}, "
            f"{row['evaluated']} candidates): {row['best_ms']:.4f} ms")
    if "long_best_ms" in row:
        s5, l5 = row["short_to_5pct_s"], row["long_to_5pct_s"]
        head += (f"\n  long search {row['long_tune_s']:.1f} s, best {row['long_best_ms']:.4f} ms;"
                 f" within 5% of the better best after: short "
                 f"{'never' if s5 is None else f'{s5:.1f} s'}, long "
                 f"{'never' if l5 is None else f'{l5:.1f} s'}")
    lines = [head, f"  {'size':>16} {'default ms':>11} {'served ms':>10} {'tuned ms':>9} "
                   f"{'tuned/served':>12} {'default/served':>14}"]
    for s in row["sweep"]:
        lines.append(f"  {'x'.join(map(str, s['size'])):>16} {s['default_ms']:11.4f} "
                     f"{s['served_ms']:10.4f} {s['tuned_ms']:9.4f} "
                     f"{s['tuned_over_served']:12.2f} {s['default_over_served']:14.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--kernel", default="all", choices=("all", *SOURCES))
    ap.add_argument("--generations", type=int, default=3)
    ap.add_argument("--population", type=int, default=8)
    ap.add_argument("--long-generations", type=int, default=10)
    ap.add_argument("--long-population", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds per size")
    ap.add_argument("--runs", type=int, default=10, help="runs per round")
    ap.add_argument("--tiny", action="store_true", help="tiny sizes and budgets (a smoke test)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    table = SIZES["tiny" if args.tiny else args.target]
    if args.tiny:
        args.generations, args.population = 1, 3
        args.long_generations, args.long_population = 2, 3
        args.rounds, args.runs = 1, 2
    # a fresh artifact cache for the whole run: no candidate comes compiled from earlier runs
    fresh = tempfile.TemporaryDirectory(prefix="tcmlir-sweep-cache-")
    previous = os.environ.get("TCMLIR_CACHE_DIR")
    os.environ["TCMLIR_CACHE_DIR"] = fresh.name
    rows = []
    try:
        for kernel in SOURCES if args.kernel == "all" else (args.kernel,):
            row = _row(kernel, args.target, args, table)
            rows.append(row)
            print(json.dumps(row), flush=True)
            print(_table(row), file=sys.stderr, flush=True)
    finally:
        if previous is None:
            os.environ.pop("TCMLIR_CACHE_DIR", None)
        else:
            os.environ["TCMLIR_CACHE_DIR"] = previous
        fresh.cleanup()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
