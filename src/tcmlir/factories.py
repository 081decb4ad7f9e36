"""Options factories (DESIGN.md §3): what options a call uses when it names none.

A factory is called as ``factory(fn, inputs) -> MappingOptions`` on the first call of each
signature; pass one to ``tc.define(..., options_factory=...)``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from .options import MappingOptions

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


def make_load_from_cache_options_factory(cache: Any = True) -> Factory:
    """Options from the cache: the exact signature, else the nearest size (logged), else naive."""

    def factory(fn: Any, inputs: Sequence[Any]) -> MappingOptions:
        from .tune.autotune import open_cache

        store = open_cache(cache)
        exact = store.lookup(fn, *inputs, exact=True)
        if exact is not None:
            return exact
        near = store.lookup(fn, *inputs, exact=False)
        if near is not None:
            log.info("%s: no tuned options for this size; using those of the nearest size", fn.entry)
            return near
        log.info("%s: no tuned options in the cache; using naive options", fn.entry)
        return MappingOptions.naive()

    return factory


def make_autotuned_options_factory(config: Any = None, cache: Any = True) -> Factory:
    """Tune once per new signature (then served from the cache)."""

    def factory(fn: Any, inputs: Sequence[Any]) -> MappingOptions:
        return fn.autotune(*inputs, config=config, cache=cache)

    return factory
