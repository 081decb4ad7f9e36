"""TC printer: `tcmlir.lang.ast` nodes -> canonical TC text (the inverse of the parser).

The text is canonical and deterministic: one statement per line, 4-space indent, one space
around binary operators and after commas, the fewest parentheses TC's precedence allows, float
literals as Python's shortest round-tripping ``repr``. For every AST the parser can produce,
``parse(format_program(p)) == p`` and printing is idempotent; the cache keys kernels on it.

Nodes the parser never builds (negative or non-finite literals) still print as readable text,
but they re-parse as ``Unary('-', ...)`` (negatives) or not at all (inf/nan).
"""

from __future__ import annotations

from . import ast

__all__ = ["format_def", "format_expr", "format_program", "format_stmt"]

# Binding strength of each expression form; higher binds tighter.
_TERNARY, _UNARY, _PRIMARY = 0, 6, 7
_BINARY_LEVEL = {op: level + 1 for level, ops in enumerate(ast.BINARY_OPS) for op in ops}


def _level(e: ast.Expr) -> int:
    if isinstance(e, ast.Ternary):
        return _TERNARY
    if isinstance(e, ast.Binary):
        return _BINARY_LEVEL[e.op]
    if isinstance(e, ast.Unary):
        return _UNARY
    if isinstance(e, (ast.IntLit, ast.FloatLit)) and e.value < 0:
        return _UNARY  # only hand-built ASTs have these; print them like `-x`
    return _PRIMARY


def _float_text(value: float) -> str:
    # repr is the shortest text that reads back to the same float, and (for finite values)
    # always has a '.' or an exponent, so it lexes as a float literal, not an integer.
    return repr(float(value))


def _join(parts: tuple[ast.Expr, ...]) -> str:
    # A plain loop, not a generator: fewer Python frames per nesting level (deep ASTs).
    texts = []
    for p in parts:
        texts.append(_bare(p))
    return ", ".join(texts)


def _fmt(e: ast.Expr, min_level: int) -> str:
    text = _bare(e)
    return f"({text})" if _level(e) < min_level else text


def _bare(e: ast.Expr) -> str:
    if isinstance(e, ast.Ident):
        return e.name
    if isinstance(e, ast.BoolLit):
        return "true" if e.value else "false"
    if isinstance(e, ast.IntLit):
        return str(e.value)
    if isinstance(e, ast.FloatLit):
        return _float_text(e.value)
    if isinstance(e, ast.Access):
        return f"{e.tensor.name}({_join(e.indices)})"
    if isinstance(e, ast.Call):
        return f"{e.func}({_join(e.args)})"
    if isinstance(e, ast.Cast):
        return f"{e.dtype}({_bare(e.operand)})"
    if isinstance(e, ast.DimRef):
        return f"{e.tensor.name}.{e.dim}"
    if isinstance(e, ast.Unary):
        return e.op + _fmt(e.operand, _UNARY)
    if isinstance(e, ast.Binary):
        level = _BINARY_LEVEL[e.op]  # left-associative: the right operand binds tighter
        return f"{_fmt(e.lhs, level)} {e.op} {_fmt(e.rhs, level + 1)}"
    if isinstance(e, ast.Ternary):
        # `?:` is right-associative: a ternary condition needs parentheses, the arms do not.
        return f"{_fmt(e.cond, _TERNARY + 1)} ? {_fmt(e.then, _TERNARY)} : {_fmt(e.orelse, _TERNARY)}"
    raise TypeError(f"not a TC expression node: {e!r}")


def format_expr(e: ast.Expr) -> str:
    """Canonical text of an expression (no outer parentheses)."""
    return _bare(e)


def _format_clause(c: ast.WhereClause) -> str:
    if isinstance(c, ast.RangeConstraint):
        # Bounds that are ternaries get parentheses so the range's ':' stays readable.
        return f"{c.index.name} in {_fmt(c.lo, _TERNARY + 1)}:{_fmt(c.hi, _TERNARY + 1)}"
    if isinstance(c, ast.Let):
        return f"{c.name.name} = {format_expr(c.value)}"
    if isinstance(c, ast.Exists):
        return f"exists {format_expr(c.expr)}"
    raise TypeError(f"not a where clause: {c!r}")


def format_stmt(s: ast.Stmt) -> str:
    """One statement on one line, without indentation: ``C(i, j) +=! ... where ...``."""
    lhs = s.tensor.name + (f"({', '.join(i.name for i in s.indices)})" if s.indices else "")
    text = f"{lhs} {s.op}{'!' if s.init else ''} {format_expr(s.rhs)}"
    if s.equivalent is not None:
        text += f" <=> {format_expr(s.equivalent)}"
    if s.where:
        text += " where " + ", ".join(_format_clause(c) for c in s.where)
    return text


def _format_param(p: ast.Param) -> str:
    if p.dtype is None:
        return p.name.name
    if not p.dims:
        return f"{p.dtype} {p.name.name}"
    dims = ", ".join(d.name if isinstance(d, ast.Ident) else str(d.value) for d in p.dims)
    return f"{p.dtype}({dims}) {p.name.name}"


def format_def(d: ast.Def) -> str:
    """A definition: header line, one indented statement per line, closing brace (no newline)."""
    params = ", ".join(_format_param(p) for p in d.params)
    returns = ", ".join(_format_param(p) for p in d.returns)
    lines = [f"def {d.name.name}({params}) -> ({returns}) {{"]
    lines += ["    " + format_stmt(s) for s in d.body]
    lines.append("}")
    return "\n".join(lines)


def format_program(program: ast.Program) -> str:
    """All definitions, separated by a blank line, ending with a newline."""
    return "\n\n".join(format_def(d) for d in program.defs) + "\n"
