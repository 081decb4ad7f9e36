"""Half-precision reductions accumulate in float32: a rewrite of the checked statements.

A ``+`` or ``*`` reduction into a float16/bfloat16 tensor would round the running value to the
half type at every step when compiled (a float16 sum of 3000 ones gives 2994). docs/language.md
promises float32 accumulation, so sema rewrites such a statement ``T(lhs) op[!] rhs`` into three
statements over a float32 temporary ``T_acc`` of T's shape:

    T_acc(lhs) = T(lhs)          (only without ``!``: start from T's values)
    T_acc(lhs) op[!] rhs         (the reduction, in float32)
    T(lhs) = T_acc(lhs)          (one rounding to the half type)

Every target runs the rewritten IR, so all of them (and the numpy oracle, which accumulates in
the compute type anyway) agree; ``min``/``max`` are exact in any type and stay as they are.
"""

from __future__ import annotations

from collections.abc import Collection

from .. import ir
from ..dtypes import DType

__all__ = ["accumulate_halves_in_float32"]

_HALVES = (DType.FLOAT16, DType.BFLOAT16)
_ROUNDING = (ir.Reduction.ADD, ir.Reduction.MUL)


def accumulate_halves_in_float32(
        statements: list[ir.Statement], tensors: dict[str, ir.Tensor], taken: Collection[str],
) -> tuple[list[ir.Statement], list[ir.Tensor]]:
    """The rewritten statements and the float32 temporaries they add (names not in ``taken``)."""
    out: list[ir.Statement] = []
    temps: list[ir.Tensor] = []
    used = set(taken) | set(tensors)
    for st in statements:
        t = tensors[st.tensor]
        if t.dtype not in _HALVES or st.reduction not in _ROUNDING:
            out.append(st)
            continue
        name = f"{st.tensor}_acc"
        k = 1
        while name in used:
            name, k = f"{st.tensor}_acc{k}", k + 1
        used.add(name)
        temps.append(ir.Tensor(name, DType.FLOAT32, t.shape, ir.Role.TEMP, span=t.span))
        lhs_ranges = tuple(st.range_of(n) for n in st.lhs)
        idx = tuple(ir.Index(n) for n in st.lhs)
        f32 = DType.FLOAT32
        if not st.init:
            out.append(ir.Statement(name, st.lhs, None, False, ir.Read(st.tensor, idx, f32),
                                    lhs_ranges, span=st.span))
        out.append(ir.Statement(name, st.lhs, st.reduction, st.init, st.rhs, st.ranges,
                                span=st.span))
        out.append(ir.Statement(st.tensor, st.lhs, None, False, ir.Read(name, idx, f32),
                                lhs_ranges, span=st.span))
    return out, temps
