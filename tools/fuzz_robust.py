"""Time-boxed robustness fuzz (issue 36): every case must give the right answer or a `TCError`,
never another exception or a hang.

    python tools/fuzz_robust.py --minutes 10 --seed 1 [--out fuzz-out] [--jobs 2] [--limit 30]

Four categories of cases, drawn in turn:

* ``valid``: random well-formed programs (tests/strategies_programs.py, drawn through hypothesis
  outside pytest, at awkward sizes 0..129), and corpus programs with a unicode comment added;
* ``broken``: corpus and generated programs mutated by token deletions/insertions/replacements
  and unicode (lone surrogates, U+2028/2029, lone CR, RTL marks, zero-width, emoji, NUL, BOM)
  inside identifiers, comments and anywhere;
* ``badcall``: valid programs called with wrong shapes, dtypes, strings, None, scalars for
  tensors, keyword inputs, unknown keywords, options/outputs/devices of the wrong type;
* ``extreme``: up to ~300 statements, ~300 outputs, ~500 levels of expression nesting, ranks
  up to 16, sizes 0, 1 and huge (a 2**40 extent next to a 0).

Each case runs in a forked child (at most ``--jobs`` at once), killed when one of its steps (the
numpy call, the cpu call, the cuda compile) runs past ``--limit`` seconds (a hang). A case defines its program and runs it on targets numpy and cpu (compared with each
other and, where there is one, with an independent numpy model) and compiles it for cuda to PTX
(``fn.compile(..., target="cuda", arch="sm_90")``, no GPU needed). Outcomes: ``tcerror`` (every
refusal was a TCError), ``correct``, ``wrong`` (a result differs, or one target refuses what
another runs), ``exception`` (anything else; the reproducer is saved under ``--out``), ``hang``.
The counts are printed at the end, per category.
"""
from __future__ import annotations

import argparse
import hashlib
import multiprocessing as mp
import os
import resource
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("TCMLIR_CACHE_DIR", tempfile.mkdtemp(prefix="tcmlir-fuzz-cache-"))

import fuzz_robust_cases as cases  # noqa: E402

import tcmlir as tc  # noqa: E402

OUTCOMES = ("tcerror", "correct", "wrong", "exception", "hang")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return (text.splitlines()[0] if text else "")[:200]


class _Log(list):
    """The steps a case ran, also sent to the parent as they happen (a hang names its step)."""

    def __init__(self, conn):
        super().__init__()
        self.conn = conn
        self.start = time.monotonic()

    def append(self, step: str) -> None:
        step = f"{step} [{time.monotonic() - self.start:.1f}s]"
        super().append(step)
        self.conn.send(("step", step))


def _child(case: cases.Case, conn) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))
    sys.setrecursionlimit(10_000)
    log = _Log(conn)
    try:
        outcome, detail = case.run(log)
    except tc.TCError as e:  # a case's run catches per step; this is a last resort
        outcome, detail = "tcerror", f"{type(e).__name__}: {_first_line(e)}"
    except BaseException as e:  # noqa: BLE001 - every other exception is a finding
        outcome = "exception"
        detail = f"{type(e).__name__}: {_first_line(e)}\n{traceback.format_exc()[-4000:]}"
    conn.send((outcome, detail, list(log)))
    conn.close()


