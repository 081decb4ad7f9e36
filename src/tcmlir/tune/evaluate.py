"""Evaluating tuning candidates: in-process on the CPU, in worker processes on GPUs.

Every candidate is first run once into poisoned outputs and compared with the tuning run's
reference (`tune.verify`); a wrong one is recorded as failed with the reason ("wrong result:
max rel error ... at C[4, 7]") and never timed, ranked or stored. The fitness of a candidate is the median of ``runs`` timed runs; a candidate whose first run
is ``prune_factor`` times slower than the best so far is not timed further. On GPUs every
device gets a worker process (it sees only its GPU through CUDA_VISIBLE_DEVICES): a kernel
that faults or hangs kills its worker, the candidate is recorded as failed, a new worker is
started, and the tuning goes on. Workers ignore SIGINT, so Ctrl-C reaches only the tuner.

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
options' kernel, in-process on the CPU and at start-up inside each GPU worker.

Test hook (for the fault-tolerance test, harmless otherwise): ``TCMLIR_TUNE_FAULT`` =
``crash:FIELD=VALUE`` or ``hang:FIELD=VALUE`` (VALUE as JSON, e.g. ``crash:unroll_factor=8``)
makes a *worker process* die by SIGSEGV, or hang, when asked to evaluate a candidate whose
option FIELD has that value; ``compile-crash:...`` and ``compile-hang:...`` do the same to a
compile worker asked to compile it.
"""

from __future__ import annotations

import faulthandler
import json
import math
import multiprocessing as mp
import multiprocessing.connection as mp_connection
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


def _fault(opts_json: str, stage: str = "") -> str | None:
    """The test hook's action ("crash"/"hang") for this candidate in this ``stage`` ("" for a
    GPU worker, "compile" for a compile worker), or None."""
    spec = os.environ.get(FAULT_ENV, "")
    action, _, cond = spec.partition(":")
    name, _, value = cond.partition("=")
    where, _, action = action.rpartition("-")
    if where != stage or action not in ("crash", "hang") or not name:
        return None
    try:
        wanted = json.loads(value)
    except ValueError:
        wanted = value
    have = json.loads(opts_json).get(name)
    if isinstance(have, list):
        wanted = list(wanted) if isinstance(wanted, list | tuple) else wanted
    return action if have == wanted else None


def _obey_fault_hook(opts_json: str, stage: str = "") -> None:  # pragma: no cover - child
    """In a worker process: die by SIGSEGV or hang when the test hook says so."""
    fault = _fault(opts_json, stage)
    if fault == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif fault == "hang":
        time.sleep(1e6)


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
    faulthandler.enable()  # a native crash prints where it happened (on the tuner's stderr)
    os.environ["CUDA_VISIBLE_DEVICES"] = str(device)
    try:
        import tcmlir

        fn = tcmlir.define(source, entry, target=target)
        with np.load(inputs_path) as data:
            inputs = [data[f"arg{i}"] for i in range(len(data.files))]
        # None: too large for the interpreter, the default options' kernel is the reference
        reference = (Reference.load(reference_path) if reference_path is not None
                     else compute_reference(fn, inputs, target, max_ops=-1))
        identity = bound = None
        if target == "cuda":  # what a compile worker must compile for to serve this worker
            from ..runtime.arrays import bind_device_inputs

            bound = bind_device_inputs(fn.ir, inputs)
            identity = (fn.default_arch("cuda"), bound.signature.to_json(), dict(bound.sizes))
        conn.send(("ready", identity))
    except BaseException:  # noqa: BLE001 - report anything to the parent
        conn.send(("fatal", traceback.format_exc()))
        return
    while True:
        msg = conn.recv()
        if msg is None:
            return
        opts_json, best, payload = msg
        _obey_fault_hook(opts_json)
        try:
            opts = MappingOptions.from_json(opts_json)
            kernel = (_unpacked(fn, opts, bound, payload) if payload is not None
                      else compile_candidate(fn, inputs, opts, target))
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


