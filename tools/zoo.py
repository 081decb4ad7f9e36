"""Run the workload zoo: tcmlir (default options) beside PyTorch eager and torch.compile, in one run.

    python tools/zoo.py [--quick] [--size tiny|small|medium|large] [--only SUBSTR[,SUBSTR]]
                        [--device cuda|cpu] [--no-compile] [--no-half] [--budget SECONDS]
                        [--json OUT.json] [--list] [--save-defaults F.json] [--against F.json]

Per workload of `tools/zoo_workloads.py`: inputs on the device, the call users make
(``tc.define(src, target=...)(*inputs)``, default options; forward + backward through
`tcmlir.torch.op` for the ``grad`` workloads), checked against the PyTorch reference, then
timed warm beside torch eager and ``torch.compile`` of the same reference. On cuda: CUDA
events, a sample is the mean of up to 10 back-to-back calls after an untimed lead call,
median of 20 samples (as tools/bench.py). On cpu (``--device cpu``, a smoke run of the code
paths: target cpu against torch CPU) a wall clock, median of a few runs.

Prints one line per workload, then per category and overall (float32) the geomean of
``eager time / tcmlir time`` (above 1: tcmlir faster) and of ``torch.compile time / tcmlir
time``, the half-precision workloads' geomean apart, and the ten worst cases. A workload that
fails to compile, raises or mismatches is reported with the first line of its error and left
out of the geomeans; the run goes on. ``--quick``: the ``quick`` workloads at medium sizes
(~25, made to fit one 8-minute device call with compile times, and a default budget of
400 s); ``--budget``: start no workload but the first after that many seconds (the rest are
reported as skipped).

Comparing two versions of the defaults in one device call: ``--save-defaults F.json`` (no GPU
needed) writes each chosen forward workload's default cuda options at the size class, as the
checkout it runs from computes them; ``--against F.json`` (such a file, from an older checkout)
also times every workload it names with those options (``against_ms``, and ``vs_against`` =
``against_ms / tcmlir_ms``: above 1, today's defaults are faster) and prints their geomean.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import zoo_workloads as zw

QUICK_BUDGET_S = 400.0  # --quick starts no workload after this: one 8-minute device call


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:160] if text else ''}"


def as_tuple(x: Any) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def rel_error(out: Any, ref: Any) -> float:
    """max |out - ref| / max |ref| over all outputs (in float64; shapes must agree)."""
    import torch

    outs, refs = as_tuple(out), as_tuple(ref)
    if len(outs) != len(refs):
        raise AssertionError(f"{len(outs)} outputs, the reference has {len(refs)}")
    worst = 0.0
    for o, r in zip(outs, refs, strict=True):
        r = torch.as_tensor(r).detach().double()   # on the reference's device
        o = torch.as_tensor(o).detach().to(r.device).double()
        if o.numel() == r.numel() and o.shape != r.shape and o.numel() == 1:
            o = o.reshape(r.shape)  # a scalar output beside a 0-d or (1,) reference
        if o.shape != r.shape:
            raise AssertionError(f"output shape {tuple(o.shape)}, the reference has {tuple(r.shape)}")
        if not r.numel():
            continue
        scale = float(r.abs().max())
        err = float((o - r).abs().max())
        if math.isnan(err):
            return math.inf
        worst = max(worst, err / max(scale, 1e-30))
    return worst


def calls(w: zw.Workload, target: str, inputs: Sequence[Any],
          options: Any = None) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """(tcmlir's call, the reference's call) on ``inputs``: forward, or forward + backward
    (the gradients of the outputs with a fixed random seed, through `tcmlir.torch.op`).
    ``options``: those of the forward call (None: the defaults)."""
    import torch

    import tcmlir as tc

    fn = tc.define(w.tc, target=target)
    if not w.grad:
        def ours():
            return fn(*inputs, options=options)

        def ref():
            with torch.no_grad():
                return w.ref(*inputs)
        return ours, ref
    import tcmlir.torch as tt

    op = tt.op(fn, name=f"zoo_{w.name}_{target}")
    params = [x.detach().requires_grad_(True) for x in inputs]
    with torch.no_grad():
        like = as_tuple(w.ref(*inputs))[0]
    seed = torch.randn(like.shape, generator=torch.Generator().manual_seed(1)).to(like)

    def fwd_bwd(f):
        def run():
            out = f(*params)
            return (out, *torch.autograd.grad(out, params, seed))
        return run
    return fwd_bwd(op), fwd_bwd(w.ref)


def timer(device: str, fn: Callable[[], Any], runs: int) -> float:
    """Median seconds per call (see the module docstring for how a sample is taken)."""
    import torch

    if device != "cuda":
        fn()
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)
    from bench import time_cuda  # the benchmark suite's CUDA timer: both measure alike

    return time_cuda(torch, fn, warmup=3, runs=runs)


def sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def default_options(w: zw.Workload, size: str) -> str:
    """The JSON of ``w``'s default cuda options at size class ``size`` (no GPU needed)."""
    import tcmlir as tc

    fn = tc.define(w.tc, target="cuda")
    return tc.MappingOptions.default_for(fn.ir, "cuda", w.dims(size)).to_json()


