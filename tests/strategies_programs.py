"""Hypothesis strategies: random well-formed TC programs with a numpy model, and token soups.

    from strategies_programs import programs, token_soups
    @given(programs())
    def test(p):  # p.source, p.sizes, p.numpy_fn (also unpacks: source, sizes, numpy_fn = p)

A generated program has 1-3 float32 inputs over the size names N, M, K (values drawn from
{1, 2, 3, 5, 7, 13}) and 1-3 statements, each writing a new tensor T0, T1, ...: pointwise
statements (+ - * /, min/max, ternaries with comparisons, exp/tanh/sqrt(fabs)) or reductions
(`+=!` `*=!` `min=!` `max=!` over one reduction index, sometimes restricted by a where range).
A tensor written by one statement may be read by a later one; it is a temporary when it is
read later and not returned. ``numpy_fn(*inputs)`` evaluates the same program with numpy in
float32, built alongside the source, so it shares no code with tcmlir.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

__all__ = ["SIZE_VALUES", "TC_TOKENS", "GeneratedProgram", "check_against_model", "model_close",
           "programs", "token_soups"]

SIZE_NAMES = ("N", "M", "K")
SIZE_VALUES = (1, 2, 3, 5, 7, 13)
INPUT_NAMES = ("X", "Y", "Z")
F32 = np.float32

# a value: given the arrays by tensor name, an array broadcastable to the statement's grid
Eval = Callable[[dict], np.ndarray]


@dataclass(frozen=True)
class GeneratedProgram:
    source: str
    sizes: dict[str, int]
    numpy_fn: Callable[..., tuple[np.ndarray, ...]]
    input_shapes: tuple[tuple[int, ...], ...]
    output_shapes: tuple[tuple[int, ...], ...]
    has_reduction: bool

    def __iter__(self):  # source, sizes, numpy_fn = program
        return iter((self.source, self.sizes, self.numpy_fn))

    def make_inputs(self, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
        return tuple(rng.uniform(-1, 1, size=s).astype(F32) for s in self.input_shapes)


def _grid_read(arr: np.ndarray, idx: tuple[str, ...], grid: tuple[str, ...]) -> np.ndarray:
    """``arr`` read at index names ``idx``, as an array broadcastable over ``grid``."""
    present = "".join(g for g in grid if g in idx)
    out = np.einsum(f"{''.join(idx)}->{present}", arr)
    return out.reshape([out.shape[present.index(g)] if g in present else 1 for g in grid])


_CONSTS = ("0.5", "2.0", "1.5", "3.0", "0.25")
_CMPS = {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal}
_BINOPS = {"+": np.add, "-": np.subtract, "*": np.multiply}
_REDUCTIONS = {"+=!": np.sum, "*=!": np.prod, "min=!": np.min, "max=!": np.max}


def _reads(known: dict[str, tuple[str, ...]], env: list[tuple[str, str]]):
    """Every way to read a known tensor with the statement's indices (sizes must match)."""
    out = []
    for name, shape in known.items():
        choices = [[i for i, s in env if s == dim] for dim in shape]
        for idx in itertools.product(*choices):
            out.append((name, tuple(idx)))
    return out


