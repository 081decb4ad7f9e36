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
Factory = Callable[[Any, Sequence[Any]], MappingOptions]


def make_naive_options_factory() -> Factory:
    """Always `MappingOptions.naive()`."""

    def factory(fn: Any, inputs: Sequence[Any]) -> MappingOptions:
        return MappingOptions.naive()

    return factory


def _memo_key(fn: Any, inputs: Sequence[Any]) -> tuple:
    return (fn.canonical_source, fn.entry, fn.target, fn.signature(*inputs))


def make_load_from_cache_options_factory(cache: Any = True) -> Factory:
    """Options from the cache: the exact signature, else the nearest size (logged), else the
    default options a call without a factory gets (`MappingOptions.default_for` at the call's
    sizes; TC's factory gave naive options there, which on a GPU are many times slower).

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
        if record is None and store is not None:
            record = store.lookup_record(fn, *inputs, exact=False)
            if record is not None:
                log.info("%s: no tuned options for this size; using those of the nearest size",
                         fn.entry)
        if record is None:
            log.info("%s: no tuned options in the cache; using the default options", fn.entry)
            found = _default_options(fn, inputs)
        else:
            found = _verified_or_default(fn, inputs, store, record)
        memo[key] = found
        return found

    return factory


def _verified_or_default(fn: Any, inputs: Sequence[Any], store: Any, record: Any
                         ) -> MappingOptions:
    """The stored options if they compute the right result on these inputs; else the row is
    dropped, a warning says so, and the default options are returned."""
    from .tune.verify import WrongResultWarning, verify_for_call

    found = MappingOptions.from_json(record.options_json)
    wrong = verify_for_call(fn, inputs, found)
    if wrong is None:
        return found
    # a row tuned at this very signature is dropped; one borrowed from the nearest size is
    # only not used here (its own size re-verifies it when a call there first uses it)
    own = record.signature == fn.signature(*inputs).to_json()
    if own:
        store.discard(record)
    message = (f"{fn.entry}: the tuned options cached in {store.path} failed their check on "
               f"this call's inputs ({wrong}); "
               + ("dropped them from the cache" if own else
                  "not using those of the nearest size") + " and using the default options "
               "instead")
    log.warning("%s", message)
    warnings.warn(message, WrongResultWarning, stacklevel=4)
    return _default_options(fn, inputs)


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
