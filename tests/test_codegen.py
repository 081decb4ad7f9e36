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
from tcmlir.runtime.host import CHUNKS_PER_THREAD

F32, F64, I32, I64, U8, BOOL, F16 = (DType.FLOAT32, DType.FLOAT64, DType.INT32, DType.INT64,
                                     DType.UINT8, DType.BOOL, DType.FLOAT16)
IN, OUT, TMP = ir.Role.INPUT, ir.Role.OUTPUT, ir.Role.TEMP
RED = {"+": ir.Reduction.ADD, "*": ir.Reduction.MUL, "min": ir.Reduction.MIN, "max": ir.Reduction.MAX}


# ---------------------------------------------------------------- building IR by hand


def size(x: str | int | ir.SizeExpr) -> ir.SizeExpr:
    if isinstance(x, ir.SizeExpr):
        return x
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


def check_ref(fn, sizes, inputs, rtol=1e-5, atol=1e-6, **kw):
    """Compile, run with poisoned outputs, compare with the reference interpreter in float64."""
    from tcmlir import reference

    out, k = run(fn, sizes, inputs, **kw)
    ref = reference.run(fn, inputs, sizes)
    for name, want in ref.items():
        got = out[name]
        assert got.dtype == want.dtype, name
        if want.dtype.kind == "f":
            np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol,
                                       atol=atol, err_msg=name)
        else:
            np.testing.assert_array_equal(got, want, err_msg=name)
    return out, k


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


def test_matmul_against_reference_and_ir_text():
    A = rng.standard_normal((5, 3)).astype(np.float32)
    B = rng.standard_normal((3, 11)).astype(np.float32)
    _, k = check_ref(matmul_fn(), {"M": 5, "N": 11, "K": 3}, {"A": A, "B": B})
    assert 'define void @"matmul_0"(ptr' in k.llvm_ir
    assert "noalias" in k.llvm_ir


def conv_fn():
    ho = ir.SizeExpr("[H, KH] -> { [(H - KH + 1)] }")
    wo = ir.SizeExpr("[W, KW] -> { [(W - KW + 1)] }")
    In = tensor("I", F32, "N", "C", "H", "W")
    Wt = tensor("Wt", F32, "F", "C", "KH", "KW")
    Ot = tensor("O", F32, "N", "F", ho, wo, role=OUT)
    h, w = bin_("+", idx("h"), idx("kh")), bin_("+", idx("w"), idx("kw"))
    rhs = bin_("*", rd(In, "n", "c", h, w), rd(Wt, "f", "c", "kh", "kw"))
    s = stmt(Ot, ("n", "f", "h", "w"), rhs,
             [("n", 0, "N"), ("f", 0, "F"), ("h", 0, ho), ("w", 0, wo), ("c", 0, "C"), ("kh", 0, "KH"),
              ("kw", 0, "KW")], red="+", init=True)
    return function("conv", [In, Wt], [Ot], [s])


@pytest.mark.parametrize("parallel,threads", [(False, 1), (True, 2)])
def test_conv(parallel, threads):
    sizes = {"N": 2, "C": 3, "H": 7, "W": 5, "F": 4, "KH": 3, "KW": 2}
    I_ = rng.standard_normal((2, 3, 7, 5)).astype(np.float32)
    W_ = rng.standard_normal((4, 3, 3, 2)).astype(np.float32)
    out, _ = check_ref(conv_fn(), sizes, {"I": I_, "Wt": W_}, parallel=parallel, threads=threads)
    want = np.zeros((2, 4, 5, 4))
    for kh in range(3):
        for kw in range(2):
            want += np.einsum("nchw,fc->nfhw", I_[:, :, kh:kh + 5, kw:kw + 4], W_[:, :, kh, kw])
    np.testing.assert_allclose(out["O"], want, rtol=1e-4, atol=1e-5)


