"""Extreme programs for tools/fuzz_robust.py: many statements, many outputs, deep nesting,
high ranks, sizes 0, 1 and huge. Each comes with a numpy model (float32)."""
from __future__ import annotations

import random

import numpy as np

F32 = np.float32


def _chain(rng: random.Random):
    n = rng.choice([20, 50, 100, 200, 300])
    n_size = rng.choice([1, 5, 64])
    body = ["    T0(i) = A(i) * 0.5"] + [f"    T{k}(i) = T{k - 1}(i) * 0.5 + A(i)"
                                         for k in range(1, n)]
    src = f"def chain(float(N) A) -> (T{n - 1}) {{\n" + "\n".join(body) + "\n}\n"
    a = np.random.default_rng(n).uniform(-1, 1, n_size).astype(F32)

    def model():
        t = a * F32(0.5)
        for _ in range(1, n):
            t = t * F32(0.5) + a
        return (t,)
    return src, [a], model, f"{n} chained statements"


def _repeat(rng: random.Random):
    n = rng.choice([50, 150, 300])
    src = ("def rep(float(N) A) -> (O) {\n" + "\n".join(["    O(i) = A(i)"] * n) + "\n}\n")
    a = np.arange(7, dtype=F32)
    return src, [a], (lambda: (a,)), f"{n} identical statements"


def _outputs(rng: random.Random):
    n = rng.choice([20, 100, 200, 300])
    outs = ", ".join(f"O{k}" for k in range(n))
    body = "\n".join(f"    O{k}(i) = A(i) + {k}.0" for k in range(n))
    src = f"def many(float(N) A) -> ({outs}) {{\n{body}\n}}\n"
    a = np.linspace(-1, 1, rng.choice([1, 3, 33])).astype(F32)
    return src, [a], (lambda: tuple(a + F32(k) for k in range(n))), f"{n} outputs"


def _nesting(rng: random.Random):
    d = rng.choice([50, 100, 300, 500])
    form = rng.choice(["parens", "neg", "add", "tanh", "ternary", "mul", "minmax"])
    a = np.random.default_rng(d).uniform(-1, 1, 9).astype(F32)
    if form == "parens":
        expr, model = "(" * d + "A(i)" + ")" * d, a
    elif form == "neg":
        expr, model = "-(" * d + "A(i)" + ")" * d, a if d % 2 == 0 else -a
    elif form == "add":
        expr, model = "(A(i) + " * d + "A(i)" + ")" * d, a * F32(d + 1)
    elif form == "mul":
        expr, model = "(1.0 * " * d + "A(i)" + ")" * d, a
    elif form == "tanh":
        expr = "tanh(" * d + "A(i)" + ")" * d
        model = a.copy()
        for _ in range(d):
            model = np.tanh(model)
    elif form == "minmax":
        expr, model = "fmax(0.0, " * d + "A(i)" + ")" * d, np.maximum(a, 0)
    else:
        expr, model = "(A(i) > 2.0 ? 1.0 : " * d + "A(i)" + ")" * d, a
    src = f"def deep(float(N) A) -> (O) {{\n    O(i) = {expr}\n}}\n"
    return src, [a], (lambda: (model.astype(F32),)), f"nesting {form} x{d}"


def _rank(rng: random.Random):
    r = rng.randint(4, 16)
    shape = tuple(rng.choice([1, 2]) for _ in range(r))
    idx = [f"i{k}" for k in range(r)]
    dims = [f"S{k}" for k in range(r)]
    a = np.random.default_rng(r).uniform(-1, 1, shape).astype(F32)
    b = np.random.default_rng(r + 1).uniform(-1, 1, shape[-1]).astype(F32)
    if rng.random() < 0.5:
        src = (f"def hi(float({', '.join(dims)}) A, float({dims[-1]}) B) -> (O) {{\n"
               f"    O({', '.join(idx)}) = A({', '.join(idx)}) * 2.0 + B({idx[-1]})\n}}\n")
        return src, [a, b], (lambda: (a * F32(2) + b,)), f"rank {r} pointwise {shape}"
    src = (f"def hi(float({', '.join(dims)}) A) -> (O) {{\n"
           f"    O({', '.join(idx[:-1])}) +=! A({', '.join(idx)})\n}}\n")
    return src, [a], (lambda: (a.sum(axis=-1, dtype=F32),)), f"rank {r} reduction {shape}"


def _sizes(rng: random.Random):
    huge = 1 << rng.choice([31, 32, 40, 50])
    form = rng.choice(["zero_huge", "huge_zero", "empty_red", "empty_max", "empty_mm", "ones",
                       "long_sum"])
    if form in ("zero_huge", "huge_zero"):
        shape = (0, huge) if form == "zero_huge" else (huge, 0)
        a = np.zeros(shape, F32)
        src = "def z(float(N, M) A) -> (O) {\n    O(i, j) = A(i, j) + 1.0\n}\n"
        return src, [a], (lambda: (np.zeros(shape, F32),)), f"{form} {shape}"
    if form in ("empty_red", "empty_max"):
        op = "+=!" if form == "empty_red" else "max=!"
        a = np.zeros((rng.choice([1, 3]), 0), F32)
        src = f"def e(float(N, K) A) -> (O) {{\n    O(i) {op} A(i, k)\n}}\n"
        ident = 0.0 if op == "+=!" else -np.inf
        return src, [a], (lambda: (np.full(a.shape[0], ident, F32),)), f"{form} {a.shape}"
    if form == "empty_mm":
        m, n = rng.choice([1, 4]), rng.choice([1, 5])
        a, b = np.zeros((m, 0), F32), np.zeros((0, n), F32)
        src = "def mm(float(M, K) A, float(K, N) B) -> (C) {\n    C(m, n) +=! A(m, k) * B(k, n)\n}\n"
        return src, [a, b], (lambda: (np.zeros((m, n), F32),)), "matmul with K = 0"
    if form == "ones":
        a = np.full((1, 1, 1), 3.0, F32)
        src = ("def one(float(A, B, C) X) -> (O, P) {\n    O(a, b) +=! X(a, b, c)\n"
               "    P(a) max=! O(a, b)\n}\n")
        return src, [a], (lambda: (a.sum(axis=2), a.sum(axis=2).max(axis=1))), "all sizes 1"
    if form == "long_sum":
        n = (1 << 24) + 3
        a = np.ones((1, n), F32)
        src = "def s(float(M, N) A) -> (O) {\n    O(m) +=! A(m, n)\n}\n"
        return src, [a], (lambda: (np.full(1, n, F32),)), f"sum of {n} ones"
    raise AssertionError(form)


KINDS = (_chain, _repeat, _outputs, _nesting, _rank, _sizes)


def extreme_case(rng: random.Random):
    """(source, inputs, model thunk or None, description)."""
    return rng.choice(KINDS)(rng)
