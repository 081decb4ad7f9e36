"""Readable text of the TC IR (``python -m tcmlir.dump --stage ir``): the printers live in
`tcmlir.ir` (``str(fn)`` uses them); re-exported here, where they were."""

from __future__ import annotations

from .ir import format_expr, format_function, format_statement

__all__ = ["format_expr", "format_function", "format_statement"]
