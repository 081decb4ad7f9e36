"""The `pad-operands` pass: tensor-core operands with misaligned rows copied into aligned ones.

An IR rewrite (`poly/operand_pad.py`, PyTorch inductor's ``pad_mm`` in the compiler): each
operand of the tensor-core contraction whose rows do not start 16 bytes apart — so that
`codegen/gpu_mma.py` would load its tiles in copies narrower than 16 bytes, or element by
element — is first copied into a temporary ``<tensor>_pad`` of the same shape with its last
dimension rounded up to 16 bytes, and the contraction reads that::

    C(m, n) +=! A(m, k) * B(k, n)     ->    A_pad(i0, i1) = A(i0, i1)
      (A: 4095 x 4093 halves)               C(m, n) +=! A_pad(m, k) * B(k, n)
                                              (A_pad: 4095 x 4096 halves, i1 < 4093 copied)

An NHWC convolution's operands are both padded along their channels, the reduction then
running over the (zero-filled) padding too. Operands that padding does not widen (read
along a stride, an NCHW convolution's) stay.
`map-mma` maps the copies to one elementwise kernel before the tensor-core kernel. Whether it
pays is `MappingOptions.mma_pad_operands`, chosen by default with `operand_pad.pad_saving`.
Requires no schedule and fixed sizes, like `split-k` (run it before `schedule`: the scop and
dependences are rebuilt from the new function, which the kernel keeps in
`Kernel.compiled_ir`, so that the runtime allocates the temporaries). A function that is no
tensor-core contraction at its sizes is left alone (`map-mma` says why).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .. import ir
from ..errors import OptionsError
from ..poly.operand_pad import padded_function
from ..poly.state import CompileState
from .base import Pass, register

__all__ = ["PadOperands", "pad_note"]


@register
@dataclass(frozen=True)
class PadOperands(Pass):
    """Copy each tensor-core operand whose rows are misaligned into a padded temporary that
    the contraction reads (see the module docstring); ``tf32``: a float32 contraction too.
    Requires no schedule and fixed sizes (run it before `schedule`)."""

    name = "pad-operands"
    tf32: bool = False

    def run(self, state: CompileState) -> CompileState:
        missing = [s for s in state.fn.sizes if s not in (state.sizes or {})]
        if missing:
            raise OptionsError(f"pad-operands needs every size fixed ({', '.join(missing)} "
                               "not given); it does not combine with a parametric kernel")
        assert state.sizes is not None
        fn = padded_function(state.fn, state.sizes, self.tf32)
        if fn is state.fn:
            return state
        return CompileState.initial(fn, state.sizes, state.ctx)


def pad_note(fn: ir.Function, pipeline: str, sizes: Mapping[str, int] | None) -> str | None:
    """What the dump's ``ir`` stage adds for a ``pipeline`` with `pad-operands`: the function
    the later passes compile (None without it, or when it pads nothing)."""
    from .pipeline import parse_pipeline

    passes = [p for p in parse_pipeline(pipeline) if isinstance(p, PadOperands)]
    if not passes:
        return None
    missing = [s for s in fn.sizes if s not in (sizes or {})]
    if missing:
        return (f"pad-operands rewrites the program at fixed sizes: give {', '.join(missing)} "
                "with --sizes to see it")
    padded = padded_function(fn, sizes or {}, passes[0].tf32)
    if padded is fn:
        return "pad-operands: no operand to pad at these sizes"
    return f"after {passes[0]}:\n{padded}".rstrip()
