"""What a pass is, and the registry of passes by name.

A pass is a frozen dataclass deriving from `Pass`, registered with `@register`:

* ``name`` (class attribute): its kebab-case name in pipeline strings;
* its fields are its options, typed ``int``, ``bool``, ``str`` or ``tuple[int, ...]``; a
  pipeline option ``max-bytes`` sets field ``max_bytes``; ``field(metadata={"choices": ...})``
  restricts a string option;
* a pass whose options are arbitrary names (``specialize{N=64}``) names the field that collects
  them in ``free_options`` (a ``tuple[tuple[str, int], ...]`` field);
* ``requires_schedule``: the pass needs a schedule tree (the pass manager checks it);
* ``run(state) -> state``: pure, returns a new `CompileState`.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, ClassVar

from ..poly.state import CompileState

__all__ = ["PASSES", "Pass", "format_pass", "option_fields", "register"]

PASSES: dict[str, type[Pass]] = {}


class Pass:
    """Base of every pass (see the module docstring)."""

    name: ClassVar[str] = ""
    requires_schedule: ClassVar[bool] = False
    free_options: ClassVar[str | None] = None

    def run(self, state: CompileState) -> CompileState:  # pragma: no cover - abstract
        raise NotImplementedError

    def __str__(self) -> str:
        return format_pass(self)


def register(cls: type[Pass]) -> type[Pass]:
    """Class decorator: add a pass to `PASSES` under its ``name``."""
    assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen, cls
    assert cls.name and cls.name not in PASSES, f"pass name {cls.name!r} missing or taken"
    assert cls.__doc__, f"pass {cls.name} needs a docstring"
    PASSES[cls.name] = cls
    return cls


def option_fields(cls: type[Pass]) -> dict[str, tuple[dataclasses.Field, Any]]:
    """kebab-case option name -> (dataclass field, resolved type annotation)."""
    hints = typing.get_type_hints(cls)
    return {f.name.replace("_", "-"): (f, hints[f.name]) for f in dataclasses.fields(cls)}


def _format_value(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)


def format_pass(p: Pass) -> str:
    """The pass in pipeline syntax, non-default options only: ``tile{sizes=32,32}``."""
    parts = []
    for f in dataclasses.fields(p):
        value = getattr(p, f.name)
        if f.name == p.free_options:
            parts.extend(f"{k}={v}" for k, v in value)
        elif f.default is dataclasses.MISSING or value != f.default:
            parts.append(f"{f.name.replace('_', '-')}={_format_value(value)}")
    return f"{p.name}{{{','.join(parts)}}}" if parts else p.name
