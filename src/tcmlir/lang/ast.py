"""The TC abstract syntax tree: frozen dataclasses that carry source spans.

Spans are excluded from equality, so ``parse(print(ast)) == ast`` compares structure only.
The parser builds these; the printer (`tcmlir.lang.printer`) turns them back into canonical TC
text; semantic analysis (`tcmlir.lang.sema`) checks them and produces the typed TC IR.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import Span

__all__ = [
    "ASSIGN_OPS",
    "BINARY_OPS",
    "BUILTINS",
    "Access",
    "Binary",
    "BoolLit",
    "Call",
    "Cast",
    "Def",
    "DimRef",
    "Exists",
    "Expr",
    "FloatLit",
    "Ident",
    "IntLit",
    "Let",
    "Param",
    "Program",
    "RangeConstraint",
    "Stmt",
    "Ternary",
    "Unary",
    "WhereClause",
]

# `=` and the reduction operators; each reduction has an initialising form with a trailing `!`.
ASSIGN_OPS = ("=", "+=", "*=", "min=", "max=")

# Binary operators from lowest to highest precedence (TC's table; `?:` is lowest and right-assoc).
BINARY_OPS = (("||",), ("&&",), ("<", ">", "<=", ">=", "==", "!="), ("+", "-"), ("*", "/", "%"))

# TC's built-in functions (CUDA math) and their arity. `min`/`max` are two-argument built-ins too.
BUILTINS: dict[str, int] = {
    "acos": 1, "acosh": 1, "asin": 1, "asinh": 1, "atan2": 2, "atan": 1, "atanh": 1, "cbrt": 1,
    "ceil": 1, "copysign": 2, "cos": 1, "cosh": 1, "cospi": 1, "cyl_bessel_i0": 1,
    "cyl_bessel_i1": 1, "erfc": 1, "erfcinv": 1, "erfcx": 1, "erf": 1, "erfinv": 1, "exp10": 1,
    "exp2": 1, "exp": 1, "expm1": 1, "fabs": 1, "fdim": 2, "fdivide": 2, "floor": 1, "fma": 3,
    "fmax": 2, "fmin": 2, "fmod": 2, "hypot": 2, "j0": 1, "j1": 1, "lgamma": 1, "log10": 1,
    "log1p": 1, "log2": 1, "logb": 1, "log": 1, "nextafter": 2, "norm3d": 3, "norm4d": 4,
    "normcdf": 1, "normcdfinv": 1, "pow": 2, "rcbrt": 1, "remainder": 2, "rhypot": 2,
    "rnorm3d": 3, "rnorm4d": 4, "round": 1, "rsqrt": 1, "sin": 1, "sinh": 1, "sinpi": 1,
    "sqrt": 1, "tan": 1, "tanh": 1, "tgamma": 1, "trunc": 1, "y0": 1, "y1": 1,
    "min": 2, "max": 2,
}


@dataclass(frozen=True)
class Node:
    span: Span = field(compare=False, repr=False, kw_only=True)


# ---------------------------------------------------------------- expressions


@dataclass(frozen=True)
class Ident(Node):
    """A name: an index variable, a size name, a scalar, or a let-bound name (sema decides)."""

    name: str


@dataclass(frozen=True)
class IntLit(Node):
    value: int


@dataclass(frozen=True)
class FloatLit(Node):
    value: float


@dataclass(frozen=True)
class BoolLit(Node):
    value: bool


@dataclass(frozen=True)
class Access(Node):
    """``T(e1, ..., en)``: a tensor read (an index that is itself an access is a gather)."""

    tensor: Ident
    indices: tuple[Expr, ...]


@dataclass(frozen=True)
class Call(Node):
    """A built-in function call, ``exp(x)``, ``min(a, b)``."""

    func: str
    args: tuple[Expr, ...]


@dataclass(frozen=True)
class Cast(Node):
    """``float(e)``: conversion to the named scalar type (type name as written)."""

    dtype: str
    operand: Expr


@dataclass(frozen=True)
class Unary(Node):
    op: str  # "-" or "!"
    operand: Expr


@dataclass(frozen=True)
class Binary(Node):
    op: str  # one of BINARY_OPS
    lhs: Expr
    rhs: Expr


@dataclass(frozen=True)
class Ternary(Node):
    cond: Expr
    then: Expr
    orelse: Expr


@dataclass(frozen=True)
class DimRef(Node):
    """``T.k``: the size of dimension k of tensor T."""

    tensor: Ident
    dim: int


Expr = Ident | IntLit | FloatLit | BoolLit | Access | Call | Cast | Unary | Binary | Ternary | DimRef


# ---------------------------------------------------------------- where clauses


@dataclass(frozen=True)
class RangeConstraint(Node):
    """``where i in lo:hi`` (half-open)."""

    index: Ident
    lo: Expr
    hi: Expr


@dataclass(frozen=True)
class Let(Node):
    """``where x = expr``."""

    name: Ident
    value: Expr


@dataclass(frozen=True)
class Exists(Node):
    """``where exists expr``: the accesses in expr take part in range inference only."""

    expr: Expr


WhereClause = RangeConstraint | Let | Exists


# ---------------------------------------------------------------- statements and definitions


@dataclass(frozen=True)
class Stmt(Node):
    """``T(i, j) op rhs where ...``; ``op`` is one of ASSIGN_OPS, ``init`` marks the ``!`` form.

    ``equivalent`` is TC's ``<=> name(args)`` annotation (documentation: kept and printed,
    not checked, no effect on the program)."""

    tensor: Ident
    indices: tuple[Ident, ...]
    op: str
    init: bool
    rhs: Expr
    where: tuple[WhereClause, ...] = ()
    equivalent: Expr | None = None


@dataclass(frozen=True)
class Param(Node):
    """A parameter or a return: ``float(M, K) A``, ``float alpha``, or a bare output ``C``.

    ``dtype`` is the type name as written (None for a bare output); ``dims`` are size names
    (Ident) or integer constants (IntLit), None for a bare output, () for a scalar.
    """

    name: Ident
    dtype: str | None
    dims: tuple[Ident | IntLit, ...] | None


@dataclass(frozen=True)
class Def(Node):
    name: Ident
    params: tuple[Param, ...]
    returns: tuple[Param, ...]
    body: tuple[Stmt, ...]


@dataclass(frozen=True)
class Program(Node):
    defs: tuple[Def, ...]

    def get(self, name: str) -> Def | None:
        return next((d for d in self.defs if d.name.name == name), None)
