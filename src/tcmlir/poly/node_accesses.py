"""The buffer accesses of the AST's user nodes (`poly.loops.build_ast` annotates each node
with them; the code generators and the simulator read them through `loops.annotation_of`).

For a statement ``S{k}``: per access that goes to a buffer of `promotion.Promotion`, the buffer
coordinates as isl AST expressions in the node's loop iterators; for a copy statement
(``cpin_<buf>`` ...), a `CopyAccess`. What depends only on the statement and the buffer — the
coordinates as a function of the statement's instances (`promotion.local_index`) and its
`access_exprs.Template` — is computed once per AST build; each node substitutes its call's
arguments (`access_exprs.compose`, no isl) and asks isl only where that does not simplify
(issue 31: an unrolled 8x8 register tile has ~1200 user nodes; isl's
``access_from_pw_multi_aff`` per node and access was ~2 s of a matmul's compile).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import islpy as isl

from .. import ir
from .access_exprs import Arguments, compose, template_of
from .promotion import (
    COPY_STMT,
    Buffer,
    Promotion,
    access_map,
    copy_parts,
    local_index,
    prefix_pma,
    statement_accesses,
)
from .scop import maps_of

__all__ = ["CopyAccess", "annotate_user_node"]

_STMT = re.compile(r"^S(\d+)(_init)?$")


@dataclass(frozen=True)
class CopyAccess:
    """What a copy statement instance does: ``kind`` ``"in"`` (``buffer[local] = tensor[global]``),
    ``"out"`` (back) or ``"init"`` (``buffer[local]`` = the identity of `Buffer.fill`'s reduction);
    ``"next"`` is ``"in"`` one tile ahead, and ``"vin"`` / ``"vnext"`` copy `Buffer.copy_lanes`
    elements from the leader ``global`` / ``local`` on along the last dimension."""

    buffer: str
    kind: str
    global_index: tuple[isl.AstExpr, ...]
    local_index: tuple[isl.AstExpr, ...]


def _access_args(expr: isl.AstExpr) -> tuple[isl.AstExpr, ...]:
    return tuple(expr.get_op_arg(i) for i in range(1, expr.get_op_n_arg()))


def annotate_user_node(promotion: Promotion, fn: ir.Function, node: isl.AstNode,
                       build: isl.AstBuild, memo: dict | None = None) -> dict | CopyAccess | None:
    """The buffer accesses of one user node of the AST, as isl AST expressions in the loop
    iterators: for a statement ``S{k}``, ``{key: (buffer, local index)}`` for each access
    (`statement_accesses` keys) that goes to a buffer; for a copy statement, a `CopyAccess`.

    ``memo`` (a dict kept over one AST build): what depends only on the statement and the
    buffer — the buffer coordinates of each access as a function of the statement's instances,
    and their `access_exprs.Template`s — is computed once; each node substitutes its call's
    arguments into the templates (`access_exprs.compose`, no isl), and asks isl (restricting
    the function to its instances and writing it in its iterators) only where that does not
    simplify (an unrolled register tile has hundreds of user nodes per statement)."""
    memo = {} if memo is None else memo
    call = node.user_get_expr()
    name = call.get_op_arg(0).get_id().get_name()
    facts = _NodeFacts(build, _access_args(call))
    m = COPY_STMT.match(name)
    if m is not None:
        key = ("copy", name, len(facts.exprs))
        found = memo.get(key)
        if found is None:
            buf = promotion.buffer(m.group(2))
            ma_p, ma_a = copy_parts(facts.inst.get_space(), buf.n_prefix, len(buf.box.extent),
                                    ahead=m.group(1) in ("next", "vnext"))
            ga = isl.PwMultiAff.from_multi_aff(ma_a).set_range_tuple_id(
                isl.Id(buf.tensor, context=node.get_ctx()))
            la = local_index(buf, ga, isl.PwMultiAff.from_multi_aff(ma_p))
            found = memo[key] = (buf, ga, la, template_of(ga), template_of(la))
        buf, ga, la, tg, tl = found
        g = facts.coordinates(tg, ga)
        loc = facts.coordinates(tl, la)
        return CopyAccess(buf.name, m.group(1), g, loc)
    if not _STMT.match(name):
        return None
    out: dict = {}
    for buf in promotion.buffers:
        within = _within_scope(memo, name, buf)
        if within is None:  # part of the statement is in the buffer's scope: this node?
            inst = facts.inst
            scope = buf.scope.align_params(inst.get_space().params())
            within = not isl.UnionSet.from_set(inst).align_params(scope.get_space()) \
                .intersect(scope).is_empty()
        if not within:
            continue
        for i, (key, la) in enumerate(_statement_locals(memo, promotion, fn, name, buf)):
            if key in out:
                continue
            tkey = ("template", name, buf.name, i)
            if tkey not in memo:
                memo[tkey] = template_of(la)
            out[key] = (buf.name, facts.coordinates(memo[tkey], la))
    return out or None


class _NodeFacts:
    """What one user node's accesses need from isl, computed on first use: its schedule (the
    instances and the outer iterators' values), and bounds of the remainders' operands."""

    def __init__(self, build: isl.AstBuild, args: tuple[isl.AstExpr, ...]):
        self.build, self.exprs = build, args
        self._args: Arguments | None = None
        self._sched: isl.Map | None = None
        self._iters: isl.PwMultiAff | None = None
        self._bounds: dict = {}

    @property
    def sched(self) -> isl.Map:
        if self._sched is None:
            self._sched = isl.Map.from_union_map(self.build.get_schedule())
        return self._sched

    @property
    def inst(self) -> isl.Set:
        return self.sched.domain()

    def coordinates(self, template, fallback: isl.PwMultiAff) -> tuple[isl.AstExpr, ...]:
        """The coordinates of ``fallback`` (a function of the statement's instances; its
        ``template``) at this node: composed from the call's arguments, or by isl."""
        if template is not None:
            if self._args is None:
                self._args = Arguments(self.exprs)
            got = compose(template, self._args, self.build.get_ctx(), self.nonneg)
            if got is not None:
                return tuple(got)
        if self._iters is None:
            self._iters = isl.PwMultiAff.from_map(self.sched.reverse())
        # (the pullback by the node's iterators restricts it to the node's instances)
        return _access_args(self.build.access_from_pw_multi_aff(
            fallback.pullback_pw_multi_aff(self._iters)))

    def nonneg(self, form: dict, below: int) -> bool | None:
        """Bounds of a linear form (of `access_exprs.linear_of`: atoms are parameters and
        iterators) on the node, from the ranges of its outer iterators and of the parameters:
        None if it may be negative, False if it lies in ``[0, below)``, True if only >= 0."""
        key = (tuple(sorted((str(k), v) for k, v in form.items())), below)
        if key in self._bounds:
            return self._bounds[key]
        rng = self.sched.range()  # (its dimensions are the schedule space's, unnamed)
        space = self.build.get_schedule_space()
        aff = isl.Aff.zero_on_domain(isl.LocalSpace.from_space(rng.get_space()))
        for atom, c in form.items():
            if atom == 1:
                aff = aff.set_constant_val(isl.Val.int_from_si(aff.get_ctx(), int(c)))
                continue
            kind, pos = isl.dim_type.in_, space.find_dim_by_name(isl.dim_type.set, atom)
            if pos < 0:
                kind, pos = isl.dim_type.param, rng.find_dim_by_name(isl.dim_type.param, atom)
            if pos < 0:
                return None
            aff = aff.set_coefficient_val(kind, pos, isl.Val.int_from_si(aff.get_ctx(), int(c)))
        lo, hi = rng.min_val(aff), rng.max_val(aff)
        found = None
        if lo.is_int() and lo.to_python() >= 0:
            found = not (hi.is_int() and hi.to_python() < below)
        self._bounds[key] = found
        return found


def _within_scope(memo: dict, name: str, buf: Buffer) -> bool | None:
    """Whether every instance of statement ``name`` is in ``buf``'s scope (True), none is
    (False), or some are (None: each node is checked), memoised in ``memo``."""
    key = ("scope", name, buf.name)
    if key in memo:
        return memo[key]
    found = None
    for m in maps_of(buf.prefix):
        if m.get_tuple_name(isl.dim_type.in_) == name:
            dom = isl.UnionSet.from_set(m.domain())
            scope = buf.scope.align_params(dom.get_space())
            dom = dom.align_params(scope.get_space())
            if dom.is_subset(scope):
                found = True
            elif dom.intersect(scope).is_empty():
                found = False
            break
    memo[key] = found
    return found


def _statement_locals(memo: dict, promotion: Promotion, fn: ir.Function, name: str,
                      buf: Buffer) -> list[tuple[object, isl.PwMultiAff]]:
    """(access key, buffer coordinates over all of the statement's instances) of every
    access of statement ``name`` to ``buf``'s tensor (not gathers), memoised in ``memo``."""
    key = ("stmt", name, buf.name)
    found = memo.get(key)
    if found is not None:
        return found
    dims = fn.statements[int(_STMT.match(name).group(1))]
    dims = dims.lhs if name.endswith("_init") else dims.index_names
    pre = prefix_pma(buf.prefix, name)
    found = []
    for access, tensor, indices in statement_accesses(fn, name):
        if tensor != buf.tensor:
            continue
        amap = access_map(name, tuple(dims), tensor, tuple(indices), buf.scope.get_space().params())
        if amap is not None:
            found.append((access, local_index(buf, isl.PwMultiAff.from_map(amap), pre)))
    memo[key] = found
    return found