def _save(out: Path, case: cases.Case, outcome: str, detail: str, log: list[str]) -> str:
    key = hashlib.sha1(f"{case.category}{case.repro}".encode("utf-8", "surrogatepass")).hexdigest()[:10]
    path = out / f"{outcome}-{case.category}-{key}.txt"
    text = (f"# {outcome} ({case.category}): {detail.splitlines()[0] if detail else ''}\n"
            f"# steps: {' | '.join(log)}\n\n{case.repro}\n\n# detail\n{detail}\n")
    path.write_text(text, encoding="utf-8", errors="backslashreplace")
    return path.name


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="fuzz-out")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--limit", type=float, default=30.0, help="seconds per case before a hang")
    ap.add_argument("--only", choices=cases.CATEGORIES, action="append")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gen = cases.CaseSource(args.seed, args.only or list(cases.CATEGORIES))
    ctx = mp.get_context("fork")
    counts: dict[str, Counter] = {c: Counter() for c in cases.CATEGORIES}
    findings: dict[tuple[str, str, str], list[str]] = {}
    # (process, pipe, case, start, steps so far, when the last step ended)
    running: list[tuple[object, object, cases.Case, float, list[str], float]] = []
    deadline = time.monotonic() + 60 * args.minutes
    slow = 0

    def finish(proc, conn, case, start, hung: bool, steps: list[str]) -> None:
        if hung:
            proc.kill()
            proc.join()
            outcome, detail, log = "hang", f"killed after {args.limit:.0f} s", steps
        else:
            outcome, detail, log = "exception", f"child died (exit {proc.exitcode})", steps
            while True:
                try:
                    if not conn.poll(0.5):
                        break
                    msg = conn.recv()
                except (EOFError, OSError):
                    break
                if msg[0] == "step":
                    steps.append(msg[1])
                else:
                    outcome, detail, log = msg
                    break
            proc.join()
        conn.close()
        record(case, start, outcome, detail, log)

    def record(case, start, outcome, detail, log) -> None:
        nonlocal slow
        elapsed = time.monotonic() - start
        slow += elapsed > args.limit / 3
        counts[case.category]["cases"] += 1
        counts[case.category][outcome] += 1
        if outcome == "tcerror" and "internal" in detail.lower():
            counts[case.category]["internal"] += 1  # a TCError, but one the compiler owns
            outcome = "internal"
        if outcome in ("wrong", "exception", "hang", "internal"):
            name = _save(out, case, outcome, detail, log)
            first = detail.splitlines()[0][:120] if detail else ""
            findings.setdefault((outcome, case.category, first), []).append(name)
            print(f"{outcome.upper():9} {case.category:8} {elapsed:5.1f}s {first}  -> {name}",
                  flush=True)

    while running or time.monotonic() < deadline:
        while len(running) < args.jobs and time.monotonic() < deadline:
            try:
                case = gen.next()
            except Exception as e:  # noqa: BLE001 - a generator slip must not end the campaign
                print(f"generator: {type(e).__name__}: {_first_line(e)}", flush=True)
                continue
            parent, child = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_child, args=(case, child))
            proc.start()
            child.close()
            now = time.monotonic()
            running.append((proc, parent, case, now, [], now))
        time.sleep(0.02)
        for item in list(running):
            proc, conn, case, start, steps, last = item
            done = not proc.is_alive()
            while not done and conn.poll():
                try:
                    msg = conn.recv()
                except (EOFError, OSError):
                    done = True
                    break
                if msg[0] == "step":
                    steps.append(msg[1])
                    running[running.index(item)] = item = (proc, conn, case, start,
                                                           steps, time.monotonic())
                else:
                    running.remove(item)
                    conn.close()
                    proc.join()
                    record(case, start, *msg)
                    break
            else:
                if done:
                    running.remove(item)
                    finish(proc, conn, case, start, False, steps)
                elif time.monotonic() - last > args.limit:  # one step ran past the limit
                    running.remove(item)
                    finish(proc, conn, case, start, True, steps)

    print(f"\nfuzz_robust seed={args.seed} minutes={args.minutes} limit={args.limit:.0f}s "
          f"jobs={args.jobs}")
    print(f"{'category':9} " + " ".join(f"{k:>9}" for k in ("cases", *OUTCOMES)))
    total: Counter = Counter()
    for cat, c in counts.items():
        total.update(c)
        print(f"{cat:9} " + " ".join(f"{c[k]:9d}" for k in ("cases", *OUTCOMES)))
    print(f"{'total':9} " + " ".join(f"{total[k]:9d}" for k in ("cases", *OUTCOMES)))
    print(f"internal TCErrors (counted as tcerror): {total['internal']}")
    print(f"cases slower than {args.limit / 3:.0f} s: {slow}")
    if findings:
        print("\ndistinct findings:")
        for (outcome, cat, first), names in sorted(findings.items()):
            print(f"  {outcome:9} {cat:8} x{len(names)} {first}  e.g. {out / names[0]}")
    return 1 if any(k[0] != "internal" for k in findings) else 0


if __name__ == "__main__":
    sys.exit(main())