def _unpacked(fn: Any, opts: MappingOptions, bound: Any, payload: bytes) -> Any:
    """The `Kernel` a compile worker compiled (`_compile_main`), for this worker's inputs."""
    from ..cache.kernel_image import unpack_cuda_kernel
    from ..compiler import cuda_kernel_from

    fields = unpack_cuda_kernel(payload)
    if fields is None:
        raise TCError("the compile worker's kernel payload did not load")
    return cuda_kernel_from(fn, opts, bound.signature, bound.sizes, fields)


def _compile_main(conn: Any, source: str, entry: str, arch: str, signature_json: str,
                  sizes: dict[str, int]) -> None:  # pragma: no cover - child
    """A compile worker: cuda candidates in (options JSON), packed kernels out."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    faulthandler.enable()
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # compiling needs no GPU and must not take one
    try:
        import tcmlir

        from .. import compiler
        from ..cache.kernel_image import pack_cuda_kernel
        from ..signature import Signature

        fn = tcmlir.define(source, entry, target="cuda")
        signature = Signature.from_json(signature_json)
        conn.send(("ready", None))
    except BaseException:  # noqa: BLE001 - report anything to the parent
        conn.send(("fatal", traceback.format_exc()))
        return
    while True:
        opts_json = conn.recv()
        if opts_json is None:
            return
        _obey_fault_hook(opts_json, "compile")
        try:
            kernel = compiler.compile_kernel(fn, "cuda", MappingOptions.from_json(opts_json),
                                             signature, sizes, arch)
            conn.send(("ok", pack_cuda_kernel(kernel)))
        except TCError as exc:
            conn.send(("error", str(exc).splitlines()[0]))
        except Exception as exc:  # noqa: BLE001 - a compiler bug fails the candidate only
            first = (str(exc).splitlines() or [""])[0]
            conn.send(("error", f"{type(exc).__name__} while compiling: {first}"))


class _Worker:
    """A child process and its pipe: `start` it, then `wait_ready` (which returns what the
    child said when it was ready), so that several start in parallel."""

    def __init__(self, ctx: Any, main: Any, args: tuple, what: str):
        self.what = what
        self.parent, child = ctx.Pipe()
        self.proc = ctx.Process(target=main, args=(child, *args), daemon=True)
        self.proc.start()
        child.close()

    def wait_ready(self, startup_s: float) -> Any:
        if not self.parent.poll(startup_s):
            self.kill()
            raise TCError(f"{self.what} did not start within {startup_s:.0f} s")
        try:
            kind, payload = self.parent.recv()
        except (EOFError, OSError):
            self.proc.join(5)
            kind, payload = "fatal", f"it {_exit_text(self.proc.exitcode)} while starting"
        if kind != "ready":
            self.kill()
            raise TCError(f"{self.what} failed to start:\n{payload}")
        return payload

    def receive(self) -> tuple[str, Any] | None:
        """The child's answer if one is there, ("crash", why) if it died, else None."""
        try:
            if self.parent.poll(0):
                return self.parent.recv()
        except (EOFError, OSError):
            self.proc.join(5)
            return ("crash", f"worker {_exit_text(self.proc.exitcode)}")
        if not self.proc.is_alive():
            return ("crash", f"worker {_exit_text(self.proc.exitcode)}")
        return None

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5)


def _exit_text(code: int | None) -> str:
    """How a child ended: "was killed by SIGSEGV", "exited with code 3", "died"."""
    if code is None:
        return "died"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


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
        self.workers: dict[int, _Worker] = {}
        self.compilers: list[_Worker] = []
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
                self._compile_args = (fn.source.text, fn.entry, arch, signature, sizes)
                for _ in range(count):
                    self.compilers.append(self._compiler())
                for worker in self.compilers:
                    worker.wait_ready(120.0)
        except BaseException:
            self.close()
            raise

    def _gpu_worker(self, device: int) -> _Worker:
        return _Worker(self._ctx, _worker_main, (device, *self._args),
                       f"tuning worker for GPU {device}")

    def _compiler(self) -> _Worker:
        return _Worker(self._ctx, _compile_main, self._compile_args, "tuning compile worker")

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

    @staticmethod
    def _wait(workers: list[_Worker]) -> None:
        """Until one of ``workers`` has something to say or dies (at most 50 ms)."""
        if workers:
            mp_connection.wait([w.parent for w in workers] + [w.proc.sentinel for w in workers],
                               timeout=0.05)

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
