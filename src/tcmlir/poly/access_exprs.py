"""Buffer access expressions of AST user nodes, composed in Python (issue 31).

A promoted access of statement ``S`` to buffer ``b`` has buffer coordinates that are a
quasi-affine function ``la`` of the statement's instance (`promotion.local_index`): the same
for every user node of ``S``. A user node is a call ``S(e0, e1, ...)`` whose arguments are
isl AST expressions of the loop iterators and parameters, affine in them after isl's own
simplification (an unrolled 8x8 register tile: ``S0(128 * _by + 8 * _ty + 1, ..., 16 * c2)``).
So the node's coordinates are ``la(e0, e1, ...)``: this module turns ``la`` once per statement,
buffer and access into a `Template` (exact rational coefficients and nested floor divisions),
and per node substitutes the arguments and simplifies with exact rules:

* ``floor((d*Q + R) / d) = Q + floor(R / d)`` (each coefficient split by floor division, so
  the remainder's coefficients lie in ``[0, d)``), and ``floor(r / d) = 0`` for a constant
  ``0 <= r < d``;
* ``floor((g*X + c) / (g*e)) = floor((X + floor(c / g)) / e)`` for ``g`` dividing every
  non-constant coefficient (``X`` integer);
* ``X - e*floor(X / e)`` is ``X mod e``, printed ``X % e`` (isl's ``pdiv_r``) when the caller
  proves ``X >= 0`` on the node, and ``X`` when it proves ``0 <= X < e`` (`compose`'s
  ``nonneg``, from the node's iterator and parameter ranges); a plain argument (a copy's
  element coordinate) is the argument itself. An argument that divides an iterator (isl
  wrote the node's instances piecewise) is left to isl.

The result is built as isl AST expressions in isl's own order (remainders first, then the
terms in the order their atoms first appear in the arguments, the constant last), which is
what isl's ``access_from_pw_multi_aff`` prints for these nodes, so the generated code does not
change. Anything else — a piecewise ``la``, a floor that does not simplify, a negative
coefficient, a remainder not proved non-negative — returns None and the caller asks isl
(`node_accesses.annotate_user_node`), as it did for every node before.
"""

from __future__ import annotations

import re
from fractions import Fraction
from math import gcd

import islpy as isl

__all__ = ["Arguments", "Template", "compose", "linear_of", "template_of"]

_T = isl.ast_expr_op_type
_ITERATOR = re.compile(r"^c\d+$")  # isl's names of the AST's loop iterators
_ITERATOR_IN = re.compile(r"\bc\d+\b")


class _Fail(Exception):
    """The composition needs isl (see the module docstring)."""


class Template:
    """One buffer coordinate of a statement's access as a function of its instance:
    ``form / den``, ``form`` an integer linear form over ``("in", i)`` (the statement's
    dimension i), ``("p", name)`` (a parameter) and ``("div", j)`` (``floor(divs[j][0] /
    divs[j][1])``, over the same atoms); ``params`` ranks the parameters as their space does."""

    __slots__ = ("den", "divs", "form", "params", "plain")

    def __init__(self, form: tuple[dict, int], divs: list[tuple[dict, int]], params: dict[str, int]):
        (self.form, self.den), self.divs, self.params = form, divs, params
        atoms = [a for a in self.form if a != 1]
        # a plain argument: the statement's dimension i itself (a copy's element coordinate)
        self.plain = (atoms[0][1] if self.den == 1 and len(self.form) == 1 and len(atoms) == 1
                      and atoms[0][0] == "in" and self.form[atoms[0]] == 1 else None)


def _form_of(aff: isl.Aff, n_div: int) -> tuple[dict, int]:
    """``aff`` as an integer linear form over a common denominator."""
    terms: list = [(1, aff.get_constant_val())]
    for i in range(aff.dim(isl.dim_type.in_)):
        terms.append((("in", i), aff.get_coefficient_val(isl.dim_type.in_, i)))
    for i in range(aff.dim(isl.dim_type.param)):
        terms.append((("p", aff.get_dim_name(isl.dim_type.param, i)),
                      aff.get_coefficient_val(isl.dim_type.param, i)))
    for j in range(min(n_div, aff.dim(isl.dim_type.div))):
        terms.append((("div", j), aff.get_coefficient_val(isl.dim_type.div, j)))
    fracs = [(k, Fraction(str(v))) for k, v in terms]
    den = 1
    for _, v in fracs:
        den = den * v.denominator // gcd(den, v.denominator)
    return {k: int(v * den) for k, v in fracs if v}, den


