"""TC lexer: source text -> list of `Token`s with spans (first stage of the front end).

The parser (`tcmlir.lang.parser`) consumes the tokens; nothing else does. Every character the
lexer does not understand is a located `ParseError`; it never raises anything else.

Decisions worth knowing:
* ``A.1`` (a dimension reference): a ``.`` right after an identifier is the ``.`` token and the
  digits after it lex as an integer, so ``A.1`` never lexes as ``A`` followed by the float ``.1``.
* Float literals: ``1.5``, ``2.``, ``.5``, ``1e-3``, ``3.0e+2``; a trailing ``f`` (``1.5f``) is
  accepted and ignored. ``1f`` (an integer with ``f``) is an error. Non-finite values are errors.
* ``min=``/``max=`` lex as one token only when ``=`` follows at once and is not ``==``; the
  reduction operators take a trailing ``!`` (``+=!``) as part of the same token when adjacent.
"""

from __future__ import annotations

import bisect
import math
import re
from dataclasses import dataclass

from ..errors import ParseError, Source, Span

__all__ = ["KEYWORDS", "MAX_IDENTIFIER", "TYPE_NAMES", "Token", "tokenize"]

# Scalar type names as written in TC (aliases included: `float` = float32, `double` = float64).
TYPE_NAMES = frozenset({
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "bfloat16", "float32", "float64", "float", "double",
})

KEYWORDS = frozenset({"def", "where", "in", "exists", "min", "max", "true", "false"})

# Operators, longest first so that maximal munch is a prefix scan.
_OPERATORS = (
    "<=>", "+=!", "*=!",
    "->", "<=", ">=", "==", "!=", "&&", "||", "+=", "*=",
    "+", "-", "*", "/", "%", "(", ")", "[", "]", "?", ":", ",", "=", "{", "}", ">", "<", "!", ".",
)

_IDENT_START = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")
_DIGITS = frozenset("0123456789")
_IDENT_CHARS = _IDENT_START | _DIGITS
_WHITESPACE = frozenset(" \t\r\n")
_LINE_END = re.compile(r"[\r\n]")
_MAX_INT_DIGITS = 100
#: Longest identifier (docs/language.md, "Limits"): names reach LLVM, which truncates local names past
#: 1024 characters (two long names could then clash), and PTX.
MAX_IDENTIFIER = 256


@dataclass(frozen=True)
class Token:
    """One token. ``kind`` is ``IDENT``, ``INT``, ``FLOAT``, ``TYPE``, ``EOF``, or the text
    itself for keywords and operators (``"def"``, ``"+=!"``). ``value`` is the int/float value
    of a literal, else None."""

    kind: str
    text: str
    span: Span
    value: int | float | None = None

    def describe(self) -> str:
        """How error messages name this token: ``'where'``, ``end of input``."""
        return "end of input" if self.kind == "EOF" else repr(self.text)


