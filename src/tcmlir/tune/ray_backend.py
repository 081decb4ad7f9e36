"""Evaluating tuning candidates on a Ray cluster (``TunerConfig(backend="ray")``).

Place: `tune.autotune.tune` picks this evaluator instead of the local ones (`tune.evaluate`);
the genetic search, the reference, the progress bar and the options cache stay in the caller's
process, so results come back to one writer. The interface is the local evaluators': an
`evaluate(candidates, best) -> list[Evaluation]`, `close()`, and the counters ``compiles``,
``restarts`` and ``workers`` the tuning statistics read.

On the cluster:

- *measurers* are Ray actors, one per GPU of the cluster (``num_gpus=1``: Ray pins each to its
  GPU) for ``target="cuda"``, or one per CPU slot (``num_cpus=1``) for ``target="cpu"``. Each
  defines the TC function once, holds the inputs and the reference (put once in Ray's object
  store), and checks then times the candidates it is sent (`verify.run_checked`,
  `evaluate.time_kernel`), as a local worker process does;
- cuda candidates are compiled first by Ray tasks on CPUs (``num_gpus=0``), which return the
  packed kernel (`cache.kernel_image`) that the measurer loads; a host (cpu) kernel is a JIT
  function of the process that compiled it, so a cpu measurer compiles its own candidates.

A candidate whose actor or task dies (a faulting kernel, a killed worker process, a lost node)
is recorded as failed with Ray's reason, and a new measurer replaces the lost one; the other
candidates go on. So is one that runs past ``timeout_s`` (its measurer is killed). Ray tasks
are not retried (``max_retries=0``): a candidate that crashes its worker fails once.

`ray.init` is called with ``TunerConfig.address`` unless Ray is already initialised (then the
caller's cluster is used as it is); a cluster started here is shut down by `close`.

Test hook: ``TCMLIR_TUNE_FAULT`` as in `tune.evaluate` (``crash:FIELD=VALUE``), read in the
caller and handed to the measurers: a measurer asked to evaluate a matching candidate exits.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import TCError
from ..options import MappingOptions
from .config import TunerConfig
from .evaluate import FAULT_ENV, Evaluation, compile_candidate, time_kernel
from .verify import Reference, run_checked, to_host

__all__ = ["RayEvaluator", "RayMissingError", "import_ray"]

INSTALL_HINT = "pip install 'tcmlir[ray]'"


class RayMissingError(TCError):
    """``backend="ray"`` without Ray installed."""


def import_ray() -> Any:
    """The ``ray`` module, or a `RayMissingError` that says what to install."""
    try:
        import ray
    except ImportError as exc:
        raise RayMissingError(f"TunerConfig(backend='ray') needs Ray, which is not installed "
                              f"here ({exc}); install it with: {INSTALL_HINT}") from None
    return ray


def fault_action(spec: str, opts_json: str) -> str | None:
    """``"crash"`` when the test hook ``spec`` (``crash:FIELD=VALUE``) names this candidate."""
    action, _, cond = spec.partition(":")
    name, _, value = cond.partition("=")
    if action != "crash" or not name:
        return None
    try:
        return "crash" if json.loads(opts_json).get(name) == json.loads(value) else None
    except ValueError:
        return None


class Measurer:
    """The body of a measuring actor (`ray.remote` wraps it in `RayEvaluator`)."""

    def __init__(self, definer: Any, target: str, inputs: list[np.ndarray],
                 reference: Reference, config: TunerConfig, fault: str) -> None:
        self.fn = definer(target=target)  # `TCFunction.definer`: tcmlir.define of the source
        self.target, self.inputs, self.reference = target, inputs, reference
        self.config, self.fault = config, fault
        self.bound = None
        if target == "cuda":
            from ..runtime.arrays import bind_device_inputs

            self.bound = bind_device_inputs(self.fn.ir, inputs)

    def identity(self) -> tuple[str, str, dict[str, int]] | None:
        """What a compile task must compile for (cuda), None on cpu."""
        if self.bound is None:
            return None
        return (self.fn.default_arch("cuda"), self.bound.signature.to_json(),
                dict(self.bound.sizes))

    def pid(self) -> int:
        return os.getpid()

    def evaluate(self, opts_json: str, best: float, payload: bytes | None) -> tuple[str, Any]:
        if fault_action(self.fault, opts_json) == "crash":
            os._exit(70)   # the test hook: this worker dies as a faulting kernel would
        opts = MappingOptions.from_json(opts_json)
        try:
            if payload is not None:
                from ..cache.kernel_image import unpack_cuda_kernel
                from ..compiler import cuda_kernel_from

                fields = unpack_cuda_kernel(payload)
                if fields is None:
                    return ("error", "the compile task's kernel payload did not load")
                kernel = cuda_kernel_from(self.fn, opts, self.bound.signature,
                                          self.bound.sizes, fields)
            else:
                kernel = compile_candidate(self.fn, self.inputs, opts, self.target)
            wrong = run_checked(kernel, self.inputs, self.reference)
            if wrong is not None:
                return ("wrong", wrong)
            return ("ok", time_kernel(kernel, self.inputs, self.config.runs, best,
                                      self.config.prune_factor, self.config.timeout_s))
        except TCError as exc:
            return ("error", str(exc).splitlines()[0])


    def remeasure(self, opts_jsons: list[str], rounds: int) -> list[Any]:
        """The candidates timed side by side on this actor (`evaluate.measure_side_by_side`)."""
        from .evaluate import measure_side_by_side

        candidates = [MappingOptions.from_json(j) for j in opts_jsons]
        return list(measure_side_by_side(self.fn, self.inputs, candidates, self.target, rounds,
                                         self.config.timeout_s))


def compile_cuda(definer: Any, arch: str, signature_json: str,
                 sizes: dict[str, int], opts_json: str) -> tuple[str, Any]:
    """A compile task (CPU, no GPU): a cuda candidate's packed kernel, or its error."""
    from .. import compiler
    from ..cache.kernel_image import pack_cuda_kernel
    from ..signature import Signature

    fn = definer(target="cuda")
    try:
        kernel = compiler.compile_kernel(fn, "cuda", MappingOptions.from_json(opts_json),
                                         Signature.from_json(signature_json), sizes, arch)
    except TCError as exc:
        return ("error", str(exc).splitlines()[0])
    return ("ok", pack_cuda_kernel(kernel))


