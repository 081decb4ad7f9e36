"""An options factory answers for the first call of each signature (factories.py); later calls
of that signature take the remembered plan, as calls without a factory do (a factory used to
cost every call the full binding path: ~150 us against ~5 us on the host)."""

from __future__ import annotations

import numpy as np
import pytest

import tcmlir as tc

ADD = "def add(float(N) x, float(N) y) -> (z) { z(i) = x(i) + y(i) }"


def _counting(inner):
    calls = []

    def factory(fn, inputs):
        calls.append(tuple(np.shape(x) for x in inputs))
        return inner(fn, inputs)
    return factory, calls


def _array(kind, n):
    x = np.arange(n, dtype=np.float32)
    if kind == "torch":
        torch = pytest.importorskip("torch")
        return torch.from_numpy(x)
    return x


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("make", [tc.make_naive_options_factory,
                                  lambda: tc.make_load_from_cache_options_factory(False)])
def test_a_factory_is_asked_once_per_signature_and_calls_take_the_plan(make, kind):
    factory, calls = _counting(make())
    fn = tc.define(ADD, target="cpu", options_factory=factory)
    x = _array(kind, 8)
    for _ in range(5):
        np.testing.assert_array_equal(np.asarray(fn(x, x)), 2 * np.asarray(x))
    assert calls == [((8,), (8,))]
    assert len(fn._plans) == 1  # the warm path, not the binding path
    y = _array(kind, 12)  # another signature: asked again
    np.testing.assert_array_equal(np.asarray(fn(y, y)), 2 * np.asarray(y))
    np.testing.assert_array_equal(np.asarray(fn(x, x)), 2 * np.asarray(x))
    assert calls == [((8,), (8,)), ((12,), (12,))]


def test_explicit_options_still_bypass_the_factory():
    factory, calls = _counting(tc.make_naive_options_factory())
    fn = tc.define(ADD, target="cpu", options_factory=factory)
    x = np.ones(4, np.float32)
    fn(x, x, options=tc.MappingOptions.naive())
    assert calls == []
