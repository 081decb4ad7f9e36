"""Host code generation (target cpu): JIT kernels against numpy and the reference interpreter.

Functions are built as `ir.Function`s by hand (the tests do not depend on the front end), and
scheduled with a program-order schedule tree built here: one loop nest per statement (its init
first), optionally under a ``parallel`` mark, so these tests do not depend on the poly layer.
"""

from __future__ import annotations

import math

import islpy as isl
import numpy as np
import pytest

from tcmlir import ir
from tcmlir.codegen.host import compile_host_from_ast
from tcmlir.dtypes import DType
from tcmlir.errors import CallError, CodegenError, Source

F32, F64, I32, I64, U8, BOOL, F16 = (DType.FLOAT32, DType.FLOAT64, DType.INT32, DType.INT64,
                                     DType.UINT8, DType.BOOL, DType.FLOAT16)
IN, OUT, TMP = ir.Role.INPUT, ir.Role.OUTPUT, ir.Role.TEMP
RED = {"+": ir.Reduction.ADD, "*": ir.Reduction.MUL, "min": ir.Reduction.MIN, "max": ir.Reduction.MAX}


# ---------------------------------------------------------------- building IR by hand


def size(x: str | int) -> ir.SizeExpr:
    return ir.SizeExpr.param(x) if isinstance(x, str) else ir.SizeExpr.constant(x)


def tensor(name, dtype, *shape, role=IN):
    return ir.Tensor(name, dtype, tuple(size(s) for s in shape), role)


def idx(name):
    return ir.Index(name)


def rd(t: ir.Tensor, *indices):
    return ir.Read(t.name, tuple(ir.Index(i) if isinstance(i, str) else i for i in indices), t.dtype.compute)


def c(v, dt):
    return ir.Const(v, dt)


def bin_(op, a, b, dt=None):
    if dt is None:
        dt = BOOL if op in ir.COMPARISONS or op in ("&&", "||") else a.dtype
    return ir.Binary(op, a, b, dt)


def call(f, *args):
    return ir.Call(f, tuple(args), args[0].dtype)


def stmt(t, lhs, rhs, ranges, red=None, init=False):
    rng = tuple(ir.IndexRange(n, size(lo), size(hi)) for n, lo, hi in ranges)
    return ir.Statement(t.name, tuple(lhs), RED[red] if red else None, init, rhs, rng)


def function(name, inputs, outputs, statements, temps=(), source=None):
    names: list[str] = []
    for t in (*inputs, *outputs, *temps):
        for s in t.shape:
            for p in s.params:
                if p not in names:
                    names.append(p)
    ctx = f"[{', '.join(names)}] -> {{ : {' and '.join(f'{n} >= 1' for n in names) or '1 = 1'} }}"
    return ir.Function(name, tuple(names), ctx, tuple(inputs), tuple(outputs), tuple(temps),
                       tuple(statements), source=source)


# ---------------------------------------------------------------- a program-order schedule


def _box(st: ir.Statement, dims) -> str:
    cons = [f"{r.lo} <= {r.name} < {r.hi}" for r in st.ranges if r.name in dims]
    return " and ".join(cons) or "1 = 1"


def schedule_ast(fn: ir.Function, parallel=False) -> isl.AstNode:
    """One loop nest per statement instance set, in program order; ``parallel`` puts a
    ``parallel`` mark above every nest whose outer dimension is not a reduction index."""
    ctx = isl.Context()
    params = f"[{', '.join(fn.sizes)}]"
    doms, kids = [], []
    for k, st in enumerate(fn.statements):
        parts = [(f"S{k}_init", st.lhs)] if st.init else []
        parts.append((f"S{k}", st.index_names))
        for name, dims in parts:
            tup = f"{name}[{', '.join(dims)}]"
            doms.append(f"{tup} : {_box(st, dims)}")
            if dims:
                band = ", ".join(f"{{ {tup} -> [({d})] }}" for d in dims)
                child = f'{{ schedule: "{params} -> [{band}]" }}'
                if parallel and dims[0] in st.lhs:
                    child = f'{{ mark: "parallel", child: {child} }}'
                kids.append(f'{{ filter: "{{ {tup} }}", child: {child} }}')
            else:
                kids.append(f'{{ filter: "{{ {tup} }}" }}')
    text = (f'{{ domain: "{params} -> {{ {"; ".join(doms)} }}", '
            f'child: {{ sequence: [ {", ".join(kids)} ] }} }}')
    if len(kids) == 1:
        text = f'{{ domain: "{params} -> {{ {"; ".join(doms)} }}", child: {kids[0][kids[0].index("child:") + 7:-2]} }}' \
            if "child:" in kids[0] else f'{{ domain: "{params} -> {{ {doms[0]} }}" }}'
    sched = isl.Schedule.read_from_str(ctx, text)
    build = isl.AstBuild.from_context(isl.Set.read_from_str(ctx, fn.context))
    return build.node_from_schedule(sched)


def compile_fn(fn, sizes, parallel=False, threads=1, fixed=True):
    return compile_host_from_ast(fn, schedule_ast(fn, parallel), sizes if fixed else None, threads=threads)


def run(fn, sizes, inputs, parallel=False, threads=1, fixed=True, poison=True):
    k = compile_fn(fn, sizes, parallel, threads, fixed)
    arrays = dict(inputs)
    for t in fn.outputs:
        shape = tuple(s.evaluate(sizes) for s in t.shape)
        a = np.empty(shape, dtype=t.dtype.numpy)
        if poison:
            if t.dtype.is_float:
                a.fill(np.nan)
            else:
                a.view(np.uint8).fill(0x7F)
        else:
            a.fill(0)
        arrays[t.name] = a
    return k.run(arrays, sizes), k


rng = np.random.default_rng(0)


# ---------------------------------------------------------------- tests


def matmul_fn(dt=F32):
    A, B = tensor("A", dt, "M", "K"), tensor("B", dt, "K", "N")
    C = tensor("C", dt, "M", "N", role=OUT)
    s = stmt(C, ("m", "n"), bin_("*", rd(A, "m", "k"), rd(B, "k", "n")),
             [("m", 0, "M"), ("n", 0, "N"), ("k", 0, "K")], red="+", init=True)
    return function("matmul", [A, B], [C], [s])


@pytest.mark.parametrize("M,N,K", [(1, 1, 1), (7, 13, 5), (32, 17, 64)])
@pytest.mark.parametrize("fixed", [True, False])
def test_matmul(M, N, K, fixed):
    A, B = rng.standard_normal((M, K)).astype(np.float32), rng.standard_normal((K, N)).astype(np.float32)
    out, _ = run(matmul_fn(), {"M": M, "N": N, "K": K}, {"A": A, "B": B}, fixed=fixed)
    np.testing.assert_allclose(out["C"], A @ B, rtol=1e-5, atol=1e-5)
