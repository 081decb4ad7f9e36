"""The TC IR: a typed, checked function, the output of semantic analysis.

Everything below the front end reads this and nothing else of the source: the reference
interpreter, the polyhedral model, the code generators. Invariants established by sema:

* every expression carries its *compute* dtype (half types never appear: loads of float16 /
  bfloat16 tensors are float32 values, stores round back); operands of a `Binary` arithmetic
  op already have the result type (sema inserts `Cast` nodes), comparisons give BOOL;
* `Statement.rhs.dtype == tensor.dtype.compute` for the tensor it writes;
* lets and ``T.k`` are substituted, literals are typed `Const`s;
* integer ``/`` and ``%`` on values follow C (truncate toward zero); inside tensor indices sema
  writes ``floordiv`` / ``floormod`` (isl's floor semantics), the only division allowed there;
* each statement iterates over the box given by its `IndexRange`s (half-open, bounds are
  `SizeExpr`s in the size parameters): lhs indices first, then reduction indices.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import islpy as isl

from .dtypes import DType
from .errors import Source, Span

__all__ = [
    "BINARY_OPS", "UNARY_OPS", "Binary", "Call", "Cast", "Const", "Expr", "Function", "Index",
    "IndexRange", "Read", "Reduction", "Role", "Select", "Size", "SizeExpr", "Statement",
    "Tensor", "Unary", "format_expr", "format_function", "format_statement", "fresh_name",
    "instance_count", "replace_indices", "walk",
]

# '/' and '%' truncate (C); 'floordiv'/'floormod' floor (index expressions only);
# 'min'/'max' come from the min/max built-ins; '&&' '||' are on BOOL operands.
BINARY_OPS = (
    "+", "-", "*", "/", "%", "floordiv", "floormod", "min", "max",
    "<", "<=", ">", ">=", "==", "!=", "&&", "||",
)
COMPARISONS = ("<", "<=", ">", ">=", "==", "!=")
UNARY_OPS = ("-", "!")


# ---------------------------------------------------------------- symbolic sizes

_ISL_CTX = isl.Context()


@dataclass(frozen=True)
class SizeExpr:
    """A size or bound as an integer function of the size parameters, held as isl text.

    ``isl`` is an `isl.PwAff` in isl syntax over the parameters, e.g. ``[N, K] -> { [(N - K + 1)] }``.
    """

    isl: str

    @classmethod
    def constant(cls, value: int) -> SizeExpr:
        return cls(f"{{ [({value})] }}")

    @classmethod
    def param(cls, name: str) -> SizeExpr:
        return cls(f"[{name}] -> {{ [({name})] }}")

    def pw_aff(self, ctx: isl.Context | None = None) -> isl.PwAff:
        return isl.PwAff.read_from_str(ctx or _ISL_CTX, self.isl)

    def evaluate(self, sizes: Mapping[str, int]) -> int:
        """The value for concrete sizes (every parameter the expression uses must be given)."""
        return _evaluate(self.isl, tuple(sorted(sizes.items())))

    @property
    def params(self) -> tuple[str, ...]:
        pa = self.pw_aff()
        return tuple(pa.get_dim_name(isl.dim_type.param, i) for i in range(pa.dim(isl.dim_type.param)))

    def __str__(self) -> str:
        text = self.isl
        body = text[text.index("{") + 1 : text.rindex("}")].strip()
        if body.startswith("[(") and body.endswith(")]") and ";" not in body:
            return body[2:-2].strip()
        return body


@functools.lru_cache(maxsize=4096)
def _evaluate(text: str, sizes: tuple[tuple[str, int], ...]) -> int:
    pa = isl.PwAff.read_from_str(_ISL_CTX, text)
    given = dict(sizes)
    for i in range(pa.dim(isl.dim_type.param)):
        name = pa.get_dim_name(isl.dim_type.param, i)
        if name not in given:
            raise KeyError(f"size {name} is not bound")
    names = [pa.get_dim_name(isl.dim_type.param, i) for i in range(pa.dim(isl.dim_type.param))]
    if names:
        cond = " and ".join(f"{n} = {given[n]}" for n in names)
        pa = pa.intersect_params(isl.Set.read_from_str(_ISL_CTX, f"[{', '.join(names)}] -> {{ : {cond} }}"))
    if pa.domain().is_empty():
        raise ValueError(f"{text} is undefined at {given}")
    val = pa.max_val()
    return int(val.to_python())


# ---------------------------------------------------------------- tensors


class Role(enum.Enum):
    INPUT = "input"
    OUTPUT = "output"
    TEMP = "temporary"


@dataclass(frozen=True)
class Tensor:
    """A tensor of the function (rank 0 for scalars). ``shape`` is row-major, symbolic."""

    name: str
    dtype: DType
    shape: tuple[SizeExpr, ...]
    role: Role
    span: Span | None = field(default=None, compare=False, repr=False)

    @property
    def rank(self) -> int:
        return len(self.shape)


# ---------------------------------------------------------------- expressions


@dataclass(frozen=True)
class Const:
    value: int | float | bool
    dtype: DType
    span: Span | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Index:
    """The value of an index variable of the enclosing statement (INT32 in value positions)."""

    name: str
    dtype: DType = DType.INT32
    span: Span | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Size:
    """The value of a size parameter (INT32 in value positions, as in TC)."""

    name: str
    dtype: DType = DType.INT32
    span: Span | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Read:
    """``tensor(indices)``; indices are integer expressions evaluated in 64-bit arithmetic.

    ``dtype`` is the tensor's compute type. An index containing a `Read` makes this a gather.
    """

    tensor: str
    indices: tuple[Expr, ...]
    dtype: DType
    span: Span | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Unary:
    op: str
    operand: Expr
    dtype: DType
    span: Span | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Binary:
    op: str
    lhs: Expr
    rhs: Expr
    dtype: DType
    span: Span | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Select:
    cond: Expr
    then: Expr
    orelse: Expr
    dtype: DType
    span: Span | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Call:
    """A built-in (names as in `tcmlir.lang.ast.BUILTINS`, without min/max) on float operands."""

    func: str
    args: tuple[Expr, ...]
    dtype: DType
    span: Span | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Cast:
    operand: Expr
    dtype: DType
    span: Span | None = field(default=None, compare=False, repr=False)


Expr = Const | Index | Size | Read | Unary | Binary | Select | Call | Cast


def children(expr: Expr) -> tuple[Expr, ...]:
    match expr:
        case Read(indices=idx):
            return idx
        case Unary(operand=x) | Cast(operand=x):
            return (x,)
        case Binary(lhs=a, rhs=b):
            return (a, b)
        case Select(cond=c, then=t, orelse=e):
            return (c, t, e)
        case Call(args=args):
            return args
    return ()


def walk(expr: Expr) -> Iterator[Expr]:
    """Pre-order traversal of an expression tree."""
    yield expr
    for child in children(expr):
        yield from walk(child)


def replace_indices(expr: Expr, f: Callable[[Index], Expr]) -> Expr:
    """``expr`` with every `Index` node ``i`` replaced by ``f(i)`` (renaming or substituting
    index variables; the rest of the tree is rebuilt around the replacements)."""
    match expr:
        case Index():
            return f(expr)
        case Read(indices=idx):
            return dataclasses.replace(expr, indices=tuple(replace_indices(x, f) for x in idx))
        case Unary(operand=x) | Cast(operand=x):
            return dataclasses.replace(expr, operand=replace_indices(x, f))
        case Binary(lhs=a, rhs=b):
            return dataclasses.replace(expr, lhs=replace_indices(a, f), rhs=replace_indices(b, f))
        case Select(cond=c, then=t, orelse=o):
            return dataclasses.replace(expr, cond=replace_indices(c, f), then=replace_indices(t, f),
                                       orelse=replace_indices(o, f))
        case Call(args=args):
            return dataclasses.replace(expr, args=tuple(replace_indices(a, f) for a in args))
    return expr


# ---------------------------------------------------------------- statements and functions


class Reduction(enum.Enum):
    ADD = "+"
    MUL = "*"
    MIN = "min"
    MAX = "max"

    def identity(self, dtype: DType) -> int | float | bool:
        """The neutral element (the value `!` initialises with)."""
        if self is Reduction.ADD:
            return False if dtype is DType.BOOL else (0.0 if dtype.is_float else 0)
        if self is Reduction.MUL:
            return True if dtype is DType.BOOL else (1.0 if dtype.is_float else 1)
        if dtype.is_float:
            return float("inf") if self is Reduction.MIN else float("-inf")
        if dtype is DType.BOOL:
            return self is Reduction.MIN
        import numpy as np

        info = np.iinfo(dtype.numpy)
        return int(info.max) if self is Reduction.MIN else int(info.min)


@dataclass(frozen=True)
class IndexRange:
    """An index variable iterating over ``[lo, hi)``."""

    name: str
    lo: SizeExpr
    hi: SizeExpr


@dataclass(frozen=True)
class Statement:
    """``tensor(lhs) op rhs`` over the box ``ranges``.

    ``reduction`` is None for ``=``; ``init`` is True for the ``!`` forms, which first set the
    written part of the tensor (the lhs indices' box) to the reduction's identity.
    """

    tensor: str
    lhs: tuple[str, ...]
    reduction: Reduction | None
    init: bool
    rhs: Expr
    ranges: tuple[IndexRange, ...]
    span: Span | None = field(default=None, compare=False, repr=False)

    @property
    def index_names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.ranges)

    @property
    def reduction_indices(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.ranges if r.name not in self.lhs)

    def range_of(self, name: str) -> IndexRange:
        return next(r for r in self.ranges if r.name == name)


@dataclass(frozen=True)
class Function:
    """A checked TC definition.

    ``sizes`` are the size parameters in order of first appearance; ``context`` is an isl set
    over them (sizes >= 1 and whatever the program implies). ``inputs`` and ``outputs`` follow
    the signature's order; ``temporaries`` are the other tensors written (not returned).
    ``preconditions`` are the conditions on the sizes (isl syntax over the size names, already
    part of ``context``) that some access needs to stay in bounds and that the program implies
    without stating (e.g. ``L >= 2``); a call with sizes outside them is a `CallError`.
    """

    name: str
    sizes: tuple[str, ...]
    context: str
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    temporaries: tuple[Tensor, ...]
    statements: tuple[Statement, ...]
    source: Source | None = field(default=None, compare=False, repr=False)
    preconditions: tuple[str, ...] = ()

    @property
    def tensors(self) -> tuple[Tensor, ...]:
        return self.inputs + self.outputs + self.temporaries

    def tensor(self, name: str) -> Tensor:
        try:
            return self._tensor_by_name[name]
        except KeyError:
            raise KeyError(name) from None

    def tensor_position(self, name: str) -> int:
        """The position of tensor ``name`` in ``tensors`` (KeyError if there is none)."""
        return self._tensor_position[name]

    @functools.cached_property
    def _tensor_by_name(self) -> dict[str, Tensor]:
        """`tensor`'s table, made once: code generation looks a tensor up per access, and a
        scan of ``tensors`` made that quadratic in a definition of many tensors."""
        return {t.name: t for t in self.tensors}

    @functools.cached_property
    def _tensor_position(self) -> dict[str, int]:
        return {t.name: i for i, t in enumerate(self.tensors)}

    def first_writer(self, name: str) -> int | None:
        """The number of the first statement that writes tensor ``name`` (None: none does)."""
        return self._first_writer.get(name)

    @functools.cached_property
    def _first_writer(self) -> dict[str, int]:
        first: dict[str, int] = {}
        for k, st in enumerate(self.statements):
            first.setdefault(st.tensor, k)
        return first

    def __str__(self) -> str:
        return format_function(self)


def fresh_name(base: str, taken: set[str]) -> str:
    """``base``, or ``base2``, ``base3``, ... : the first not in ``taken`` (names a pass adds:
    temporaries, indices)."""
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}{n}"
    return name


def instance_count(fn: Function, sizes: Mapping[str, int]) -> int:
    """Statement instances of ``fn`` at ``sizes``, each statement counted over its whole box
    (what the interpreter runs; the host plan's threading threshold and the tuner's reference
    budget use it)."""
    total = 0
    for st in fn.statements:
        n = 1
        for r in st.ranges:
            n *= max(0, r.hi.evaluate(sizes) - r.lo.evaluate(sizes))
        total += n
    return total


# ---------------------------------------------------------------- readable text


def format_expr(e: Expr) -> str:
    """An expression as text (``python -m tcmlir.dump --stage ir``)."""
    match e:
        case Const(value=v, dtype=t):
            return f"{v!r}:{t}"
        case Index(name=n) | Size(name=n):
            return n
        case Read(tensor=t, indices=idx):
            return f"{t}({', '.join(map(format_expr, idx))})" if idx else t
        case Unary(op=op, operand=x):
            return f"{op}{format_expr(x)}"
        case Binary(op=op, lhs=a, rhs=b) if op in ("min", "max", "floordiv", "floormod"):
            return f"{op}({format_expr(a)}, {format_expr(b)})"
        case Binary(op=op, lhs=a, rhs=b):
            return f"({format_expr(a)} {op} {format_expr(b)})"
        case Select(cond=c, then=t, orelse=f):
            return f"({format_expr(c)} ? {format_expr(t)} : {format_expr(f)})"
        case Call(func=f, args=args):
            return f"{f}({', '.join(map(format_expr, args))})"
        case Cast(operand=x, dtype=t):
            return f"{t}({format_expr(x)})"
    raise AssertionError(f"unknown IR node {e!r}")


def format_statement(s: Statement) -> str:
    """A statement as text: ``lhs op rhs  for ranges``."""
    lhs = f"{s.tensor}({', '.join(s.lhs)})" if s.lhs else s.tensor
    op = "=" if s.reduction is None else ("+=" if s.reduction.value == "+" else
                                         "*=" if s.reduction.value == "*" else f"{s.reduction.value}=")
    bang = "!" if s.init else ""
    ranges = ", ".join(f"{r.name} in [{r.lo}, {r.hi})" for r in s.ranges)
    return f"{lhs} {op}{bang} {format_expr(s.rhs)}  for {ranges}" if ranges else \
        f"{lhs} {op}{bang} {format_expr(s.rhs)}"


def format_function(fn: Function) -> str:
    """A function as text: its signature, sizes, preconditions, temporaries and statements
    (`Function.__str__`)."""
    def sig(t: Tensor) -> str:
        dims = ", ".join(str(d) for d in t.shape)
        return f"{t.dtype}({dims}) {t.name}" if t.shape else f"{t.dtype} {t.name}"

    lines = [f"func {fn.name}({', '.join(map(sig, fn.inputs))}) -> ({', '.join(map(sig, fn.outputs))})"]
    lines.append(f"  sizes: {', '.join(fn.sizes) or '-'}   context: {fn.context}")
    for cond in fn.preconditions:
        lines.append(f"  requires {cond}")
    for t in fn.temporaries:
        lines.append(f"  temporary {sig(t)}")
    for k, s in enumerate(fn.statements):
        lines.append(f"  S{k}: {format_statement(s)}")
    return "\n".join(lines)
