"""Every TC program of Facebook's TensorComprehensions repository, on numpy, cpu and cuda.

    python tools/tc_repo_programs.py [--jobs 2] [--emulate] [--only ID ...]   # no GPU needed
    python tools/tc_repo_programs.py --device cuda                            # on a GPU machine

The programs are tests/corpus/tc_repo.json (`tools/tc_repo_extract.py` cuts them out of TC's
repository). For each: define it (a program TC itself rejects, or one using a feature tcmlir does
not have, must give a located `tcmlir.TCError`: outcome ``rejected``), choose small distinct
sizes and random inputs (`tc_repo_inputs`), run the reference interpreter (``target="numpy"``)
and compare it with an independent reference (numpy.einsum where the program is a product of
reads, else `tc_repo_reference`'s float64 broadcasting evaluator, where it applies), run the
cpu target against it, compile for cuda under the default options for sm_90 and assemble the
PTX with ptxas, and (``--emulate``) run the cuda kernels on the host with
tests/mma_emulator.py. ``--device cuda`` runs the cuda target on torch CUDA tensors instead of the
emulator. Prints one line per failure (its first error line) and the counts per stage.

Stages and outcomes: ``define`` (ok / rejected: a located TCError / crash), then per stage ok,
``error`` (a TCError at run time, with its line), ``mismatch``, ``crash`` (any other exception:
a bug), ``skip`` (with why). Exit status 1 when any stage crashed or mismatched.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import signal
import sys
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

import tc_repo_inputs as inputs_lib  # noqa: E402
import tc_repo_reference  # noqa: E402

import tcmlir as tc  # noqa: E402
from tcmlir import ir  # noqa: E402

CORPUS = HERE.parent / "tests" / "corpus" / "tc_repo.json"
STAGES = ("define", "numpy", "indep", "cpu", "ptx", "emulate", "cuda")
LOCATED = re.compile(r"^\S+:\d+:\d+: error: ")
RTOL = 1e-4
EMULATE_ELEMENTS = 4096  # the emulator runs one host thread per GPU thread: keep it tiny


def load_programs(path: Path = CORPUS) -> list[dict]:
    return json.loads(path.read_text())["programs"]


@dataclass
class Result:
    id: str
    path: str
    sizes: dict[str, int] = field(default_factory=dict)
    stages: dict[str, tuple[str, str]] = field(default_factory=dict)  # stage -> (outcome, note)
    seconds: float = 0.0

    def failed(self) -> list[str]:
        return [s for s, (o, _) in self.stages.items() if o in ("crash", "mismatch")]


class _Timeout(Exception):
    pass


def _alarm(_signum, _frame):
    raise _Timeout


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def _where(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    last = next((f for f in reversed(frames) if "tcmlir" in f.filename or "passes" in
                 f.filename), frames[-1] if frames else None)
    return "" if last is None else f" [{Path(last.filename).name}:{last.lineno} {last.name}]"


def _as_tuple(x) -> tuple:
    return x if isinstance(x, tuple) else (x,)


def compare(got, want, rtol: float = RTOL) -> str | None:
    """None when every output matches (floats within rtol of the largest magnitude, others
    exactly); else what differs."""
    for k, (g, w) in enumerate(zip(_as_tuple(got), _as_tuple(want), strict=True)):
        g, w = np.asarray(g), np.asarray(w)
        if g.shape != w.shape:
            return f"output {k}: shape {g.shape} != {w.shape}"
        if not np.issubdtype(w.dtype, np.floating):
            if not np.array_equal(g, w):
                return f"output {k}: {int((g != w).sum())} of {w.size} elements differ"
            continue
        g64, w64 = g.astype(np.float64), w.astype(np.float64)
        finite = np.isfinite(w64)
        scale = float(np.abs(w64[finite]).max()) if finite.any() else 0.0
        bad = ~np.isclose(g64, w64, rtol=rtol, atol=rtol * max(scale, 1e-30), equal_nan=True)
        if bad.any():
            i = np.unravel_index(int(np.argmax(bad)), w.shape) if w.ndim else ()
            return (f"output {k}: {int(bad.sum())} of {w.size} elements differ, e.g. at {i}: "
                    f"{g64[i]} vs {w64[i]}")
    return None


def _stage(result: Result, name: str, fn, *args):
    """Run one stage, record its outcome; return its value (None unless ok)."""
    try:
        value = fn(*args)
    except _Timeout:
        result.stages[name] = ("crash", "timeout: over the CPU seconds allowed per program")
        raise
    except tc.TCError as e:
        result.stages[name] = ("error", _first_line(e))
        return None
    except Exception as e:  # noqa: BLE001 - any other exception is the bug this tool looks for
        result.stages[name] = ("crash", _first_line(e) + _where(e))
        return None
    result.stages[name] = ("ok", "")
    return value


def _emulate(src: str, inputs: list[np.ndarray], sizes: dict[str, int]):
    """The default cuda kernels of ``src`` run on the host (tests/mma_emulator.py)."""
    import mma_emulator as emu

    fn = tc.define(src, target="cuda")
    kernel = fn.compile(*inputs, target="cuda", arch="sm_90")
    arrays = emu.stage_arrays(fn.ir, kernel, inputs, sizes)
    emu.run_kernel(kernel, arrays, sizes)
    return tuple(arrays[t.name] for t in fn.ir.outputs)


def _device_call(src: str, inputs: list[np.ndarray]):
    import torch

    # a scalar parameter as users pass it, a Python number (np.ascontiguousarray would make a
    # 0-d array 1-d); tensors as torch CUDA tensors. A program without tensor inputs returns
    # numpy (outputs come back in the inputs' kind, and there is none).
    args = [x.item() if x.ndim == 0 else torch.from_numpy(np.ascontiguousarray(x)).cuda()
            for x in inputs]
    got = tc.define(src, target="cuda")(*args)
    torch.cuda.synchronize()
    return tuple(g.cpu().numpy() if isinstance(g, torch.Tensor) else np.asarray(g)
                 for g in _as_tuple(got))


def check(program: dict, **kwargs) -> Result:
    """Every stage of one program (see the module docstring); warnings (preconditions, fp32
    advice) are not outcomes and are silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return _check(program, **kwargs)


