"""Options factories (DESIGN.md §3): what options a call uses when it names none.

A factory is called as ``factory(fn, inputs) -> MappingOptions`` on the first call of each
signature; pass one to ``tc.define(..., options_factory=...)``.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .options import MappingOptions

if TYPE_CHECKING:  # pragma: no cover
    from .tune.config import TunerConfig

__all__ = [
    "make_autotuned_options_factory",
    "make_load_from_cache_options_factory",
    "make_naive_options_factory",
]

log = logging.getLogger("tcmlir.options")
NEAREST_CANDIDATES = 3  # options tuned at other sizes timed beside the default at a new size
SIDE_BY_SIDE = (3, 5)   # rounds x runs of that timing (interleaved; median of the medians)
Factory = Callable[[Any, Sequence[Any]], MappingOptions]


def make_naive_options_factory() -> Factory:
    """Always `MappingOptions.naive()`."""

    def factory(fn: Any, inputs: Sequence[Any]) -> MappingOptions:
        return MappingOptions.naive()

    return factory


def _memo_key(fn: Any, inputs: Sequence[Any]) -> tuple:
    return (fn.canonical_source, fn.entry, fn.target, fn.signature(*inputs))


def make_load_from_cache_options_factory(cache: Any = True) -> Factory:
    """Options from the cache: the exact signature; else the fastest of the options tuned at
    the nearest other sizes (up to `NEAREST_CANDIDATES`) and the default, timed side by side on
    this call's inputs when the signature is first seen (logged), so that borrowed options
    never serve a size where the default is faster as measured then; else the default options
    a call without a factory gets (`MappingOptions.default_for` at the call's sizes; TC's
    factory gave naive options there, which on a GPU are many times slower).

    The database is opened once, on the first call; each signature is looked up once. Stored
    options are re-verified on this call's inputs the first time this process uses them
    (`tcmlir.tune.verify.verify_for_call`: the kernel the call will use is compiled here and
    run once against the reference); options that compute a wrong result are dropped from
    the cache (when tuned for this signature; nearest-size ones are only skipped) with a
    `WrongResultWarning`, and the default options are used instead.
    """
    state: dict[str, Any] = {}
    memo: dict[tuple, MappingOptions] = {}

    def factory(fn: Any, inputs: Sequence[Any]) -> MappingOptions:
        from .tune.autotune import open_cache

        key = _memo_key(fn, inputs)
        if key in memo:
            return memo[key]
        if "store" not in state:
            state["store"] = open_cache(cache)
        store = state["store"]
        record = store.lookup_record(fn, *inputs, exact=True) if store is not None else None
        if record is not None:
            log.info("%s: tuned options found in the cache for this signature", fn.entry)
        nearest = ([] if record is not None or store is None else
                   store.nearest_records(fn, *inputs, count=NEAREST_CANDIDATES))
        if record is not None:
            found = _verified_or_default(fn, inputs, store, record)
        elif nearest:
            found = _best_of_nearest(fn, inputs, store, nearest)
        else:
            log.info("%s: no tuned options in the cache; using the default options", fn.entry)
            found = _default_options(fn, inputs)
        memo[key] = found
        return found

    return factory


def _verified_or_default(fn: Any, inputs: Sequence[Any], store: Any, record: Any
                         ) -> MappingOptions:
    """The options stored for this signature if they compute the right result on these
    inputs; else the row is dropped, a warning says so, and the default options are returned."""
    from .tune.verify import WrongResultWarning, verify_for_call

    found = MappingOptions.from_json(record.options_json)
    wrong = verify_for_call(fn, inputs, found)
    if wrong is None:
        return found
    store.discard(record)  # tuned at this very signature: wrong here is wrong everywhere
    message = (f"{fn.entry}: the tuned options cached in {store.path} failed their check on "
               f"this call's inputs ({wrong}); dropped them from the cache and using the "
               "default options instead")
    log.warning("%s", message)
    warnings.warn(message, WrongResultWarning, stacklevel=4)
    return _default_options(fn, inputs)


def _best_of_nearest(fn: Any, inputs: Sequence[Any], store: Any, records: Sequence[Any]
                     ) -> MappingOptions:
    """The fastest, on ``inputs``, of the default options and the ``records``' options (tuned
    at other sizes) that compute the right result here; each kernel compiled by ``fn.compile``
    (the call that follows reuses the chosen one) and timed with `Kernel.benchmark`, the
    candidates interleaved round by round."""
    import statistics

    from .tune.verify import WrongResultWarning, verify_for_call

    default = _default_options(fn, inputs)
    borrowed: list[MappingOptions] = []
    for record in records:
        options = MappingOptions.from_json(record.options_json)
        if options == default or options in borrowed:
            continue
        wrong = verify_for_call(fn, inputs, options)
        if wrong is None:
            borrowed.append(options)
            continue
        message = (f"{fn.entry}: the options cached in {store.path} for sizes {record.sizes} "
                   f"failed their check on this call's inputs ({wrong}); not using those of "
                   "the nearest size here")
        log.warning("%s", message)
        warnings.warn(message, WrongResultWarning, stacklevel=5)
    if not borrowed:
        log.info("%s: no usable options tuned at another size; using the default options",
                 fn.entry)
        return default
    candidates = [*borrowed, default]
    kernels = [fn.compile(*inputs, options=o) for o in candidates]
    rounds, runs = SIDE_BY_SIDE
    samples: list[list[float]] = [[] for _ in candidates]
    for _ in range(rounds):
        for kernel, times in zip(kernels, samples, strict=True):
            times.append(kernel.benchmark(*inputs, runs=runs).median)
    medians = [statistics.median(t) for t in samples]
    best = min(range(len(candidates)), key=lambda i: medians[i])
    log.info("%s: no tuned options for this size; timed %d option(s) tuned at the nearest "
             "sizes beside the default (%s ms): using %s (%.4f ms)", fn.entry, len(borrowed),
             f"{medians[-1] * 1e3:.4f}", "the default" if best == len(borrowed)
             else f"those tuned at sizes {_sizes_of(records, candidates[best])}",
             medians[best] * 1e3)
    return candidates[best]


def _sizes_of(records: Sequence[Any], options: MappingOptions) -> str:
    return next((r.sizes for r in records
                 if MappingOptions.from_json(r.options_json) == options), "?")


def _default_options(fn: Any, inputs: Sequence[Any]) -> MappingOptions:
    """What a call on ``inputs`` without a factory uses: the defaults at the call's sizes."""
    from .targets import resolve_target

    return MappingOptions.default_for(fn.ir, resolve_target(fn.target), fn.size_values(*inputs))


def make_autotuned_options_factory(config: TunerConfig | None = None,
                                   cache: bool | str | Any = True, *,
                                   generations: int | None = None,
                                   population: int | None = None,
                                   devices: Sequence[int] | None = None,
                                   target: str | None = None,
                                   progress: bool = True) -> Factory:
    """Tune once per new signature (the result is stored in ``cache`` and served from it, in
    this process and later ones). ``config`` (a `tc.TunerConfig`), ``generations``,
    ``population``, ``devices``, ``target`` and ``progress`` are passed to ``fn.autotune``."""
    autotune_kwargs = {"generations": generations, "population": population,
                       "devices": devices, "target": target, "progress": progress}
    state: dict[str, Any] = {}
    memo: dict[tuple, MappingOptions] = {}

    def factory(fn: Any, inputs: Sequence[Any]) -> MappingOptions:
        from .tune.autotune import open_cache

        key = _memo_key(fn, inputs)
        if key not in memo:
            if "store" not in state:
                state["store"] = open_cache(cache)
            memo[key] = fn.autotune(*inputs, config=config, cache=state["store"] or False,
                                    **autotune_kwargs)
        return memo[key]

    return factory
