"""``fn.autotune(...)``: genetic search of MappingOptions with caching and a progress bar.

Looks the signature up in the options cache first (a hit returns without tuning or
compiling); otherwise runs `GeneticSearch` with the evaluator of the target (in-process on
the CPU, worker processes on GPUs), shows generation / candidates / best time on a tqdm bar,
ends after the current generation on Ctrl-C with the best so far (a second Ctrl-C aborts; see
`tcmlir.interrupt`, installed from the tuning's first instant), and stores the best
candidates in the cache. Candidates are verified against a reference computed once per run
(`tune.verify`): a wrong one is logged, recorded as failed and never ranked, stored or
returned. A cache hit is re-verified on these inputs the first time this process uses it; a
row that fails is dropped and the tuning runs. After the search, the finalists and the default
options are re-measured side by side in one worker (`choose_final`): the options returned are
the fastest of them as measured then, never slower than the default; the cache stores those
times and their spread. Inputs are taken as a call takes them (`TCFunction.input_spec`):
device arrays are read in place, and copied to the host once (logged) for the reference and
the worker processes.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
from collections.abc import Sequence
from typing import Any

from ..errors import TCError
from ..input_spec import host_copies
from ..interrupt import stop_on_interrupt
from ..options import MappingOptions
from .config import TunerConfig
from .evaluate import Evaluation, HostEvaluator, WorkerPoolEvaluator
from .genetic import GeneticSearch, TuningResult
from .model_prune import ModelPruner
from .space import space_for
from .verify import (
    REFERENCE_MAX_OPS,
    TuneError,
    compute_reference,
    estimated_ops,
    mark_verified,
    verify_for_call,
)

__all__ = ["FINALISTS", "TOP_K", "autotune", "cached_result_message", "check_cuda_usable",
           "choose_final", "open_cache", "tune"]

log = logging.getLogger("tcmlir.tune")
TOP_K = 3
FINALISTS = 3  # the fastest candidates re-measured beside the default before one is chosen
SEEDS_FROM_CACHE = 3  # options tuned at the nearest other sizes that seed the first generation


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
        hit = store.lookup_record(fn, *inputs, exact=True, target=target)
        if hit is None:
            log.info("autotune %s: no tuned options in the cache %s for this signature; "
                     "tuning", fn.entry, store.path)
        else:
            found = MappingOptions.from_json(hit.options_json)
            wrong = verify_for_call(fn, inputs, found, target=target)
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
    from ..targets import resolve_target

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
    if target == "cuda" and config.backend == "local":
        check_cuda_usable(config.devices)
    store = open_cache(cache)

    # the inputs as a call takes them (device arrays are read in place, not copied)
    spec = fn.input_spec(inputs, target)
    sizes = spec.sizes
    # seeded with naive, with what a call without options would use (the best found is at
    # least as fast as either: both are measured) and with options tuned at the nearest
    # other sizes in the cache
    start = [MappingOptions.naive()]
    default = MappingOptions.default_for(fn.ir, target, sizes)
    if default != start[0]:
        start.append(default)
    if options is not None:
        start.insert(0, options)
    start += _seeds_from_cache(store, fn, inputs, target, start)
    # the reference: once per run, by the interpreter unless the domain is too large for it
    fits = estimated_ops(fn.ir, sizes) <= REFERENCE_MAX_OPS
    if config.backend == "ray":
        from .ray_backend import RayEvaluator, import_ray

        import_ray()  # before any work: without Ray the error says what to install
        # the GPUs are the cluster's: the default limits, and a reference computed on the host
        space = space_for(fn.ir, target, None, sizes)
        host = host_copies(fn.ir, inputs, "the reference check and the Ray workers")
        reference = compute_reference(fn, host, "cpu")
        evaluator: Any = RayEvaluator(fn, host, config, target, reference)
        reference_kind = reference.source
    elif target == "cuda":
        from .space import cuda_limits

        space = space_for(fn.ir, target, cuda_limits((config.devices or (0,))[0]), sizes)
        # the reference and the worker processes read host data: device inputs are copied
        # once here (logged); the caller's arrays stay where they are
        host = host_copies(fn.ir, inputs, "the reference check of the candidates and the "
                           "tuning workers")
        reference = compute_reference(fn, host, target) if fits else None
        evaluator = WorkerPoolEvaluator(fn, host, config, target="cuda",
                                             reference=reference,
                                             input_kind=_input_kind(fn, inputs))
        reference_kind = reference.source if reference else "default kernel (in each worker)"
    else:
        space = space_for(fn.ir, target)
        evaluator = HostEvaluator(fn, inputs, target, config)
        reference_kind = evaluator.reference.source
    wrong: list[Evaluation] = []
    # hopeless candidates by the cost model's account are not compiled (target cuda: the
    # model prices the GPU's kernels)
    pruner = ModelPruner(fn.ir, sizes if target == "cuda" else None, default)

    def evaluate(candidates: list[MappingOptions], best: float) -> list[Evaluation]:
        keep, answers = pruner.split(candidates)
        measured = iter(evaluator.evaluate(keep, best) if keep else [])
        evaluations = [answers[i] if i in answers else next(measured)
                       for i in range(len(candidates))]
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
                log.info("autotune %s: generation %d/%d: %d candidate(s) evaluated (%d pruned "
                         "by the cost model, not compiled), %d wrong, best %s", fn.entry, gen + 1,
                         config.generations, len(result.evaluated), pruner.pruned, len(wrong),
                         f"{result.best.time_s * 1e3:.4f} ms" if result.best else "none yet")
                if bar is not None:
                    bar.update(len(result.evaluated) - bar.n)
                    best = result.best.time_s if result.best else math.inf
                    bar.set_postfix_str(f"gen {gen + 1}/{config.generations} "
                                        f"evaluated {len(result.evaluated)} "
                                        f"wrong {len(wrong)} best {best * 1e3:.4f} ms")

            result = search.run(evaluate, on_generation, lambda: flag.stop)
            if result.best is not None:
                choose_final(evaluator, result, default, fn.entry)
    finally:
        evaluator.close()
        if bar is not None:
            bar.close()
    result.stats = {"compiles": evaluator.compiles, "restarts": evaluator.restarts,
                    "workers": len(getattr(evaluator, "workers", {})),
                    "compile_workers": len(getattr(evaluator, "compilers", ())),
                    "compile_restarts": getattr(evaluator, "compile_restarts", 0),
                    "wrong": len(wrong), "pruned": pruner.pruned}
    result.reference = reference_kind
    if result.best is None:
        errors = {e.error for e in result.evaluated.values() if e.error}
        what = (f"compiled, ran and computed the right result ({len(wrong)} of "
                f"{len(result.evaluated)} computed a wrong result; nothing stored)" if wrong
                else "compiled and ran")
        raise TuneError(f"autotune: no candidate for {fn.entry} {what}; errors: "
                        + "; ".join(sorted(errors)[:5]))
    signature = spec.signature.to_json()
    for ev in result.evaluated.values():
        if ev.ok:  # checked on these inputs: a cache hit in this process needs no re-check
            mark_verified(fn, target, signature, ev.options)
    if result.interrupted:
        log.warning("autotune: interrupted after generation %d; keeping the best so far",
                    result.generations_run)
    if store is not None:
        # the side-by-side figures where there are some (they decided), else the search's
        ranked = sorted((e for e in (result.final or result.evaluated.values()) if e.ok),
                        key=lambda e: e.time_s)
        # a cache that cannot be written (disk full) warns; the tuned result is still returned
        store.save_tuned(fn, inputs, [(ev.options, ev.time_s, ev.runs, ev.spread_s)
                                      for ev in ranked[:TOP_K]], target=target)
    return result


def choose_final(evaluator: Any, result: TuningResult, default: MappingOptions,
                 entry: str) -> None:
    """Re-measure the `FINALISTS` fastest candidates and the default options side by side in
    one worker (`evaluate.measure_side_by_side`) and make the fastest of them, as measured
    then, ``result.best``: never slower than the default measured beside it. Both times go to
    the log and to ``result.final`` / ``result.final_default``."""
    ranked = sorted((e for e in result.evaluated.values() if e.ok), key=lambda e: e.time_s)
    contenders = [e.options for e in ranked[:FINALISTS]]
    searched_default = result.evaluated.get(default.to_json())
    if searched_default is not None and searched_default.ok and default not in contenders:
        contenders.append(default)
    if len(contenders) < 2:
        return  # one candidate ran: nothing to compare it with
    measured = evaluator.remeasure(contenders)
    good = [m for m in measured if m.ok]
    if not good:
        log.warning("autotune %s: the re-measurement of the finalists failed (%s); keeping "
                    "the search's best", entry, measured[0].error)
        return
    chosen = min(good, key=lambda m: m.time_s)
    beside = next((m for m in measured if m.options == default and m.ok), None)
    result.best, result.final, result.final_default = chosen, measured, beside
    log.info("autotune %s: re-measured %d finalist(s)%s side by side (%d samples each): "
             "chose %s ms%s", entry, len(contenders) - (beside is not None),
             " and the default" if beside is not None else "", chosen.runs,
             _ms(chosen), "" if beside is None else
             f", the default {_ms(beside)} ms"
             + (" (the default itself)" if chosen.options == default else ""))


def _seeds_from_cache(store: Any, fn: Any, inputs: Sequence[Any], target: str,
                      taken: Sequence[MappingOptions]) -> list[MappingOptions]:
    """Options tuned at the nearest other sizes in the cache (`SEEDS_FROM_CACHE` at most), for
    the first generation; logged."""
    if store is None:
        return []
    from ..cache.store import CacheError

    try:
        records = store.nearest_records(fn, *inputs, count=SEEDS_FROM_CACHE, target=target)
    except CacheError as exc:  # an unreadable cache costs the seeds only
        log.warning("autotune %s: no seeds from the cache (%s)", fn.entry, exc)
        return []
    seeds = [o for o in (MappingOptions.from_json(r.options_json) for r in records)
             if o not in taken]
    if seeds:
        log.info("autotune %s: seeded with %d option(s) tuned at the nearest sizes in %s (%s)",
                 fn.entry, len(seeds), store.path,
                 "; ".join(",".join(f"{k}={v}" for k, v in r.sizes.items()) for r in records))
    return seeds


def _ms(ev: Evaluation) -> str:
    spread = f" ± {ev.spread_s * 1e3:.4f}" if ev.spread_s else ""
    return f"{ev.time_s * 1e3:.4f}{spread}"


def _input_kind(fn: Any, inputs: Sequence[Any]) -> str | None:
    """``"torch-cuda"`` or ``"cupy"`` when the first array input is one (the workers time on
    inputs of that kind), else None."""
    from ..array_kinds import array_library

    first = next((x for t, x in zip(fn.ir.inputs, inputs, strict=False) if t.rank > 0), None)
    library = array_library(first)
    if library == "torch" and getattr(getattr(first, "device", None), "type", None) == "cuda":
        return "torch-cuda"
    return "cupy" if library == "cupy" else None


def _progress(enabled: bool, config: TunerConfig, name: str) -> Any:
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return None
    return tqdm(total=config.generations * config.population, desc=f"tuning {name}",
                unit="cand", leave=True)
