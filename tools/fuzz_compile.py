"""Compile-time fuzz of the tuner's search space (no GPU): candidates drawn and mutated from the
default options of small awkward programs, each compiled for sm_90 in a child process that is
killed after LIMIT seconds.

    python tools/fuzz_compile.py [N=14] [LIMIT=30] [SEED=0]

Prints ``HANG`` (killed), ``DIED`` (the child crashed), ``SLOW`` (over a third of LIMIT) with
the candidate's options JSON, then one ``ERR`` line per distinct compile error. A tuning worker
gives a candidate 60 s (`TunerConfig.timeout_s`) and is restarted after a hang, so what this
finds costs tuning time; it found the split-K scheduling and copy-proof blow-ups fixed on
2026-12-01 (fifth session).
"""
from __future__ import annotations

import multiprocessing as mp
import random
import sys
import time

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
    t0 = time.time()
    try:
        fn.compile(*xs, options=tc.MappingOptions.from_json(opts_json), arch="sm_90")
        q.put(("ok", time.time() - t0, ""))
    except Exception as e:  # noqa: BLE001 - every compile error is a finding
        q.put(("err", time.time() - t0, f"{type(e).__name__}: {str(e).splitlines()[0][:150]}"))


def main() -> int:
    import tcmlir as tc
    from tcmlir.binding import bind_sizes
    from tcmlir.tune.space import space_for

    args = sys.argv[1:] + ["14", "30", "0"][len(sys.argv) - 1:]
    n, limit, rng = int(args[0]), float(args[1]), random.Random(int(args[2]))
    ctx = mp.get_context("fork")
    errors: dict[tuple[str, str], tuple[str, str]] = {}
    for name, (src, shapes) in PROGS.items():
        fn = tc.define(src, target="cuda")
        space = space_for(fn.ir, "cuda")
        base = tc.MappingOptions.default_for(fn.ir, "cuda", bind_sizes(fn.ir, shapes))
        for i in range(n):
            o = space.sample(rng, base) if i % 2 == 0 else space.mutate(rng, base, 0.5)
            q = ctx.Queue()
            p = ctx.Process(target=child, args=(src, shapes, o.to_json(), q))
            p.start()
            p.join(limit)
            if p.is_alive():
                p.kill()
                p.join()
                print(f"HANG {name} >{limit}s {o.to_json()}", flush=True)
                continue
            kind, dt, msg = q.get() if not q.empty() else ("died", 0, f"exit {p.exitcode}")
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


if __name__ == "__main__":
    sys.exit(main())