def softmax_fn(dt=F32):
    X = tensor("X", dt, "N", "M")
    Y = tensor("Y", dt, "N", "M", role=OUT)
    mx, e, sm = tensor("mx", F32, "N", role=TMP), tensor("e", F32, "N", "M", role=TMP), tensor("s", F32, "N", role=TMP)
    rows = [("n", 0, "N")]
    both = [("n", 0, "N"), ("m", 0, "M")]
    x = rd(X, "n", "m")
    sts = [
        stmt(mx, ("n",), x, both, red="max", init=True),
        stmt(e, ("n", "m"), call("exp", bin_("-", x, rd(mx, "n"))), both),
        stmt(sm, ("n",), rd(e, "n", "m"), both, red="+", init=True),
        stmt(Y, ("n", "m"), bin_("/", rd(e, "n", "m"), rd(sm, "n")), both),
    ]
    del rows
    return function("softmax", [X], [Y], sts, temps=[mx, e, sm])


@pytest.mark.parametrize("N,M", [(1, 1), (3, 7), (17, 129)])
@pytest.mark.parametrize("threads", [1, 2])
def test_softmax(N, M, threads):
    X = rng.standard_normal((N, M)).astype(np.float32) * 10
    out, k = check_ref(softmax_fn(), {"N": N, "M": M}, {"X": X}, parallel=True, threads=threads)
    z = np.exp(X - X.max(axis=1, keepdims=True))
    np.testing.assert_allclose(out["Y"], z / z.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)
    assert len(k.entries) == 6 and all(e.range is not None for e in k.entries)


def reduce_fn(dt, op, init):
    A = tensor("A", dt, "N", "M")
    Ot = tensor("O", dt, "N", role=OUT)
    s = stmt(Ot, ("n",), rd(A, "n", "m"), [("n", 0, "N"), ("m", 0, "M")], red=op, init=init)
    return function("red", [A], [Ot], [s])


def _values(dt, shape):
    if dt is BOOL:
        return rng.random(shape) < 0.5
    if dt.is_float:
        return (rng.standard_normal(shape) * 2).astype(dt.numpy)
    info = np.iinfo(dt.numpy)
    lo, hi = max(info.min, -5), min(info.max, 5)
    return rng.integers(lo, hi + 1, shape).astype(dt.numpy)


@pytest.mark.parametrize("dt", [F32, F64, I32, I64, U8, BOOL, F16])
@pytest.mark.parametrize("op", ["+", "*", "min", "max"])
@pytest.mark.parametrize("init", [True, False])
def test_reductions(dt, op, init):
    N, M = 5, 7
    A = _values(dt, (N, M))
    if op == "*" and not dt.is_float and dt is not BOOL:
        A[A == 0] = 2  # a zero factor would make every product 0
    fn = reduce_fn(dt, op, init)
    out, _ = run(fn, {"N": N, "M": M}, {"A": A}, poison=init)
    want = _numpy_reduce(A, op, init, dt)
    tol = 2e-2 if dt is F16 else 1e-5
    if dt.is_float:
        np.testing.assert_allclose(out["O"].astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)
    else:
        np.testing.assert_array_equal(out["O"], want)


def _numpy_reduce(A, op, init, dt):
    """The oracle, in numpy: ``!`` starts from the identity, else from the zero-filled output;
    integers wrap as C's unsigned (and two's-complement) arithmetic does."""
    if dt is BOOL:  # on bools + and max are "or", * and min are "and"
        r = (np.any if op in ("+", "max") else np.all)(A, axis=1)
        return r if init or op in ("+", "max") else np.zeros_like(r)
    wide = A.astype(np.float64 if dt.is_float else np.int64)
    r = {"+": np.sum, "*": np.prod, "min": np.min, "max": np.max}[op](wide, axis=1)
    if not init:
        r = {"+": r, "*": r * 0, "min": np.minimum(r, 0), "max": np.maximum(r, 0)}[op]
    return r.astype(dt.numpy)