def run_workload(w: zw.Workload, size: str, device: str, *, torch_compile: bool = True,
                 runs: int | None = None, against: str | None = None) -> dict[str, Any]:
    """One workload's row: status (``ok``, ``mismatch``, ``error``), times in ms, ratios."""
    import torch

    target = "cuda" if device == "cuda" else "cpu"
    runs = runs or (20 if device == "cuda" else 3)
    row: dict[str, Any] = {"name": w.name, "category": w.category, "dtype": w.dtype, "size": size,
                           "dims": w.dims(size), "grad": w.grad}
    try:
        inputs = w.make(size, device)
        ours, ref = calls(w, target, inputs)
        expected = ref()
        t0 = time.perf_counter()
        out = ours()
        sync(device)
        row["first_call_s"] = time.perf_counter() - t0  # compile(s) + one run
    except Exception as exc:  # noqa: BLE001 - a failing workload is a result, the run goes on
        row.update(status="error", error=first_line(exc))
        return row
    try:
        row["rel_err"] = err = rel_error(out, expected)
    except AssertionError as exc:
        row.update(status="mismatch", error=first_line(exc))
        return row
    if not err <= w.tol:
        row.update(status="mismatch", error=f"max relative error {err:.3g} > {w.tol:g}")
        return row
    try:
        row["tcmlir_ms"] = timer(device, ours, runs) * 1e3
        row["eager_ms"] = timer(device, ref, runs) * 1e3
    except Exception as exc:  # noqa: BLE001
        row.update(status="error", error=first_line(exc))
        return row
    row["status"] = "ok"
    row["vs_eager"] = row["eager_ms"] / row["tcmlir_ms"]
    if against is not None:
        try:
            theirs, _ = calls(w, target, inputs, options=against)
            err = rel_error(theirs(), expected)
            if err <= w.tol:
                row["against_ms"] = timer(device, theirs, runs) * 1e3
                row["vs_against"] = row["against_ms"] / row["tcmlir_ms"]
            else:
                row["against_error"] = f"max relative error {err:.3g} > {w.tol:g}"
        except Exception as exc:  # noqa: BLE001 - the older options may no longer compile
            row["against_error"] = first_line(exc)
    if torch_compile:
        try:
            # a fresh dynamo state per workload: the wrappers share one code object, whose
            # recompile limit would otherwise send later workloads to eager without a word
            torch.compiler.reset()
            compiled = torch.compile(lambda *args: w.ref(*args))
            _, cref = calls(dataclasses.replace(w, ref=compiled), target, inputs)
            t0 = time.perf_counter()
            cref()
            sync(device)
            row["torch_compile_s"] = time.perf_counter() - t0
            row["compile_ms"] = timer(device, cref, runs) * 1e3
            row["vs_compile"] = row["compile_ms"] / row["tcmlir_ms"]
        except Exception as exc:  # noqa: BLE001 - torch.compile's failure is torch's, not ours
            row["compile_error"] = first_line(exc)
    return row


