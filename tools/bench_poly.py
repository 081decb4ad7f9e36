"""Time the polyhedral front half (scop + dependences + isl schedule) on every corpus program.

    python tools/bench_poly.py [--repeat 5] [--fusion max] [--sized]

Prints, per program, the median wall time of building the scop, computing the dependences and
scheduling (goal: < 100 ms each), and the total; the front end (parse + sema) is not timed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from corpus.programs import CASES

import tcmlir.lang as lang
from tcmlir.errors import TCError
from tcmlir.poly.deps import compute_dependences
from tcmlir.poly.scheduler import FUSION_STRATEGIES, compute_schedule
from tcmlir.poly.scop import build_scop


def measure(fn, sizes, fusion: str) -> tuple[float, float, float]:
    t0 = time.perf_counter()
    scop = build_scop(fn, sizes)
    t1 = time.perf_counter()
    deps = compute_dependences(scop)
    t2 = time.perf_counter()
    compute_schedule(scop, deps, fusion)
    t3 = time.perf_counter()
    return t1 - t0, t2 - t1, t3 - t2


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--fusion", choices=FUSION_STRATEGIES, default="max")
    p.add_argument("--sized", action="store_true", help="use each case's first sizes")
    args = p.parse_args(argv)
    rows = []
    for case in CASES:
        try:
            fn = lang.check(lang.parse(case.source), case.entry)
        except TCError as exc:
            print(f"{case.name}: front end: {str(exc).splitlines()[0]}", file=sys.stderr)
            continue
        sizes = dict(case.sizes[0]) if args.sized else None
        runs = [measure(fn, sizes, args.fusion) for _ in range(args.repeat)]
        med = [statistics.median(r[k] for r in runs) * 1e3 for k in range(3)]
        total = statistics.median(sum(r) for r in runs) * 1e3
        rows.append((case.name, len(fn.statements), *med, total))
    width = max(len(r[0]) for r in rows)
    print(f"{'program':<{width}}  stmts   scop ms   deps ms  sched ms  total ms")
    for name, n, a, b, c, t in rows:
        flag = "  SLOW" if t >= 100 else ""
        print(f"{name:<{width}}  {n:5d}  {a:8.2f}  {b:8.2f}  {c:8.2f}  {t:8.2f}{flag}")
    totals = [r[-1] for r in rows]
    print(f"{len(rows)} programs, fusion={args.fusion}, {'sized' if args.sized else 'parametric'}: "
          f"median {statistics.median(totals):.2f} ms, max {max(totals):.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
