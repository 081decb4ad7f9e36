"""Bounds of index ranges (isl `PwAff`s over the sizes) written as TC text, for messages that
suggest a ``where`` clause (`lang.ranges`)."""

from __future__ import annotations

import islpy as isl

__all__ = ["affine_text", "tc_bound"]


def _aff_text(aff: isl.Aff) -> str | None:
    """An affine function of the sizes as TC text (``I_1 - 2*I_0 + 1``); None with divisions
    or fractions."""
    if aff.dim(isl.dim_type.div) or aff.dim(isl.dim_type.in_):
        return None
    terms: list[tuple[int, str]] = []
    for i in range(aff.dim(isl.dim_type.param)):
        c = aff.get_coefficient_val(isl.dim_type.param, i)
        if not c.is_int():
            return None
        if c.to_python():
            terms.append((int(c.to_python()), aff.get_dim_name(isl.dim_type.param, i)))
    const = aff.get_constant_val()
    if not const.is_int():
        return None
    text = ""
    for c, name in terms:
        mag = name if abs(c) == 1 else f"{abs(c)} * {name}"
        text += (f" {'-' if c < 0 else '+'} " if text else "-" if c < 0 else "") + mag
    k = int(const.to_python())
    if not text:
        return str(k)
    return text + (f" {'-' if k < 0 else '+'} {abs(k)}" if k else "")


def affine_text(pa: isl.PwAff) -> str | None:
    """A one-piece affine bound as TC text, else None."""
    pieces: list[isl.Aff] = []
    pa.foreach_piece(lambda _set, aff: pieces.append(aff))
    return _aff_text(pieces[0]) if len(pieces) == 1 else None


def tc_bound(pa: isl.PwAff, context: isl.Set) -> str:
    """A bound as TC text: an affine function of the sizes, or the ``min``/``max`` of its
    pieces (``min(I_0, I_2)``); isl's text when it is neither."""
    pieces: list[isl.Aff] = []
    pa.foreach_piece(lambda _set, aff: pieces.append(aff))
    texts = [_aff_text(a) for a in pieces]
    if not pieces or any(t is None for t in texts):
        return str(pa)
    if len(set(texts)) == 1:
        return str(texts[0])
    dom = pa.domain().intersect_params(context)
    for op in ("min", "max"):
        whole = isl.PwAff.from_aff(pieces[0])
        text = str(texts[0])
        for aff, t in zip(pieces[1:], texts[1:], strict=True):
            whole = getattr(whole, op)(isl.PwAff.from_aff(aff))
            text = f"{op}({text}, {t})"
        if dom.is_subset(whole.eq_set(pa)):
            return text
    return str(pa)