class RayEvaluator:
    """Candidates compiled and measured on a Ray cluster (see the module docstring)."""

    def __init__(self, fn: Any, inputs: Sequence[Any], config: TunerConfig, target: str,
                 reference: Reference) -> None:
        ray = self.ray = import_ray()
        self.config, self.target = config, target
        self.compiles = 0
        self.restarts = 0
        self.lost: list[str] = []   # why each lost measurer went
        self._started = False
        if not ray.is_initialized():
            ray.init(address=config.address, ignore_reinit_error=True,
                     log_to_driver=False, include_dashboard=False)
            self._started = True
        resources = ray.cluster_resources()
        if target == "cuda":
            slots = int(resources.get("GPU", 0))
            if slots < 1:
                self.close()
                raise TCError("autotune on Ray: the cluster has no GPU for target 'cuda' "
                              f"(resources: {resources}); add GPU nodes or tune target='cpu'")
            self._options = {"num_gpus": 1, "num_cpus": 0, "max_restarts": 0}
        else:
            slots = max(1, int(resources.get("CPU", 1)))
            self._options = {"num_cpus": 1, "max_restarts": 0}
        self._slots = min(slots, config.population)
        self._actor_class = ray.remote(Measurer)
        self._compile = ray.remote(compile_cuda).options(num_cpus=1, num_gpus=0, max_retries=0)
        self._args = (fn.definer(), target,
                      ray.put([np.asarray(to_host(x)) for x in inputs]), ray.put(reference),
                      config, os.environ.get(FAULT_ENV, ""))
        self.workers: dict[int, Any] = {}
        try:
            for k in range(self._slots):
                self.workers[k] = self._new_actor()
            idents = ray.get([w.identity.remote() for w in self.workers.values()], timeout=300)
        except (ray.exceptions.RayError, TimeoutError) as exc:
            self.close()
            raise TCError(f"autotune on Ray: the {self._slots} measuring actor(s) did not "
                          f"start ({type(exc).__name__}: {_first_line(exc)}); check the "
                          "cluster's resources (ray status) and that tcmlir is installed on "
                          "its nodes") from None
        except BaseException:
            self.close()
            raise
        self._identity = idents[0]

    def _new_actor(self) -> Any:
        return self._actor_class.options(**self._options).remote(*self._args)

    def _replace(self, k: int, why: str) -> None:
        self.lost.append(why)
        self.ray.kill(self.workers[k], no_restart=True)
        self.restarts += 1
        self.workers[k] = self._new_actor()

    def _payloads(self, candidates: Sequence[MappingOptions]) -> list[Any]:
        """Compile tasks (cuda) for every candidate, started now; None on cpu."""
        if self._identity is None:
            return [None] * len(candidates)
        arch, signature, sizes = self._identity
        self.compiles += len(candidates)
        return [self._compile.remote(self._args[0], arch, signature, sizes,
                                     c.to_json()) for c in candidates]

    def evaluate(self, candidates: Sequence[MappingOptions], best: float) -> list[Evaluation]:
        ray = self.ray
        compiled = self._payloads(candidates)
        results: list[Evaluation | None] = [None] * len(candidates)
        queue = list(range(len(candidates)))
        running: dict[Any, tuple[int, int, float]] = {}   # ref -> (candidate, actor, start)
        free = list(self.workers)
        while queue or running:
            while queue and free:
                i, k = queue.pop(0), free.pop(0)
                payload = None
                if compiled[i] is not None:
                    try:
                        kind, payload = ray.get(compiled[i], timeout=self.config.timeout_s)
                    except (ray.exceptions.RayError, TimeoutError) as exc:
                        kind, payload = "error", f"compile task failed: {_first_line(exc)}"
                    if kind != "ok":
                        results[i] = Evaluation(candidates[i], math.inf, 0, error=payload)
                        free.append(k)
                        continue
                else:
                    self.compiles += 1
                ref = self.workers[k].evaluate.remote(candidates[i].to_json(), best, payload)
                running[ref] = (i, k, time.monotonic())
            if not running:
                continue
            done, _ = ray.wait(list(running), num_returns=1, timeout=1.0)
            for ref in done:
                i, k, _ = running.pop(ref)
                results[i] = self._collect(ref, candidates[i], k)
                if results[i].ok:
                    best = min(best, results[i].time_s)
                free.append(k)
            now = time.monotonic()
            for ref, (i, k, start) in list(running.items()):
                if now - start > self.config.timeout_s:
                    running.pop(ref)
                    why = f"timed out after {self.config.timeout_s:.0f} s"
                    self._replace(k, why)
                    results[i] = Evaluation(candidates[i], math.inf, 0, error=why)
                    free.append(k)
        assert all(r is not None for r in results)
        return results  # type: ignore[return-value]

    def _collect(self, ref: Any, opts: MappingOptions, k: int) -> Evaluation:
        ray = self.ray
        try:
            kind, value = ray.get(ref)
        except ray.exceptions.RayTaskError as exc:   # a bug raised in the measurer
            return Evaluation(opts, math.inf, 0, error=f"error while measuring: "
                                                       f"{_first_line(exc)}")
        except ray.exceptions.RayError as exc:       # the actor, its worker or its node is gone
            why = f"Ray worker lost: {type(exc).__name__}: {_first_line(exc)}"
            self._replace(k, why)
            return Evaluation(opts, math.inf, 0, error=why)
        if kind == "ok":
            t, n, pruned, *rest = value  # (median, runs, pruned, spread)
            return Evaluation(opts, t, n, pruned=pruned, spread_s=rest[0] if rest else None)
        return Evaluation(opts, math.inf, 1 if kind == "wrong" else 0, error=value)

    def remeasure(self, candidates: Sequence[MappingOptions]) -> list[Evaluation]:
        """The finalists and the default timed side by side on one actor (as the local
        backend does in one worker); a lost actor fails them all with the reason."""
        from .evaluate import FINAL_ROUNDS, remeasured

        k = next(iter(self.workers))
        try:
            answers = self.ray.get(self.workers[k].remeasure.remote(
                [c.to_json() for c in candidates], FINAL_ROUNDS))
        except self.ray.exceptions.RayError as exc:
            why = f"Ray worker lost: {type(exc).__name__}: {_first_line(exc)}"
            self._replace(k, why)
            return [Evaluation(c, math.inf, 0, error=why) for c in candidates]
        return remeasured(candidates, answers)

    def close(self) -> None:
        for w in getattr(self, "workers", {}).values():
            self.ray.kill(w, no_restart=True)
        if self._started:
            self.ray.shutdown()
            self._started = False


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
