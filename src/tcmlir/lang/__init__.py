"""The TC front end: lexer, parser, printer, semantic checks and range inference.

    program = parse(text, name="<string>")      # -> ast.Program (raises ParseError)
    fn = check(program, entry=None, source=Source(text, name))
                                                # -> ir.Function (raises SemaError/InferenceError)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from .. import ir
    from ..errors import Source
    from .ast import Program


def parse(text: str, name: str = "<string>") -> Program:
    """Parse TC source text (one or more ``def``s) into an AST; errors are `ParseError`."""
    from .parser import parse_program

    return parse_program(text, name)


def check(program: Program, entry: str | None = None, *, source: Source | None = None) -> ir.Function:
    """Check one definition (``entry``; optional when there is one) and build its TC IR.

    ``source`` (the text the program was parsed from) locates errors; without it they carry
    line and column but no source line.
    """
    from .sema import check_program

    return check_program(program, entry, source=source)


__all__ = ["check", "parse"]
