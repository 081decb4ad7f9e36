"""Benchmark target cpu against numpy doing the same work, and time source -> callable kernel.

    python tools/bench_cpu.py [--threads N] [--repeat R] [--small]

Kernels: a fused elementwise chain ``O(i) = tanh(A(i)) * B(i) + exp(-A(i))`` over 4M elements,
a row softmax 4096x1024, a matmul 512^3 (float32). Each is compiled through the front end, the
polyhedral core (isl scheduler, ``max`` fusion) with a ``parallel`` mark above every outermost
band whose first member is coincident, and the host JIT. Prints median times and the ratio
numpy / cpu (> 1: faster than numpy), then the median source-to-kernel time for the matmul.
"""

from __future__ import annotations

import argparse
import statistics
import time

import islpy as isl
import numpy as np

from tcmlir import lang
from tcmlir.codegen.host import compile_host
from tcmlir.errors import Source
from tcmlir.poly.scheduler import compute_schedule
from tcmlir.poly.state import CompileState

CHAIN = "def chain(float(N) A, float(N) B) -> (O) { O(i) = tanh(A(i)) * B(i) + exp(-A(i)) }"
SOFTMAX = """def softmax(float(N, M) X) -> (Y) {
  mx(n) max=! X(n, m)
  e(n, m) = exp(X(n, m) - mx(n))
  s(n) +=! e(n, m)
  Y(n, m) = e(n, m) / s(n)
}"""
MATMUL = "def matmul(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }"


def mark_parallel(schedule: isl.Schedule) -> isl.Schedule:
    """Insert a ``parallel`` mark above each outermost band whose first member is coincident
    (a stand-in for the ``mark-parallel`` pass while the pass library is being written)."""
    def visit(node: isl.ScheduleNode) -> isl.ScheduleNode:
        if node.get_type() == isl.schedule_node_type.band:
            if node.band_member_get_coincident(0):
                node = node.insert_mark(isl.Id("parallel", context=node.get_ctx()))
                node = node.child(0)
            return node
        for i in range(node.n_children()):
            node = visit(node.child(i)).parent()
        return node

    return visit(schedule.get_root()).get_schedule()


def compile_cpu(text: str, sizes: dict[str, int], threads: int | None):
    fn = lang.check(lang.parse(text), source=Source(text))
    state = CompileState.initial(fn, sizes)
    sched = mark_parallel(compute_schedule(state.scop, state.deps, "max"))
    from dataclasses import replace

    return compile_host(replace(state, schedule=sched), threads=threads)


def median_time(f, repeat: int) -> float:
    f()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--small", action="store_true", help="smaller sizes (a quick check)")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    n = 1 << (18 if args.small else 22)
    rows, cols = (512, 256) if args.small else (4096, 1024)
    mm = 128 if args.small else 512

    A, B = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
    Out = np.empty_like(A)
    X = rng.standard_normal((rows, cols), dtype=np.float32)
    Y = np.empty_like(X)
    P, Q = rng.standard_normal((mm, mm), dtype=np.float32), rng.standard_normal((mm, mm), dtype=np.float32)
    C = np.empty((mm, mm), np.float32)

    def np_chain():
        return np.tanh(A) * B + np.exp(-A)

    def np_softmax():
        e = np.exp(X - X.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    cases = [
        ("chain 4M" if not args.small else "chain", CHAIN, {"N": n}, {"A": A, "B": B, "O": Out}, np_chain, "O"),
        (f"softmax {rows}x{cols}", SOFTMAX, {"N": rows, "M": cols}, {"X": X, "Y": Y}, np_softmax, "Y"),
        (f"matmul {mm}^3", MATMUL, {"M": mm, "N": mm, "K": mm}, {"A": P, "B": Q, "C": C}, lambda: P @ Q, "C"),
    ]
    print(f"{'kernel':<22}{'cpu ms':>10}{'numpy ms':>10}{'numpy/cpu':>11}")
    for name, text, sizes, arrays, ref, out in cases:
        k = compile_cpu(text, sizes, args.threads)
        t_cpu = median_time(lambda k=k, a=arrays, s=sizes: k.run(a, s), args.repeat)
        t_np = median_time(ref, args.repeat)
        err = float(np.max(np.abs(arrays[out] - ref())))
        print(f"{name:<22}{t_cpu * 1e3:>10.3f}{t_np * 1e3:>10.3f}{t_np / t_cpu:>11.2f}   (max |err| {err:.1e})")

    sizes = {"M": mm, "N": mm, "K": mm}
    compile_times = []
    for _ in range(5):
        t0 = time.perf_counter()
        compile_cpu(MATMUL, sizes, args.threads)
        compile_times.append(time.perf_counter() - t0)
    print(f"matmul source -> kernel: median {statistics.median(compile_times) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