class _Lexer:
    def __init__(self, source: Source):
        self.source = source
        self.text = source.text
        self.line_starts = source.line_starts
        self.tokens: list[Token] = []

    def span(self, start: int, end: int) -> Span:
        # Source.position's numbering ("\n", "\r\n" and a lone "\r" end a line).
        line = bisect.bisect_right(self.line_starts, start)
        return Span(start, max(start, end), line, start - self.line_starts[line - 1] + 1)

    def error(self, start: int, end: int, what: str, fix: str | None = None) -> ParseError:
        err = ParseError.at(self.source, self.span(start, end), what, fix)
        assert isinstance(err, ParseError)
        return err

    def add(self, kind: str, start: int, end: int, value: int | float | None = None) -> None:
        self.tokens.append(Token(kind, self.text[start:end], self.span(start, end), value))

    def run(self) -> list[Token]:
        text, n, pos = self.text, len(self.text), 0
        while pos < n:
            ch = text[pos]
            if ch in _WHITESPACE:
                pos += 1
            elif ch == "#":
                end = _LINE_END.search(text, pos)  # a lone "\r" ends a comment too
                pos = n if end is None else end.start()
            elif ch in _IDENT_START:
                pos = self.identifier(pos)
            elif ch in _DIGITS:
                pos = self.number(pos)
            elif ch == ".":
                prev = self.tokens[-1].kind if self.tokens else None
                nxt = text[pos + 1] if pos + 1 < n else ""
                if prev != "IDENT" and nxt in _DIGITS:
                    pos = self.number(pos)
                else:
                    self.add(".", pos, pos + 1)
                    pos += 1
            else:
                pos = self.operator(pos)
        self.add("EOF", n, n)
        return self.tokens

    def identifier(self, start: int) -> int:
        text, pos = self.text, start + 1
        while pos < len(text) and text[pos] in _IDENT_CHARS:
            pos += 1
        word = text[start:pos]
        if len(word) > MAX_IDENTIFIER:
            raise self.error(start, pos, f"identifier is too long ({len(word)} characters; "
                             f"at most {MAX_IDENTIFIER})", "use a shorter name")
        if word in ("min", "max") and text.startswith("=", pos) and not text.startswith("==", pos):
            end = pos + 2 if text.startswith("=!", pos) and not text.startswith("=!=", pos) else pos + 1
            self.add(text[start:end], start, end)
            return end
        kind = "TYPE" if word in TYPE_NAMES else word if word in KEYWORDS else "IDENT"
        self.add(kind, start, pos)
        return pos

    def number(self, start: int) -> int:
        text, n = self.text, len(self.text)
        after_dot = bool(self.tokens) and self.tokens[-1].kind == "." and text[start] != "."
        pos = start
        while pos < n and text[pos] in _DIGITS:
            pos += 1
        is_float = False
        if not after_dot:
            if pos < n and text[pos] == ".":
                is_float = True
                pos += 1
                while pos < n and text[pos] in _DIGITS:
                    pos += 1
            if pos < n and text[pos] in "eE":
                exp = pos + 1
                if exp < n and text[exp] in "+-":
                    exp += 1
                if exp < n and text[exp] in _DIGITS:
                    is_float = True
                    pos = exp
                    while pos < n and text[pos] in _DIGITS:
                        pos += 1
        digits_end = pos
        if is_float and pos < n and text[pos] in "fF" and (pos + 1 >= n or text[pos + 1] not in _IDENT_CHARS):
            pos += 1  # C-style float suffix, ignored
        if pos < n and text[pos] in _IDENT_CHARS:
            end = pos
            while end < n and text[end] in _IDENT_CHARS:
                end += 1
            fix = None if is_float or after_dot else (
                f"write {text[start:digits_end]}.0 for a float literal"
                if text[pos:end] in ("f", "F") else None)
            raise self.error(start, end, f"malformed number {text[start:end]!r}", fix)
        literal = text[start:digits_end]
        if is_float:
            value = float(literal)
            if not math.isfinite(value):
                raise self.error(start, pos, f"float literal {literal!r} is out of range",
                                 "use a literal within the float64 range")
            self.add("FLOAT", start, pos, value)
        else:
            if len(literal) > _MAX_INT_DIGITS:
                raise self.error(start, pos, f"integer literal is too long ({len(literal)} digits)")
            self.add("INT", start, pos, int(literal))
        return pos

    def operator(self, start: int) -> int:
        text = self.text
        for op in _OPERATORS:
            if text.startswith(op, start):
                if op in ("+=!", "*=!") and text.startswith("=", start + len(op)):
                    continue  # `+=!=` is `+=` then `!=`, not `+=!` then `=`
                self.add(op, start, start + len(op))
                return start + len(op)
        ch = text[start]
        fix = None
        if ch == ";":
            fix = "TC statements need no separator: put each statement on its own line"
        elif ch == "&" or ch == "|":
            fix = f"logical operators are '&&' and '||'; TC has no bitwise '{ch}'"
        raise self.error(start, start + 1, f"unexpected character {ch!r}", fix)


def tokenize(text: str, name: str = "<string>") -> list[Token]:
    """The tokens of ``text``, ending with an ``EOF`` token; errors are located `ParseError`s."""
    return _Lexer(Source(text, name)).run()


def tokenize_source(source: Source) -> list[Token]:
    """`tokenize` for an existing `Source` (the parser reports errors against the same one)."""
    return _Lexer(source).run()
