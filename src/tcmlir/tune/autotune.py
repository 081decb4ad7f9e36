"""``fn.autotune(...)``: genetic search of MappingOptions with caching and a progress bar.

Looks the signature up in the options cache first (a hit returns without tuning or
compiling); otherwise runs `GeneticSearch` with the evaluator of the target (in-process on
the CPU, worker processes on GPUs), shows generation / candidates / best time on a tqdm bar,
ends after the current generation on Ctrl-C with the best so far (a second Ctrl-C aborts; see
`tcmlir.interrupt`, installed from the tuning's first instant), and stores the best
candidates in the cache. Candidates are verified against a reference computed once per run
(`tune.verify`): a wrong one is logged, recorded as failed and never ranked, stored or
returned. A cache hit is re-verified on these inputs the first time this process uses it; a
row that fails is dropped and the tuning runs.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
from collections.abc import Sequence
from typing import Any

from ..errors import TCError
from ..interrupt import stop_on_interrupt
from ..options import MappingOptions
from .config import TunerConfig
from .evaluate import Evaluation, HostEvaluator, WorkerPoolEvaluator
from .genetic import GeneticSearch, TuningResult
from .space import space_for
from .verify import (
    REFERENCE_MAX_OPS,
    TuneError,
    compute_reference,
    estimated_ops,
    mark_verified,
    to_host,
    verify_for_call,
)

__all__ = ["TOP_K", "autotune", "cached_result_message", "check_cuda_usable", "open_cache",
           "tune"]

log = logging.getLogger("tcmlir.tune")
TOP_K = 3


def open_cache(cache: bool | str | Any) -> Any:
    """None for ``False``; the default database for ``True``; a path; or an OptionsCache."""
    if cache is False or cache is None:
        return None
    from ..cache.options_cache import OptionsCache

    if cache is True:
        return OptionsCache()
    if isinstance(cache, OptionsCache):
        return cache
    return OptionsCache(str(cache))


def autotune(fn: Any, inputs: Sequence[Any], *, generations: int | None = None,
             population: int | None = None, cache: bool | str | Any = True,
             devices: Sequence[int] | None = None, config: TunerConfig | None = None,
             options: MappingOptions | None = None, target: str | None = None,
             progress: bool = True, retune: bool = False) -> MappingOptions:
    """Tune ``fn`` for these inputs and return the best MappingOptions found.

    A cache hit for the exact signature returns the stored options without tuning, and says
    so (on stderr when ``progress`` is on, and in the ``tcmlir.tune`` log); ``retune=True``
    skips the lookup, tunes again and stores the new result. Ctrl-C: see the module docstring.
    """
    with stop_on_interrupt():  # (the lookup too: a Ctrl-C there stops the tuning that follows)
        return _autotune(fn, inputs, generations=generations, population=population,
                         cache=cache, devices=devices, config=config, options=options,
                         target=target, progress=progress, retune=retune)


def _autotune(fn: Any, inputs: Sequence[Any], *, generations: int | None,
              population: int | None, cache: bool | str | Any,
              devices: Sequence[int] | None, config: TunerConfig | None,
              options: MappingOptions | None, target: str | None, progress: bool,
              retune: bool) -> MappingOptions:
    store = open_cache(cache)
    if store is not None and not retune:
        hit = store.lookup_record(fn, *inputs, exact=True)
        if hit is None:
            log.info("autotune %s: no tuned options in the cache %s for this signature; "
                     "tuning", fn.entry, store.path)
        else:
            found = MappingOptions.from_json(hit.options_json)
            wrong = verify_for_call(fn, inputs, found)
            if wrong is None:
                message = cached_result_message(fn.entry, store.path, hit)
                log.info("%s", message)
                if progress:
                    print(message, file=sys.stderr)
                return found
            store.discard(hit)
            log.warning("autotune: the cached options for %s failed their check (%s); dropped "
                        "them from the cache and tuning again", fn.entry, wrong)
    result = tune(fn, inputs, generations=generations, population=population, cache=store,
                  devices=devices, config=config, options=options, target=target,
                  progress=progress)
    assert result.best is not None
    return result.best.options


def cached_result_message(entry: str, path: Any, record: Any) -> str:
    """What a cached `autotune` says: that nothing was tuned, where the result came from, and
    how to tune again."""
    return (f"autotune {entry}: returned the options cached in {path} for this signature "
            f"(measured {record.time_s * 1e3:.4f} ms over {record.runs} runs); nothing was "
            "tuned. To tune again: fn.autotune(..., retune=True), or `tcmlir tune FILE ...`.")


def check_cuda_usable(devices: Sequence[int] | None) -> None:
    """Fail at once (a `CudaError`) when tuning for cuda cannot work here: no usable GPU, or a
    device ordinal the machine does not have."""
    from ..errors import CudaError
    from ..runtime.probe import probe_gpu

    probe = probe_gpu()
    if not probe.ok:
        raise CudaError(f"autotune: target 'cuda' needs a CUDA GPU, and none is usable here "
                        f"({probe.reason or probe.state}); tune for the host with "
                        "target='cpu' (`tcmlir tune --target cpu`) instead")
    bad = [d for d in devices or () if not 0 <= d < probe.devices]
    if bad:
        raise CudaError(f"autotune: no GPU {', '.join(map(str, bad))} here ({probe.devices} "
                        f"visible: ordinals 0..{probe.devices - 1})")


def tune(fn: Any, inputs: Sequence[Any], *, generations: int | None = None,
         population: int | None = None, cache: bool | str | Any = False,
         devices: Sequence[int] | None = None, config: TunerConfig | None = None,
         options: MappingOptions | None = None, target: str | None = None,
         progress: bool = True) -> TuningResult:
    """Run the genetic search (no cache lookup first) and return the whole `TuningResult`:
    every evaluation, the evaluation order, and ``stats`` (compiles, worker restarts). The best
    `TOP_K` candidates go to ``cache`` when one is given."""
    from ..api import resolve_target

    target = resolve_target(target or fn.target)
    if target == "numpy":
        raise TCError("autotuning needs a compiled target (cpu or cuda), not the numpy interpreter")
    config = config or TunerConfig()
    overrides: dict[str, Any] = {}
    if generations is not None:
        overrides["generations"] = generations
    if population is not None:
        overrides["population"] = population
    if devices is not None:
        overrides["devices"] = tuple(devices)
    config = dataclasses.replace(config, **overrides)
    if target == "cuda":
        check_cuda_usable(config.devices)
    store = open_cache(cache)

    # seeded with naive and with what a call without options would use: the best found is at
    # least as fast as either (both are measured)
    from ..binding import bind_host_inputs

    sizes = bind_host_inputs(fn.ir, [to_host(x) for x in inputs]).sizes
    start = [MappingOptions.naive()]
    default = MappingOptions.default_for(fn.ir, target, sizes)
    if default != start[0]:
        start.append(default)
    if options is not None:
        start.insert(0, options)
    # the reference: once per run, by the interpreter unless the domain is too large for it
    fits = estimated_ops(fn.ir, sizes) <= REFERENCE_MAX_OPS
    if target == "cuda":
        from .space import cuda_limits

        space = space_for(fn.ir, target, cuda_limits((config.devices or (0,))[0]))
        reference = compute_reference(fn, inputs, target) if fits else None
        evaluator: Any = WorkerPoolEvaluator(fn, inputs, config, target="cuda",
                                             reference=reference)
        reference_kind = reference.source if reference else "default kernel (in each worker)"
    else:
        space = space_for(fn.ir, target)
        evaluator = HostEvaluator(fn, inputs, target, config)
        reference_kind = evaluator.reference.source
    wrong: list[Evaluation] = []

    def evaluate(candidates: list[MappingOptions], best: float) -> list[Evaluation]:
        evaluations = evaluator.evaluate(candidates, best)
        for ev in evaluations:
            if ev.wrong:
                wrong.append(ev)
                log.warning("autotune %s: rejected %s: %s", fn.entry, ev.options.to_json(),
                            ev.error)
        return evaluations

    search = GeneticSearch(space, config, start)
    bar = _progress(progress, config, fn.entry)
    try:
        with stop_on_interrupt() as flag:
            def on_generation(gen: int, result: TuningResult) -> None:
                log.info("autotune %s: generation %d/%d: %d candidate(s) evaluated, %d wrong, "
                         "best %s", fn.entry, gen + 1, config.generations, len(result.evaluated),
                         len(wrong), f"{result.best.time_s * 1e3:.4f} ms" if result.best
                         else "none yet")
                if bar is not None:
                    bar.update(len(result.evaluated) - bar.n)
                    best = result.best.time_s if result.best else math.inf
                    bar.set_postfix_str(f"gen {gen + 1}/{config.generations} "
                                        f"evaluated {len(result.evaluated)} "
                                        f"wrong {len(wrong)} best {best * 1e3:.4f} ms")

            result = search.run(evaluate, on_generation, lambda: flag.stop)
    finally:
        evaluator.close()
        if bar is not None:
            bar.close()
    result.stats = {"compiles": evaluator.compiles, "restarts": evaluator.restarts,
                    "workers": len(getattr(evaluator, "workers", {})),
                    "compile_workers": len(getattr(evaluator, "compilers", ())),
                    "compile_restarts": getattr(evaluator, "compile_restarts", 0),
                    "wrong": len(wrong)}
    result.reference = reference_kind
    if result.best is None:
        errors = {e.error for e in result.evaluated.values() if e.error}
        what = (f"compiled, ran and computed the right result ({len(wrong)} of "
                f"{len(result.evaluated)} computed a wrong result; nothing stored)" if wrong
                else "compiled and ran")
        raise TuneError(f"autotune: no candidate for {fn.entry} {what}; errors: "
                        + "; ".join(sorted(errors)[:5]))
    signature = fn.signature(*[to_host(x) for x in inputs]).to_json()
    for ev in result.evaluated.values():
        if ev.ok:  # checked on these inputs: a cache hit in this process needs no re-check
            mark_verified(fn, target, signature, ev.options)
    if result.interrupted:
        log.warning("autotune: interrupted after generation %d; keeping the best so far",
                    result.generations_run)
    if store is not None:
        ranked = sorted((e for e in result.evaluated.values() if e.ok), key=lambda e: e.time_s)
        # a cache that cannot be written (disk full) warns; the tuned result is still returned
        store.save_tuned(fn, inputs, [(ev.options, ev.time_s, ev.runs) for ev in ranked[:TOP_K]])
    return result


def _progress(enabled: bool, config: TunerConfig, name: str) -> Any:
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return None
    return tqdm(total=config.generations * config.population, desc=f"tuning {name}",
                unit="cand", leave=True)
