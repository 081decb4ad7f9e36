"""Evaluating tuning candidates: in-process on the CPU, in worker processes on GPUs.

Every candidate is first run once into poisoned outputs and compared with the tuning run's
reference (`tune.verify`); a wrong one is recorded as failed with the reason ("wrong result:
max rel error ... at C[4, 7]") and never timed, ranked or stored. The fitness of a candidate is the median of ``runs`` timed runs; a candidate whose first run
is ``prune_factor`` times slower than the best so far is not timed further. On GPUs every
device gets a worker process (it sees only its GPU through CUDA_VISIBLE_DEVICES): a kernel
that faults or hangs kills its worker, the candidate is recorded as failed, a new worker is
started, and the tuning goes on. Workers ignore SIGINT, so Ctrl-C reaches only the tuner.

Candidates are compiled without entering the function's in-memory kernel table (a tuning run
would otherwise keep every candidate's JIT engine or CUDA module alive).

The reference is computed once per tuning run: in the tuner's process by the interpreter (and
handed to the workers in a file), or, for a domain too large for the interpreter, by the default
options' kernel, in-process on the CPU and at start-up inside each GPU worker.

Test hook (for the fault-tolerance test, harmless otherwise): ``TCMLIR_TUNE_FAULT`` =
``crash:FIELD=VALUE`` or ``hang:FIELD=VALUE`` (VALUE as JSON, e.g. ``crash:unroll_factor=8``)
makes a *worker process* die by SIGSEGV, or hang, when asked to evaluate a candidate whose
option FIELD has that value.
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import signal
import statistics
import tempfile
import time
import traceback
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import CudaError, LaunchConfigError, TCError
from ..options import MappingOptions
from .config import TunerConfig
from .verify import Reference, compute_reference, run_checked, to_host

__all__ = ["WRONG_RESULT", "Evaluation", "HostEvaluator", "WorkerPoolEvaluator",
           "compile_candidate"]

FAULT_ENV = "TCMLIR_TUNE_FAULT"
WRONG_RESULT = "wrong result"  # how the reason of a candidate that failed its check starts


@dataclass(frozen=True)
class Evaluation:
    options: MappingOptions
    time_s: float  # median of the timed runs; inf when the candidate failed
    runs: int
    error: str | None = None
    pruned: bool = False

    @property
    def ok(self) -> bool:
        return math.isfinite(self.time_s) and self.error is None

    @property
    def wrong(self) -> bool:
        """Whether the candidate ran but failed the check against the reference."""
        return self.error is not None and self.error.startswith(WRONG_RESULT)


def time_kernel(kernel: Any, inputs: Sequence[Any], runs: int, best: float,
                prune_factor: float, timeout_s: float) -> tuple[float, int, bool]:
    """(median seconds, runs made, pruned?) of ``kernel.benchmark`` with early pruning."""
    start = time.perf_counter()
    first = kernel.benchmark(*inputs, runs=1)[0]
    times = [first]
    if math.isfinite(best) and first > prune_factor * best:
        return first, 1, True
    while len(times) < runs and time.perf_counter() - start < timeout_s:
        times.extend(kernel.benchmark(*inputs, runs=1))
    return statistics.median(times), len(times), False


def compile_candidate(fn: Any, inputs: Sequence[Any], opts: MappingOptions, target: str) -> Any:
    """A `Kernel` for ``opts`` (through the artifact cache, not the in-memory kernel table)."""
    from .. import compiler

    if target == "cuda":
        from ..runtime.arrays import bind_device_inputs

        bound = bind_device_inputs(fn.ir, inputs)
    else:
        from ..binding import bind_host_inputs

        bound = bind_host_inputs(fn.ir, inputs)
    return compiler.compile_kernel(fn, target, opts, bound.signature, bound.sizes, None)


def _fault(opts_json: str) -> str | None:
    """The test hook's action ("crash"/"hang") for this candidate, or None."""
    spec = os.environ.get(FAULT_ENV, "")
    action, _, cond = spec.partition(":")
    name, _, value = cond.partition("=")
    if action not in ("crash", "hang") or not name:
        return None
    try:
        wanted = json.loads(value)
    except ValueError:
        wanted = value
    have = json.loads(opts_json).get(name)
    if isinstance(have, list):
        wanted = list(wanted) if isinstance(wanted, list | tuple) else wanted
    return action if have == wanted else None


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
                t, n, pruned = time_kernel(kernel, self.inputs, self.config.runs, best,
                                           self.config.prune_factor, self.config.timeout_s)
            except TCError as exc:
                results.append(Evaluation(opts, math.inf, 0, error=str(exc).splitlines()[0]))
                continue
            best = min(best, t)
            results.append(Evaluation(opts, t, n, pruned=pruned))
        return results

    def close(self) -> None:
        pass


# ---------------------------------------------------------------- GPU worker processes


