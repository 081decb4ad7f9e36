"""``fn.autotune(...)``: genetic search of MappingOptions with caching and a progress bar.

Looks the signature up in the options cache first (a hit returns without tuning or
compiling); otherwise runs `GeneticSearch` with the evaluator of the target (in-process on
the CPU, worker processes on GPUs), shows generation / candidates / best time on a tqdm bar,
ends after the current generation on Ctrl-C with the best so far, and stores the best
candidates in the cache.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import signal
import threading
from collections.abc import Sequence
from typing import Any

from ..errors import TCError
from ..options import MappingOptions
from .config import TunerConfig
from .evaluate import HostEvaluator, WorkerPoolEvaluator
from .genetic import GeneticSearch, TuningResult
from .space import space_for

__all__ = ["TOP_K", "autotune", "open_cache", "tune"]

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


class _StopFlag:
    """Ctrl-C sets the flag (the tuner ends after the current generation); a second one aborts."""

    def __init__(self) -> None:
        self.stop = False
        self._old: Any = None

    def __enter__(self) -> _StopFlag:
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGINT, self._handler)
        return self

    def _handler(self, signum: int, frame: Any) -> None:
        if self.stop:
            raise KeyboardInterrupt
        self.stop = True
        log.warning("interrupted: finishing the current generation (Ctrl-C again to abort)")

    def __exit__(self, *exc: Any) -> None:
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)


def autotune(fn: Any, inputs: Sequence[Any], *, generations: int | None = None,
             population: int | None = None, cache: bool | str | Any = True,
             devices: Sequence[int] | None = None, config: TunerConfig | None = None,
             options: MappingOptions | None = None, target: str | None = None,
             progress: bool = True) -> MappingOptions:
    """Tune ``fn`` for these inputs and return the best MappingOptions found.

    A cache hit for the exact signature returns the stored options without tuning.
    """
    store = open_cache(cache)
    if store is not None:
        hit = store.lookup(fn, *inputs, exact=True)
        if hit is not None:
            log.info("autotune: options for %s found in the cache", fn.entry)
            return hit
    result = tune(fn, inputs, generations=generations, population=population, cache=store,
                  devices=devices, config=config, options=options, target=target,
                  progress=progress)
    assert result.best is not None
    return result.best.options


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
    store = open_cache(cache)

    # seeded with naive and with what a call without options would use: the best found is at
    # least as fast as either (both are measured)
    start = [MappingOptions.naive()]
    default = MappingOptions.default_for(fn.ir, target)
    if default != start[0]:
        start.append(default)
    if options is not None:
        start.insert(0, options)
    if target == "cuda":
        from .space import cuda_limits

        space = space_for(fn.ir, target, cuda_limits((config.devices or (0,))[0]))
        evaluator: Any = WorkerPoolEvaluator(fn, inputs, config, target="cuda")
    else:
        space = space_for(fn.ir, target)
        evaluator = HostEvaluator(fn, inputs, target, config)
    search = GeneticSearch(space, config, start)
    bar = _progress(progress, config, fn.entry)
    try:
        with _StopFlag() as flag:
            def on_generation(gen: int, result: TuningResult) -> None:
                if bar is not None:
                    bar.update(len(result.evaluated) - bar.n)
                    best = result.best.time_s if result.best else math.inf
                    bar.set_postfix_str(f"gen {gen + 1}/{config.generations} "
                                        f"evaluated {len(result.evaluated)} "
                                        f"best {best * 1e3:.4f} ms")

            result = search.run(evaluator.evaluate, on_generation, lambda: flag.stop)
    finally:
        evaluator.close()
        if bar is not None:
            bar.close()
    result.stats = {"compiles": evaluator.compiles, "restarts": evaluator.restarts,
                    "workers": len(getattr(evaluator, "workers", {}))}
    if result.best is None:
        errors = {e.error for e in result.evaluated.values() if e.error}
        raise TCError(f"autotune: no candidate for {fn.entry} compiled and ran; errors: "
                      + "; ".join(sorted(errors)[:5]))
    if result.interrupted:
        log.warning("autotune: interrupted after generation %d; keeping the best so far",
                    result.generations_run)
    if store is not None:
        ranked = sorted((e for e in result.evaluated.values() if e.ok), key=lambda e: e.time_s)
        for ev in ranked[:TOP_K]:
            store.record(fn, *inputs, options=ev.options, time_s=ev.time_s, runs=ev.runs)
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
