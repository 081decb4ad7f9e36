"""Run-time fuzz of the cuda mapping space on the host emulator (no GPU): tuner candidates
compiled for sm_90, run by `tests/mma_emulator.py`, checked against the reference interpreter.

    python tools/fuzz_emulated.py [--samples 20] [--seed 0] [--limit 60] [--only LABEL-PREFIX ...]
                                  [--odd] [--verbose] [--list]

For each program of `PROGRAMS` (taken from tools/zoo_workloads.py, at small awkward sizes: odd
extents, extents below the tiles), ``--samples`` candidates drawn the way the genetic search
draws them (`tune.space.SearchSpace.sample` around the naive and the default options,
`SearchSpace.mutate` of the defaults; ``--odd``: then given some odd tiles, blocks, unroll
factors a user may pass, `wild`), each compiled for sm_90 and run in a forked child killed
after ``--limit`` seconds. Every array is staged between poisoned margins (a write out of
bounds fails), outputs start as NaN unless the runtime zero-fills them, shared memory is
poisoned (`tests/mma_emulator.py`). wgmma (inline assembly) is not emulated: tensor-core
candidates run in their mma.sync form.

One line per failure: ``FAIL <label> <kind> <options JSON> -- <detail>``, the options JSON
holding only the fields that differ from `MappingOptions()` (``MappingOptions.from_json``
reads it back). Kinds: ``wrong`` (values off the reference), ``nan`` (NaN where the reference
is finite: an element never written, or a read of poisoned memory), ``oob`` (a write out of
bounds), ``input`` (an input was written), ``crash`` (the compiler or the emulator raised
something other than a refusal, the kernel reported an error, or a barrier waited
`BARRIER_TIMEOUT` seconds: a deadlock), ``died`` (the child crashed). Not failures, counted and
listed with ``--verbose``: ``refused`` (a `TCError` at compile time: an `OptionsError` or
`PipelineError` that says why; or a launch the runtime refuses with sm_90's limits), ``skipped`` (more OS threads than `MAX_COST`: too slow to
emulate), ``slow`` (killed at the limit while still running). Exit status 1 when some
candidate failed.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import multiprocessing as mp
import os
import random
import sys
import time
from dataclasses import dataclass
from math import prod
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

SM90 = None  # the launch limits of an H100 (`launch_limits.LaunchLimits`), set by `check`
MAX_COST = 8192  # `emulator_cost` above which a candidate is skipped (about 30 s)
FAILURES = ("wrong", "nan", "oob", "input", "crash", "died")
BARRIER_TIMEOUT = 20  # seconds a barrier waits for the rest of its block: then a deadlock


@dataclass(frozen=True)
class Program:
    label: str
    zoo: str  # the workload's name in tools/zoo_workloads.py
    dims: dict[str, int]


PROGRAMS = [
    Program("mm_33x40x70", "mm_odd", {"M": 33, "N": 40, "K": 70}),
    Program("mm_32x256x160", "mm_odd", {"M": 32, "N": 256, "K": 160}),
    Program("mm_5x3x200", "mm_odd", {"M": 5, "N": 3, "K": 200}),
    Program("mm_fp16", "mm_fp16", {"M": 33, "N": 40, "K": 70}),
    Program("bmm", "bmm", {"B": 3, "N": 17, "K": 12, "M": 33}),
    Program("conv_valid", "conv2d_valid", {"N": 2, "C": 3, "H": 9, "W": 10, "F": 5, "KH": 3, "KW": 3}),
    Program("conv_pad", "conv2d_pad_select", {"N": 2, "C": 3, "H": 9, "W": 10, "F": 5}),
    Program("softmax", "softmax_1000", {"N": 5, "D": 70}),
    Program("layernorm", "layernorm_1000", {"T": 5, "D": 70}),
    Program("row_sum", "row_sum", {"N": 7, "D": 130}),
    Program("col_sum", "col_sum", {"N": 37, "D": 13}),
    Program("full_sum", "full_sum_2d", {"N": 37, "D": 13}),
    Program("mid_sum", "mid_axis_sum", {"A": 3, "B": 35, "C": 7}),
    Program("chain", "chain_poly", {"N": 1003}),
    Program("attention", "attention_fused", {"B": 2, "S": 13, "D": 6}),
    Program("transpose", "transpose2d", {"N": 37, "M": 33}),
    # more classes than the brief's: strided/depthwise convolutions, pooling, gathers, mixed
    # rows and columns, lead contractions, chains of contractions
    Program("conv_s2", "conv2d_stride2", {"N": 1, "C": 3, "H": 11, "W": 10, "F": 4, "KH": 3, "KW": 3}),
    Program("depthwise", "depthwise_conv", {"N": 2, "C": 5, "H": 9, "W": 7, "KH": 3, "KW": 3}),
    Program("maxpool", "maxpool3x3s2", {"N": 2, "C": 3, "H": 11, "W": 9}),
    Program("perm4", "perm4_heads", {"B": 2, "H": 3, "S": 7, "D": 5}),
    Program("embag", "embedding_bag_mean", {"V": 11, "D": 37, "B": 5, "L": 4}),
    Program("groupnorm", "groupnorm", {"N": 2, "G": 3, "C": 5, "S": 7}),
    Program("softmax_cols", "softmax_cols", {"N": 37, "D": 13}),
    Program("causal", "causal_softmax", {"B": 2, "S": 13}),
    Program("kron", "kron3_2", {"M": 3, "N0": 4, "N1": 7, "N2": 5, "D": 3}),
    Program("mlp2", "mlp2", {"B": 5, "M": 37, "N": 9, "P": 6}),
]


def compact(opts: Any) -> str:
    """The options' JSON, only the fields that differ from `MappingOptions()`."""
    from tcmlir import MappingOptions

    full, plain = opts.to_dict(), MappingOptions().to_dict()
    return json.dumps({k: v for k, v in full.items() if plain.get(k) != v and k != "version"},
                      sort_keys=True, separators=(",", ":"))


