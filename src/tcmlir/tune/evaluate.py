"""Evaluating tuning candidates: in-process on the CPU, in worker processes on GPUs.

Every candidate is first run once into poisoned outputs and compared with the tuning run's
reference (`tune.verify`); a wrong one is recorded as failed with the reason ("wrong result:
max rel error ... at C[4, 7]") and never timed, ranked or stored. On GPUs every device gets a
worker process (`tune.worker`: a fresh interpreter running tcmlir, never the user's program;
it sees only its GPU through CUDA_VISIBLE_DEVICES): a kernel that faults or hangs kills its
worker, the candidate is recorded as failed, a new worker is started, and the tuning goes on.
Workers ignore SIGINT, so Ctrl-C reaches only the tuner.

Timing protocol (`time_kernel`, `measure_side_by_side`). A candidate is timed the way a warm
call runs: through its kernel's launch plan (`Kernel.benchmark`, the warm call's launch path),
on inputs resident on the device (copied there once when the worker starts, as torch CUDA
tensors when the caller's inputs were torch tensors, CuPy arrays for CuPy, else tcmlir device
arrays: `worker_loops.resident_inputs`), with outputs made as a call makes them (torch: from
torch's allocator on its current stream) or preallocated. On the GPU each sample is CUDA
events around up to 10 calls queued back to back, after an untimed warm-up call and an untimed
lead call (`runtime.cuda_launch.benchmark_cuda`); the L2 cache is warm (the same inputs every
call, as a loop of calls sees them; it is not flushed). On the host a sample is the wall clock
of one run. The fitness is the median of ``TunerConfig.runs`` samples, with their spread (half
the interquartile range, `spread_of`); a candidate whose first sample is ``prune_factor``
times the best so far is not timed further. Before the winner is chosen, the finalists and the
default options are re-measured side by side in one worker (`measure_side_by_side`): the same
resident inputs, `FINAL_ROUNDS` rounds each timing every contender once in turn, so drift
(clocks, temperature, other work on the machine) reaches all of them alike; the medians over
those rounds decide (`tune.autotune.choose_final`). With 15 samples the true median lies between
the 4th and the 12th smallest with 96% confidence, whatever the distribution (a binomial
count); the spread stored beside the time is half the interquartile range.

Candidates are compiled without entering the function's in-memory kernel table (a tuning run
would otherwise keep every candidate's JIT engine or CUDA module alive). On cuda they are
compiled ahead, on the CPUs, by compile worker processes (``TunerConfig.compile_workers``; they
see no GPU): a whole generation compiles in parallel while the GPU workers time what is ready,
and each GPU worker gets the compiled kernel as a payload (`cache.kernel_image`) instead of
compiling it. A candidate that fails to compile is recorded with the compiler's message; one
that crashes its compile worker or compiles past ``timeout_s`` is recorded as failed and the
compile worker is replaced.

The reference is computed once per tuning run: in the tuner's process by the interpreter (and
handed to the workers in a file), or, for a domain too large for the interpreter, by the default
options' kernel, in-process on the CPU and at start-up inside each GPU worker. The worker
processes' test hook (``TCMLIR_TUNE_FAULT``) is described in `tune.worker_loops`.
"""

from __future__ import annotations

import math
import multiprocessing.connection as mp_connection
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import TCError
from ..options import MappingOptions
from .config import TunerConfig
from .verify import Reference, compile_candidate, compute_reference, run_checked, to_host
from .worker import FAULT_ENV, WorkerProcess

__all__ = ["FAULT_ENV", "FINAL_ROUNDS", "WRONG_RESULT", "Evaluation", "HostEvaluator",
           "WorkerPoolEvaluator", "compile_candidate", "default_compile_workers",
           "measure_side_by_side", "spread_of", "time_kernel"]

WRONG_RESULT = "wrong result"  # how the reason of a candidate that failed its check starts
FINAL_ROUNDS = 15  # rounds of the side-by-side re-measurement of the finalists and the default


@dataclass(frozen=True)
class Evaluation:
    options: MappingOptions
    time_s: float  # median of the timed runs; inf when the candidate failed
    runs: int
    error: str | None = None
    pruned: bool = False
    spread_s: float | None = None  # half the interquartile range of the timed runs

    @property
    def ok(self) -> bool:
        return math.isfinite(self.time_s) and self.error is None

    @property
    def wrong(self) -> bool:
        """Whether the candidate ran but failed the check against the reference."""
        return self.error is not None and self.error.startswith(WRONG_RESULT)


