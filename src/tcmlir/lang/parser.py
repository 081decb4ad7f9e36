"""TC parser: tokens (from `tcmlir.lang.lexer`) -> `tcmlir.lang.ast.Program`.

Recursive descent for definitions and statements, an operator-precedence loop for binary
expressions (TC's table in `ast.BINARY_OPS`, all left-associative; ``?:`` lowest and
right-associative; unary ``-``/``!`` highest). Semantic checks (names, types, ranges) are
`tcmlir.lang.sema`'s job; the parser only checks the shape of the text (and built-in arity).

Every failure is a located `ParseError` that says what was expected and what was found. Deep
nesting is bounded (`MAX_DEPTH`) so that no input gives a RecursionError here or in the passes
that later walk the AST recursively.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from ..errors import ParseError, Source, Span
from . import ast
from .lexer import TYPE_NAMES, Token, tokenize_source

__all__ = ["MAX_DEPTH", "did_you_mean", "parse_program"]

# Deepest expression tree (and deepest parenthesis nesting) the parser accepts.
MAX_DEPTH = 200

_PRECEDENCE = {op: level + 1 for level, ops in enumerate(ast.BINARY_OPS) for op in ops}
_ASSIGN_TOKENS = {
    "=": ("=", False), "+=": ("+=", False), "*=": ("*=", False), "min=": ("min=", False),
    "max=": ("max=", False), "+=!": ("+=", True), "*=!": ("*=", True),
    "min=!": ("min=", True), "max=!": ("max=", True),
}
_DEPTH_FIX = "split the expression with `where x = ...` lets or intermediate tensors"


class _Parser:
    def __init__(self, source: Source):
        self.source = source
        self.tokens = tokenize_source(source)
        self.pos = 0
        self.nesting = 0  # open nested parse_expr calls
        self.depths: dict[int, int] = {}  # id(expr node) -> height of its tree

    # ------------------------------------------------------------ token helpers

    @property
    def tok(self) -> Token:
        return self.tokens[self.pos]

    def peek(self, k: int = 1) -> Token:
        return self.tokens[min(self.pos + k, len(self.tokens) - 1)]

    def advance(self) -> Token:
        tok = self.tokens[self.pos]
        if tok.kind != "EOF":
            self.pos += 1
        return tok

    def accept(self, kind: str) -> Token | None:
        return self.advance() if self.tok.kind == kind else None

    def error(self, span: Span, what: str, fix: str | None = None) -> ParseError:
        err = ParseError.at(self.source, span, what, fix)
        assert isinstance(err, ParseError)
        return err

    def unexpected(self, expected: str, fix: str | None = None) -> ParseError:
        return self.error(self.tok.span, f"expected {expected} but found {self.tok.describe()}", fix)

    def expect(self, kind: str, expected: str | None = None, fix: str | None = None) -> Token:
        if self.tok.kind != kind:
            raise self.unexpected(expected or repr(kind), fix)
        return self.advance()

    def ident(self, what: str) -> ast.Ident:
        tok = self.tok
        if tok.kind != "IDENT":
            fix = None
            if tok.kind in ("TYPE", "def", "where", "in", "exists", "min", "max", "true", "false"):
                fix = f"{tok.text!r} is reserved; choose another name"
            raise self.unexpected(what, fix)
        self.advance()
        return ast.Ident(tok.text, span=tok.span)

    # ------------------------------------------------------------ definitions

    def program(self) -> ast.Program:
        defs: list[ast.Def] = []
        seen: dict[str, ast.Def] = {}
        while self.tok.kind != "EOF" or not defs:
            if self.tok.kind != "def":
                fix = None if defs else "a TC source holds one or more `def name(...) -> (...) { ... }`"
                raise self.unexpected("'def'", fix)
            d = self.definition()
            first = seen.get(d.name.name)
            if first is not None:
                raise self.error(d.name.span, f"duplicate definition of {d.name.name!r} "
                                 f"(first defined on line {first.span.line})",
                                 "give each def its own name")
            seen[d.name.name] = d
            defs.append(d)
        return ast.Program(tuple(defs), span=defs[0].span.merge(defs[-1].span))

    def definition(self) -> ast.Def:
        start = self.expect("def").span
        name = self.ident("a definition name")
        self.expect("(", "'(' after the definition name")
        params: list[ast.Param] = []
        if self.tok.kind != ")":
            params.append(self.param(output=False))
            while self.accept(","):
                params.append(self.param(output=False))
        self.expect(")", "',' or ')' in the parameter list")
        self.expect("->", "'->' after the parameters")
        self.expect("(", "'(' before the outputs")
        if self.tok.kind == ")":
            raise self.error(self.tok.span, "a definition needs at least one output",
                             "name the outputs: `-> (C)`")
        returns = [self.param(output=True)]
        while self.accept(","):
            returns.append(self.param(output=True))
        self.expect(")", "',' or ')' in the output list")
        brace = self.expect("{", "'{' to open the body")
        body: list[ast.Stmt] = []
        while self.tok.kind != "}":
            if self.tok.kind in ("EOF", "def"):  # point at the brace left open, not at the end
                raise self.error(brace.span, f"'{{' of def {name.name} is never closed "
                                 f"(found {self.tok.describe()})", "close the definition with '}'")
            body.append(self.statement())
        end = self.advance().span
        return ast.Def(name, tuple(params), tuple(returns), tuple(body), span=start.merge(end))

    def param(self, output: bool) -> ast.Param:
        if self.tok.kind == "IDENT" and self.peek().kind in ("(", "IDENT"):  # a misspelt type
            raise self.error(self.tok.span, f"unknown type {self.tok.text}",
                             did_you_mean(self.tok.text, TYPE_NAMES)
                             or f"the types are {', '.join(sorted(TYPE_NAMES))}")
        if output and self.tok.kind == "IDENT":
            name = self.ident("an output name")
            return ast.Param(name, None, None, span=name.span)
        if self.tok.kind != "TYPE":
            what = "an output (`C` or `float(M, N) C`)" if output else "a parameter type (e.g. `float(M, K) A`)"
            raise self.unexpected(what)
        dtype = self.advance()
        dims: list[ast.Ident | ast.IntLit] = []
        if self.accept("("):
            if self.tok.kind != ")":
                dims.append(self.dim())
                while self.accept(","):
                    dims.append(self.dim())
            self.expect(")", "',' or ')' in the dimension list")
        name = self.ident("a tensor name after the type")
        return ast.Param(name, dtype.text, tuple(dims), span=dtype.span.merge(name.span))

    def dim(self) -> ast.Ident | ast.IntLit:
        tok = self.tok
        if tok.kind == "INT":
            self.advance()
            return ast.IntLit(int(tok.value or 0), span=tok.span)
        if tok.kind == "IDENT":
            return self.ident("a dimension")
        raise self.unexpected("a dimension (a size name or an integer)")

    # ------------------------------------------------------------ statements

    def statement(self) -> ast.Stmt:
        if self.tok.kind != "IDENT":
            fix = "close the definition with '}'" if self.tok.kind in ("EOF", "def") else None
            if self.tok.kind == "[":
                fix = "TC indexes tensors with parentheses: `A(i, j)`"
            raise self.unexpected("a statement (`C(i) = ...`) or '}'", fix)
        tensor = self.ident("a tensor name")
        indices: list[ast.Ident] = []
        if self.accept("("):
            if self.tok.kind != ")":
                indices.append(self.lhs_index())
                while self.accept(","):
                    indices.append(self.lhs_index())
            self.expect(")", "',' or ')' in the left-hand side indices")
        op_tok = self.tok
        if op_tok.kind not in _ASSIGN_TOKENS:
            raise self.bad_assign_op()
        self.advance()
        op, init = _ASSIGN_TOKENS[op_tok.kind]
        if op == "=" and self.tok.kind in ("!", "!=") and self.tok.span.start == op_tok.span.end:
            raise self.error(op_tok.span.merge(self.tok.span), "'=!' is not an operator",
                             "use `+=!` (or `*=!`, `min=!`, `max=!`) for an initialising "
                             "reduction, or `=` (with a space before a `!` operand)")
        rhs = self.expr()
        equivalent = self.equivalent()  # TC writes it before the where clauses
        where: list[ast.WhereClause] = []
        if self.accept("where"):
            where.append(self.clause())
            while self.accept(","):
                where.append(self.clause())
        if equivalent is None:
            equivalent = self.equivalent()
        end = max((n.span for n in (rhs, *where, equivalent) if n is not None),
                  key=lambda sp: sp.end)
        return ast.Stmt(tensor, tuple(indices), op, init, rhs, tuple(where), equivalent,
                        span=tensor.span.merge(end))

    def equivalent(self) -> ast.Expr | None:
        """TC's ``<=> name(args)`` annotation, or None."""
        if not self.accept("<=>"):
            return None
        if self.tok.kind != "IDENT":
            raise self.unexpected("a comprehension after '<=>' (e.g. `<=> matmul(A(i, k), B(k, j))`)")
        return self.operand()

    def lhs_index(self) -> ast.Ident:
        if self.tok.kind != "IDENT":
            raise self.unexpected("an index name", "left-hand side indices are plain names; "
                                  "move computed indices to the right-hand side")
        tok = self.advance()
        if self.tok.kind not in (",", ")"):
            raise self.unexpected("',' or ')' in the left-hand side indices",
                                  "left-hand side indices are plain names; move computed "
                                  "indices to the right-hand side")
        return ast.Ident(tok.text, span=tok.span)

    def bad_assign_op(self) -> ParseError:
        tok = self.tok
        fix = "TC's statement operators are =, +=, *=, min=, max= and +=!, *=!, min=!, max=!"
        if tok.kind in ("min", "max") and self.peek().kind in ("=", "==", "!", "!="):
            fix = f"write `{tok.text}=` without a space"
        elif tok.kind in ("-", "/", "%") and self.peek().kind == "=":
            fix = f"TC has no '{tok.text}='; write `C(i) = C(i) {tok.text} ...` or use +=/*="
        elif tok.kind == "==":
            fix = "assignment is a single `=`"
        return self.unexpected("an assignment operator (=, +=, *=, min=, max=, or +=! ...)", fix)

    def clause(self) -> ast.WhereClause:
        tok = self.tok
        if tok.kind == "exists":
            self.advance()
            e = self.expr()
            return ast.Exists(e, span=tok.span.merge(e.span))
        if tok.kind != "IDENT":
            fix = "write `where i in lo:hi`, `where x = expr` or `where exists expr`"
            raise self.unexpected("a where clause", fix)
        name = self.ident("an index name")
        if self.accept("in"):
            lo = self.expr()
            self.expect(":", "':' between the bounds of the range")
            hi = self.expr()
            return ast.RangeConstraint(name, lo, hi, span=name.span.merge(hi.span))
        if self.accept("="):
            value = self.expr()
            return ast.Let(name, value, span=name.span.merge(value.span))
        raise self.unexpected("'in' or '=' in the where clause",
                              "write `where i in lo:hi` or `where x = expr`")

    # ------------------------------------------------------------ expressions

    def node(self, n: ast.Expr, *children: ast.Expr) -> ast.Expr:
        """Record the height of ``n``'s tree and reject trees deeper than MAX_DEPTH."""
        height = 1 + max((self.depths.get(id(c), 1) for c in children), default=0)
        if height > MAX_DEPTH:
            raise self.error(n.span, f"expression nested too deeply (more than {MAX_DEPTH} levels)",
                             _DEPTH_FIX)
        self.depths[id(n)] = height
        return n

    def expr(self) -> ast.Expr:
        """A full expression, ``?:`` included.

        Binary operators go by precedence with explicit stacks and ternaries chain to the right
        in a loop, so that one nesting level costs two Python frames (expr -> operand -> expr).
        """
        self.nesting += 1
        if self.nesting > MAX_DEPTH:
            raise self.error(self.tok.span, "expression nested too deeply "
                             f"(more than {MAX_DEPTH} levels)", _DEPTH_FIX)
        try:
            arms: list[tuple[ast.Expr, ast.Expr]] = []
            while True:
                operands = [self.operand()]
                operators: list[str] = []
                while self.tok.kind in _PRECEDENCE:
                    level = _PRECEDENCE[self.tok.kind]
                    while operators and _PRECEDENCE[operators[-1]] >= level:
                        self.reduce(operands, operators)
                    operators.append(self.advance().kind)
                    operands.append(self.operand())
                while operators:
                    self.reduce(operands, operators)
                e = operands[0]
                if not self.accept("?"):
                    break
                then = self.expr()
                self.expect(":", "':' in the conditional expression")
                arms.append((e, then))
            for cond, then in reversed(arms):
                e = self.node(ast.Ternary(cond, then, e, span=cond.span.merge(e.span)), cond, then, e)
            return e
        finally:
            self.nesting -= 1

    def reduce(self, operands: list[ast.Expr], operators: list[str]) -> None:
        rhs, lhs = operands.pop(), operands.pop()
        binary = ast.Binary(operators.pop(), lhs, rhs, span=lhs.span.merge(rhs.span))
        operands.append(self.node(binary, lhs, rhs))

    def operand(self) -> ast.Expr:
        """Prefix ``-``/``!`` (collected in a loop) applied to a primary expression."""
        prefix: list[Token] = []
        while self.tok.kind in ("-", "!"):
            prefix.append(self.advance())
        tok = self.tok
        kind = tok.kind
        if kind == "INT":
            self.advance()
            e = self.node(ast.IntLit(int(tok.value or 0), span=tok.span))
        elif kind == "FLOAT":
            self.advance()
            e = self.node(ast.FloatLit(float(tok.value or 0.0), span=tok.span))
        elif kind in ("true", "false"):
            self.advance()
            e = self.node(ast.BoolLit(kind == "true", span=tok.span))
        elif kind == "(":
            self.advance()
            e = self.expr()
            self.expect(")", "')' to close the parenthesis")
        elif kind == "TYPE":
            self.advance()
            self.expect("(", f"'(' after the type name {tok.text!r} (a cast is `{tok.text}(e)`)")
            inner = self.expr()
            end = self.expect(")", "')' to close the cast").span
            e = self.node(ast.Cast(tok.text, inner, span=tok.span.merge(end)), inner)
        elif kind in ("min", "max", "IDENT"):
            self.advance()
            builtin = kind != "IDENT" or (tok.text in ast.BUILTINS and self.tok.kind == "(")
            if self.tok.kind == "(":
                # Arguments parsed inline (not in a helper) to keep nesting cheap in frames.
                self.advance()
                args: list[ast.Expr] = []
                if self.tok.kind != ")":
                    args.append(self.expr())
                    while self.accept(","):
                        args.append(self.expr())
                end = self.expect(")", "',' or ')' in the argument list").span
                span = tok.span.merge(end)
                if builtin:
                    self.check_arity(tok.text, len(args), span)
                    e = self.node(ast.Call(tok.text, tuple(args), span=span), *args)
                else:
                    e = self.node(ast.Access(ast.Ident(tok.text, span=tok.span), tuple(args),
                                             span=span), *args)
            elif builtin:
                raise self.unexpected(f"'(' after the built-in {tok.text!r}")
            elif self.tok.kind == ".":
                self.advance()
                dim = self.expect("INT", "a dimension number after '.' (as in `A.1`)")
                e = self.node(ast.DimRef(ast.Ident(tok.text, span=tok.span), int(dim.value or 0),
                                         span=tok.span.merge(dim.span)))
            else:
                e = self.node(ast.Ident(tok.text, span=tok.span))
        else:
            fix = None
            if kind in ("min=", "max=", "min=!", "max=!"):
                fix = f"{kind!r} is a statement operator; the built-in is `{kind[:3]}(a, b)`"
            raise self.unexpected("an expression", fix)
        for op in reversed(prefix):
            e = self.node(ast.Unary(op.kind, e, span=op.span.merge(e.span)), e)
        return e

    def check_arity(self, func: str, given: int, span: Span) -> None:
        arity = ast.BUILTINS[func]
        if given != arity:
            noun = "argument" if arity == 1 else "arguments"
            raise self.error(span, f"{func} takes {arity} {noun}, but {given} "
                             f"{'was' if given == 1 else 'were'} given", f"{func} takes {arity} {noun}")


def did_you_mean(name: str, candidates: Iterable[str]) -> str | None:
    """``did you mean `x`?`` for the closest candidate (difflib's), or None."""
    close = difflib.get_close_matches(name, sorted(candidates), n=1)
    return f"did you mean `{close[0]}`?" if close else None


def parse_program(text: str, name: str = "<string>") -> ast.Program:
    """Parse TC source (one or more ``def``s) into an `ast.Program`; errors are `ParseError`."""
    parser = _Parser(Source(text, name))
    try:
        return parser.program()
    except RecursionError:  # pragma: no cover - MAX_DEPTH keeps normal stacks well clear
        raise parser.error(parser.tok.span, "expression nested too deeply", _DEPTH_FIX) from None