def elementwise(name, dt_in, dt_out, rhs_of, n_inputs=1, out_dt=None):
    ins = [tensor(chr(ord("A") + i), dt_in, "N") for i in range(n_inputs)]
    Ot = tensor("O", dt_out, "N", role=OUT)
    rhs = rhs_of(*(rd(t, "i") for t in ins))
    return function(name, ins, [Ot], [stmt(Ot, ("i",), rhs, [("i", 0, "N")])])


@pytest.mark.parametrize("dt", [I32, I64])
@pytest.mark.parametrize("op", ["/", "%"])
def test_c_integer_division(dt, op):
    a = np.array([7, -7, 7, -7, 5, 0, -1, np.iinfo(dt.numpy).min, 9, 3], dtype=dt.numpy)
    b = np.array([2, 2, -2, -2, 0, 3, 5, -1, 0, 3], dtype=dt.numpy)
    fn = elementwise("div", dt, dt, lambda x, y: bin_(op, x, y), 2)
    out, _ = check_ref(fn, {"N": len(a)}, {"A": a, "B": b})

    def cdiv(x, y):
        if y == 0:
            return 0
        q = abs(x) // abs(y) * (1 if (x < 0) == (y < 0) else -1)
        return q if op == "/" else x - q * y

    want = np.array([cdiv(int(x), int(y)) for x, y in zip(a, b, strict=True)], dtype=object)
    want = np.array([(w + 2**63) % 2**dt.bits - 2**(dt.bits - 1) if dt.bits == 64 else w for w in want])
    np.testing.assert_array_equal(out["O"].astype(np.int64)[:7], want[:7].astype(np.int64))


