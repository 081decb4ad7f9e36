"""Calls that pass ``options=`` (a tuned result, on every call) take a remembered plan after
the first, as calls with the defaults do: keyed by the inputs' call key and the options (the
JSON text, or the very `MappingOptions` object). They cost ~100-170 us of binding and option
parsing per call before (measured on the host and seen on an H100: the zoo's ``--against``
column paid it), ~5 us after."""

from __future__ import annotations

import numpy as np
import pytest
from test_launch_plan import ADD, _faked

import tcmlir as tc


def _counting_compiles(monkeypatch, fn):
    seen = []
    inner = fn._compile

    def spy(*args, **kwargs):
        seen.append(args[1])
        return inner(*args, **kwargs)
    monkeypatch.setattr(fn, "_compile", spy)
    return seen


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("form", ["object", "json", "preset"])
def test_explicit_options_take_the_remembered_plan(monkeypatch, kind, form):
    fn = tc.define(ADD, target="cpu")
    x = np.arange(9, dtype=np.float32)
    if kind == "torch":
        torch = pytest.importorskip("torch")
        x = torch.from_numpy(x)
    opts = tc.MappingOptions.naive()
    given = {"object": opts, "json": opts.to_json(), "preset": "naive"}[form]
    seen = _counting_compiles(monkeypatch, fn)
    for _ in range(4):
        np.testing.assert_array_equal(np.asarray(fn(x, x, options=given)), 2 * np.asarray(x))
    assert len(seen) == 1, "later calls bound and parsed again"
    assert len(fn._option_plans) == 1
    fn(x, x)  # the defaults: their own plan, not the explicit one's
    assert len(seen) == 2 and len(fn._plans) == 1


def test_other_options_or_sizes_are_other_plans(monkeypatch):
    fn = tc.define(ADD, target="cpu")
    seen = _counting_compiles(monkeypatch, fn)
    x, y = np.ones(8, np.float32), np.ones(12, np.float32)
    a, b = tc.MappingOptions.naive(), tc.MappingOptions.pointwise()
    for opts in (a, b, a.to_json(), b.to_json()):
        for z in (x, y):
            np.testing.assert_array_equal(fn(z, z, options=opts), 2 * z)
    assert len(seen) == 8 and len(fn._option_plans) == 8
    for opts in (a, b, a.to_json(), b.to_json()):
        for z in (x, y):
            np.testing.assert_array_equal(fn(z, z, options=opts), 2 * z)
    assert len(seen) == 8
    # an equal options object that is another object: its own entry, the same kernel
    fn(x, x, options=tc.MappingOptions.naive())
    assert len(seen) == 9 and len(fn._kernels) == 4


def test_the_remembered_plans_are_bounded():
    fn = tc.define(ADD, target="cpu")
    x = np.ones(4, np.float32)
    for _ in range(40):  # a fresh options object per call: never more than 32 entries
        fn(x, x, options=tc.MappingOptions.naive())
    assert len(fn._option_plans) == 32


def test_explicit_options_on_a_cuda_function(monkeypatch, rng):
    """Over the fake driver, numpy inputs: the plan serves the second call, whose result is
    right (device arrays have no call key: every call of theirs binds, with or without options)."""
    a, b = (rng.standard_normal(300).astype(np.float32) for _ in range(2))
    fn, kernel, driver = _faked(monkeypatch, ADD, a, b)
    seen = _counting_compiles(monkeypatch, fn)
    for opts in (kernel.options, kernel.options.to_json()):
        for _ in range(3):
            driver.calls.clear()
            np.testing.assert_array_equal(fn(a, b, options=opts), a + b)
            assert [c[1] for c in driver.calls if c[0] == "cuLaunchKernel"] == \
                [k.name for k in kernel.runner.image.kernels]
    assert len(seen) == 2 and len(fn._option_plans) == 2