def template_of(pma: isl.PwMultiAff) -> list[Template] | None:
    """The coordinates of ``pma`` as `Template`s, or None when it has several pieces."""
    if pma.n_piece() != 1:
        return None
    pieces: list = []
    pma.foreach_piece(lambda _s, ma: pieces.append(ma))
    ma = pieces[0]
    space = ma.get_space()
    params = {space.get_dim_name(isl.dim_type.param, i): i
              for i in range(space.dim(isl.dim_type.param))}
    out = []
    for d in range(ma.dim(isl.dim_type.out)):
        aff = ma.get_at(d)
        n = aff.dim(isl.dim_type.div)
        divs = [_form_of(aff.get_div(j), j) for j in range(n)]
        out.append(Template(_form_of(aff, n), divs, params))
    return out


# ---------------------------------------------------------------- linear forms of AST expressions


class Arguments:
    """A user node's call arguments as integer linear forms (`linear_of`), parsed once."""

    __slots__ = ("exprs", "lins", "opaque", "order", "wild")

    def __init__(self, exprs: tuple[isl.AstExpr, ...]):
        self.exprs = exprs
        self.opaque: dict = {}
        self.order: dict = {}
        self.lins = [linear_of(a, self.opaque, self.order) for a in exprs]
        # arguments that divide an iterator: isl wrote the node's instances piecewise
        self.wild = {i for i, lin in enumerate(self.lins)
                     if any(isinstance(a, tuple) and _ITERATOR_IN.search(a[1]) for a in lin)}


def linear_of(expr: isl.AstExpr, opaque: dict, order: dict) -> dict:
    """``expr`` as a linear form ``{atom: int, 1: constant}``: atoms are id names and, for any
    other operation (``/``, ``%``, ``min``, ...), ``("x", text)`` with the expression kept in
    ``opaque``; ``order`` records the rank of each atom's first appearance."""
    kind = expr.get_type()
    if kind == isl.ast_expr_type.int:
        v = int(expr.get_val().to_python())
        return {1: v} if v else {}
    if kind == isl.ast_expr_type.id:
        name = expr.get_id().get_name()
        order.setdefault(name, len(order))
        return {name: 1}
    op = expr.get_op_type()
    n = expr.get_op_n_arg()
    if op in (_T.add, _T.sub) and n == 2:
        a = linear_of(expr.get_op_arg(0), opaque, order)
        b = linear_of(expr.get_op_arg(1), opaque, order)
        return _add(a, b, 1 if op == _T.add else -1)
    if op == _T.minus and n == 1:
        return _scale(linear_of(expr.get_op_arg(0), opaque, order), -1)
    if op == _T.mul and n == 2:
        a, b = expr.get_op_arg(0), expr.get_op_arg(1)
        if a.get_type() == isl.ast_expr_type.int:
            return _scale(linear_of(b, opaque, order), int(a.get_val().to_python()))
        if b.get_type() == isl.ast_expr_type.int:
            return _scale(linear_of(a, opaque, order), int(b.get_val().to_python()))
    key = ("x", expr.to_C_str())
    opaque[key] = expr
    order.setdefault(key, len(order))
    return {key: 1}


def _add(a: dict, b: dict, sign: int = 1) -> dict:
    out = dict(a)
    for k, v in b.items():
        w = out.get(k, 0) + sign * v
        if w:
            out[k] = w
        else:
            out.pop(k, None)
    return out


def _scale(a: dict, c: int) -> dict:
    return {k: v * c for k, v in a.items()} if c else {}


# ---------------------------------------------------------------- composition


def _eval(form: dict, t: Template, args: list[dict], divs: dict) -> dict:
    """The integer linear form ``form`` (of ``t``) over the node's atoms."""
    out: dict = {}
    for atom, c in form.items():
        if atom == 1:
            term = {1: c}
        elif atom[0] == "in":
            term = _scale(args[atom[1]], c)
        elif atom[0] == "p":
            term = {atom[1]: c}
        else:
            j = atom[1]
            if j not in divs:
                num, den = t.divs[j]
                divs[j] = _floor_int(_eval(num, t, args, divs), den)
            term = _scale(divs[j], c)
        out = _add(out, term)
    return out


