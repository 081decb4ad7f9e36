"""Compile time per stage, cold artifact cache, for the benchmark suite and the workload zoo.

    python tools/bench_compile.py [--zoo] [--only PREFIX ...] [--size medium] [--ptxas] [--json]
    python tools/bench_compile.py --tiny            # one tiny case (CI: the tool still runs)
    python tools/bench_compile.py --tuner 20 [--only matmul] [--limit 60]

Each case is compiled for the cuda target (``arch=sm_90``; no GPU needed) under its default
options at its full size, with ``TCMLIR_ALWAYS_COMPILE=1`` (the artifact cache is neither read
nor trusted), in one process after a warm-up compile (imports, LLVM's initialisation and
libdevice's first read are not counted). The stages are the pipeline's own
(`tcmlir.log.stage_times`): scop (domains, accesses, dependences), schedule (isl's scheduler),
passes (the other passes), verify (legality and coverage proofs), isl AST, access expressions
(the promoted buffers' coordinates, computed in the AST build's callbacks), LLVM IR (the walk and
its text), LLVM parse, libdevice, LLVM opt, PTX (LLVM's NVPTX backend), loops text, cache store;
``other`` is what no stage covers. ``--ptxas`` also runs ``ptxas -arch=sm_90 -v`` on the PTX
(what the driver's JIT does at module load) and reports its seconds, registers and spills.

Cases: `tools/bench.py`'s suite; with ``--zoo`` also `ZOO_CASES` of `tools/zoo_workloads.py`
at ``--size`` (default medium). ``--json`` prints one JSON object per case instead of the table.

``--tuner N``: the tuner's throughput instead: per case, N candidates of its search space
(`tune.space.space_for`; drawn and mutated from the default options alternately, seed 0, as
`tools/fuzz_compile.py` does), each compiled cold in a forked child killed after ``--limit``
seconds (the tuner's per-candidate timeout is 60 s): candidates per minute of one core, the
median and slowest compile, and how many failed or ran out of time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np

import tcmlir as tc
from tcmlir.log import stage_times

# the zoo's workloads timed with --zoo: one or two per category, the quick subset's core
ZOO_CASES = ("mm_square", "mm_odd", "tmm_nt", "tbmm", "bmm_scores", "conv2d_valid", "group_conv",
             "depthwise_conv", "maxpool2x2", "row_sum", "col_sum", "full_sum_scalar",
             "add_row_bias", "transpose2d", "perm4_heads", "embedding_bag_sum", "layernorm_768",
             "softmax_1000", "attention_fused", "chain_poly", "linear_bias_relu", "mlp2")
STAGES = ("cached kernel", "scop", "schedule", "passes", "verify", "isl AST", "access expressions", "LLVM IR",
          "LLVM parse", "libdevice", "LLVM opt", "PTX", "loops text", "cache store")
SHORT = {"cached kernel": "load", "access expressions": "access", "LLVM parse": "parse", "loops text": "loops",
         "cache store": "store", "libdevice": "libdev"}
TINY = ("add 64", "def add(float(N) X, float(N) Y) -> (O) { O(i) = X(i) + Y(i) }",
        lambda: (np.zeros(64, np.float32), np.zeros(64, np.float32)))


def _zeros(*shape: object, device: object = None) -> np.ndarray:  # torch.randn's signature
    return np.zeros(shape[0] if len(shape) == 1 and isinstance(shape[0], tuple) else shape,
                    np.float32)


def bench_cases() -> list[tuple[str, str, Callable[[], tuple[Any, ...]]]]:
    """(name, TC source, inputs) of `tools/bench.py`'s suite, inputs as numpy zeros."""
    from bench import cases

    fake_torch = types.SimpleNamespace(randn=_zeros)
    return [(c.name, c.tc, (lambda c=c: c.make(fake_torch))) for c in cases(False)]


def zoo_cases(size: str) -> list[tuple[str, str, Callable[[], tuple[Any, ...]]]]:
    from zoo_workloads import by_name

    out = []
    for name in ZOO_CASES:
        w = by_name(name)
        out.append((f"zoo {name} ({size})", w.tc, (lambda w=w: w.make(size))))
    return out


def ptxas(ptx: str, arch: str = "sm_90") -> dict[str, Any]:
    """Seconds of ``ptxas -v`` on ``ptx``, and the most registers and spilled bytes of a kernel."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        start = time.perf_counter()
        done = subprocess.run(["ptxas", f"-arch={arch}", "-v", path, "-o", os.path.join(d, "k.o")],
                              capture_output=True, text=True, check=True)
        seconds = time.perf_counter() - start
    regs = [int(r) for r in re.findall(r"Used (\d+) registers", done.stderr)]
    spills = [int(a) + int(b) for a, b in
              re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", done.stderr)]
    return {"ptxas": seconds, "registers": max(regs, default=0), "spill_bytes": sum(spills)}


def measure(name: str, source: str, make: Callable[[], tuple[Any, ...]],
            run_ptxas: bool) -> dict[str, Any]:
    """One cold compile of ``source`` at ``make()``'s inputs: total and per-stage seconds."""
    inputs = make()
    fn = tc.define(source, target="cuda")
    start = time.perf_counter()
    with stage_times() as times:
        kernel = fn.compile(*inputs, arch="sm_90")
    total = time.perf_counter() - start
    row: dict[str, Any] = {"case": name, "total": total, "stages": dict(times),
                           "ptx_lines": kernel.ptx.count("\n"),
                           "llvm_ir_lines": kernel.llvm_ir.count("\n")}
    if run_ptxas:
        row.update(ptxas(kernel.ptx))
    return row


