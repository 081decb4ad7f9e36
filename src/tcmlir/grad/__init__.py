"""Reverse-mode gradients of TC definitions, derived as TC definitions.

    import tcmlir as tc
    from tcmlir.grad import derive
    mm = tc.define("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }")
    g = derive(mm)            # GradProgram: g.source is TC text, g.define() a TCFunction
    dA, dB = g.define()(A, B, dC)

Layout: `derive` (versions, forward recomputation, adjoints in reverse), `rules` (the chain
rule through one expression), `indexing` (inverting a read's index map), `emit` (IR -> TC
text). `tcmlir.torch` builds autograd-aware torch ops on it; ``python -m tcmlir.dump --grad``
prints the derived program.
"""

from __future__ import annotations

from .derive import GradProgram, derive
from .emit import GradError

__all__ = ["GradError", "GradProgram", "derive"]
