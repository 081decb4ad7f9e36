"""Buffer access expressions composed in Python from a statement's template and a user node's
call arguments (`tcmlir.poly.access_exprs`, issue 31): the exact floor rules, the remainders,
the refusals, and, over whole promoted kernels, the same expressions as isl's
``access_from_pw_multi_aff`` on every node (so the generated code does not change)."""

from __future__ import annotations

import islpy as isl
import numpy as np
import pytest

import tcmlir as tc
from tcmlir.poly import node_accesses
from tcmlir.poly.access_exprs import Arguments, compose, template_of

CTX = isl.DEFAULT_CONTEXT


def _v(x) -> isl.AstExpr:
    if isinstance(x, isl.AstExpr):
        return x
    if isinstance(x, int):
        return isl.AstExpr.from_val(isl.Val.int_from_si(CTX, x))
    return isl.AstExpr.from_id(isl.Id(x, context=CTX))


def _sum(*terms) -> isl.AstExpr:
    """``t0 + t1 + ...`` (a term ``(c, x)`` is ``c * x``), as isl builds it (left to right)."""
    out = None
    for t in terms:
        e = _v(t[0]).mul(_v(t[1])) if isinstance(t, tuple) else _v(t)
        out = e if out is None else out.add(e)
    return out


def _args(*exprs) -> Arguments:
    return Arguments(tuple(_v(e) for e in exprs))


def _texts(got):
    return None if got is None else [e.to_C_str() for e in got]


def _templates(text: str):
    return template_of(isl.PwMultiAff.read_from_str(CTX, text))


def _never(form, below):
    raise AssertionError("no remainder expected")


def test_floors_simplify_by_divisibility_and_gcd():
    # A(m, k) in a 2-stage 128 x 16 tile: (floor(k/16) mod 2, m - 128 _ty, k mod 16)
    t = _templates("[_tx, _ty] -> { S[m, k] -> B[floor(k/16) - 2*floor(k/32), m - 128_ty, "
                   "k mod 16] }")

    def nonneg(form, below):
        assert form == {"c2": 1} and below == 2
        return True  # c2 >= 0 and not below 2: a remainder

    got = compose(t, _args(_sum((128, "_ty"), (8, "_tx"), 3), _sum((16, "c2"), 5)), CTX,
                  nonneg)
    assert _texts(got) == ["c2 % 2", "8 * _tx + 3", "5"]


def test_a_remainder_whose_operand_is_known_below_the_modulus_is_the_operand():
    t = _templates("[_tx, _ty] -> { S[k] -> B[k mod 32] }")
    assert _texts(compose(t, _args("c2"), CTX, lambda form, below: False)) == ["c2"]


def test_a_remainder_that_may_be_negative_is_left_to_isl():
    t = _templates("[_tx, _ty] -> { S[k] -> B[k mod 32] }")
    assert compose(t, _args("c2"), CTX, lambda form, below: None) is None


def test_a_floor_that_does_not_simplify_is_left_to_isl():
    t = _templates("[_tx, _ty] -> { S[m, k] -> B[floor((m + k)/3)] }")
    assert compose(t, _args("c2", "_tx"), CTX, _never) is None


def test_piecewise_functions_and_divided_iterators_are_left_to_isl():
    assert _templates("[_tx, _ty] -> { S[k] -> B[k] : k >= 0; S[k] -> B[-k] : k < 0 }") is None
    t = _templates("[_tx, _ty] -> { S[k] -> B[k] }")
    assert compose(t, _args(_v("c2").pdiv_q(_v(4))), CTX, _never) is None
    # a division of parameters only is an atom like any other
    got = compose(_templates("[_tx, _ty] -> { S[k, j] -> B[j - 4_tx] }"),
                  _args("c2", _sum((64, _v("_ty").pdiv_r(_v(2))), (4, "_tx"), 1)), CTX,
                  _never)
    assert _texts(got) == ["64 * (_ty % 2) + 1"]


def test_a_plain_argument_is_the_argument_itself():
    args = _args("c2", _sum("_tx", (16, "c2"), 16))
    got = compose(_templates("[_tx, _ty] -> { S[p, a] -> T[a] }"), args, CTX, _never)
    assert got is not None and got[0].to_C_str() == args.exprs[1].to_C_str()


MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
TMM = "def tmm(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,k) * B(n,k) }"
CONV = ("def c(float(N,C,H,W) I, float(F,C,KH,KW) W1) -> (O) "
        "{ O(n,f,h,w) +=! I(n,c,h+kh,w+kw) * W1(f,c,kh,kw) }")


@pytest.mark.parametrize("source,shapes,options", [
    (MM, [(256, 256), (256, 256)], None),                                  # 8x8 register tile
    (MM, [(96, 64), (64, 80)], tc.MappingOptions.cuda_contraction()),      # partial tiles
    (TMM, [(128, 1024), (1024, 1024)], None),                              # split-K, cp.async
    (CONV, [(2, 3, 12, 12), (4, 3, 3, 3)], None),
])
def test_composed_expressions_are_isls_on_every_node(monkeypatch, source, shapes, options):
    """Every node of a promoted kernel: what `compose` gives (where it gives anything) prints
    as what isl gives for the same coordinates."""
    seen = {"composed": 0}
    orig = node_accesses._NodeFacts.coordinates

    def both(self, template, fallback):
        got = orig(self, template, fallback)
        iters = isl.PwMultiAff.from_map(self.sched.reverse())
        want = self.build.access_from_pw_multi_aff(fallback.pullback_pw_multi_aff(iters))
        want = [want.get_op_arg(i).to_C_str() for i in range(1, want.get_op_n_arg())]
        assert [e.to_C_str() for e in got] == want
        seen["composed"] += self._args is not None
        return got

    monkeypatch.setattr(node_accesses._NodeFacts, "coordinates", both)
    monkeypatch.setenv("TCMLIR_ALWAYS_COMPILE", "1")
    fn = tc.define(source, target="cuda")
    fn.compile(*[np.zeros(s, np.float32) for s in shapes], options=options, arch="sm_90")
    assert seen["composed"] > 0