def inputs_of(prog: Program) -> tuple[str, list[Any], float]:
    """(TC source, numpy inputs, tolerance) of ``prog``."""
    import numpy as np
    import torch
    import zoo_workloads as zw

    w = dataclasses.replace({x.name: x for x in zw.ZOO}[prog.zoo], size_classes={"tiny": prog.dims})
    xs = [t.numpy() if t.dtype in (torch.float32, torch.int32) else t.float().numpy()
          for t in w.make("tiny")]
    if w.half:
        assert w.dtype == "float16", w.dtype
        xs = [x.astype(np.float16) if x.dtype == np.float32 else x for x in xs]
    return w.tc, [np.ascontiguousarray(x) for x in xs], max(w.tol, 1e-2 if w.half else 1e-4)


ODD_TILES = (1, 3, 5, 7, 12, 24, 48, 96)
ODD_BLOCK = (1, 3, 5, 12, 24, 48, 96)


def wild(rng: random.Random, opts: Any, depth: int) -> Any:
    """``opts`` with some of its sizes replaced by ones the tuner never proposes but a user
    may pass (odd tiles and blocks, an unroll factor of 3, an odd register tile, small grids,
    parametric kernels)."""
    changes: dict[str, Any] = {}
    if rng.random() < 0.6:
        changes["tile_sizes"] = tuple(rng.choice((0, *ODD_TILES)) for _ in range(depth))
    if rng.random() < 0.5:
        changes["block"] = tuple(rng.choice(ODD_BLOCK) for _ in range(rng.choice((1, 2))))
    if rng.random() < 0.3:
        changes["unroll_factor"] = rng.choice((3, 5, 6))
    if rng.random() < 0.3 and opts.register_tile:
        changes["register_tile"] = tuple(rng.choice((1, 3, 5)) for _ in opts.register_tile)
    if rng.random() < 0.3:
        changes["grid"] = tuple(rng.choice((1, 2, 3, 5)) for _ in range(rng.choice((1, 2, 3))))
    if rng.random() < 0.2:  # sizes as kernel arguments, on a grid the emulator can run
        changes["parametric"] = True
        changes["grid"] = tuple(rng.choice((1, 2, 3)) for _ in range(rng.choice((1, 2, 3))))
    return dataclasses.replace(opts, **changes)


