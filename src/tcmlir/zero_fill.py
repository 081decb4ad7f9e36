"""Which tensors a call must zero before its kernels run (`needs_zero_fill`): the language
promises zeros under `+=` and under elements no statement writes; a tensor its first statement
sets entirely starts uninitialised instead (no memset, no host-side fill)."""

from __future__ import annotations

from collections.abc import Mapping

from . import ir

__all__ = ["needs_zero_fill"]


def needs_zero_fill(fn: ir.Function, tensor: ir.Tensor, sizes: Mapping[str, int]) -> bool:
    """Whether a fresh buffer for ``tensor`` (an output or temporary) must start at zero.

    False only when the first statement writing it sets every element before anything reads
    it: a ``=`` or ``!`` statement whose left-hand side indexes each dimension with its own
    index, ranging over exactly ``[0, extent)`` at these ``sizes``, and whose right-hand side
    does not read the tensor — or, for a temporary, over ``[0, hi)`` with every other read
    of it at plain indices inside that box (a padded operand copy, `passes/pad_operands.py`:
    its padding is never read). Anything else (``+=`` onto zeros, a partial box, a
    self-read) keeps the zero fill the language promises.
    """
    k = fn.first_writer(tensor.name)
    if k is not None:
        st = fn.statements[k]
        if st.reduction is not None and not st.init:
            return True
        if len(st.lhs) != tensor.rank or len(set(st.lhs)) != tensor.rank:
            return True
        box = []
        for name, extent in zip(st.lhs, tensor.shape, strict=True):
            if name not in st.index_names:
                return True
            r = st.range_of(name)
            box.append(r.hi.evaluate(sizes))
            if r.lo.evaluate(sizes) != 0 or box[-1] > extent.evaluate(sizes):
                return True
        if any(isinstance(e, ir.Read) and e.tensor == tensor.name for e in ir.walk(st.rhs)):
            return True
        full = all(hi == e.evaluate(sizes) for hi, e in zip(box, tensor.shape, strict=True))
        return not full and (tensor.role is not ir.Role.TEMP
                             or not _reads_inside(fn, tensor.name, box, sizes, skip=k))
    return True


def _reads_inside(fn: ir.Function, tensor: str, box: list[int], sizes: Mapping[str, int],
                  skip: int) -> bool:
    """Every statement but ``skip`` reads ``tensor`` at plain indices within ``[0, box)``
    and writes it nowhere."""
    for j, st in enumerate(fn.statements):
        if j == skip:
            continue
        if st.tensor == tensor:
            return False
        for e in ir.walk(st.rhs):
            if not (isinstance(e, ir.Read) and e.tensor == tensor):
                continue
            for idx, hi in zip(e.indices, box, strict=True):
                if not isinstance(idx, ir.Index) or idx.name not in st.index_names:
                    return False
                r = st.range_of(idx.name)
                if r.lo.evaluate(sizes) < 0 or r.hi.evaluate(sizes) > hi:
                    return False
    return True