def test_floordiv_floormod_in_index():
    A = tensor("A", F32, "N")
    Ot = tensor("O", F32, "N", role=OUT)
    i = idx("i")
    q = bin_("floordiv", bin_("-", i, c(3, I32)), c(4, I32))
    r = bin_("floormod", bin_("-", i, c(3, I32)), c(4, I32))
    rhs = bin_("+", rd(A, bin_("+", q, c(1, I32))), ir.Cast(rd(A, r), F32))
    fn = function("fd", [A], [Ot], [stmt(Ot, ("i",), rhs, [("i", 0, "N")])])
    a = np.arange(10, dtype=np.float32) * 10
    out, _ = run(fn, {"N": 10}, {"A": a})
    want = [a[(i - 3) // 4 + 1] + a[(i - 3) % 4] for i in range(10)]
    np.testing.assert_array_equal(out["O"], want)


def test_select_and_casts():
    fn = elementwise("sel", F32, F32, lambda x: ir.Select(bin_(">", x, c(0.0, F32)), x,
                                                          ir.Unary("-", x, F32), F32))
    a = rng.standard_normal(11).astype(np.float32)
    out, _ = check_ref(fn, {"N": 11}, {"A": a})
    np.testing.assert_array_equal(out["O"], np.abs(a))


@pytest.mark.parametrize("src,dst", [(F32, I32), (F64, U8), (I32, F32), (I64, F64), (BOOL, F32),
                                     (F32, BOOL), (I32, BOOL), (I64, I32), (U8, I64), (F64, F32),
                                     (F32, F16), (F16, I32), (I32, U8)])
def test_casts(src, dst):
    fn = elementwise("cast", src, dst, lambda x: ir.Cast(x, dst.compute))
    if src.is_float:
        a = (rng.standard_normal(13) * 20).astype(src.numpy)
        if dst is U8:
            a = np.abs(a)
    else:
        a = _values(src, (13,))
    if src is F64 and dst is F32:  # halfway and near-halfway cases of round-to-nearest-even
        a[:3] = [1 + 2.0 ** -24, 1 + 3 * 2.0 ** -24, 1 + 2.0 ** -24 + 2.0 ** -50]
    if src is F32 and dst is F16:
        a[:3] = np.array([1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, 65519.0], np.float32)
    out, _ = run(fn, {"N": 13}, {"A": a})
    # numpy's own cast is the oracle, exactly: a cast rounds (or truncates) one way only
    np.testing.assert_array_equal(out["O"], a.astype(dst.numpy))
    assert out["O"].dtype == dst.numpy


def test_bool_and_logic():
    fn = elementwise("logic", F32, BOOL, lambda x, y: bin_("||", bin_("&&", bin_("<", x, y), bin_(
        "!=", x, c(0.0, F32))), ir.Unary("!", bin_(">=", y, c(1.0, F32)), BOOL)), 2)
    a, b = rng.standard_normal(17).astype(np.float32), rng.standard_normal(17).astype(np.float32)
    out, _ = check_ref(fn, {"N": 17}, {"A": a, "B": b})
    np.testing.assert_array_equal(out["O"], ((a < b) & (a != 0)) | ~(b >= 1))


UNARY = ["exp", "log", "sqrt", "tanh", "erf", "erfc", "lgamma", "tgamma", "cbrt", "expm1", "log1p",
         "asinh", "sin", "cos", "tan", "atan", "floor", "ceil", "round", "trunc", "exp2", "log2",
         "log10", "exp10", "rsqrt", "sinpi", "cospi", "rcbrt", "normcdf", "logb", "fabs", "cosh",
         "sinh", "cyl_bessel_i0"]
BINARY = ["pow", "atan2", "hypot", "fmin", "fmax", "fmod", "copysign", "fdim", "remainder",
          "rhypot", "fdivide", "nextafter"]


@pytest.mark.parametrize("dt", [F32, F64])
@pytest.mark.parametrize("f", UNARY)
def test_unary_builtins(dt, f):
    a = (np.abs(rng.standard_normal(23)) * 3 + 0.1).astype(dt.numpy)
    a[::3] *= -1 if f not in ("log", "sqrt", "lgamma", "tgamma", "log2", "log10", "rsqrt") else 1
    a[0] = 2.5  # a tie for round
    fn = elementwise(f, dt, dt, lambda x: call(f, x))
    check_ref(fn, {"N": 23}, {"A": a}, rtol=2e-6 if dt is F32 else 1e-12, atol=1e-6 if dt is F32 else 1e-12)


@pytest.mark.parametrize("f", BINARY)
def test_binary_builtins(f):
    a, b = rng.standard_normal(19) * 3, rng.standard_normal(19) * 3
    fn = elementwise(f, F64, F64, lambda x, y: call(f, x, y), 2)
    check_ref(fn, {"N": 19}, {"A": np.abs(a) if f == "pow" else a, "B": b}, rtol=1e-12, atol=1e-12)


def test_ternary_builtins():
    fn = elementwise("fma", F64, F64, lambda x, y, z: call("fma", x, y, z), 3)
    a, b, cc = (rng.standard_normal(9) for _ in range(3))
    check_ref(fn, {"N": 9}, {"A": a, "B": b, "C": cc})
    fn = elementwise("n3", F64, F64, lambda x, y, z: call("rnorm3d", x, y, z), 3)
    out, _ = run(fn, {"N": 9}, {"A": a, "B": b, "C": cc})
    np.testing.assert_allclose(out["O"], 1 / np.sqrt(a * a + b * b + cc * cc), rtol=1e-14)


@pytest.mark.parametrize("dt", [F32, F64])
def test_inverse_error_functions(dt):
    y = np.array([-0.999, -0.5, -1e-3, 0.0, 0.3, 0.9, 0.99999], dtype=dt.numpy)
    out, _ = run(elementwise("ei", dt, dt, lambda x: call("erfinv", x)), {"N": 7}, {"A": y})
    erf = np.vectorize(math.erf)
    tol = 1e-6 if dt is F32 else 1e-13
    np.testing.assert_allclose(erf(out["O"].astype(np.float64)), y, rtol=tol * 10, atol=tol)
    p = np.array([1e-30, 1e-5, 0.1, 0.5, 0.9, 0.99999], dtype=np.float64)
    out, _ = run(elementwise("nci", F64, F64, lambda x: call("normcdfinv", x)), {"N": 6}, {"A": p})
    back = 0.5 * np.vectorize(math.erfc)(-out["O"] / math.sqrt(2))
    np.testing.assert_allclose(back, p, rtol=1e-12)
    out, _ = run(elementwise("ecx", F64, F64, lambda x: call("erfcx", x)), {"N": 6},
                 {"A": np.array([-1.0, 0.0, 1.0, 10.0, 30.0, 1e4])})
    want = [math.exp(1) * math.erfc(-1), 1.0, math.exp(1) * math.erfc(1), math.exp(100) * math.erfc(10)]
    np.testing.assert_allclose(out["O"][:4], want, rtol=1e-13)
    np.testing.assert_allclose(out["O"][4:], 1 / (np.array([30.0, 1e4]) * math.sqrt(math.pi)), rtol=1e-3)


def gather_fn():
    A, Ix = tensor("A", F32, "N"), tensor("Ix", I32, "M")
    Ot = tensor("O", F32, "M", role=OUT)
    src = Source("def g(float(N) A, int32(M) Ix) -> (O) {\n  O(i) = A(Ix(i))\n}\n", "g.tc")
    read = ir.Read("A", (rd(Ix, "i"),), F32, span=src.span(src.text.index("A(Ix"), src.text.index("A(Ix") + 8))
    return function("g", [A, Ix], [Ot], [stmt(Ot, ("i",), read, [("i", 0, "M")])], source=src)


@pytest.mark.parametrize("threads", [1, 2])
def test_gather_and_out_of_bounds(threads):
    a = np.arange(5, dtype=np.float32)
    ok = np.array([4, 0, 2, 2], dtype=np.int32)
    out, k = run(gather_fn(), {"N": 5, "M": 4}, {"A": a, "Ix": ok}, parallel=True, threads=threads)
    np.testing.assert_array_equal(out["O"], a[ok])
    for bad in (5, -1):
        arrays = {"A": a, "Ix": np.array([0, 1, bad, 3], dtype=np.int32), "O": np.zeros(4, np.float32)}
        with pytest.raises(CallError, match="tensor A") as info:
            k.run(arrays, {"N": 5, "M": 4})
        assert "g.tc:2:" in str(info.value)


def test_guarded_gather_is_not_checked():
    A, Ix = tensor("A", F32, "N"), tensor("Ix", I32, "M")
    Ot = tensor("O", F32, "M", role=OUT)
    g = ir.Read("A", (rd(Ix, "i"),), F32)
    rhs = ir.Select(bin_("<", rd(Ix, "i"), ir.Size("N")), g, c(-1.0, F32), F32)
    fn = function("gg", [A, Ix], [Ot], [stmt(Ot, ("i",), rhs, [("i", 0, "M")])])
    out, _ = run(fn, {"N": 3, "M": 4}, {"A": np.arange(3, dtype=np.float32), "Ix": np.array([0, 7, 2, 3], np.int32)})
    np.testing.assert_array_equal(out["O"], [0, -1, 2, -1])


@pytest.mark.parametrize("M,N,K", [(1, 3, 2), (2, 5, 3), (37, 31, 7), (128, 8, 4)])
def test_parallel_two_threads_equals_one(M, N, K):
    A, B = rng.standard_normal((M, K)).astype(np.float32), rng.standard_normal((K, N)).astype(np.float32)
    sizes = {"M": M, "N": N, "K": K}
    one, _ = run(matmul_fn(), sizes, {"A": A, "B": B}, parallel=True, threads=1)
    two, k = run(matmul_fn(), sizes, {"A": A, "B": B}, parallel=True, threads=2)
    # against numpy (an oracle), then bit for bit: threads split rows, never one sum
    want = A.astype(np.float64) @ B.astype(np.float64)
    np.testing.assert_allclose(two["C"], want, rtol=1e-5, atol=1e-5 * max(1, K))
    np.testing.assert_array_equal(one["C"], two["C"])
    assert all(e.range is not None for e in k.entries)
    chunks = k._chunks(k.entries[1], (__import__("ctypes").c_int64 * 3)(M, N, K))
    assert len(chunks) == min(2 * CHUNKS_PER_THREAD, M)


def test_scalar_output_and_size_value():
    A = tensor("A", F64, "N")
    S = tensor("S", F64, role=OUT)
    rhs = bin_("*", rd(A, "i"), ir.Cast(ir.Size("N"), F64))
    fn = function("sum", [A], [S], [stmt(S, (), rhs, [("i", 0, "N")], red="+", init=True)])
    a = rng.standard_normal(13)
    out, _ = check_ref(fn, {"N": 13}, {"A": a}, rtol=1e-12)
    assert out["S"].shape == ()


def test_unknown_builtin_is_a_located_codegen_error():
    src = Source("def f(float(N) A) -> (O) {\n  O(i) = frobnicate(A(i))\n}\n", "f.tc")
    A, Ot = tensor("A", F32, "N"), tensor("O", F32, "N", role=OUT)
    bad = ir.Call("frobnicate", (rd(A, "i"),), F32, span=src.span(31, 47))
    fn = function("f", [A], [Ot], [stmt(Ot, ("i",), bad, [("i", 0, "N")])], source=src)
    with pytest.raises(CodegenError, match="frobnicate") as info:
        compile_fn(fn, {"N": 4})
    assert "f.tc:2:" in str(info.value)


def test_wrong_inputs_are_call_errors():
    k = compile_fn(matmul_fn(), {"M": 2, "N": 2, "K": 2})
    good = {"A": np.zeros((2, 2), np.float32), "B": np.zeros((2, 2), np.float32), "C": np.zeros((2, 2), np.float32)}
    with pytest.raises(CallError, match="dtype"):
        k.run({**good, "A": np.zeros((2, 2))}, {"M": 2, "N": 2, "K": 2})
    with pytest.raises(CallError, match="shape"):
        k.run({**good, "B": np.zeros((3, 2), np.float32)}, {"M": 2, "N": 2, "K": 2})
    with pytest.raises(CallError, match="compiled for"):
        k.run(good, {"M": 3, "N": 2, "K": 2})


def test_bessel_j_y_through_libm():
    fn = elementwise("j0", F64, F64, lambda x: call("j0", x))
    out, _ = run(fn, {"N": 2}, {"A": np.array([0.0, 2.404825557695773])})
    np.testing.assert_allclose(out["O"], [1.0, 0.0], atol=1e-15)
    fn = elementwise("y1", F32, F32, lambda x: call("y1", x))
    out, _ = run(fn, {"N": 1}, {"A": np.array([1.0], np.float32)})
    np.testing.assert_allclose(out["O"], [-0.7812128213], rtol=1e-6)


def test_front_end_and_poly_state_end_to_end():
    import tcmlir.lang as lang
    import tcmlir.poly.state as state_mod
    from tcmlir import reference
    from tcmlir.codegen.host import compile_host

    text = """def softmax(float(N, M) X) -> (Y) {
  mx(n) max=! X(n, m)
  e(n, m) = exp(X(n, m) - mx(n))
  s(n) +=! e(n, m)
  Y(n, m) = e(n, m) / s(n)
}"""
    fn = lang.check(lang.parse(text), source=Source(text))
    for sizes in ({"N": 1, "M": 1}, {"N": 13, "M": 31}):
        k = compile_host(state_mod.CompileState.initial(fn, sizes), threads=2)
        X = rng.standard_normal((sizes["N"], sizes["M"])).astype(np.float32)
        Y = np.full_like(X, np.nan)
        k.run({"X": X, "Y": Y}, sizes)
        np.testing.assert_allclose(Y, reference.run(fn, {"X": X}, sizes)["Y"], rtol=1e-6, atol=1e-7)
