"""The profile of a split call: ``fn.profile(*inputs, devices=[...])`` (issue 14, item 4).

Place: `profiler.profile_function` hands a call with ``devices`` here; the call runs through
the same executor a split call uses (`multi.execute.split_kernel`, then
`multi.cuda_split.SplitExecutor` or `multi.execute.HostSplitExecutor`), one warm-up call first.

On CUDA every sample is one call bracketed by events: on the output device's legacy stream
(the whole call: the caller's streams wait for every part) and, per part, on the part's own
stream before the call, around its sub-call's kernels (the executor's sub-call plans are
wrapped for the profile) and after the call:

    part stream:  start | wait, copies in, zero fills | kernels | copies out | end
                  `----------- in_s -----------------' `kernels_s' `- out_s --'

so each part's time of copying in (its input slabs, from the host or another GPU), of its
kernels, and of sending its output rows to the output device, all per call (medians of
``runs``); a phase that moves no bytes counts as no transfer time. `Profile.transfer_bytes`
is what the parts receive and send (`multi.plan.Part.bytes_in` / ``bytes_out``, less the host
scalars the executor passes by value) and `Profile.transfer_s` the sum of the parts' copy
phases (device time, which may overlap across parts); `Profile.parts` has them per part
(`report.PartTransfers`) and `Profile.kernels` one row per part (its kernels, at the part's
sizes). The call's roofline uses the ceilings of one device times the number of distinct
devices. On the host targets the parts run one after another on row slices (no copies):
wall-clock times, no transfers.
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..errors import TCError
from .advice import advise_split
from .ceilings import Ceilings, ceilings_for
from .counts import count_work
from .report import KernelProfile, PartTransfers, Profile, roofline

__all__ = ["profile_split"]


class _TimedPlan:
    """A part's sub-call plan with an event recorded on its stream before and after."""

    def __init__(self, plan: Any, before: Any, after: Any, stream: Any):
        self.plan, self.before, self.after, self.stream = plan, before, after, stream

    def call(self, *args: Any, **kwargs: Any) -> Any:
        self.before.record(self.stream)
        out = self.plan.call(*args, **kwargs)
        self.after.record(self.stream)
        return out

    def launch_packed(self, *args: Any) -> None:  # how a prepared split call launches a part
        self.before.record(self.stream)
        self.plan.launch_packed(*args)
        self.after.record(self.stream)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.plan, name)


def profile_split(fn: Any, inputs: Sequence[Any], devices: Sequence[int], options: Any = None,
                  runs: int = 20, ceilings: Ceilings | Mapping[str, Any] | None = None,
                  output_device: int | None = None) -> Profile:
    """Profile ``fn(*inputs, devices=devices)`` (see the module docstring)."""
    from ..multi.execute import HostSplitExecutor, split_kernel
    from ..targets import resolve_target

    if not isinstance(runs, int) or runs < 1:
        raise TCError(f"profile: runs must be a positive integer, got {runs!r}")
    target = resolve_target(fn.target)
    split, _ = split_kernel(fn, inputs, devices, options, target, None, output_device)
    ceil = ceilings_for("cpu" if target == "numpy" else target, ceilings)
    if target == "cuda":
        from ..multi.cuda_split import SplitExecutor

        executor = SplitExecutor(fn, split)
        whole, per_part = _cuda_samples(executor, inputs, runs)
    else:
        whole, per_part = _host_samples(fn, HostSplitExecutor(fn, split), inputs, runs)
    return build_split_profile(fn, split.plan, whole, per_part, ceil, runs, target)


def _cuda_samples(executor: Any, inputs: Sequence[Any], runs: int
                  ) -> tuple[list[float], list[list[tuple[float, float, float]]]]:
    from ..runtime.cuda_memory import elapsed_ms

    rt, plan = executor.runtime, executor.plan
    executor(inputs)  # warm-up: makes the parts' sub-call plans
    parts = executor.parts
    ev = [[rt.event(s.device) for _ in range(4)] for s in parts]  # start, before, after, end
    first, last = rt.event(plan.output_device), rt.event(plan.output_device)
    saved = [s.plan for s in parts]
    for s, (_, before, after, _) in zip(parts, ev, strict=True):
        s.plan = _TimedPlan(s.plan, before, after, s.stream)
    whole: list[float] = []
    per: list[list[tuple[float, float, float]]] = [[] for _ in parts]
    try:
        for _ in range(runs):
            for s, e in zip(parts, ev, strict=True):
                rt.context(s.device)
                e[0].record(s.stream)
            rt.context(plan.output_device)
            first.record()
            executor(inputs)
            for s, e in zip(parts, ev, strict=True):
                rt.context(s.device)
                e[3].record(s.stream)
            rt.context(plan.output_device)
            last.record()
            whole.append(elapsed_ms(first, last) / 1e3)
            for k, e in enumerate(ev):
                per[k].append(tuple(elapsed_ms(a, b) / 1e3 for a, b in itertools.pairwise(e)))
    finally:
        for s, p in zip(parts, saved, strict=True):
            s.plan = p
    return whole, per


