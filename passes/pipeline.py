"""Parsing pipeline strings such as ``schedule{fusion=max},tile{sizes=32,32}`` into passes.

Grammar (whitespace allowed between tokens)::

    pipeline := pass ("," pass)*
    pass     := NAME ("{" [option ("," option)*] "}")?
    option   := KEY "=" VALUE ("," VALUE)*      -- a VALUE not followed by "=" continues a list

Errors are `PipelineError`s located in the pipeline text (column, caret) that list the known
passes or the pass's options.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from typing import Any

from ..errors import PipelineError, Source
from .base import PASSES, Pass, option_fields

__all__ = ["parse_pipeline"]

_TOKEN = re.compile(r"\s*(?:(?P<word>[A-Za-z0-9_.+\-]+)|(?P<punct>[{},=])|(?P<bad>\S))")


@dataclasses.dataclass(frozen=True)
class _Tok:
    kind: str   # "word", one of "{},=", "bad", "end"
    text: str
    start: int


def _tokens(text: str) -> list[_Tok]:
    out, pos = [], 0
    while True:
        m = _TOKEN.match(text, pos)
        if m is None:
            break
        kind = "word" if m.group("word") else ("bad" if m.group("bad") else m.group("punct"))
        start = m.start(m.lastgroup)
        out.append(_Tok(kind, text[start:m.end()], start))
        pos = m.end()
    out.append(_Tok("end", "", len(text.rstrip())))
    return out


class _Parser:
    def __init__(self, text: str):
        self.source = Source(text, "<pipeline>")
        self.toks = _tokens(text)
        self.i = 0

    def error(self, tok: _Tok, what: str, fix: str | None = None) -> PipelineError:
        span = self.source.span(tok.start, tok.start + max(1, len(tok.text)))
        return PipelineError.at(self.source, span, what, fix)

    @property
    def tok(self) -> _Tok:
        return self.toks[self.i]

    def peek(self, k: int = 1) -> _Tok:
        return self.toks[min(self.i + k, len(self.toks) - 1)]

    def expect(self, kind: str, what: str) -> _Tok:
        tok = self.tok
        if tok.kind != kind:
            shown = "end of pipeline" if tok.kind == "end" else f"'{tok.text}'"
            raise self.error(tok, f"expected {what}, found {shown}")
        self.i += 1
        return tok

    def pipeline(self) -> tuple[Pass, ...]:
        if self.tok.kind == "end":
            raise self.error(self.tok, "empty pipeline", fix=_known_passes())
        passes = [self.one_pass()]
        while self.tok.kind == ",":
            self.i += 1
            passes.append(self.one_pass())
        if self.tok.kind != "end":
            raise self.error(self.tok, f"expected ',' or end of pipeline, found '{self.tok.text}'")
        return tuple(passes)

    def one_pass(self) -> Pass:
        name_tok = self.expect("word", "a pass name")
        cls = PASSES.get(name_tok.text)
        if cls is None:
            raise self.error(name_tok, f"unknown pass '{name_tok.text}'", fix=_known_passes())
        raw: list[tuple[_Tok, list[_Tok]]] = []
        if self.tok.kind == "{":
            self.i += 1
            if self.tok.kind != "}":
                raw.append(self.option())
                while self.tok.kind == ",":
                    self.i += 1
                    raw.append(self.option())
            self.expect("}", "'}' or ',' after an option")
        return self.build(cls, name_tok, raw)

    def option(self) -> tuple[_Tok, list[_Tok]]:
        key = self.expect("word", "an option name")
        self.expect("=", f"'=' after option '{key.text}'")
        values = [self.expect("word", f"a value for option '{key.text}'")]
        while self.tok.kind == "," and self.peek().kind == "word" and self.peek(2).kind != "=":
            self.i += 1
            values.append(self.expect("word", "a value"))
        return key, values

    def build(self, cls: type[Pass], name_tok: _Tok, raw) -> Pass:
        fields = option_fields(cls)
        kwargs: dict[str, Any] = {}
        free: list[tuple[str, int]] = []
        seen: set[str] = set()
        for key, values in raw:
            if key.text in seen:
                raise self.error(key, f"option '{key.text}' given twice")
            seen.add(key.text)
            if key.text in fields and key.text.replace("-", "_") != cls.free_options:
                field, typ = fields[key.text]
                kwargs[field.name] = self.convert(key, values, typ, field)
            elif cls.free_options is not None:
                free.append((key.text, self.convert(key, values, int, None)))
            else:
                known = ", ".join(fields) or "none"
                raise self.error(key, f"pass '{cls.name}' has no option '{key.text}'",
                                 fix=f"options of {cls.name}: {known}")
        if cls.free_options is not None:
            kwargs[cls.free_options] = tuple(free)
        try:
            return cls(**kwargs)
        except (ValueError, TypeError) as exc:
            raise self.error(name_tok, f"bad options for pass '{cls.name}': {exc}") from None

    def convert(self, key: _Tok, values: list[_Tok], typ: Any, field) -> Any:
        origin = typing.get_origin(typ)
        if origin is tuple:
            return tuple(self.scalar(key, v, int) for v in values)
        if len(values) > 1:
            raise self.error(values[1], f"option '{key.text}' takes one value")
        value = self.scalar(key, values[0], typ)
        choices = field.metadata.get("choices") if field is not None else None
        if choices and value not in choices:
            raise self.error(values[0], f"bad value '{values[0].text}' for option '{key.text}'",
                             fix=f"choose one of {', '.join(choices)}")
        return value

    def scalar(self, key: _Tok, tok: _Tok, typ: Any) -> Any:
        if typ is bool:
            if tok.text.lower() in ("true", "1", "on"):
                return True
            if tok.text.lower() in ("false", "0", "off"):
                return False
            raise self.error(tok, f"option '{key.text}' expects true or false, found '{tok.text}'")
        if typ is int:
            try:
                return int(tok.text)
            except ValueError:
                raise self.error(tok, f"option '{key.text}' expects an integer, "
                                      f"found '{tok.text}'") from None
        return tok.text


def _known_passes() -> str:
    return "known passes: " + ", ".join(sorted(PASSES))


def parse_pipeline(text: str) -> tuple[Pass, ...]:
    """The passes of a pipeline string (raises a located `PipelineError`)."""
    return _Parser(text).pipeline()