def spread_of(times: Sequence[float]) -> float:
    """Half the interquartile range of ``times`` (0 for fewer than two)."""
    if len(times) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(times, n=4, method="inclusive")
    return (q3 - q1) / 2


def time_kernel(kernel: Any, inputs: Sequence[Any], runs: int, best: float,
                prune_factor: float, timeout_s: float) -> tuple[float, int, bool, float]:
    """(median seconds, runs made, pruned?, spread seconds) of ``kernel.benchmark`` samples
    (see the module docstring), with early pruning."""
    start = time.perf_counter()
    first = kernel.benchmark(*inputs, runs=1)[0]
    times = [first]
    if math.isfinite(best) and first > prune_factor * best:
        return first, 1, True, 0.0
    while len(times) < runs and time.perf_counter() - start < timeout_s:
        times.extend(kernel.benchmark(*inputs, runs=1))
    return statistics.median(times), len(times), False, spread_of(times)


def measure_side_by_side(fn: Any, inputs: Sequence[Any], candidates: Sequence[MappingOptions],
                         target: str, rounds: int, timeout_s: float
                         ) -> list[tuple[float, float, int] | str]:
    """Time ``candidates`` together: ``rounds`` rounds, each one sample of every candidate in
    turn (`time_kernel` with one run), on the same ``inputs``; per candidate ``(median,
    spread, samples)``, or why it could not be timed."""
    kernels: list[Any] = []
    for opts in candidates:
        try:
            kernels.append(compile_candidate(fn, inputs, opts, target))
        except TCError as exc:
            kernels.append(str(exc).splitlines()[0])
    samples: list[list[float]] = [[] for _ in candidates]
    start = time.perf_counter()
    for r in range(max(1, rounds)):
        for k, kernel in enumerate(kernels):
            if isinstance(kernel, str):
                continue
            try:
                t, *_ = time_kernel(kernel, inputs, 1, math.inf, 2.0, timeout_s)
            except TCError as exc:
                kernels[k] = str(exc).splitlines()[0]
                continue
            samples[k].append(t)
        if r >= 2 and time.perf_counter() - start > timeout_s:
            break  # enough rounds for a median; the rest would pass the time allowed
    return [kernel if isinstance(kernel, str) else
            (statistics.median(ts), spread_of(ts), len(ts))
            for kernel, ts in zip(kernels, samples, strict=True)]


def remeasured(candidates: Sequence[MappingOptions],
               answers: Sequence[tuple[float, float, int] | str]) -> list[Evaluation]:
    """`measure_side_by_side` answers as Evaluations."""
    return [Evaluation(opts, math.inf, 0, error=a) if isinstance(a, str)
            else Evaluation(opts, a[0], a[2], spread_s=a[1])
            for opts, a in zip(candidates, answers, strict=True)]


class HostEvaluator:
    """Compiles candidates on a thread pool, then times them one after another in-process."""

    def __init__(self, fn: Any, inputs: Sequence[Any], target: str, config: TunerConfig,
                 reference: Reference | None = None):
        self.fn, self.inputs, self.target, self.config = fn, tuple(inputs), target, config
        self.compiles = 0
        self.restarts = 0
        self.reference = reference or compute_reference(fn, inputs, target)

    def _compile(self, opts: MappingOptions) -> Any:
        self.compiles += 1
        return compile_candidate(self.fn, self.inputs, opts, self.target)

    def evaluate(self, candidates: Sequence[MappingOptions], best: float) -> list[Evaluation]:
        with ThreadPoolExecutor(max_workers=self.config.threads) as pool:
            futures = [pool.submit(self._compile, c) for c in candidates]
        results = []
        for opts, fut in zip(candidates, futures, strict=True):
            try:
                kernel = fut.result()
                wrong = run_checked(kernel, self.inputs, self.reference)
                if wrong is not None:
                    results.append(Evaluation(opts, math.inf, 1, error=wrong))
                    continue
                t, n, pruned, *rest = time_kernel(kernel, self.inputs, self.config.runs, best,
                                                  self.config.prune_factor,
                                                  self.config.timeout_s)
            except TCError as exc:
                results.append(Evaluation(opts, math.inf, 0, error=str(exc).splitlines()[0]))
                continue
            best = min(best, t)
            results.append(Evaluation(opts, t, n, pruned=pruned,
                                      spread_s=rest[0] if rest else None))
        return results

    def remeasure(self, candidates: Sequence[MappingOptions]) -> list[Evaluation]:
        """The ``candidates`` timed side by side (`measure_side_by_side`), in this process."""
        return remeasured(candidates, measure_side_by_side(
            self.fn, self.inputs, candidates, self.target, FINAL_ROUNDS,
            self.config.timeout_s))

    def close(self) -> None:
        pass