def candidates(src: str, inputs: list[Any], n: int, rng: random.Random,
               odd: bool = False) -> list[Any]:
    """``n`` candidates the tuner could propose: sampled around the naive options (the
    search's first base) and the defaults, and the defaults mutated; ``odd``: then passed
    through `wild` (kept where the search space's checks accept them)."""
    import tcmlir as tc
    from tcmlir.binding import bind_sizes
    from tcmlir.tune.space import space_for

    fn = tc.define(src, target="cuda")
    sizes = bind_sizes(fn.ir, [x.shape for x in inputs])
    space = space_for(fn.ir, "cuda", sizes=sizes)
    default = tc.MappingOptions.default_for(fn.ir, "cuda", sizes)
    naive = tc.MappingOptions.naive()
    out = []
    for i in range(n):
        kind = i % 3
        if kind == 0:
            out.append(space.sample(rng, naive))
        elif kind == 1:
            out.append(space.sample(rng, default))
        else:
            out.append(space.mutate(rng, default, 0.3))
        if odd:
            for _ in range(20):
                cand = wild(rng, out[-1], space.depth)
                if space.is_valid(cand):
                    out[-1] = cand
                    break
    # wgmma is inline assembly, which the emulator does not run: its mma.sync form instead
    return [dataclasses.replace(o, mma_wgmma=False) for o in out]


def check(src: str, inputs: list[Any], opts_json: str, tol: float) -> tuple[str, str]:
    """(kind, detail) of one candidate: "ok", "refused" or one of `FAILURES`."""
    import mma_emulator as emu
    import numpy as np

    import tcmlir as tc
    from tcmlir.binding import bind_sizes
    from tcmlir.runtime.launch_limits import validate_launch

    global SM90
    if SM90 is None:
        from tcmlir.runtime.launch_limits import LaunchLimits

        SM90 = LaunchLimits(1024, (1024, 1024, 64), (2**31 - 1, 65535, 65535), 48 * 1024,
                            227 * 1024)
    fn = tc.define(src, target="cuda")
    opts = tc.MappingOptions.from_json(opts_json)
    try:
        kernel = fn.compile(*inputs, target="cuda", arch="sm_90", options=opts)
    except tc.TCError as exc:
        return "refused", f"{type(exc).__name__}: {first_line(exc)}"
    except Exception as exc:  # noqa: BLE001 - every other compile error is a finding
        return "crash", f"compile: {type(exc).__name__}: {first_line(exc)}"
    sizes = bind_sizes(fn.ir, [x.shape for x in inputs])
    arrays = emu.stage_arrays(fn.ir, kernel, inputs, sizes)
    try:  # what the runtime checks at launch (`runtime.launch_limits`), with sm_90's limits
        for launch in kernel.runner.image.kernels:
            validate_launch(SM90, launch.grid, launch.block, launch.shared_bytes,
                            kernel=launch.name)
    except tc.TCError as exc:
        return "refused", f"at launch: {type(exc).__name__}: {first_line(exc)}"
    cost = emulator_cost(kernel)
    if cost > MAX_COST:
        return "skipped", f"{cost} OS threads on the emulator > {MAX_COST}"
    try:
        emu.run_kernel(kernel, arrays, sizes)
    except AssertionError as exc:
        text = str(exc)
        kind = "oob" if "out-of-bounds" in text else "crash"
        return kind, f"emulator: {text.splitlines()[0][:200] if text else 'assertion'}"
    except Exception as exc:  # noqa: BLE001
        return "crash", f"emulator: {type(exc).__name__}: {first_line(exc)}"
    for t, x in zip(fn.ir.inputs, inputs, strict=True):
        if not np.array_equal(arrays[t.name], x, equal_nan=True):
            return "input", f"input {t.name} was written"
    want = tc.define(src, target="numpy")(*inputs)
    want = want if isinstance(want, tuple) else (want,)
    for t, w in zip(fn.ir.outputs, want, strict=True):
        w = np.asarray(w, np.float64)
        got = np.asarray(arrays[t.name], np.float64)
        bad_nan = np.isnan(got) & ~np.isnan(w)
        if bad_nan.any():
            return "nan", (f"{t.name}: {int(bad_nan.sum())} of {got.size} NaN, first at "
                           f"{np.unravel_index(int(np.flatnonzero(bad_nan)[0]), got.shape)}")
        scale = max(float(np.abs(w).max()) if w.size else 0.0, 1e-30)
        err = np.abs(got - w) / scale
        if (err > tol).any():
            return "wrong", (f"{t.name}: {int((err > tol).sum())} of {got.size} off, "
                             f"max {float(err.max()):.3g} of the largest |value|, first at "
                             f"{np.unravel_index(int(np.argmax(err > tol)), got.shape)}")
    return "ok", ""