def _check(program: dict, *, emulate: bool = False, device: str | None = None,
           ptx: bool = True, cpu: bool = True, limit_s: int = 120,
           max_elements: int | None = None, size_set: str = "small") -> Result:
    from tcmlir.codegen.ptx_tools import find_ptxas, ptxas_check

    src = program["text"]
    result = Result(program["id"], program["path"])
    start = time.perf_counter()
    # CPU seconds of this process (a busy machine does not make a slow program), SIGPROF
    old = signal.signal(signal.SIGPROF, _alarm)
    signal.setitimer(signal.ITIMER_PROF, limit_s)
    try:
        fn = _stage(result, "define", lambda: tc.define(src, target="numpy"))
        if fn is None:
            outcome, note = result.stages["define"]
            if outcome == "error":
                located = LOCATED.match(note.split(": ", 1)[-1])
                result.stages["define"] = ("rejected" if located else "crash",
                                           note if located else f"not located: {note}")
            return result
        sizes = inputs_lib.choose_sizes(fn.ir, inputs_lib.SIZE_SETS[size_set])
        if sizes is None:
            result.stages["numpy"] = ("skip", "no sizes up to 32 satisfy the context")
            return result
        result.sizes = sizes
        if max_elements is not None and (n := max(inputs_lib.element_count(fn.ir, sizes),
                                                  ir.instance_count(fn.ir, sizes))) > max_elements:
            result.stages["numpy"] = ("skip", f"{n} elements or statement instances at {sizes}")
            return result
        sizes, args, want = _run_reference(result, fn, src, sizes)
        if want is None:
            return result
        ref = _stage(result, "indep", _independent, fn, args, sizes)
        if ref is None and result.stages["indep"][0] == "ok":
            result.stages["indep"] = ("skip", "no independent reference for its operations")
        elif ref is not None and (why := compare(want, ref[1])):
            result.stages["indep"] = ("mismatch", f"numpy vs {ref[0]}: {why}")
        elif ref is not None:
            result.stages["indep"] = ("ok", ref[0])
        if cpu:
            got = _stage(result, "cpu", lambda: tc.define(src, target="cpu")(*args))
            if got is not None and (why := compare(got, want)):
                result.stages["cpu"] = ("mismatch", why)
        if ptx:
            kernel = _stage(result, "ptx", lambda: tc.define(src, target="cuda").compile(
                *args, target="cuda", arch="sm_90"))
            if kernel is not None and ".entry" in kernel.ptx and find_ptxas() is not None:
                _stage(result, "ptx", ptxas_check, kernel.ptx, "sm_90")
        if emulate:
            _emulate_stage(result, fn, src, args, want, sizes)
        if device == "cuda":
            got = _stage(result, "cuda", _device_call, src, args)
            if got is not None and (why := compare(got, want)):
                result.stages["cuda"] = ("mismatch", why)
    except _Timeout:  # the stage that ran out is marked; the others do not run
        if not any(note.startswith("timeout") for _, note in result.stages.values()):
            result.stages["timeout"] = ("crash", f"timeout: over {limit_s} CPU seconds")
    finally:
        result.seconds = time.perf_counter() - start
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, old)
    return result


def _independent(fn, args, sizes: dict[str, int]):
    """(which, outputs) of a reference that shares no code with tcmlir: numpy.einsum for
    products of reads, else the broadcasting evaluator; None when neither applies."""
    out = inputs_lib.einsum_reference(fn, args, sizes)
    if out is not None:
        return "einsum", out
    out = tc_repo_reference.broadcast_reference(fn.ir, args, sizes)
    return None if out is None else ("broadcast", out)