# ---------------------------------------------------------------- GPU worker processes


def default_compile_workers(config: TunerConfig) -> int:
    """The compile workers a cuda tuning run starts: ``config.compile_workers``, or one per CPU
    core that the GPU workers leave (at least one), at most the population."""
    if config.compile_workers is not None:
        return config.compile_workers
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return max(1, min(config.population, cores - len(config.devices or (0,))))


class WorkerPoolEvaluator:
    """One worker process per device; candidates go to whichever worker is free. On cuda,
    compile workers compile the candidates first (see the module docstring)."""

    def __init__(self, fn: Any, inputs: Sequence[Any], config: TunerConfig,
                 target: str = "cuda", reference: Reference | None = None,
                 input_kind: str | None = None):
        """``inputs``: host data (the tuner copies device inputs once); ``reference``: the
        interpreter's outputs, saved for the workers; None makes each worker compute the
        default options' kernel's outputs when it starts. ``input_kind``: the kind of the
        caller's inputs (``"torch-cuda"``, ``"cupy"`` or None), which the workers time on."""
        self.config = config
        self.compiles = 0
        self.devices = config.devices or (0,)
        self._tmp = tempfile.TemporaryDirectory(prefix="tcmlir-tune-")
        path = os.path.join(self._tmp.name, "inputs.npz")
        np.savez(path, **{f"arg{i}": np.asarray(to_host(x)) for i, x in enumerate(inputs)})
        ref_path = None
        if reference is not None:
            ref_path = os.path.join(self._tmp.name, "reference.npz")
            reference.save(ref_path)
        self._args = (fn.definer(), path, config, target, ref_path, input_kind)
        self.workers: dict[int, WorkerProcess] = {}
        self.compilers: list[WorkerProcess] = []
        self.restarts = 0
        self.compile_restarts = 0
        try:
            for d in self.devices:  # they start in parallel
                self.workers[d] = self._gpu_worker(d)
            identities = {d: w.wait_ready(120.0) for d, w in self.workers.items()}
            # compile ahead for what the first worker runs; a worker whose arch or signature
            # differs (another kind of GPU) compiles its own candidates
            self._identity = identities[self.devices[0]]
            self._served = {d for d, ident in identities.items() if ident == self._identity}
            count = default_compile_workers(config) if target == "cuda" else 0
            if count and self._identity is not None:
                arch, signature, sizes = self._identity
                self._compile_args = (fn.definer(), arch, signature, sizes)
                for _ in range(count):
                    self.compilers.append(self._compiler())
                for worker in self.compilers:
                    worker.wait_ready(120.0)
        except BaseException:
            self.close()
            raise

    def _gpu_worker(self, device: int) -> WorkerProcess:
        return WorkerProcess("gpu", (device, *self._args), f"tuning worker for GPU {device}",
                             env={"CUDA_VISIBLE_DEVICES": str(device)})

    def _compiler(self) -> WorkerProcess:
        return WorkerProcess("compile", self._compile_args, "tuning compile worker",
                             env={"CUDA_VISIBLE_DEVICES": ""})

    def _restart(self, device: int) -> None:
        self.workers[device].kill()
        self.restarts += 1
        worker = self._gpu_worker(device)
        worker.wait_ready(120.0)
        self.workers[device] = worker

    def _restart_compiler(self, k: int) -> None:
        self.compilers[k].kill()
        self.compile_restarts += 1
        worker = self._compiler()
        worker.wait_ready(120.0)
        self.compilers[k] = worker

    def evaluate(self, candidates: Sequence[MappingOptions], best: float) -> list[Evaluation]:
        timeout = self.config.timeout_s
        results: dict[int, Evaluation] = {}
        to_compile = list(enumerate(candidates)) if self.compilers else []
        # compiled (or to be compiled by the GPU worker): (index, options, payload or None)
        ready: list[tuple[int, MappingOptions, bytes | None]] = (
            [] if self.compilers else [(i, c, None) for i, c in enumerate(candidates)])
        compiling: dict[int, tuple[int, MappingOptions, float]] = {}
        busy: dict[int, tuple[int, MappingOptions, float]] = {}
        while to_compile or compiling or ready or busy:
            for k, worker in enumerate(self.compilers):
                if k not in compiling and to_compile:
                    idx, opts = to_compile.pop(0)
                    worker.parent.send(opts.to_json())
                    self.compiles += 1
                    compiling[k] = (idx, opts, time.monotonic())
            for device, worker in self.workers.items():
                if device in busy or not ready:
                    continue
                pick = next((n for n, item in enumerate(ready)
                             if item[2] is None or device in self._served), None)
                if pick is None:
                    continue
                idx, opts, payload = ready.pop(pick)
                if payload is None:
                    self.compiles += 1  # the GPU worker compiles it
                worker.parent.send((opts.to_json(), best, payload))
                busy[device] = (idx, opts, time.monotonic())
            self._wait([self.compilers[k] for k in compiling] +
                       [self.workers[d] for d in busy])
            for k in list(compiling):
                idx, opts, started = compiling[k]
                msg = self.compilers[k].receive()
                if msg is None:
                    if time.monotonic() - started > timeout:
                        del compiling[k]
                        results[idx] = Evaluation(opts, math.inf, 0, error=f"compile timed out "
                                                  f"after {timeout:g} s")
                        self._restart_compiler(k)
                    continue
                del compiling[k]
                kind, payload = msg
                if kind == "ok":
                    ready.append((idx, opts, payload))
                elif kind == "error":
                    results[idx] = Evaluation(opts, math.inf, 0, error=payload)
                else:
                    results[idx] = Evaluation(opts, math.inf, 0, error="candidate crashed its "
                                              f"compile worker: {payload}")
                    self._restart_compiler(k)
            for device in list(busy):
                idx, opts, started = busy[device]
                msg = self.workers[device].receive()
                if msg is None:
                    if time.monotonic() - started > timeout:
                        results[idx] = Evaluation(opts, math.inf, 0, error="timed out")
                        del busy[device]
                        self._restart(device)
                    continue
                kind, payload = msg
                del busy[device]
                if kind == "ok":
                    t, n, pruned, spread = payload
                    best = min(best, t)
                    results[idx] = Evaluation(opts, t, n, pruned=pruned, spread_s=spread)
                elif kind == "wrong":
                    results[idx] = Evaluation(opts, math.inf, 1, error=payload)
                elif kind == "error":
                    results[idx] = Evaluation(opts, math.inf, 0, error=payload)
                else:
                    results[idx] = Evaluation(opts, math.inf, 0, error=f"candidate crashed its "
                                              f"worker on GPU {device}: {payload}")
                    self._restart(device)
        return [results[i] for i in range(len(candidates))]

    def remeasure(self, candidates: Sequence[MappingOptions]) -> list[Evaluation]:
        """The ``candidates`` timed side by side in the first device's worker
        (`measure_side_by_side`); a worker that dies or passes the time allowed fails them all
        with the reason (and is replaced)."""
        device = self.devices[0]
        jsons = [c.to_json() for c in candidates]
        self.workers[device].parent.send(("remeasure", jsons, FINAL_ROUNDS))
        allowed = self.config.timeout_s * (len(candidates) + 1)
        started = time.monotonic()
        while True:
            msg = self.workers[device].receive()
            if msg is not None:
                break
            if time.monotonic() - started > allowed:
                msg = ("crash", f"the re-measurement took over {allowed:g} s")
                break
            self._wait([self.workers[device]])
        kind, payload = msg
        if kind == "measured":
            return remeasured(candidates, payload)
        self._restart(device)
        why = f"re-measurement failed on GPU {device}: {payload}"
        return [Evaluation(c, math.inf, 0, error=why) for c in candidates]

    @staticmethod
    def _wait(workers: list[WorkerProcess]) -> None:
        """Until one of ``workers`` has something to say or dies (at most 50 ms)."""
        if workers:
            mp_connection.wait([w.parent for w in workers], timeout=0.05)

    def close(self) -> None:
        for worker in [*self.workers.values(), *self.compilers]:
            try:
                worker.parent.send(None)
            except OSError:
                pass
        for worker in [*self.workers.values(), *self.compilers]:
            worker.proc.join(5)
            worker.kill()
        self._tmp.cleanup()
