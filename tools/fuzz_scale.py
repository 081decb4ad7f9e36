"""How compile and call cost grow with the size of a program (issue 36): time each stage of a
compile for generated programs of n statements or outputs.

    python tools/fuzz_scale.py [--family same,distinct,chain,outputs] [--n 50,100,200,400]
                               [--target cpu,cuda] [--profile FAMILY:N:TARGET]

Families (``float(N) A`` in, N = 37):
  same      n statements ``O(i) = A(i)`` (one output written n times)
  distinct  ``O0(i) = A(i)`` ... ``O{n-1}(i) = A(i)`` (n outputs)
  chain     ``T0(i) = A(i) + 1`` ... ``T{k}(i) = T{k-1}(i) + 1``, one output
  outputs   the chain with every ``T{k}`` an output (n outputs, each read by the next)

Per row: define (parse + sema), then on cuda the whole compile as a call makes it (PTX, no
GPU needed); then stage by stage: scop, dependences, each pass of the pipeline and the
legality proofs between them (verify), the GPU coverage proof, the isl AST, LLVM IR lowering,
emit (PTX for cuda, MCJIT for cpu), and on cpu the whole compile and the first call. A stage that raises a
`TCError` stops the row with its message (the cuda parameter-space limit, say). ``--profile``
runs one case under cProfile and prints the 25 most expensive functions (cumulative).
The artifact cache is off (a fresh temporary directory), so every row compiles.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np

SIZE = 37


def program(family: str, n: int) -> str:
    """The TC source of ``family`` at ``n`` statements (see the module docstring)."""
    if family == "same":
        body, outs = ["O(i) = A(i)"] * n, ["O"]
    elif family == "distinct":
        body, outs = [f"O{k}(i) = A(i)" for k in range(n)], [f"O{k}" for k in range(n)]
    elif family in ("chain", "outputs"):
        body = [f"T{k}(i) = {'A' if k == 0 else f'T{k - 1}'}(i) + 1.0" for k in range(n)]
        outs = [f"T{k}" for k in range(n)] if family == "outputs" else [f"T{n - 1}"]
    else:
        raise SystemExit(f"unknown family {family!r}")
    lines = "\n    ".join(body)
    return f"def f(float(N) A) -> ({', '.join(outs)}) {{\n    {lines}\n}}"


def stages(family: str, n: int, target: str) -> tuple[dict[str, float], str]:
    """Wall seconds per stage of compiling (and, on cpu, calling) ``program(family, n)``."""
    from tcmlir.passes import PassManager, parse_pipeline

    import tcmlir as tc
    from tcmlir.codegen import host, nvptx
    from tcmlir.poly.deps import compute_dependences
    from tcmlir.poly.gpu_mapping import check_coverage, kernel_marks
    from tcmlir.poly.loops import build_ast
    from tcmlir.poly.scop import build_scop
    from tcmlir.poly.state import CompileState

    times: dict[str, float] = {}

    def timed(name: str, thunk: Callable):
        t0 = time.perf_counter()
        try:
            return thunk()
        finally:
            times[name] = times.get(name, 0.0) + time.perf_counter() - t0

    a = np.arange(SIZE, dtype=np.float32)
    try:
        fn = timed("define", lambda: tc.define(program(family, n), target=target))
        sizes = {"N": SIZE}
        opts = tc.MappingOptions.default_for(fn, target)
        if target == "cuda":  # the whole compile, as a call makes it (limits refuse it early)
            timed("compile", lambda: fn.compile(a, arch="sm_90"))
        scop = timed("scop", lambda: build_scop(fn.ir, sizes))
        deps = timed("deps", lambda: compute_dependences(scop))
        state = CompileState(fn.ir, scop, deps, None, sizes)
        manager = PassManager(parse_pipeline(opts.to_pipeline(target)))
        t0 = time.perf_counter()
        state = manager.run(state)
        total = time.perf_counter() - t0
        for name, t in manager.timings:
            times[name.split("{")[0]] = t
        times["verify"] = total - sum(t for _, t in manager.timings)
        if target == "cuda" and state.schedule is not None and kernel_marks(state.schedule):
            timed("coverage", lambda: check_coverage(state.proof_schedule, state.scop.domain,
                                                     state.scop.context))
        timed("ast", lambda: build_ast(state))
        emit_name = "emit_ptx" if target == "cuda" else "jit"
        module = nvptx if target == "cuda" else host
        real_emit = getattr(module, emit_name)
        setattr(module, emit_name, lambda *args, **kw: timed("emit", lambda: real_emit(*args, **kw)))
        try:
            t0 = time.perf_counter()
            if target == "cuda":
                nvptx.compile_cuda(state, "sm_90")
            else:
                host.compile_host(state)
            times["lower"] = time.perf_counter() - t0 - times.get("emit", 0.0)
        finally:
            setattr(module, emit_name, real_emit)
        if target == "cpu":
            timed("compile", lambda: fn.compile(a))  # the whole compile again, as a call does
            timed("call", lambda: fn(a))  # (reuses that kernel)
    except tc.TCError as exc:
        return times, f"{type(exc).__name__}: {str(exc).splitlines()[0][:110]}"
    return times, ""


COLUMNS = ("define", "scop", "deps", "schedule", "verify", "coverage", "ast", "lower", "emit",
           "compile", "call")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--family", default="same,distinct,chain,outputs")
    p.add_argument("--n", default="50,100,200,400")
    p.add_argument("--target", default="cpu,cuda")
    p.add_argument("--profile", help="FAMILY:N:TARGET to run under cProfile")
    args = p.parse_args(argv)
    os.environ["TCMLIR_CACHE_DIR"] = tempfile.mkdtemp(prefix="tcmlir-scale-")
    os.environ.setdefault("TCMLIR_THREADS", "2")
    if args.profile:
        family, n, target = args.profile.split(":")
        prof = cProfile.Profile()
        prof.enable()
        _, err = stages(family, int(n), target)
        prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
        print(err or "ok")
        return 0
    print(f"{'family':<9}{'target':<6}{'n':>6}" + "".join(f"{c:>9}" for c in COLUMNS)
          + f"{'total':>9}  error")
    for family in args.family.split(","):
        for target in args.target.split(","):
            for n in (int(x) for x in args.n.split(",")):
                times, err = stages(family, n, target)
                others = sum(t for k, t in times.items() if k not in COLUMNS)
                cells = "".join(f"{times[c]:9.2f}" if c in times else f"{'-':>9}"
                                for c in COLUMNS)
                rest = f" (+{others:.2f} other passes)" if others >= 0.01 else ""
                print(f"{family:<9}{target:<6}{n:>6}{cells}{sum(times.values()):9.2f}  "
                      f"{err}{rest}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