def _emulate_stage(result: Result, fn, src: str, args, want, sizes: dict[str, int]) -> None:
    """The cuda kernels on the host emulator, at the smallest sizes (`tc_repo_inputs.TINY`) when
    the chosen ones are too large for one host thread per GPU thread."""
    if "ptx" in result.stages and result.stages["ptx"][0] != "ok":
        result.stages["emulate"] = ("skip", "no cuda kernel")
        return
    if inputs_lib.element_count(fn.ir, sizes) > EMULATE_ELEMENTS:
        tiny = inputs_lib.choose_sizes(fn.ir, inputs_lib.TINY)
        if tiny is None or inputs_lib.element_count(fn.ir, tiny) > EMULATE_ELEMENTS:
            result.stages["emulate"] = ("skip", "too large to emulate")
            return
        probe = Result(result.id, result.path)
        sizes, args, want = _run_reference(probe, fn, src, tiny)
        if want is None:
            result.stages["emulate"] = ("skip", f"reference at {sizes}: {probe.stages['numpy']}")
            return
    got = _stage(result, "emulate", _emulate, src, args, sizes)
    if got is not None and (why := compare(got, want)):
        result.stages["emulate"] = ("mismatch", f"at {sizes}: {why}")


def _run_reference(result: Result, fn, src: str, sizes: dict[str, int]):
    """Sizes, inputs and the reference outputs. While a gather reads out of range (TC's shifted
    lookups, ``LUT(1 + j + I(i, k), j)``), integer inputs shrink to 0, then the gathered
    extent grows to hold the index (`tc_repo_inputs.widen_for_gather`)."""
    high = None
    for _ in range(8):
        args = inputs_lib.make_inputs(fn.ir, src, sizes, int_high=high)
        want = _stage(result, "numpy", lambda a=args: _as_tuple(fn(*a)))
        note = result.stages["numpy"][1]
        if want is not None or "out of bounds" not in note:
            break
        if high != 1:
            high = 4 if high is None else max(1, high // 2)
            continue
        wider = inputs_lib.widen_for_gather(fn.ir, sizes, note)
        if wider is None:
            break
        sizes = result.sizes = wider
    return sizes, args, want


def _worker(job):
    program, kwargs = job
    return check(program, **kwargs)


def _results(jobs: list, processes: int):
    if processes <= 1:
        yield from map(_worker, jobs)
        return
    with multiprocessing.get_context("spawn").Pool(processes, maxtasksperchild=16) as pool:
        yield from pool.imap(_worker, jobs)


def summarize(results: list[Result], out=sys.stdout) -> int:
    """Failures with their first line, rejections with their reason, and counts per stage."""
    bad = 0
    for r in results:
        for stage, (outcome, note) in r.stages.items():
            if outcome in ("crash", "mismatch"):
                bad += 1
                print(f"FAIL {r.id} ({r.path}) {stage} {outcome} at {r.sizes}: {note}", file=out)
    for r in results:
        outcome, note = r.stages.get("define", ("", ""))
        if outcome == "rejected":
            print(f"rejected {r.id} ({r.path}): {note}", file=out)
        for stage, (outcome, note) in r.stages.items():
            if outcome in ("error", "skip") and stage != "indep":
                print(f"{outcome} {r.id} {stage}: {note}", file=out)
    print(f"{len(results)} programs", file=out)
    for stage in STAGES:
        counts: dict[str, int] = {}
        for r in results:
            if stage in r.stages:
                counts[r.stages[stage][0]] = counts.get(r.stages[stage][0], 0) + 1
        if counts:
            print(f"  {stage:8s} " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())),
                  file=out)
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--emulate", action="store_true", help="run the cuda kernels on the host")
    ap.add_argument("--device", choices=["cuda"], help="run the cuda target on the GPU")
    ap.add_argument("--no-ptx", action="store_true")
    ap.add_argument("--only", nargs="*", help="program ids")
    ap.add_argument("--limit", type=int, default=120, help="CPU seconds per program")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--sizes", choices=sorted(inputs_lib.SIZE_SETS), default="small",
                    help="the size values to prefer (small: 3, 5, 7, ...; ones: 1 first; wide: "
                         "33, 17, 65, ...)")
    ap.add_argument("--max-elements", type=int,
                    help="skip programs with more elements or statement instances")
    args = ap.parse_args(argv)
    os.environ.setdefault("TCMLIR_ALWAYS_COMPILE", "1")  # (a command-line run: its own process)
    programs = [p for p in load_programs() if not args.only or p["id"] in args.only]
    on_gpu = args.device is not None  # the cuda call compiles; cpu and ptx ran in CI
    kwargs = {"emulate": args.emulate, "device": args.device, "ptx": not (args.no_ptx or on_gpu),
              "cpu": not on_gpu, "limit_s": args.limit, "max_elements": args.max_elements,
              "size_set": args.sizes}
    start = time.perf_counter()
    jobs = [(p, kwargs) for p in programs]
    results = []
    for r in _results(jobs, args.jobs):
        results.append(r)
        bad = ", ".join(f"{s} {r.stages[s][0]}" for s in r.failed())
        print(f"[{len(results)}/{len(jobs)}] {r.id} {r.seconds:.1f} s {bad}", file=sys.stderr,
              flush=True)
    rc = summarize(results)
    print(f"{time.perf_counter() - start:.0f} s", file=sys.stdout)
    if args.json:
        Path(args.json).write_text(json.dumps([r.__dict__ for r in results], indent=1))
    return rc


if __name__ == "__main__":
    sys.exit(main())
