"""Is the tuner's answer what a later call gets, and is it at least as fast as the default?

    python tools/tune_check.py [--only matmul] [--generations 3 --population 8] [--json OUT]
    python tools/tune_check.py --target cpu --small        # the same on the host (CI's smoke)

For each problem (matmul 2048^3, a skinny matmul 16x4096x4096, softmax 4096x1024; ``--small``:
sizes a CPU tunes in seconds) this tunes as a user does — ``fn.autotune(*inputs)`` on torch
CUDA tensors (numpy arrays on the cpu target) into a fresh options cache — then starts a
**separate process** that defines the function again with
``options_factory=tc.make_load_from_cache_options_factory(DB)``, calls it the way a user does,
and times that call beside a call with the default options (`MappingOptions.default_for` at the
sizes) in alternating rounds (ABBA: each first as often as second; CUDA events on cuda, a
wall clock over 20 calls on cpu). A row: the two medians, their ratio (default time / served time: 1 or
more means the tuned options are at least as fast), the spread of each (the interquartile
range over the rounds, relative to the median, the noise a ratio is read against), and the
tuning's wall time. Needs torch on cuda.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tune_sweep import MATMUL, SOFTMAX  # (the programs the sweep tunes)

PROBLEMS = {  # name -> (source, input shapes, small input shapes)
    "matmul 2048^3": (MATMUL, [(2048, 2048), (2048, 2048)], [(64, 48), (48, 80)]),
    "skinny 16x4096x4096": (MATMUL, [(16, 4096), (4096, 4096)], [(4, 256), (256, 256)]),
    "softmax 4096x1024": (SOFTMAX, [(4096, 1024)], [(128, 96)]),
}
ROUNDS = 8  # ABBA rounds of the separate process


def _inputs(shapes: list[tuple[int, ...]], target: str) -> list[Any]:
    import numpy as np

    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s, dtype=np.float32) for s in shapes]
    if target != "cuda":
        return arrays
    import torch

    return [torch.from_numpy(a).cuda() for a in arrays]


def _timer(target: str):
    """seconds per call of ``f`` (one sample): CUDA events around 5 queued calls after a lead
    call on cuda; a wall clock on cpu."""
    if target == "cuda":
        import torch

        def sample(f):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            f()
            start.record()
            for _ in range(5):
                f()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 5e3
        return sample

    def wall(f):
        f()
        t0 = time.perf_counter()
        for _ in range(20):
            f()
        return (time.perf_counter() - t0) / 20
    return wall


def _spread(times: list[float]) -> float:
    q = statistics.quantiles(times, n=4)
    return (q[2] - q[0]) / statistics.median(times)


def measure(name: str, db: str, target: str, small: bool) -> dict[str, Any]:
    """The separate process's part: the served call beside the default's, ABBA."""
    import tcmlir as tc

    src, shapes, small_shapes = PROBLEMS[name]
    inputs = _inputs(small_shapes if small else shapes, target)
    served = tc.define(src, target=target,
                       options_factory=tc.make_load_from_cache_options_factory(db))
    plain = tc.define(src, target=target)
    default = tc.MappingOptions.default_for(plain.ir, target, plain.size_values(*inputs))
    got = served.options_factory(served, inputs)
    sample = _timer(target)

    def a():
        return served(*inputs)

    def b():  # a plain call: the defaults, on the path a user's call takes (passing
        # options=default on every call used to add ~150 us of binding to it, fixed since)
        return plain(*inputs)
    a(), b()  # compile both before timing
    ta: list[float] = []
    tb: list[float] = []
    for r in range(ROUNDS):
        for which in ((a, b) if r % 2 == 0 else (b, a)):
            (ta if which is a else tb).append(sample(which))
    return {"served_ms": statistics.median(ta) * 1e3, "default_ms": statistics.median(tb) * 1e3,
            "default_over_served": statistics.median(tb) / statistics.median(ta),
            "served_spread": _spread(ta), "default_spread": _spread(tb),
            "served_is_default": got == default, "served_options": got.to_json()}


def check(name: str, target: str, small: bool, generations: int, population: int) -> dict[str, Any]:
    import tcmlir as tc

    src, shapes, small_shapes = PROBLEMS[name]
    work = tempfile.mkdtemp(prefix="tcmlir-tune-check-")
    db = os.path.join(work, "options.db")
    fn = tc.define(src, target=target)
    inputs = _inputs(small_shapes if small else shapes, target)
    t0 = time.perf_counter()
    fn.autotune(*inputs, generations=generations, population=population, cache=db,
                progress=False)
    tune_s = time.perf_counter() - t0
    out = subprocess.run([sys.executable, __file__, "--measure", name, "--db", db,
                          "--target", target] + (["--small"] if small else []),
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return {"problem": name, "error": out.stderr.strip().splitlines()[-1:] or ["?"]}
    row = {"problem": name, "shapes": small_shapes if small else shapes, "target": target,
           "generations": generations,
           "population": population, "tune_s": tune_s}
    row.update(json.loads(out.stdout.strip().splitlines()[-1]))
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="", help="problems whose name starts with this")
    ap.add_argument("--target", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--small", action="store_true", help="sizes a CPU tunes in seconds")
    ap.add_argument("--generations", type=int, default=3)
    ap.add_argument("--population", type=int, default=8)
    ap.add_argument("--json", default=None)
    ap.add_argument("--measure", default=None, help=argparse.SUPPRESS)  # the separate process
    ap.add_argument("--db", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.measure, args.db, args.target, args.small)))
        return 0
    rows = []
    for name in PROBLEMS:
        if not name.startswith(args.only):
            continue
        row = check(name, args.target, args.small, args.generations, args.population)
        rows.append(row)
        if "error" in row:
            print(f"{name}: the separate process failed: {row['error'][0]}", flush=True)
            continue
        shapes = " ".join("x".join(map(str, s)) for s in row["shapes"])
        print(f"{name.split()[0]} {shapes} ({args.target}): tuned {row['generations']}x{row['population']} in "
              f"{row['tune_s']:.1f} s; in a new process the served call {row['served_ms']:.4f} ms "
              f"(spread {row['served_spread']:.1%}) beside the default's {row['default_ms']:.4f} "
              f"ms (spread {row['default_spread']:.1%}): default/served "
              f"{row['default_over_served']:.3f}"
              + (" (the default was served)" if row["served_is_default"] else ""), flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
