"""Range inference and bounds proofs with isl, symbolically in the size parameters.

TC's rule (docs: inference.rst): ranges given by ``where i in lo:hi`` come first; then, round by
round, every tensor argument expression that contains exactly one index without a range gives
that index the maximal interval keeping the argument inside the tensor's dimension for every
value of the indices resolved in earlier rounds; the intervals from several arguments are
intersected. Rounds repeat until no index gains a range. Accesses that count: reads, ``exists``
accesses, and the left-hand side when the written tensor's shape is already known.

Everything is done with isl sets over the size parameters. Symbolic bounds (tensor extents,
ranges found earlier, all isl `PwAff`s) enter a set as fresh parameters tied to their value by
an equality on the parameters, and are projected out again, so the isl text built here only
ever holds validated names, integers and isl text produced by `tcmlir.affine.to_isl`.

`RangeSolver` also accumulates the function's context: every size >= 1, every tensor extent
>= 1, and the domains on which the inferred bounds are defined.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import islpy as isl

from .. import ir
from ..affine import to_isl
from ..errors import InferenceError, Source, Span
from .bound_text import affine_text, tc_bound

__all__ = ["SIZE_LIMIT", "Access", "Precondition", "RangeSolver"]

_CTX = isl.DEFAULT_CONTEXT

#: The overflow proof assumes every size is below this (sizes are int32 values in TC).
SIZE_LIMIT = 2**31
Bounds = tuple[isl.PwAff, isl.PwAff]


@dataclass(frozen=True)
class Access:
    """One tensor access of a statement: ``kind`` is "read", "write" or "exists"."""

    tensor: str
    args: tuple[ir.Expr, ...]
    kind: str
    span: Span | None
    text: str
    guard: str | None = None   # isl condition on the indices under which the access happens
    guard_exprs: tuple[ir.Expr, ...] = ()  # the ?: conditions ``guard`` was taken from


@dataclass(frozen=True)
class Precondition:
    """Sizes an access needs to stay in bounds: ``condition`` in isl syntax on the size names."""

    condition: str
    span: Span | None
    access: str
    warn: bool = True  # False: only sizes near 2^31, where a guard's int32 arithmetic wraps


_COMPARISONS = ("<", "<=", ">", ">=", "==", "!=")


def _rename(e: ir.Expr, names: Mapping[str, str]) -> ir.Expr:
    """``e`` with its index variables renamed."""
    return ir.replace_indices(e, lambda i: dataclasses.replace(i, name=names.get(i.name, i.name)))

def _arith_nodes(e: ir.Expr) -> list[ir.Expr]:
    return [n for n in ir.walk(e) if isinstance(n, ir.Binary | ir.Unary)]


def _index_names(e: ir.Expr) -> list[str]:
    seen: list[str] = []
    for node in ir.walk(e):
        if isinstance(node, ir.Index) and node.name not in seen:
            seen.append(node.name)
    return seen


def _one_piece(pa: isl.PwAff) -> isl.PwAff | None:
    pieces: list[isl.Aff] = []
    pa.foreach_piece(lambda _set, aff: pieces.append(aff))
    return isl.PwAff.from_aff(pieces[0]) if len(pieces) == 1 else None


class RangeSolver:
    """Range inference, bounds proofs and the context of one function."""

    def __init__(self, sizes: Sequence[str], reserved: Sequence[str], source: Source):
        self.sizes = tuple(sizes)
        self.source = source
        prefix = "_b"
        while any(n.startswith(prefix) for n in (*sizes, *reserved)):
            prefix = "_" + prefix
        self._prefix = prefix
        cond = " and ".join(f"{s} >= 1" for s in self.sizes)
        self.context = isl.Set.read_from_str(_CTX, f"[{', '.join(self.sizes)}] -> {{ : {cond} }}")

    # ------------------------------------------------------------ isl helpers

    def pw_aff(self, size: ir.SizeExpr | str) -> isl.PwAff:
        """The PwAff of a SizeExpr or of an affine isl text over the sizes."""
        if isinstance(size, ir.SizeExpr):
            return size.pw_aff(_CTX)
        return isl.PwAff.read_from_str(_CTX, f"[{', '.join(self.sizes)}] -> {{ [({size})] }}")

    def size_expr(self, pa: isl.PwAff) -> ir.SizeExpr:
        """A simplified SizeExpr (gist in the context, unused parameters dropped)."""
        pa = pa.gist_params(self.context).coalesce().drop_unused_params()
        return ir.SizeExpr(str(pa))

    def _bind(self, dims: Sequence[str], cond: str, bounds: Mapping[str, isl.PwAff]) -> isl.Set:
        """``{ [dims] : cond }`` where the names in ``bounds`` stand for their PwAff values."""
        params = [*self.sizes, *bounds]
        text = f"[{', '.join(params)}] -> {{ [{', '.join(dims)}] : {cond} }}"
        s = isl.Set.read_from_str(_CTX, text)
        defs = isl.Set.read_from_str(_CTX, f"[{', '.join(params)}] -> {{ : }}")
        for name, pa in bounds.items():
            var = isl.PwAff.read_from_str(_CTX, f"[{name}] -> {{ [({name})] }}")
            defs = defs & var.eq_set(pa)
        s = s.intersect_params(defs).intersect_params(self.context)
        for name in bounds:
            s = s.project_out(isl.dim_type.param, s.find_dim_by_name(isl.dim_type.param, name), 1)
        return s

    def _box(self, names: Sequence[str], ranges: Mapping[str, Bounds],
             bounds: dict[str, isl.PwAff]) -> list[str]:
        conds = []
        for v in names:
            lo, hi = ranges[v]
            b_lo, b_hi = f"{self._prefix}{len(bounds)}", f"{self._prefix}{len(bounds) + 1}"
            bounds[b_lo], bounds[b_hi] = lo, hi
            conds.append(f"{b_lo} <= {v} < {b_hi}")
        return conds

    def _outside(self, dims: Sequence[str], ranges: Mapping[str, Bounds], boxed: Sequence[str],
                 arg: str, extent: isl.PwAff, guard: str | None = None) -> isl.Set:
        """Points of ``dims`` (those in ``boxed`` inside their ranges, and satisfying ``guard``)
        where ``arg`` leaves [0, extent)."""
        bounds: dict[str, isl.PwAff] = {}
        conds = self._box(boxed, ranges, bounds)
        if guard is not None:
            conds.append(f"({guard})")
        d = f"{self._prefix}{len(bounds)}"
        bounds[d] = extent
        conds.append(f"({arg} < 0 or {arg} >= {d})")
        return self._bind(dims, " and ".join(conds), bounds)

    def require(self, cond: isl.Set, span: Span | None, what: str, fix: str | None = None) -> None:
        """Add ``cond`` (a set on the sizes) to the context; an error if no size then fits."""
        new = self.context.intersect_params(cond).coalesce()
        if new.is_empty():
            raise InferenceError.at(self.source, span, what, fix)
        self.context = new

    def require_positive(self, pa: isl.PwAff, span: Span | None, what: str) -> None:
        one = isl.PwAff.read_from_str(_CTX, "{ [(1)] }").align_params(pa.get_space())
        self.require(pa.ge_set(one), span, f"{what} is never >= 1 (it is {self.size_expr(pa)})")

    def context_text(self) -> str:
        ctx = self.context.coalesce().remove_redundancies()
        return str(ctx)

    # ------------------------------------------------------------ inference

    def infer(self, indices: Sequence[str], explicit: Mapping[str, Bounds],
              accesses: Sequence[Access], shapes: Mapping[str, tuple[ir.SizeExpr, ...] | None],
              first_use: Mapping[str, Span | None]) -> dict[str, Bounds]:
        """Ranges of ``indices``: ``explicit`` ones, then TC's rounds over ``accesses``."""
        resolved: dict[str, Bounds] = dict(explicit)
        for name, (lo, hi) in explicit.items():
            self.require(lo.domain() & hi.domain(), first_use.get(name),
                         f"the range of {name} is undefined for every size")
        while True:
            unresolved = {v for v in indices if v not in resolved}
            if not unresolved:
                break
            valid: dict[str, isl.Set] = {}
            vacuous: dict[str, isl.Set] = {}
            for acc in accesses:
                shape = shapes.get(acc.tensor)
                if shape is None:
                    continue
                for arg, extent in zip(acc.args, shape, strict=True):
                    text = to_isl(arg)
                    names = _index_names(arg)
                    free = [v for v in names if v in unresolved]
                    if text is None or len(free) != 1:
                        continue
                    v = free[0]
                    others = [w for w in names if w != v]
                    bad = self._outside([v, *others], resolved, others, text, self.pw_aff(extent))
                    bad = bad.project_out(isl.dim_type.set, 1, len(others))
                    universe = isl.Set.read_from_str(_CTX, f"{{ [{v}] }}").intersect_params(self.context)
                    # where a range found earlier is empty the statement does nothing and the
                    # access bounds nothing: leave those sizes to `_extend`
                    live = self._nonempty(others, resolved)
                    ok = universe.intersect_params(live).subtract(bad)
                    vacuous[v] = vacuous.get(v, self.context.subtract(live)) | \
                        self.context.subtract(live)
                    valid[v] = valid[v] & ok if v in valid else ok
            progress = False
            for v in indices:
                if v not in valid:
                    continue
                try:
                    lo = valid[v].dim_min(0)
                    hi = valid[v].dim_max(0).add(isl.PwAff.read_from_str(_CTX, "{ [(1)] }"))
                except isl.Error:  # unbounded: this round's accesses do not bound v
                    continue
                resolved[v] = self._extend(v, lo, hi, first_use.get(v), vacuous.get(v))
                progress = True
            if not progress:
                break
        for v in indices:
            if v not in resolved:
                hint = self._hint(v, accesses, shapes)
                raise InferenceError.at(self.source, first_use.get(v),
                                        f"cannot infer the range of index {v}",
                                        f"add `where {v} in 0:{hint}`")
        ranges = {v: resolved[v] for v in indices}
        self.check_unique_rectangle(ranges, set(explicit), accesses, shapes)
        return ranges

    def check_unique_rectangle(self, ranges: Mapping[str, Bounds], explicit: set[str],
                               accesses: Sequence[Access],
                               shapes: Mapping[str, tuple[ir.SizeExpr, ...] | None]) -> None:
        """TC's rule (inference.rst): the inferred ranges are the maximal rectangle that keeps
        every access in bounds, and where there is more than one, an error asks for a
        ``where``. The rounds give each index the range its own accesses allow; an argument
        of two or more inferred indices resolved in the same round bounds none of them. When
        the other dimensions of the same access bound each of those indices (TC's
        test_inference ``TCC`` ``I(i, i + j, j)``: ``i`` and ``j`` from dimensions 0 and 2,
        ``TCD``, ``TCE``) and the argument leaves its dimension for some sizes, the points
        where the access is in bounds are no rectangle: several maximal ones trade the range
        of one index for another's, and a located `InferenceError` names the indices and
        suggests the ``where`` that settles it. When another tensor combines indices that
        other accesses bound (inference.rst's ``B(i) * C(i + j) * D(j)``), the doc leaves "the
        requirement that C is large enough": a precondition (`check_bounds`)."""
        names = list(ranges)
        live = self._nonempty(names, ranges)
        for acc in accesses:
            shape = shapes.get(acc.tensor)
            if shape is None:
                continue
            for d, (arg, extent) in enumerate(zip(acc.args, shape, strict=True)):
                text = to_isl(arg)
                used = _index_names(arg)
                inferred = [v for v in used if v not in explicit]
                if text is None or len(inferred) < 2:
                    continue
                others = [_index_names(a) for k, a in enumerate(acc.args) if k != d]
                if not all(any(v in o for o in others) for v in inferred):
                    continue  # another tensor combines them: a precondition on its size
                dims = names if acc.guard is not None else used
                bad = self._outside(dims, ranges, dims, text, self.pw_aff(extent), acc.guard)
                if (bad.params() & live).is_empty():
                    continue
                box = ", ".join(f"{v} in [{tc_bound(ranges[v][0], self.context)}, "
                                f"{tc_bound(ranges[v][1], self.context)})" for v in inferred)
                raise InferenceError.at(
                    self.source, acc.span,
                    f"the ranges of {', '.join(inferred)} are ambiguous: {acc.text} stays in "
                    f"{acc.tensor}'s dimension {d} (extent {extent}) only for some of "
                    f"{box}, and more than one maximal rectangle of {', '.join(inferred)} "
                    "keeps it there", self._unique_fix(inferred, ranges))

    def _unique_fix(self, inferred: Sequence[str], ranges: Mapping[str, Bounds]) -> str:
        """Give all but one of ``inferred`` a range (the last is then inferred given them):
        the inferred ranges where TC can write them (a ``where`` bound is affine)."""
        texts = {v: (affine_text(ranges[v][0]), affine_text(ranges[v][1])) for v in inferred}
        writable = [v for v in inferred if None not in texts[v]]
        if len(writable) >= len(inferred) - 1:
            last = next((v for v in reversed(inferred) if v not in writable), inferred[0])
            given = [v for v in inferred if v != last]
            clause = ", ".join(f"{v} in {texts[v][0]}:{texts[v][1]}" for v in given)
        else:
            last = inferred[-1]
            given = list(inferred[:-1])
            clause = ", ".join(f"{v} in lo:hi" for v in given)
        return (f"give {', '.join(given)} the range{'s' if len(given) > 1 else ''} you mean with a where "
                f"clause, e.g. "
                f"`where {clause}`; the range of {last} is then inferred given "
                f"{'it' if len(given) == 1 else 'them'}")

    def _extend(self, v: str, lo: isl.PwAff, hi: isl.PwAff, span: Span | None,
                vacuous: isl.Set | None = None) -> Bounds:
        """Bounds defined for every size of the context.

        Where no value of ``v`` is valid, isl leaves the bounds undefined. One-piece bounds
        extended to those sizes give an empty range there, which is exact; so do they where
        ``vacuous`` (sizes for which another index of the statement has an empty range, so
        the statement does nothing); otherwise the sizes where the bounds are defined become
        part of the context.
        """
        dom = lo.domain() & hi.domain()
        rest = self.context.subtract(dom)
        if rest.is_empty():
            return lo, hi
        lo1, hi1 = _one_piece(lo), _one_piece(hi)
        if vacuous is not None:
            rest = rest.subtract(vacuous)
        if lo1 is not None and hi1 is not None and (lo1.lt_set(hi1) & rest).is_empty():
            return lo1, hi1
        self.require(dom, span, f"index {v} has an empty range for every size",
                     f"check the accesses that use {v}, or add `where {v} in lo:hi`")
        return lo, hi

    def _nonempty(self, names: Sequence[str], ranges: Mapping[str, Bounds]) -> isl.Set:
        """The sizes of the context for which every range of ``names`` is non-empty."""
        live = self.context
        for w in names:
            lo, hi = ranges[w]
            live = live & lo.lt_set(hi)
        return live

    def _hint(self, v: str, accesses: Sequence[Access], shapes: Mapping) -> str:
        for acc in accesses:
            shape = shapes.get(acc.tensor)
            if shape is None:
                continue
            for arg, extent in zip(acc.args, shape, strict=True):
                if v in _index_names(arg):
                    return str(extent)
        return self.sizes[0] if self.sizes else "N"

    # ------------------------------------------------------------ bounds proof

    def check_bounds(self, ranges: Mapping[str, Bounds], accesses: Sequence[Access],
                     shapes: Mapping[str, tuple[ir.SizeExpr, ...] | None]) -> list[Precondition]:
        """Prove every affine read/write argument lies in its dimension over the whole box.

        An access in bounds only for some sizes makes those sizes a precondition: the set is
        added to the context and returned (one `Precondition` per access that needed one).
        An access in bounds for no size of the context is an `InferenceError`.
        """
        names = list(ranges)
        found: list[Precondition] = []
        live = self._nonempty(names, ranges)
        for acc in accesses:
            shape = shapes.get(acc.tensor)
            if acc.kind == "exists" or shape is None:
                continue
            self.check_index_overflow(ranges, acc)
            wrapped = self.guard_overflow(ranges, acc) if acc.guard is not None else None
            before = self.context
            limits = None
            for d, (arg, extent) in enumerate(zip(acc.args, shape, strict=True)):
                text = to_isl(arg)
                if text is None:
                    continue  # a gather: checked at run time
                # only the indices the argument uses (and a guard's) matter, given that the
                # box is non-empty: fewer dimensions for isl than the whole box
                dims = names if acc.guard is not None else _index_names(arg)
                bad = self._outside(dims, ranges, dims, text, self.pw_aff(extent), acc.guard)
                if not bad.is_empty():
                    bad = bad.params() & live
                if not bad.is_empty():
                    safe = self.context.subtract(bad)
                    if safe.is_empty():
                        raise self._out_of_bounds(acc, d, arg, extent, ranges)
                    self.context = safe.coalesce()
                if wrapped is not None:  # where the guard wraps, the access may happen anyway
                    unguarded = self._outside(names, ranges, names, text, self.pw_aff(extent))
                    huge = unguarded.intersect(wrapped).params()
                    if not huge.is_empty():
                        limits = huge if limits is None else limits.union(huge)
            if self.context is not before:
                found.append(Precondition(self.condition_text(self.context, before), acc.span,
                                          acc.text))
            if limits is not None:  # sizes near 2^31 only: a silent precondition
                known = self.context
                self.context = self.context.subtract(limits).coalesce()
                if self.context.is_empty():
                    raise self._out_of_bounds(acc, 0, acc.args[0], shape[0], ranges)
                found.append(Precondition(self.condition_text(self.context, known), acc.span,
                                          acc.text, warn=False))
        return found

    def condition_text(self, cond: isl.Set, known: isl.Set) -> str:
        """``cond`` (a set on the sizes) given ``known`` and the sizes below `SIZE_LIMIT`
        (checked at every call), as a condition on the size names."""
        if self.sizes:
            known = known & self.pw_condition(" and ".join(f"{s} < {SIZE_LIMIT}" for s in self.sizes))
        text = str(cond.gist(known).coalesce().remove_redundancies())
        body = text[text.index("{") + 1:text.rindex("}")].strip()
        return body[1:].strip() if body.startswith(":") else body

    def pw_condition(self, condition: str) -> isl.Set:
        return isl.Set.read_from_str(_CTX, f"[{', '.join(self.sizes)}] -> {{ : {condition} }}")

    def _out_of_bounds(self, acc: Access, d: int, arg: ir.Expr, extent: ir.SizeExpr,
                       ranges: Mapping[str, Bounds]) -> InferenceError:
        used = _index_names(arg)
        where = ", ".join(
            f"{v} in [{self.size_expr(ranges[v][0])}, {self.size_expr(ranges[v][1])})"
            for v in used)
        verb = "write" if acc.kind == "write" else "read"
        what = (f"{acc.text} may {verb} outside {acc.tensor}'s dimension {d} "
                f"(extent {extent})" + (f" for {where}" if where else "")
                + " whatever the sizes")
        fix = ("add a where clause restricting " + ", ".join(used)) if used else \
            "check the constant index against the tensor's size"
        return InferenceError.at(self.source, acc.span, what, fix)

    # ------------------------------------------------------------ overflow proof

    def _overflow(self, ranges: Mapping[str, Bounds], node: ir.Expr, bits: int,
                  guard: str | None) -> isl.Set:
        """Points of the box (sizes below `SIZE_LIMIT`, where ``guard`` holds) at which the
        affine ``node`` leaves the signed ``bits``-bit range."""
        names = list(ranges)
        lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
        bounds: dict[str, isl.PwAff] = {}
        conds = self._box(names, ranges, bounds)
        conds += [f"{s} < {SIZE_LIMIT}" for s in self.sizes]
        if guard is not None:
            conds.append(f"({guard})")
        conds.append(f"({to_isl(node)} < {lo} or {to_isl(node)} > {hi})")
        return self._bind(names, " and ".join(conds), bounds)

    def check_index_overflow(self, ranges: Mapping[str, Bounds], acc: Access) -> None:
        """Prove that no intermediate of ``acc``'s affine index arithmetic (computed in int64)
        leaves int64 for sizes below `SIZE_LIMIT`; a located `InferenceError` otherwise."""
        for arg in acc.args:
            if to_isl(arg) is None:
                continue
            for node in _arith_nodes(arg):
                if self._overflow(ranges, node, 64, acc.guard).is_empty():
                    continue
                raise InferenceError.at(
                    self.source, node.span or acc.span,
                    f"the int64 index arithmetic {to_isl(node)} in {acc.text} may overflow "
                    "for some sizes below 2^31",
                    "simplify the expression so that every intermediate stays small")

    def guard_overflow(self, ranges: Mapping[str, Bounds], acc: Access) -> isl.Set | None:
        """Points where an affine comparison of ``acc``'s guards overflows its own (value)
        type: there the guard's isl text says nothing, so the access may happen. None: nowhere."""
        found: isl.Set | None = None
        for cond in acc.guard_exprs:
            for cmp in ir.walk(cond):
                if not (isinstance(cmp, ir.Binary) and cmp.op in _COMPARISONS):
                    continue
                for side in (cmp.lhs, cmp.rhs):
                    if not side.dtype.is_int or to_isl(side) is None:
                        continue
                    for node in _arith_nodes(side):
                        bad = self._overflow(ranges, node, node.dtype.bits, None)
                        if not bad.is_empty():
                            found = bad if found is None else found.union(bad)
        return found

    # ------------------------------------------------------------ order independence

    def check_order_independent(self, ranges: Mapping[str, Bounds], accesses: Sequence[Access],
                                tensor: str, lhs: Sequence[str], reduction: bool) -> None:
        """A statement may read the tensor it writes only where each instance reads what it
        writes itself: TC leaves the order of a statement's instances unspecified, so a read
        of another instance's write (``O(i) = O(N - 1 - i)``, ``O(i) = O(i - 1) + A(i)``)
        would give a different answer per target. A located `InferenceError` otherwise."""
        names = list(ranges)
        other = {v: f"{self._prefix}t{v}" for v in names}
        for acc in accesses:
            if acc.tensor != tensor or acc.kind == "write":
                continue
            texts = [to_isl(_rename(a, other)) for a in acc.args]
            if any(t is None for t in texts):
                raise self._order_error(acc, tensor, "reads it through a gather")
            bounds: dict[str, isl.PwAff] = {}
            conds = self._box(names, ranges, bounds)
            keys = list(bounds)
            conds += [f"{keys[2 * k]} <= {other[v]} < {keys[2 * k + 1]}"
                      for k, v in enumerate(names)]
            conds += [f"{w} = {t}" for w, t in zip(lhs, texts, strict=True)]
            same = " and ".join(f"{v} = {other[v]}" for v in names) or "1 = 1"
            conds.append(f"not ({same})")
            clash = self._bind([*names, *other.values()], " and ".join(conds), bounds)
            if not clash.is_empty():
                what = ("reads values other instances of this reduction update" if reduction
                        else "reads elements that other instances of this statement write")
                raise self._order_error(acc, tensor, what)

    def _order_error(self, acc: Access, tensor: str, what: str) -> InferenceError:
        return InferenceError.at(
            self.source, acc.span,
            f"{acc.text} {what}: the order in which a statement's instances run is "
            f"unspecified in TC, so the result would depend on it",
            f"write the result to a new tensor instead of overwriting {tensor}")
