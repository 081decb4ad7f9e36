"""What a call's arguments mean, before any binding: inputs by position or by their TC names,
and the forms ``options=`` takes.

`order_inputs` turns ``fn(A, B=b)`` into the positional tuple the binding layer checks (as
Python binds a function's parameters); `as_mapping_options` turns what a user may pass as
``options=`` into `MappingOptions`, or says what it takes.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from . import ir
from .errors import CallError, OptionsError
from .options import MappingOptions

__all__ = ["OPTION_PRESETS", "as_devices", "as_mapping_options", "order_inputs"]

# the preset names ``options=`` takes, each a `MappingOptions` class method (TC's presets)
OPTION_PRESETS = ("naive", "pointwise", "mlp", "convolution", "group_convolution")

_TAKES = ("options= takes tc.MappingOptions, a preset name ("
          + ", ".join(repr(p) for p in OPTION_PRESETS)
          + "), the JSON text of MappingOptions.to_json() or the dict of .to_dict()")


def as_mapping_options(value: Any) -> MappingOptions | None:
    """``value`` as `MappingOptions`: None stays None; a `MappingOptions` as it is; a preset
    name (``"naive"``) that preset; a JSON object's text or a dict the options it describes
    (`MappingOptions.from_json`, ``from_dict``). Anything else is an `OptionsError` saying
    what ``options=`` takes."""
    if value is None or isinstance(value, MappingOptions):
        return value
    if isinstance(value, str):
        text = value.strip()
        if text in OPTION_PRESETS:
            return getattr(MappingOptions, text)()
        if text.startswith("{"):
            try:
                return MappingOptions.from_json(text)
            except OptionsError as exc:
                raise OptionsError(f"options={_short(value)}: {exc}") from None
        close = difflib.get_close_matches(text, OPTION_PRESETS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise OptionsError(f"options={_short(value)} is not a preset name nor options JSON"
                           f"{hint}; {_TAKES}")
    if isinstance(value, Mapping):
        try:
            return MappingOptions.from_dict(dict(value))
        except OptionsError as exc:
            raise OptionsError(f"options= dict: {exc}") from None
        except TypeError as exc:  # a non-string key reaches the dataclass constructor
            raise OptionsError(f"options= dict: {exc}; {_TAKES}") from None
    raise OptionsError(f"{_TAKES}; got {type(value).__module__}.{type(value).__qualname__}")


def _short(value: str) -> str:
    return repr(value if len(value) <= 60 else value[:57] + "...")


def order_inputs(fn: ir.Function, inputs: Sequence[Any], named: Mapping[str, Any]) -> tuple:
    """``inputs`` followed by the ``named`` ones, in ``fn``'s input order, as Python binds
    parameters: positional first, then by TC name. An unknown name, a name also given by
    position, or an input left out after some are named is a `CallError` naming them."""
    if not named:
        return tuple(inputs)
    names = [t.name for t in fn.inputs]
    unknown = [k for k in named if k not in names]
    if unknown:
        close = difflib.get_close_matches(unknown[0], names, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise CallError(f"{fn.name}: no input named {unknown[0]}{hint}; its inputs are "
                        f"{', '.join(names) or 'none'}")
    twice = [n for n in names[:len(inputs)] if n in named]  # (all of them with too many)
    if twice:
        raise CallError(f"{fn.name}: input {twice[0]} given twice, by position and by name")
    missing = [n for n in names[len(inputs):] if n not in named]
    if missing:
        raise CallError(f"{fn.name}: missing input(s) {', '.join(missing)} (give every input, "
                        f"by position or by name: {', '.join(names)})")
    return tuple(inputs) + tuple(named[n] for n in names[len(inputs):])


def as_devices(value: Any) -> tuple[int, ...] | None:
    """``devices=`` as a tuple of CUDA device ordinals (None stays None); anything but a
    sequence of non-negative ints is a `CallError` that says what to pass."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence | range):
        hint = f"devices=[{value}]" if isinstance(value, int) else "devices=[0, 1]"
        raise CallError(f"devices= takes a sequence of CUDA device ordinals, got "
                        f"{type(value).__name__} {_short(repr(value))}: e.g. {hint}")
    out = tuple(value)
    for d in out:
        if isinstance(d, bool) or not isinstance(d, int | np.integer) or d < 0:
            raise CallError(f"devices= takes non-negative CUDA device ordinals, got "
                            f"{_short(repr(out))}: e.g. devices=[0, 1]")
    if not out:
        raise CallError("devices= is empty: name at least one CUDA device, e.g. devices=[0]")
    return tuple(int(d) for d in out)