def _worker_main(conn: Any, device: int, source: str, entry: str, inputs_path: str,
                 config: TunerConfig, target: str = "cuda",
                 reference_path: str | None = None) -> None:  # pragma: no cover - child
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the tuner's to handle
    os.environ["CUDA_VISIBLE_DEVICES"] = str(device)
    try:
        import tcmlir

        fn = tcmlir.define(source, entry, target=target)
        with np.load(inputs_path) as data:
            inputs = [data[f"arg{i}"] for i in range(len(data.files))]
        # None: too large for the interpreter, the default options' kernel is the reference
        reference = (Reference.load(reference_path) if reference_path is not None
                     else compute_reference(fn, inputs, target, max_ops=-1))
        conn.send(("ready", None))
    except BaseException:  # noqa: BLE001 - report anything to the parent
        conn.send(("fatal", traceback.format_exc()))
        return
    while True:
        msg = conn.recv()
        if msg is None:
            return
        opts_json, best = msg
        fault = _fault(opts_json)
        if fault == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        elif fault == "hang":
            time.sleep(1e6)
        try:
            kernel = compile_candidate(fn, inputs, MappingOptions.from_json(opts_json), target)
            wrong = run_checked(kernel, inputs, reference)
            if wrong is not None:
                conn.send(("wrong", wrong))
                continue
            t, n, pruned = time_kernel(kernel, inputs, config.runs, best, config.prune_factor,
                                       config.timeout_s)
            conn.send(("ok", (t, n, pruned)))
        except LaunchConfigError as exc:  # refused before launching: the context is fine
            conn.send(("error", str(exc).splitlines()[0]))
        except CudaError as exc:  # a fault poisons the context: report and let the parent restart us
            conn.send(("crash", str(exc).splitlines()[0]))
            return
        except TCError as exc:
            conn.send(("error", str(exc).splitlines()[0]))
        except Exception as exc:  # noqa: BLE001 - a bug in checking must not kill the worker
            first = (str(exc).splitlines() or [""])[0]
            conn.send(("error", f"{type(exc).__name__} while checking: {first}"))


class _Worker:
    def __init__(self, ctx: Any, device: int, args: tuple, startup_s: float):
        self.device = device
        self.parent, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, device, *args), daemon=True)
        self.proc.start()
        child.close()
        if not self.parent.poll(startup_s):
            self.kill()
            raise TCError(f"tuning worker for GPU {device} did not start within {startup_s:.0f} s")
        kind, payload = self.parent.recv()
        if kind != "ready":
            self.kill()
            raise TCError(f"tuning worker for GPU {device} failed to start:\n{payload}")

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5)


class WorkerPoolEvaluator:
    """One worker process per device; candidates go to whichever worker is free."""

    def __init__(self, fn: Any, inputs: Sequence[Any], config: TunerConfig,
                 target: str = "cuda", reference: Reference | None = None):
        """``reference``: the interpreter's outputs, saved for the workers; None makes each
        worker compute the default options' kernel's outputs when it starts."""
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
        self._ctx = mp.get_context("spawn")
        self._args = (fn.source.text, fn.entry, path, config, target, ref_path)
        self.workers = {d: _Worker(self._ctx, d, self._args, 120.0) for d in self.devices}
        self.restarts = 0

    def _restart(self, device: int) -> None:
        self.workers[device].kill()
        self.restarts += 1
        self.workers[device] = _Worker(self._ctx, device, self._args, 120.0)

    def evaluate(self, candidates: Sequence[MappingOptions], best: float) -> list[Evaluation]:
        results: dict[int, Evaluation] = {}
        pending = list(enumerate(candidates))
        busy: dict[int, tuple[int, MappingOptions, float]] = {}
        while pending or busy:
            for device, worker in self.workers.items():
                if device not in busy and pending:
                    idx, opts = pending.pop(0)
                    worker.parent.send((opts.to_json(), best))
                    self.compiles += 1
                    busy[device] = (idx, opts, time.monotonic())
            for device in list(busy):
                idx, opts, started = busy[device]
                worker = self.workers[device]
                try:
                    ready = worker.parent.poll(0.01)
                    msg = worker.parent.recv() if ready else None
                except (EOFError, OSError):
                    msg, ready = ("crash", "worker died"), True
                if not ready and worker.proc.is_alive():
                    if time.monotonic() - started > self.config.timeout_s:
                        results[idx] = Evaluation(opts, math.inf, 0, error="timed out")
                        del busy[device]
                        self._restart(device)
                    continue
                if not ready:
                    msg = ("crash", f"worker exited with code {worker.proc.exitcode}")
                kind, payload = msg
                del busy[device]
                if kind == "ok":
                    t, n, pruned = payload
                    best = min(best, t)
                    results[idx] = Evaluation(opts, t, n, pruned=pruned)
                elif kind == "wrong":
                    results[idx] = Evaluation(opts, math.inf, 1, error=payload)
                elif kind == "error":
                    results[idx] = Evaluation(opts, math.inf, 0, error=payload)
                else:
                    results[idx] = Evaluation(opts, math.inf, 0, error=f"candidate crashed its "
                                              f"worker on GPU {device}: {payload}")
                    self._restart(device)
        return [results[i] for i in range(len(candidates))]

    def close(self) -> None:
        for worker in self.workers.values():
            try:
                worker.parent.send(None)
            except OSError:
                pass
            worker.proc.join(5)
            worker.kill()
        self._tmp.cleanup()