def emulator_cost(kernel: Any) -> int:
    """OS threads the emulator starts for ``kernel``: one per GPU thread of every block of a
    launch that reaches a barrier or a warp collective (a few ms each); 0 for the others."""
    import mma_emulator as emu

    cost = 0
    for launch in kernel.runner.image.kernels:
        if emu.needs_threads(kernel.llvm_ir, launch.name):
            cost += prod(launch.grid) * prod(launch.block)
    return cost


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines() or [""])[0][:200]


def _child(src: str, inputs: list[Any], opts_json: str, tol: float, q: Any) -> None:
    import mma_emulator as emu

    # compile every candidate, no artifact cache (set in the forked child only: importing
    # this module, as the tests do, must not change the importer's environment)
    os.environ["TCMLIR_ALWAYS_COMPILE"] = "1"
    emu.TIMEOUT = BARRIER_TIMEOUT  # (a slow candidate meets its barriers sooner than that)
    try:
        q.put(check(src, inputs, opts_json, tol))
    except BaseException as exc:  # noqa: BLE001 - reported as a crash
        q.put(("crash", f"{type(exc).__name__}: {first_line(exc)}"))


def run_one(src: str, inputs: list[Any], opts_json: str, tol: float, limit: float
            ) -> tuple[str, str]:
    """`check` in a forked child killed after ``limit`` seconds."""
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(src, inputs, opts_json, tol, q))
    p.start()
    try:
        kind, detail = q.get(timeout=limit)
    except Exception:  # noqa: BLE001 - queue.Empty: the child hung or died
        kind, detail = ("slow", f"killed after {limit:g} s") if p.is_alive() else \
            ("died", f"exit {p.exitcode}")
    if p.is_alive():
        p.kill()
    p.join()
    return kind, detail


def fuzz(programs: list[Program], samples: int, seed: int, limit: float, verbose: bool,
         odd: bool = False, out: Any = sys.stdout) -> dict[str, collections.Counter]:
    """Run the fuzz; one line per failure on ``out``; per program, a Counter of the kinds."""
    import mma_emulator  # noqa: F401  (imported once, before the children fork)

    import tcmlir as tc

    tc.define("def w(float(N) X) -> (O) { O(i) = X(i) }", target="cuda")  # warm the imports
    counts: dict[str, collections.Counter] = {}
    for k, prog in enumerate(programs):
        src, inputs, tol = inputs_of(prog)
        rng = random.Random(seed * 1000 + k)
        seen = counts.setdefault(prog.label, collections.Counter())
        t0 = time.perf_counter()
        for opts in candidates(src, inputs, samples, rng, odd):
            kind, detail = run_one(src, inputs, opts.to_json(), tol, limit)
            seen[kind] += 1
            if kind in FAILURES or (kind != "ok" and verbose):
                tag = f"FAIL {prog.label} {kind}" if kind in FAILURES else f"{kind.upper()} {prog.label}"
                print(f"{tag} {compact(opts)} -- {detail}", file=out, flush=True)
        dt = time.perf_counter() - t0
        print(f"-- {prog.label}: {samples} candidates in {dt:.0f} s: "
              + ", ".join(f"{k} {v}" for k, v in sorted(seen.items())), file=out, flush=True)
    return counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=20, help="candidates per program")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--limit", type=float, default=60.0, help="seconds before a child is killed")
    ap.add_argument("--only", nargs="*", default=[], help="program label prefixes")
    ap.add_argument("--verbose", "-v", action="store_true",
                    help="list the refused, skipped and slow candidates too")
    ap.add_argument("--odd", action="store_true",
                    help="odd sizes the tuner never proposes (tiles, blocks, unroll 3: `wild`)")
    ap.add_argument("--list", action="store_true", help="list the programs and exit")
    a = ap.parse_args(argv)
    chosen = [p for p in PROGRAMS if not a.only or any(p.label.startswith(o) for o in a.only)]
    if a.list or not chosen:
        for p in PROGRAMS:
            print(f"{p.label:16} {p.zoo:20} {p.dims}")
        return 0 if chosen else 2
    counts = fuzz(chosen, a.samples, a.seed, a.limit, a.verbose, a.odd)
    total = sum(counts.values(), collections.Counter())
    print("all: " + ", ".join(f"{k} {v}" for k, v in sorted(total.items())))
    return 1 if any(total[k] for k in FAILURES) else 0


if __name__ == "__main__":
    sys.exit(main())
