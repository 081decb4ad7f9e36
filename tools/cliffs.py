"""Static cliff check: the zoo's cuda kernels (PTX compiles, no GPU) against two signs of a cliff.

    python tools/cliffs.py [--size medium] [--only SUBSTR[,SUBSTR]] [--arch sm_90]
                           [--sms 132] [--json OUT.json]

For each workload of `tools/zoo_workloads.py`, compiles the default call for cuda
(``fn.compile(*inputs, target="cuda", arch=...)``: what a user's first call gets) and reads
each launched kernel (``kernel.runner.image.kernels``: name, grid, block) beside the exact
number of statement instances it runs (the points of the kernel's domain in the schedule
tree, counted with isl as in `tcmlir.profile.counts`). It reports:

* ``few-blocks``: a grid far below the SM count for large work (fewer than ``--min-blocks``
  blocks, default half the SMs, while the kernel runs more than ``--big-work`` instances):
  most of the GPU idles;
* ``serial``: a thread that walks far more instances than a thread should (instances per
  launched thread above ``--serial-limit``) while a mapping with more parallelism exists:
  the kernel writes more than ``OUTPUTS_PER_THREAD`` (256, a tensor-core kernel's tile per
  thread) distinct elements per launched thread (more threads could each take fewer), or
  each thread reduces one element over more than ``--serial-limit`` instances with fewer
  than ``FILLING_THREADS_PER_SM`` threads per SM launched (a split reduction would spread
  them). A matmul's thread that computes a register tile over the whole K is not a cliff.

Nothing here needs a GPU; the check is how a cliff shows before a GPU sees it. For the
``grad`` workloads the derived gradient program's kernels are checked too (``grad:<name>``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

import zoo_workloads as zw

SM_COUNT = 132          # H100 SXM (the H200 has the same)
BIG_WORK = 1_000_000    # instances: a kernel this large should fill the GPU
SERIAL_LIMIT = 4096     # instances per thread
OUTPUTS_PER_THREAD = 256  # elements a thread writes (a tensor-core tile: 256 per thread)
FILLING_THREADS_PER_SM = 256  # fewer threads than this per SM leave the GPU starved


@dataclass(frozen=True)
class KernelWork:
    """One launched kernel: its launch configuration and the instances it runs."""

    name: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    statements: tuple[str, ...]
    instances: int
    outputs: int        # distinct elements the kernel's statements write

    @property
    def blocks(self) -> int:
        return math.prod(self.grid)

    @property
    def threads(self) -> int:
        return self.blocks * math.prod(self.block)

    @property
    def per_thread(self) -> float:
        return self.instances / max(self.threads, 1)


@dataclass(frozen=True)
class Cliff:
    workload: str
    kernel: str
    kind: str           # "few-blocks" or "serial"
    detail: str


def kernel_work(kernel: Any) -> list[KernelWork]:
    """The launched kernels of a compiled cuda ``kernel`` with their exact instance counts."""
    from tcmlir.compiler import lower
    from tcmlir.poly.gpu_mapping import kernel_marks
    from tcmlir.poly.scop import sets_of
    from tcmlir.poly.tree import node_at
    from tcmlir.profile.counts import count_points

    if kernel.target != "cuda":
        raise ValueError(f"cliffs: a cuda kernel is needed, got target {kernel.target!r}")
    sizes = {k: int(v) for k, v in kernel.sizes.items()}
    state = lower(kernel.function.ir, kernel.sizes, kernel.options, "cuda", verify=False)
    sched = state.proof_schedule
    marks = kernel_marks(sched)
    launches = kernel.runner.image.kernels
    if len(marks) != len(launches):
        raise AssertionError(f"{len(marks)} kernel marks, {len(launches)} launches")
    context = _size_params_only(state.scop.context, sizes)
    writes = state.scop.writes
    out = []
    for (path, _mark), launch in zip(marks, launches, strict=True):
        domain = _size_params_only(node_at(sched, path).get_domain(), sizes)
        names = tuple(sorted({s.get_tuple_name() for s in sets_of(domain)}))
        instances = count_points(domain, sizes, context).value
        written = _size_params_only(writes.intersect_domain(domain).range(), sizes)
        outputs = count_points(written, sizes, context).value if not written.is_empty() else 0
        out.append(KernelWork(launch.name, tuple(launch.grid), tuple(launch.block), names,
                              instances, outputs))
    return out


def _size_params_only(s: Any, sizes: dict[str, int]) -> Any:
    """``s`` (an isl set or union set) with the parameters that are not sizes (the mapping's
    block and thread indices) projected out."""
    import islpy as isl

    if isinstance(s, isl.UnionSet):
        from tcmlir.poly.scop import sets_of

        parts = [_size_params_only(one, sizes) for one in sets_of(s)]
        if not parts:
            return s
        out = isl.UnionSet.from_set(parts[0])
        for one in parts[1:]:
            out = out.union(isl.UnionSet.from_set(one))
        return out
    for i in reversed(range(s.dim(isl.dim_type.param))):
        if s.get_dim_name(isl.dim_type.param, i) not in sizes:
            s = s.project_out(isl.dim_type.param, i, 1)
    return s


def find_cliffs(name: str, kernels: list[KernelWork], *, sms: int = SM_COUNT,
                min_blocks: int | None = None, big_work: int = BIG_WORK,
                serial_limit: int = SERIAL_LIMIT,
                outputs_per_thread: int = OUTPUTS_PER_THREAD) -> list[Cliff]:
    """The cliffs among ``kernels`` (see the module docstring for the two kinds)."""
    min_blocks = sms // 2 if min_blocks is None else min_blocks
    cliffs = []
    for k in kernels:
        if k.blocks < min_blocks and k.instances > big_work:
            cliffs.append(Cliff(name, k.name, "few-blocks",
                                f"grid {k.grid} = {k.blocks} blocks (< {min_blocks}; {sms} SMs) "
                                f"for {k.instances:.3g} instances"))
        spread = k.outputs / max(k.threads, 1)      # elements written per thread
        depth = k.instances / max(k.outputs, 1)     # instances per element (a reduction's length)
        starved = k.threads < sms * FILLING_THREADS_PER_SM and spread <= 1
        if k.per_thread > serial_limit and (spread > outputs_per_thread
                                            or (depth > serial_limit and starved)):
            more = (f"{k.outputs:.3g} elements written, {spread:.3g} per thread: a mapping with "
                    f"{spread / outputs_per_thread:.3g}x the threads exists" if spread > outputs_per_thread
                    else f"{k.outputs:.3g} elements written, {depth:.3g} instances each: a split "
                    "reduction would spread them")
            cliffs.append(Cliff(name, k.name, "serial",
                                f"{k.per_thread:.3g} instances per thread (> {serial_limit}) on "
                                f"grid {k.grid} x block {k.block}; {more}"))
    return cliffs


def check_workload(w: zw.Workload, size: str = "medium", arch: str = "sm_90",
                   **limits: Any) -> tuple[list[KernelWork], list[Cliff]]:
    """Compile ``w``'s program for cuda at ``size`` (default options) and check it; for a
    ``grad`` workload, its derived gradient program too (kernels named ``grad:<kernel>``)."""
    import tcmlir as tc

    fn = tc.define(w.tc, target="cuda")
    inputs = w.make(size)
    kernels = kernel_work(fn.compile(*inputs, target="cuda", arch=arch))
    if w.grad:
        grad_fn, grad_inputs = gradient_call(fn, inputs)
        kernels += [dataclasses.replace(k, name=f"grad:{k.name}") for k in
                    kernel_work(grad_fn.compile(*grad_inputs, target="cuda", arch=arch))]
    return kernels, find_cliffs(w.name, kernels, **limits)


def gradient_call(fn: Any, inputs: tuple[Any, ...]) -> tuple[Any, tuple[Any, ...]]:
    """The derived gradient program of ``fn`` (`tcmlir.grad.derive`) and arguments for it:
    the forward inputs, then zero seeds shaped like the forward outputs they differentiate."""
    import numpy as np

    from tcmlir.grad import derive

    program = derive(fn.ir)
    sizes = fn.size_values(*inputs)
    outputs = {t.name: t for t in fn.ir.outputs}
    seeds = tuple(np.zeros(tuple(e.evaluate(sizes) for e in outputs[name].shape),
                           outputs[name].dtype.numpy) for name in program.outputs)
    return program.define(target="cuda"), (*inputs, *seeds)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", choices=zw.SIZE_CLASSES, default="medium")
    ap.add_argument("--only", default="", help="comma list of substrings of workload names")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--sms", type=int, default=SM_COUNT)
    ap.add_argument("--min-blocks", type=int, default=None, help="default: half the SMs")
    ap.add_argument("--big-work", type=int, default=BIG_WORK)
    ap.add_argument("--serial-limit", type=int, default=SERIAL_LIMIT)
    ap.add_argument("--verbose", action="store_true", help="print every kernel")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    limits = dict(sms=args.sms, min_blocks=args.min_blocks, big_work=args.big_work,
                  serial_limit=args.serial_limit)
    report: dict[str, Any] = {"size": args.size, "arch": args.arch, "workloads": {}}
    cliffs: list[Cliff] = []
    failed = []
    t0 = time.perf_counter()
    for w in zw.select(args.only):
        try:
            kernels, found = check_workload(w, args.size, args.arch, **limits)
        except Exception as exc:  # noqa: BLE001 - one workload's failure is a finding, not the end
            text = str(exc).strip().splitlines()
            failed.append((w.name, f"{type(exc).__name__}: {text[0][:160] if text else ''}"))
            print(f"{w.name:<22} ERROR {failed[-1][1]}", flush=True)
            continue
        cliffs += found
        report["workloads"][w.name] = {"kernels": [asdict(k) for k in kernels],
                                       "cliffs": [asdict(c) for c in found]}
        if args.verbose or found:
            for k in kernels:
                print(f"{w.name:<22} {k.name:<18} grid {k.grid} block {k.block} "
                      f"{k.instances:.3g} instances, {k.per_thread:.3g}/thread", flush=True)
        for c in found:
            print(f"{'':<22} CLIFF {c.kind}: {c.detail}", flush=True)
    print(f"\n{len(cliffs)} cliffs in {len({c.workload for c in cliffs})} of "
          f"{len(report['workloads'])} workloads ({args.size}, {args.arch}); {len(failed)} failed; {time.perf_counter() - t0:.0f} s")
    for c in cliffs:
        print(f"  {c.workload}/{c.kernel}: {c.kind}: {c.detail}")
    for name, err in failed:
        print(f"  {name}: ERROR {err}")
    if args.json:
        report["cliffs"] = [asdict(c) for c in cliffs]
        report["failed"] = failed
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