@st.composite
def _expr(draw, reads, grid, depth) -> tuple[str, Eval, bool]:
    """(TC text, numpy evaluator, is_leaf)."""
    kind = draw(st.sampled_from(["read", "read", "const"] if depth <= 0 else
                                ["read", "const", "bin", "bin", "div", "minmax", "ternary",
                                 "unary", "neg"]))
    if kind == "read":
        name, idx = draw(st.sampled_from(reads))
        return f"{name}({', '.join(idx)})", (lambda a, n=name, ix=idx: _grid_read(a[n], ix, grid)), True
    if kind == "const":
        c = draw(st.sampled_from(_CONSTS))
        value = F32(float(c))
        return c, (lambda a: value), True
    sub = _expr(reads, grid, depth - 1)
    x, fx, leaf = draw(sub)
    if kind == "neg":
        return f"(-{x})", (lambda a: -fx(a)), False
    if kind == "unary":
        fn = draw(st.sampled_from(["exp", "tanh", "sqrt"]))
        if fn == "tanh":
            return f"tanh({x})", (lambda a: np.tanh(fx(a))), False
        if fn == "sqrt":
            return f"sqrt(fabs({x}))", (lambda a: np.sqrt(np.abs(fx(a)))), False
        if leaf:  # keep exp's argument bounded
            return f"exp({x})", (lambda a: np.exp(fx(a))), False
        return f"exp(tanh({x}))", (lambda a: np.exp(np.tanh(fx(a)))), False
    y, fy, _ = draw(sub)
    if kind == "bin":
        op = draw(st.sampled_from(sorted(_BINOPS)))
        return f"({x} {op} {y})", (lambda a, f=_BINOPS[op]: f(fx(a), fy(a))), False
    if kind == "div":  # a denominator bounded away from zero
        return (f"({x} / (1.5 + {y} * {y}))",
                (lambda a: fx(a) / (F32(1.5) + fy(a) * fy(a))), False)
    if kind == "minmax":
        fn = draw(st.sampled_from(["min", "max"]))
        npf = np.minimum if fn == "min" else np.maximum
        return f"{fn}({x}, {y})", (lambda a: npf(fx(a), fy(a))), False
    # ternary with a comparison
    cmp = draw(st.sampled_from(sorted(_CMPS)))
    z, fz, _ = draw(sub)
    w, fw, _ = draw(sub)
    return (f"({x} {cmp} {y} ? {z} : {w})",
            (lambda a, c=_CMPS[cmp]: np.where(c(fx(a), fy(a)), fz(a), fw(a)).astype(F32)), False)


@st.composite
def programs(draw, max_statements: int = 3, max_depth: int = 3) -> GeneratedProgram:
    n_sizes = draw(st.integers(1, 3))
    size_names = SIZE_NAMES[:n_sizes]
    sizes = {s: draw(st.sampled_from(SIZE_VALUES)) for s in size_names}

    known: dict[str, tuple[str, ...]] = {}
    params = []
    for name in INPUT_NAMES[: draw(st.integers(1, 3))]:
        rank = draw(st.integers(1, 2))
        shape = tuple(draw(st.sampled_from(size_names)) for _ in range(rank))
        known[name] = shape
        params.append(f"float({', '.join(shape)}) {name}")
    inputs = list(known)

    statements: list[str] = []
    steps: list[Callable[[dict], None]] = []
    written: list[str] = []
    read_later: set[str] = set()
    has_reduction = False
    for k in range(draw(st.integers(1, max_statements))):
        target = f"T{k}"
        rank2 = [n for n, s in known.items() if len(s) == 2]
        reduce_op = draw(st.sampled_from([None, *sorted(_REDUCTIONS)])) if rank2 else None
        # prefer the previous statement's tensor as the base: that makes temporaries
        if written and draw(st.booleans()) and (reduce_op is None or len(known[written[-1]]) == 2):
            base = written[-1]
        else:
            base = draw(st.sampled_from(rank2 if reduce_op else list(known)))
        shape = known[base]
        where = ""
        if reduce_op is None:
            lhs = ("i", "j")[: len(shape)]
            env = list(zip(lhs, shape, strict=True))
            grid = lhs
            base_idx = lhs
            if draw(st.booleans()):
                where = f" where i in 0:{shape[0]}"
        else:
            keep = draw(st.integers(0, 1))
            lhs = ("i",)
            env = [("i", shape[keep]), ("r", shape[1 - keep])]
            grid = ("i", "r")
            base_idx = ("i", "r") if keep == 0 else ("r", "i")
            sub = draw(st.sampled_from([None, "full", "one"]))
            if sub == "full":
                where = f" where r in 0:{shape[1 - keep]}"
            elif sub == "one":
                where = " where r in 0:1"
        reads = _reads(known, env)
        rest, frest, _ = draw(_expr(reads, grid, draw(st.integers(0, max_depth))))
        op = draw(st.sampled_from(sorted(_BINOPS)))
        base_text = f"{base}({', '.join(base_idx)})"
        rhs = f"{base_text} {op} {rest}"
        read_later.update(t for t in written if re.search(rf"\b{t}\(", rhs))

        def frhs(a, f=_BINOPS[op], b=base, bi=base_idx, g=grid, fr=frest):
            return f(_grid_read(a[b], bi, g), fr(a))

        assign = reduce_op or "="
        statements.append(f"    {target}({', '.join(lhs)}) {assign} {rhs}{where}")
        out_shape = tuple(s for _, s in env[: len(lhs)])

        def step(a, t=target, fr=frhs, red=reduce_op, env=env, where=where):
            full = [sizes[s] for _, s in env]
            value = np.broadcast_to(fr(a), full).astype(F32)
            if red is not None:
                if where.endswith("0:1"):
                    value = value[:, :1]
                value = _REDUCTIONS[red](value, axis=1).astype(F32)
            a[t] = np.ascontiguousarray(value)

        steps.append(step)
        known[target] = out_shape
        written.append(target)
        has_reduction |= reduce_op is not None

    outputs = [t for t in written if t not in read_later or t == written[-1] or draw(st.booleans())]
    if written[-1] not in outputs:
        outputs.append(written[-1])
    source = (f"def random_program({', '.join(params)}) -> ({', '.join(outputs)}) {{\n"
              + "\n".join(statements) + "\n}\n")

    def numpy_fn(*arrays):
        env_arrays = dict(zip(inputs, arrays, strict=True))
        with np.errstate(all="ignore"):
            for step in steps:
                step(env_arrays)
        return tuple(env_arrays[t] for t in outputs)

    return GeneratedProgram(
        source=source,
        sizes=sizes,
        numpy_fn=numpy_fn,
        input_shapes=tuple(tuple(sizes[s] for s in known[n]) for n in inputs),
        output_shapes=tuple(tuple(sizes[s] for s in known[t]) for t in outputs),
        has_reduction=has_reduction,
    )