def geomean(values: Sequence[float]) -> float | None:
    vals = [v for v in values if v and v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


def summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Geomeans per category and overall (float32 and half apart), failures, ten worst."""
    ok = [r for r in rows if r.get("status") == "ok"]
    fp32 = [r for r in ok if r["dtype"] == "float32"]
    half = [r for r in ok if r["dtype"] != "float32"]

    def means(rs):
        return {"n": len(rs), "vs_eager": geomean([r["vs_eager"] for r in rs]),
                "vs_compile": geomean([r["vs_compile"] for r in rs if "vs_compile" in r])}
    cats = {c: means([r for r in fp32 if r["category"] == c])
            for c in zw.CATEGORIES if any(r["category"] == c for r in fp32)}
    worst = sorted(ok, key=lambda r: r["vs_eager"])[:10]
    return {"categories": cats, "overall_fp32": means(fp32), "half": means(half),
            "worst": [(r["name"], r["vs_eager"]) for r in worst],
            "failed": [(r["name"], r["status"], r.get("error", "")) for r in rows
                       if r.get("status") not in ("ok",)],
            "below_half_eager": [r["name"] for r in fp32 if r["vs_eager"] < 0.5]}


def fmt(x: float | None, spec: str = "6.2f") -> str:
    return "   n/a" if x is None else format(x, spec)


def format_row(r: dict[str, Any]) -> str:
    head = f"{r['name']:<22} {r['category']:<12}"
    if r.get("status") != "ok":
        return f"{head} {r.get('status', '?').upper()}: {r.get('error', '')}"
    comp = (f"compile {r['compile_ms']:9.3f} ms  x{r['vs_compile']:6.2f}" if "compile_ms" in r
            else f"compile {'n/a' if 'compile_error' not in r else r['compile_error'][:40]}")
    return (f"{head} tcmlir {r['tcmlir_ms']:9.3f} ms  eager {r['eager_ms']:9.3f} ms  "
            f"x{r['vs_eager']:6.2f}  {comp}  (first call {r['first_call_s']:.1f} s)")


def print_summary(s: dict[str, Any], out: Any = None) -> None:
    p = (out or sys.stdout).write
    p("\nratio = other's time / tcmlir's time (above 1: tcmlir faster); geomeans:\n")
    p(f"{'category':<14} {'n':>3} {'vs eager':>9} {'vs compile':>11}\n")
    for c, m in s["categories"].items():
        p(f"{c:<14} {m['n']:>3} {fmt(m['vs_eager'], '9.3f')} {fmt(m['vs_compile'], '11.3f')}\n")
    for label, key in (("overall fp32", "overall_fp32"), ("half", "half")):
        m = s[key]
        p(f"{label:<14} {m['n']:>3} {fmt(m['vs_eager'], '9.3f')} {fmt(m['vs_compile'], '11.3f')}\n")
    p("ten worst (vs eager): " + ", ".join(f"{n} {v:.3f}" for n, v in s["worst"]) + "\n")
    if s["below_half_eager"]:
        p(f"below 0.5x eager (fp32): {len(s['below_half_eager'])}: {', '.join(s['below_half_eager'])}\n")
    for name, status, err in s["failed"]:
        p(f"{status.upper():<9} {name}: {err}\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the quick subset at medium sizes")
    ap.add_argument("--size", choices=zw.SIZE_CLASSES, default=None,
                    help="size class (default medium; tiny is CI's)")
    ap.add_argument("--only", default="", help="comma list of substrings of workload names")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: target cpu against torch CPU (a smoke run of the code paths)")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--no-half", action="store_true", help="skip the half-precision workloads")
    ap.add_argument("--runs", type=int, default=None, help="timed samples per measurement")
    ap.add_argument("--budget", type=float, default=None,
                    help="start no new workload after this many seconds")
    ap.add_argument("--json", default=None, help="write the rows and the summary here")
    ap.add_argument("--list", action="store_true", help="list the chosen workloads and exit")
    ap.add_argument("--save-defaults", default=None, metavar="F.json",
                    help="write the chosen workloads' default cuda options and exit")
    ap.add_argument("--against", default=None, metavar="F.json",
                    help="also time the workloads this file names with its options")
    args = ap.parse_args(argv)
    size = args.size or "medium"
    chosen = zw.select(args.only, quick=args.quick, half=not args.no_half)
    if args.save_defaults:
        saved = {w.name: default_options(w, size) for w in chosen if not w.grad}
        with open(args.save_defaults, "w", encoding="utf-8") as f:
            json.dump({"size": size, "options": saved}, f, indent=1)
        print(f"zoo: the default options of {len(saved)} workloads at {size} -> {args.save_defaults}")
        return 0
    against: dict[str, str] = {}
    if args.against:
        with open(args.against, encoding="utf-8") as f:
            against = json.load(f)["options"]
    if args.list:
        for w in chosen:
            dims = " ".join(f"{k}={v}" for k, v in w.dims(size).items())
            flags = "".join(f" [{f}]" for f, on in (("grad", w.grad), ("quick", w.quick)) if on)
            print(f"{w.name:<22} {w.category:<12} {w.dtype:<9} {dims}{flags}")
        return 0
    import torch

    if args.device == "cuda":
        if not torch.cuda.is_available():
            print("tools/zoo.py: torch sees no GPU (use --device cpu for a smoke run)", file=sys.stderr)
            return 2
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    if args.quick and args.budget is None:
        args.budget = QUICK_BUDGET_S
    if not chosen:
        print(f"tools/zoo.py: no workload matches {args.only!r}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    rows = []
    print(f"zoo: {len(chosen)} workloads, size {size}, device {args.device}", flush=True)
    for w in chosen:
        if rows and args.budget is not None and time.perf_counter() - t0 > args.budget:
            rows.append({"name": w.name, "category": w.category, "dtype": w.dtype, "size": size,
                         "status": "skipped", "error": f"budget of {args.budget:g} s spent"})
            continue
        torch.manual_seed(0)
        row = run_workload(w, size, args.device, torch_compile=not args.no_compile, runs=args.runs,
                           against=against.get(w.name))
        row["elapsed_s"] = time.perf_counter() - t0
        rows.append(row)
        print(format_row(row), flush=True)
        if args.device == "cuda":
            torch.cuda.empty_cache()
    s = summary(rows)
    print_summary(s)
    if against:
        vs = [(r["name"], r["vs_against"]) for r in rows if "vs_against" in r]
        print(f"against {args.against}: geomean of the older options' time / today's "
              f"{fmt(geomean([v for _, v in vs]), '.3f')} over {len(vs)} workloads; "
              + ", ".join(f"{n} {v:.2f}" for n, v in sorted(vs, key=lambda x: x[1])))
        for r in rows:
            if "against_error" in r:
                print(f"  {r['name']}: the older options failed: {r['against_error']}")
    print(f"total {time.perf_counter() - t0:.1f} s")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"size": size, "device": args.device, "rows": rows, "summary": s}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
