"""Compile-time fuzz of the tuner's search space (no GPU): candidates drawn and mutated the way
the genetic search draws them (`SearchSpace.sample` / `SearchSpace.mutate` around the default
options), each compiled for sm_90 in a child process that is killed after LIMIT seconds.

    python tools/fuzz_compile.py [--samples 200] [--limit 60] [--seed 0] [--target 10]
                                 [--only CASE-PREFIX ...]
    python tools/fuzz_compile.py --suite small [--samples 14] [--limit 30] [--seed 0]

``--suite bench`` (the default): the cases of `tools/bench.py` at their full sizes, taken in
turn (``--samples`` candidates in all); prints one line per candidate, then per case and over
all the median and maximum compile time (wall, and the child's CPU time: on a loaded machine
the wall time overstates), the candidates over ``--target`` seconds of wall time (issue 31:
none over 10 s) with their options JSON, and one ``ERR`` line per distinct compile error. A
killed candidate counts as LIMIT seconds. Exit status 1 when some candidate is over the target.

``--suite small``: small awkward programs, ``--samples`` candidates each; prints ``HANG``
(killed), ``DIED`` (the child crashed), ``SLOW`` (over a third of LIMIT) with the candidate's
options JSON, then the ``ERR`` lines. It found the split-K scheduling and copy-proof blow-ups
fixed on 2026-12-01 (fifth session).

A tuning worker gives a candidate 60 s (`TunerConfig.timeout_s`) and is restarted after a
hang, so what this finds costs tuning time.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import statistics
import sys
import time
import types

os.environ["TCMLIR_ALWAYS_COMPILE"] = "1"  # generate, do not read (or fill) the artifact cache

PROGS = {
    "mm": ("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }", [(96, 64), (64, 80)]),
    "tmm": ("def tmm(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,k) * B(n,k) }", [(33, 100), (47, 100)]),
    "bmm": ("def bmm(float(B,N,K) X, float(B,M,K) Y) -> (Z) { Z(b,n,m) +=! X(b,n,k) * Y(b,m,k) }", [(5, 13, 24), (5, 11, 24)]),
    "conv": ("def c(float(N,C,H,W) I, float(F,C,KH,KW) W1) -> (O) { O(n,f,h,w) +=! I(n,c,h+kh,w+kw) * W1(f,c,kh,kw) }", [(2, 3, 12, 12), (4, 3, 3, 3)]),
    "softmax": ("""def softmax(float(N, D) X) -> (O) {
        mx(n) max=! X(n, d)
        e(n, d) = exp(X(n, d) - mx(n))
        s(n) +=! e(n, d)
        O(n, d) = e(n, d) / s(n) }""", [(37, 100)]),
    "fc": ("""def fc(float(B,M) I, float(N,M) W1, float(N) B1) -> (O1) {
        O1(b, n) +=! I(b, m) * W1(n, m)
        O1(b, n) = fmax(O1(b, n) + B1(n), 0) }""", [(30, 70), (50, 70), (50,)]),
}


def child(src: str, shapes: list, opts_json: str, q: object) -> None:
    import numpy as np

    import tcmlir as tc

    fn = tc.define(src, target="cuda")
    xs = [np.zeros(s, np.float32) for s in shapes]
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        fn.compile(*xs, options=tc.MappingOptions.from_json(opts_json), arch="sm_90")
        q.put(("ok", time.perf_counter() - t0, "", time.process_time() - c0))
    except Exception as e:  # noqa: BLE001 - every compile error is a finding
        q.put(("err", time.perf_counter() - t0,
               f"{type(e).__name__}: {str(e).splitlines()[0][:150]}", time.process_time() - c0))


def compile_in_child(src: str, shapes: list, opts_json: str, limit: float
                     ) -> tuple[str, float, str, float]:
    """("ok" | "err" | "hang" | "died", seconds, message, CPU seconds) of one compile in a
    forked child (a killed child's CPU seconds are the limit)."""
    q = mp.get_context("fork").Queue()
    p = mp.get_context("fork").Process(target=child, args=(src, shapes, opts_json, q))
    p.start()
    p.join(limit)
    if p.is_alive():
        p.kill()
        p.join()
        return "hang", limit, f"killed after {limit:g} s", limit
    if q.empty():
        return "died", 0.0, f"exit {p.exitcode}", 0.0
    return q.get()


def bench_suite(samples: int, limit: float, seed: int, target: float, only: list[str]) -> int:
    import numpy as np

    import tcmlir as tc
    from tcmlir.binding import bind_sizes
    from tcmlir.tune.space import space_for

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench import cases

    def zeros(*shape: object, device: object = None) -> np.ndarray:  # torch.randn's signature
        return np.zeros(shape[0] if len(shape) == 1 and isinstance(shape[0], tuple) else shape,
                        np.float32)

    fake_torch = types.SimpleNamespace(randn=zeros)
    chosen = [c for c in cases(False) if not only or any(c.name.startswith(p) for p in only)]
    if not chosen:
        print(f"no benchmark case starts with {' or '.join(only)}", file=sys.stderr)
        return 2
    rng = random.Random(seed)
    spaces = []
    for case in chosen:
        fn = tc.define(case.tc, target="cuda")
        shapes = [x.shape for x in case.make(fake_torch)]
        sizes = bind_sizes(fn.ir, shapes)
        base = tc.MappingOptions.default_for(fn.ir, "cuda", sizes)
        spaces.append((case, shapes, space_for(fn.ir, "cuda", sizes=sizes), base))
    # warm the parent's imports (llvmlite, the code generators), so children time the compile
    tc.define("def w(float(N) X) -> (O) { O(i) = X(i) }", target="cuda").compile(
        np.zeros(4, np.float32), arch="sm_90")
    times: dict[str, list[float]] = {c.name: [] for c, *_ in spaces}
    cpu: dict[str, list[float]] = {c.name: [] for c, *_ in spaces}
    over: list[tuple[float, str, str, str]] = []
    errors: dict[tuple[str, str], tuple[str, str]] = {}
    for i in range(samples):
        case, shapes, space, base = spaces[i % len(spaces)]
        opts = space.sample(rng, base) if (i // len(spaces)) % 2 == 0 else space.mutate(rng, base, 0.5)
        kind, dt, msg, ct = compile_in_child(case.tc, shapes, opts.to_json(), limit)
        times[case.name].append(dt)
        cpu[case.name].append(ct)
        tag = {"ok": "", "err": " ERR", "hang": " HANG", "died": " DIED"}[kind]
        print(f"{i:4} {case.name:32} {dt:7.2f} s (cpu {ct:6.2f} s){tag}", flush=True)
        if dt > target or kind in ("hang", "died"):
            over.append((dt, case.name, kind, opts.to_json()))
        if kind in ("err", "died"):
            errors.setdefault((case.name, msg[:80]), (msg, opts.to_json()))
    print(f"\n{'case':32} {'n':>4} {'median':>8} {'max':>8}   (CPU: median, max)")
    every = [t for row in times.values() for t in row]
    every_cpu = [c for row in cpu.values() for c in row]
    for name, ts in [*times.items(), ("all", every)]:
        cs = every_cpu if name == "all" else cpu[name]
        if ts:
            print(f"{name:32} {len(ts):4} {statistics.median(ts):7.2f}s {max(ts):7.2f}s"
                  f"   ({statistics.median(cs):.2f}s, {max(cs):.2f}s)")
    print(f"over {target:g} s (or killed/crashed): {len(over)}")
    for dt, name, kind, opts_json in sorted(over, reverse=True):
        print(f"  {dt:7.2f} s {kind:4} {name}: {opts_json}")
    for (name, _), (msg, opts_json) in errors.items():
        print(f"ERR {name}: {msg}\n    {opts_json}")
    return 1 if over else 0


def small_suite(n: int, limit: float, seed: int) -> int:
    import tcmlir as tc
    from tcmlir.binding import bind_sizes
    from tcmlir.tune.space import space_for

    rng = random.Random(seed)
    errors: dict[tuple[str, str], tuple[str, str]] = {}
    for name, (src, shapes) in PROGS.items():
        fn = tc.define(src, target="cuda")
        space = space_for(fn.ir, "cuda")
        base = tc.MappingOptions.default_for(fn.ir, "cuda", bind_sizes(fn.ir, shapes))
        for i in range(n):
            o = space.sample(rng, base) if i % 2 == 0 else space.mutate(rng, base, 0.5)
            kind, dt, msg, _ = compile_in_child(src, shapes, o.to_json(), limit)
            if kind == "hang":
                print(f"HANG {name} >{limit}s {o.to_json()}", flush=True)
                continue
            if kind == "died":
                print(f"DIED {name} {msg} {o.to_json()}", flush=True)
            elif dt > limit / 3:
                print(f"SLOW {name} {dt:.1f}s {o.to_json()}", flush=True)
            if kind == "err":
                errors.setdefault((name, msg[:80]), (msg, o.to_json()))
        print(f"-- {name} done", flush=True)
    for (name, _), (msg, opts) in errors.items():
        print(f"ERR {name}: {msg}\n    {opts}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", choices=("bench", "small"), default="bench")
    ap.add_argument("--samples", type=int, default=None,
                    help="candidates in all (bench, default 200) or per program (small, default 14)")
    ap.add_argument("--limit", type=float, default=None,
                    help="seconds before a child is killed (bench 60, small 30)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target", type=float, default=10.0,
                    help="bench: report candidates compiling longer than this (seconds)")
    ap.add_argument("--only", nargs="*", default=[], help="bench: case-name prefixes")
    a = ap.parse_args(argv)
    if a.suite == "small":
        return small_suite(a.samples or 14, a.limit or 30.0, a.seed)
    return bench_suite(200 if a.samples is None else a.samples, a.limit or 60.0, a.seed,
                       a.target, a.only)


if __name__ == "__main__":
    sys.exit(main())