def _host_samples(fn: Any, executor: Any, inputs: Sequence[Any], runs: int
                  ) -> tuple[list[float], list[list[tuple[float, float, float]]]]:
    from ..multi.inputs import host_slab, locate_inputs

    executor(inputs)  # warm-up
    whole = []
    for _ in range(runs):
        start = time.perf_counter()
        executor(inputs)
        whole.append(time.perf_counter() - start)
    views, _ = locate_inputs(fn.ir, inputs)
    per = []
    for part, kernel in zip(executor.plan.parts, executor.kernels, strict=True):
        sub = [host_slab(views[t.name], *part.slabs.get(t.name, (0, 0)), t.rank)
               for t in fn.ir.inputs]
        kernel.launch(*sub)
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            kernel.launch(*sub)
            times.append((0.0, time.perf_counter() - start, 0.0))
        per.append(times)
    return whole, per


def _by_value(fn: Any, plan: Any) -> int:
    """Bytes the plan counts for host scalars, which the executor passes by value."""
    return sum(t.dtype.itemsize for t in fn.ir.inputs
               if t.rank == 0 and plan.locations.get(t.name, 0) is None)


def _from_host(fn: Any, plan: Any, part: Any) -> int:
    """Bytes of ``part``'s input slabs copied from host arrays (host scalars go by value)."""
    from ..multi.plan import received_bytes

    total = 0
    for t in fn.ir.inputs:
        if t.rank == 0 or plan.locations.get(t.name, 0) is not None:
            continue
        rows = part.slabs.get(t.name, (0, 1)) if t.rank else (0, 1)
        row = math.prod(e.evaluate(dict(plan.sizes)) for e in t.shape[1:]) * t.dtype.itemsize
        total += received_bytes(rows, row, part.device, None)
    return total


def build_split_profile(fn: Any, plan: Any, whole: Sequence[float],
                        per_part: Sequence[Sequence[tuple[float, float, float]]],
                        ceil: Ceilings, runs: int, target: str) -> Profile:
    """The `Profile` of a split call from its samples: ``whole`` seconds per call and, per
    part, (copies in, kernels, copies out) seconds per call."""
    sizes = {k: int(v) for k, v in plan.sizes.items()}
    copies = target == "cuda"  # the host targets' parts read row slices in place
    kernels, parts = [], []
    for k, (part, samples) in enumerate(zip(plan.parts, per_part, strict=True)):
        in_s, kern_s, out_s = (statistics.median(s[i] for s in samples) for i in range(3))
        bytes_in = part.bytes_in - _by_value(fn, plan)
        in_s = in_s if bytes_in else 0.0
        out_s = out_s if part.bytes_out else 0.0
        work = count_work(fn.ir, dict(part.sizes))
        bw = ceil.bandwidth_for(work.bytes_read, work.bytes_written)
        bound, fraction, raw = roofline(work.flops, work.bytes, kern_s, ceil, bw)
        rows = part.chunk if plan.is_split else (0, 0)
        kernels.append(KernelProfile(f"part{k}@{part.device}", kern_s, work.flops, work.bytes,
                                     work.op_values(), tuple(work.statements), bound, fraction,
                                     raw_fraction=raw, bandwidth_ceiling=bw))
        if copies:
            parts.append(PartTransfers(k, part.device, tuple(rows), bytes_in,
                                       _from_host(fn, plan, part), part.bytes_out, in_s, out_s,
                                       kern_s))
        else:
            parts.append(PartTransfers(k, part.device, tuple(rows), 0, 0, 0, 0.0, 0.0, kern_s))
    n_devices = len(set(plan.devices))
    total = replace(ceil, bandwidth=ceil.bandwidth * n_devices, flops=ceil.flops * n_devices,
                    read_bandwidth=ceil.read_bandwidth * n_devices)
    work = count_work(fn.ir, sizes)
    time_s = statistics.median(whole)
    bw = total.bandwidth_for(work.bytes_read, work.bytes_written)
    bound, fraction, raw = roofline(work.flops, work.bytes, time_s, total, bw)
    prof = Profile(
        entry=fn.ir.name, target=target, sizes=sizes, time_s=time_s, flops=work.flops,
        bytes=work.bytes, ops=work.op_values(), bound=bound, roofline_fraction=fraction,
        kernels=kernels, advice=[], ceilings=ceil, bytes_read=work.bytes_read,
        bytes_written=work.bytes_written, flops_formula=work.flops_count.formula,
        bytes_formula=work.bytes_formula(), exact=work.exact, runs=runs, raw_fraction=raw,
        transfer_bytes=sum(p.bytes_in + p.bytes_out for p in parts),
        transfer_s=sum(p.in_s + p.out_s for p in parts), parts=parts,
        devices=tuple(plan.devices), split=plan.split if plan.is_split else plan.reason or "",
        bandwidth_ceiling=bw)
    prof.advice = advise_split(prof)
    return prof

