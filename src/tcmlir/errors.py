"""Errors the library raises on purpose: `TCError` and one subclass per phase.

Every user mistake ends as a TCError whose message starts ``<name>:LINE:COL: error: <what>``,
followed by the source line, a caret under the culprit and, where there is one, the fix.
Errors that are not about a source location (call-time shape checks, CUDA failures) carry a
plain message that names what is wrong and both values.
"""

from __future__ import annotations

import bisect
import functools
import re
from dataclasses import dataclass

__all__ = [
    "CallError",
    "CodegenError",
    "CudaError",
    "InferenceError",
    "LaunchConfigError",
    "OptionsError",
    "ParseError",
    "PipelineError",
    "PreconditionWarning",
    "SemaError",
    "Source",
    "Span",
    "TCError",
    "format_located",
    "line_starts",
]

# What ends a line, as the user's editor counts: "\n", "\r\n" and a lone "\r" (Python's
# universal newlines, and every editor's). U+2028/U+2029, form feeds and the other characters
# str.splitlines also splits on are not line breaks here: vim, emacs and VS Code (whose default
# only offers to remove them) show them inside a line, so a location counts them as one column
# of that line and quotes the whole line around them.
_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def line_starts(text: str) -> list[int]:
    """The offset at which each line of ``text`` starts (see ``_LINE_BREAK``), 0 first."""
    return [0] + [m.end() for m in _LINE_BREAK.finditer(text)]


@dataclass(frozen=True)
class Source:
    """A TC source text and the name it is reported under (a file name or ``<string>``)."""

    text: str
    name: str = "<string>"

    @functools.cached_property
    def line_starts(self) -> list[int]:
        """`line_starts` of the text (computed once)."""
        return line_starts(self.text)

    def line_text(self, line: int) -> str:
        """Line ``line`` (1-based) without its line break; "" past the end."""
        starts = self.line_starts
        if not 1 <= line <= len(starts):
            return ""
        end = starts[line] if line < len(starts) else len(self.text)
        return self.text[starts[line - 1]:end].rstrip("\r\n")

    def position(self, offset: int) -> tuple[int, int]:
        """1-based (line, column) of a character offset (lines end as `line_starts` says)."""
        offset = max(0, min(offset, len(self.text)))
        starts = self.line_starts
        line = bisect.bisect_right(starts, offset)
        return line, offset - starts[line - 1] + 1

    def span(self, start: int, end: int) -> Span:
        line, col = self.position(start)
        return Span(start, max(end, start), line, col)


@dataclass(frozen=True)
class Span:
    """Half-open character range ``[start, end)`` in a source, with the 1-based line/column of start."""

    start: int
    end: int
    line: int
    col: int

    def merge(self, other: Span) -> Span:
        first = self if self.start <= other.start else other
        return Span(first.start, max(self.end, other.end), first.line, first.col)


def format_located(source: Source, span: Span | None, what: str, fix: str | None = None,
                   kind: str = "error") -> str:
    """``name:LINE:COL: error: what``, the source line, a caret line, and an optional fix.

    ``kind`` replaces ``error`` (``warning`` for `PreconditionWarning`)."""
    if span is None:
        head = f"{source.name}: {kind}: {what}"
        return head if fix is None else f"{head}\n  fix: {fix}"
    line_text = source.line_text(span.line)
    width = max(1, min(span.end - span.start, len(line_text) - span.col + 1))
    caret = " " * (span.col - 1) + "^" + "~" * (width - 1)
    parts = [f"{source.name}:{span.line}:{span.col}: {kind}: {what}", f"  {line_text}", f"  {caret}"]
    if fix:
        parts.append(f"  fix: {fix}")
    return "\n".join(parts)


class TCError(Exception):
    """Base of every error tcmlir raises on purpose."""

    def __init__(self, message: str, *, span: Span | None = None, source: Source | None = None):
        super().__init__(message)
        self.span = span
        self.source = source

    @classmethod
    def at(cls, source: Source, span: Span | None, what: str, fix: str | None = None) -> TCError:
        """An error located in ``source`` (message formatted by `format_located`)."""
        return cls(format_located(source, span, what, fix), span=span, source=source)

    @property
    def line(self) -> int | None:
        return None if self.span is None else self.span.line

    @property
    def col(self) -> int | None:
        return None if self.span is None else self.span.col


class ParseError(TCError):
    """Lexing or parsing failed."""


class SemaError(TCError):
    """The program parses but breaks a rule of the language (types, names, ranks, reductions)."""


class InferenceError(SemaError):
    """Range inference could not give an index a range, or an access may leave its tensor."""


class CallError(TCError):
    """Inputs given at a call do not match the definition (count, rank, dtype, sizes)."""


class OptionsError(TCError):
    """Mapping options or tuner settings are invalid."""


class PipelineError(TCError):
    """A pass pipeline string names an unknown pass or gives a bad option, or a pass failed."""


class CodegenError(TCError):
    """A construct the backend cannot lower (named, with its source line)."""


class CudaError(TCError):
    """A CUDA driver call failed (a failed launch names the kernel, grid, block and error)."""


class LaunchConfigError(CudaError):
    """A launch configuration the device or the kernel cannot run (too many threads for its
    registers, too much shared memory, a grid too large), refused before the driver launches
    anything: the CUDA context stays usable, unlike after a failed launch."""


class PreconditionWarning(UserWarning):
    """A definition is valid only for some sizes: the condition becomes a precondition of every
    call (as in TC), checked when the sizes are bound (a violation is a `CallError`)."""