def _compile_child(source: str, inputs: tuple[Any, ...], options_json: str, q: Any) -> None:
    fn = tc.define(source, target="cuda")
    start = time.perf_counter()
    try:
        fn.compile(*inputs, options=tc.MappingOptions.from_json(options_json), arch="sm_90")
        q.put(("ok", time.perf_counter() - start))
    except Exception as exc:  # noqa: BLE001 - an invalid candidate: counted, as the tuner does
        q.put((type(exc).__name__, time.perf_counter() - start))


def tuner_rate(name: str, source: str, make: Callable[[], tuple[Any, ...]], n: int,
               limit: float) -> dict[str, Any]:
    """Compile ``n`` candidates of the tuning space of ``source`` (module docstring)."""
    import multiprocessing as mp
    import random

    from tcmlir.binding import bind_sizes
    from tcmlir.tune.space import space_for

    inputs = make()
    fn = tc.define(source, target="cuda")
    space = space_for(fn.ir, "cuda")
    base = tc.MappingOptions.default_for(fn.ir, "cuda", bind_sizes(fn.ir, [x.shape for x in inputs]))
    rng = random.Random(0)
    ctx = mp.get_context("fork")
    times, failed, timed_out = [], 0, 0
    start = time.perf_counter()
    for i in range(n):
        o = space.sample(rng, base) if i % 2 == 0 else space.mutate(rng, base, 0.5)
        q = ctx.Queue()
        p = ctx.Process(target=_compile_child, args=(source, inputs, o.to_json(), q))
        t0 = time.perf_counter()
        p.start()
        p.join(limit)
        if p.is_alive():
            p.kill()
            p.join()
            timed_out += 1
            times.append(time.perf_counter() - t0)
            continue
        kind, _ = q.get() if not q.empty() else ("died", 0.0)
        times.append(time.perf_counter() - t0)
        failed += kind != "ok"
    wall = time.perf_counter() - start
    times.sort()
    return {"case": name, "candidates": n, "per_minute": 60 * n / wall,
            "median": times[len(times) // 2], "slowest": times[-1], "failed": failed,
            "timed_out": timed_out}


def format_table(rows: list[dict[str, Any]], run_ptxas: bool) -> str:
    used = [s for s in STAGES if any(s in r["stages"] for r in rows)]
    heads = ["total", *(SHORT.get(s, s) for s in used), "other"]
    if run_ptxas:
        heads += ["ptxas", "regs", "spill"]
    width = max([len(r["case"]) for r in rows] + [4])
    lines = [f"{'case':<{width}} " + " ".join(f"{h:>8}" for h in heads) + "   (seconds)"]
    for r in rows:
        cells = [r["total"], *(r["stages"].get(s, 0.0) for s in used),
                 r["total"] - sum(r["stages"].values())]
        text = " ".join(f"{c:8.3f}" for c in cells)
        if run_ptxas:
            text += f" {r['ptxas']:8.3f} {r['registers']:8d} {r['spill_bytes']:8d}"
        lines.append(f"{r['case']:<{width}} {text}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    # generate, do not read the artifact cache; restored after, so that importing and running
    # the tool in a process (the tests) leaves later compiles of that process cached
    before = os.environ.get("TCMLIR_ALWAYS_COMPILE")
    os.environ["TCMLIR_ALWAYS_COMPILE"] = "1"
    try:
        return _main(argv)
    finally:
        if before is None:
            os.environ.pop("TCMLIR_ALWAYS_COMPILE", None)
        else:
            os.environ["TCMLIR_ALWAYS_COMPILE"] = before


def _main(argv: list[str] | None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--zoo", action="store_true", help="also the zoo's selection (ZOO_CASES)")
    p.add_argument("--size", default="medium", help="the zoo's size class (default medium)")
    p.add_argument("--only", nargs="*", default=[], metavar="PREFIX",
                   help="cases whose name starts with a prefix (zoo cases: 'zoo NAME')")
    p.add_argument("--ptxas", action="store_true", help="also time ptxas -v (registers, spills)")
    p.add_argument("--json", action="store_true", help="one JSON object per case")
    p.add_argument("--tiny", action="store_true", help="only a 64-element add (a smoke test)")
    p.add_argument("--tuner", type=int, default=0, metavar="N",
                   help="compile N tuning candidates per case: candidates per minute")
    p.add_argument("--limit", type=float, default=60.0, help="--tuner: seconds per candidate")
    args = p.parse_args(argv)
    warm = measure(*TINY, run_ptxas=False)  # imports, LLVM's initialisation: not counted
    if args.tiny:
        todo = [TINY]
    else:
        todo = bench_cases() + (zoo_cases(args.size) if args.zoo else [])
        if args.only:
            todo = [c for c in todo if any(c[0].startswith(o) for o in args.only)]
    del warm
    if args.tuner:
        for case in todo:
            r = tuner_rate(*case, n=args.tuner, limit=args.limit)
            print(json.dumps(r) if args.json else
                  f"{r['case']:34} {r['per_minute']:6.1f} candidates/min  median "
                  f"{r['median']:5.2f} s  slowest {r['slowest']:5.2f} s  failed {r['failed']}  "
                  f"timed out {r['timed_out']}", flush=True)
        return 0
    rows = []
    for case in todo:
        row = measure(*case, run_ptxas=args.ptxas)
        rows.append(row)
        if args.json:
            print(json.dumps(row), flush=True)
        else:
            print(f"{row['case']}: {row['total']:.2f} s", file=sys.stderr, flush=True)
    if not args.json:
        print(format_table(rows, args.ptxas))
    return 0


if __name__ == "__main__":
    sys.exit(main())