# ---------------------------------------------------------------- comparing with the model


def model_close(got: np.ndarray, want: np.ndarray) -> bool:
    """Within 1e-3 of max(1, max|want|) everywhere; non-finite values must agree."""
    g = got.astype(np.float64)
    w = want.astype(np.float64)
    finite = np.isfinite(w)
    if not np.array_equal(np.isfinite(g), finite):
        return False
    if not np.all((g == w)[~finite] | (np.isnan(g) & np.isnan(w))[~finite]):
        return False
    scale = max(1.0, float(np.max(np.abs(w[finite]), initial=0.0)))
    return bool(np.all(np.abs(g[finite] - w[finite]) <= 1e-3 * scale))


def check_against_model(program: GeneratedProgram, inputs, target: str, options=None) -> None:
    """``program`` on ``target``, writing into NaN-poisoned ``outputs=``, against its numpy
    model (never against tcmlir's reference interpreter)."""
    import tcmlir as tc

    want = program.numpy_fn(*[np.copy(x) for x in inputs])
    outs = tuple(np.full(shape, np.nan, dtype=F32) for shape in program.output_shapes)
    kwargs = {"options": options} if options is not None else {}
    got = tc.define(program.source, target=target)(*inputs, outputs=outs, **kwargs)
    got = got if isinstance(got, tuple) else (got,)
    assert len(got) == len(want), program.source
    for k, (g, o, w) in enumerate(zip(got, outs, want, strict=True)):
        for what, arr in (("returned", g), ("passed with outputs=", o)):
            arr = np.asarray(arr)
            assert arr.shape == w.shape and arr.dtype == F32, (
                f"output {k} ({what}): {arr.dtype}{arr.shape}\n{program.source}")
            assert model_close(arr, w), (
                f"output {k} ({what}) on {target} differs from the numpy model\n"
                f"{program.source}{program.sizes}\ngot {arr!r}\nexpected {w!r}")


# ---------------------------------------------------------------- token soups

TC_TOKENS = (
    "def", "f", "g", "(", ")", "{", "}", "->", ",", ".", ":", "?", "float", "double", "int32",
    "uint8", "bool", "float16", "A", "B", "C", "N", "M", "i", "j", "k", "=", "+=", "+=!", "*=!",
    "min=!", "max=!", "min=", "max=", "+", "-", "*", "/", "%", "<", "<=", ">", ">=", "==", "!=",
    "&&", "||", "!", "where", "in", "exists", "0", "1", "2", "2.5", "1e3", "exp", "min", "max",
    "fma", "A.0", "A.9", "#", "\n", "@", "$", ";", "'", '"', "\\", "\t", "0x1F", "-1", "true",
)


def token_soups(max_tokens: int = 40):
    """Random token sequences, bare or inside a valid signature (to get past the header)."""
    soup = st.lists(st.sampled_from(TC_TOKENS), max_size=max_tokens).map(" ".join)
    wrapped = soup.map(lambda body: "def f(float(N) A, float(N, M) B) -> (C) {\n" + body + "\n}\n")
    return st.one_of(soup, wrapped)