def _floor_int(num: dict, den: int) -> dict:
    """``floor(num / den)`` simplified by the exact rules of the module docstring; what does
    not simplify is a floor atom ``("F", X, d)`` (``floor(X / d)``, X's coefficients in
    [0, d))."""
    if den == 1:
        return num
    quot: dict = {}
    rest: dict = {}
    for k, v in num.items():
        q, r = divmod(v, den)
        if q:
            quot[k] = q
        if r:
            rest[k] = r
    const = rest.pop(1, 0)
    if not rest:  # 0 <= const < den
        return quot
    g = den
    for v in rest.values():
        g = gcd(g, v)
    if g > 1:  # floor((g*X + c) / (g*e)) = floor((X + floor(c/g)) / e)
        red = {k: v // g for k, v in rest.items()}
        if const // g:
            red[1] = const // g
        return _add(quot, _floor_int(red, den // g))
    if const:
        rest[1] = const
    atom = ("F", tuple(sorted(rest.items(), key=lambda kv: repr(kv[0]))), den)
    return _add(quot, {atom: 1})


def _remainders(form: dict) -> dict:
    """``form`` with each ``a*X - a*e*floor(X/e)`` written ``a * ("R", X, e)`` (``X mod e``)."""
    for atom in [a for a in form if a != 1 and a[0] == "F"]:
        c = form[atom]
        e = atom[2]
        if c % e:
            raise _Fail
        alpha = -c // e  # form = (form - alpha*X - c*F) + alpha*(X - e*F)
        form = _add(_add(form, _scale(dict(atom[1]), alpha), -1), {atom: c}, -1)
        form = _add(form, {("R", atom[1], e): alpha})
    return form


def compose(templates: list[Template], args: Arguments, ctx: isl.Context,
            nonneg) -> list[isl.AstExpr] | None:
    """The coordinates of ``templates`` at a user node with call arguments ``args``, as isl
    AST expressions. ``nonneg(form, e)`` bounds a linear form on the node (for a
    remainder ``X mod e``): None if it may be negative, False if it is in ``[0, e)``, True if
    it is >= 0. None: isl must compute them (see the module docstring)."""
    out = []
    try:
        for t in templates:
            if t.plain is not None:
                if t.plain in args.wild:
                    return None
                out.append(args.exprs[t.plain])
                continue
            used = {a[1] for f in (t.form, *(d[0] for d in t.divs)) for a in f
                    if a != 1 and a[0] == "in"}
            if used & args.wild:
                return None
            form = _eval(t.form, t, args.lins, {})
            if t.den != 1:
                if any(v % t.den for v in form.values()):
                    return None
                form = {k: v // t.den for k, v in form.items()}
            out.append(_to_ast(_remainders(form), args, t.params, ctx, nonneg))
    except _Fail:
        return None
    return out


def _rank(atom, args: Arguments, params: dict[str, int]) -> tuple:
    """isl's order of the terms of an AST expression (``isl_ast_expr_from_aff``): remainders
    first, then parameters in the space's order, iterators by depth, other operations (``/``)."""
    if isinstance(atom, tuple):
        if atom[0] == "F":
            raise _Fail  # a floor that did not simplify
        if atom[0] == "R" or args.opaque[atom].get_op_type() in (_T.pdiv_r, _T.zdiv_r):
            return (0, args.order.get(atom, -1))
        return (4, args.order.get(atom, 0))
    if atom in params:
        return (2, params[atom])
    if _ITERATOR.match(atom):
        return (3, int(atom[1:]))
    raise _Fail


def _to_ast(form: dict, args: Arguments, params: dict[str, int], ctx: isl.Context,
            nonneg) -> isl.AstExpr:
    const = form.get(1, 0)
    terms = sorted((a for a in form if a != 1), key=lambda a: _rank(a, args, params))
    if any(form[a] < 0 for a in terms):
        raise _Fail
    expr = None
    for atom in terms:
        if isinstance(atom, tuple) and atom[0] == "R":
            x = dict(atom[1])
            where = None if any(isinstance(a, tuple) for a in x) else nonneg(x, atom[2])
            if where is None:
                raise _Fail
            base = _to_ast(x, args, params, ctx, nonneg)
            if where:  # (False: X in [0, e), so X mod e is X)
                base = base.pdiv_r(_int(ctx, atom[2]))
        elif isinstance(atom, tuple):
            base = args.opaque[atom]
        else:
            base = isl.AstExpr.from_id(isl.Id(atom, context=ctx))
        c = form[atom]
        term = base if c == 1 else _int(ctx, c).mul(base)
        expr = term if expr is None else expr.add(term)
    if expr is None:
        return _int(ctx, const)
    return expr.add(_int(ctx, const)) if const else expr


def _int(ctx: isl.Context, v: int) -> isl.AstExpr:
    return isl.AstExpr.from_val(isl.Val.int_from_si(ctx, v))
