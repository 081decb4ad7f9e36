"""Host calls on one thread against the default's threads (all cores), warm calls of the
default options at sizes from tiny to large: where splitting a parallel loop across threads
pays (`runtime.host_plan` decides that by measuring; this shows what it chose).

    python tools/host_split.py

Prints, per kernel and size, the median microseconds of `Kernel.benchmark` (7 interleaved
rounds of 20 runs) with the default threads ("all") and with threads=1, and their ratio
(below 1: the default lost to one thread).
"""

from __future__ import annotations

import dataclasses
import statistics

import numpy as np
from tune_sweep import MATMUL as MM  # the tools' matmul and softmax (tools/ is on the path)
from tune_sweep import SOFTMAX

import tcmlir as tc

ADD = "def add(float(N) A, float(N) B) -> (C) { C(n) = A(n) + B(n) }"


def _times(src: str, inputs: tuple, sizes: dict[str, int]) -> dict[str, float]:
    fn = tc.define(src, target="cpu")
    default = tc.MappingOptions.default_for(fn.ir, "cpu", sizes)
    kernels = {"all": fn.compile(*inputs, options=default),
               "one": fn.compile(*inputs, options=dataclasses.replace(default, threads=1))}
    samples: dict[str, list[float]] = {k: [] for k in kernels}
    for _ in range(7):
        for name, kernel in kernels.items():
            samples[name].append(kernel.benchmark(*inputs, runs=20).median)
    return {k: statistics.median(v) * 1e6 for k, v in samples.items()}


def _row(what: str, t: dict[str, float]) -> None:
    print(f"{what:24} all threads {t['all']:9.1f} us  one thread {t['one']:9.1f} us  "
          f"one/all {t['one'] / t['all']:.2f}")


def main() -> None:
    rng = np.random.default_rng(0)
    for n in (32, 64, 96, 128, 192, 256, 384):
        a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
        _row(f"matmul {n}^3", _times(MM, (a, b), {"M": n, "K": n, "N": n}))
    for n in (1 << 14, 1 << 16, 1 << 18, 1 << 20):
        a, b = (rng.standard_normal(n, dtype=np.float32) for _ in range(2))
        _row(f"add {n}", _times(ADD, (a, b), {"N": n}))
    for rows, cols in ((64, 256), (256, 256), (256, 1024), (1024, 1024)):
        x = rng.standard_normal((rows, cols), dtype=np.float32)
        _row(f"softmax {rows}x{cols}", _times(SOFTMAX, (x,), {"N": rows, "D": cols}))


if __name__ == "__main__":
    main()
