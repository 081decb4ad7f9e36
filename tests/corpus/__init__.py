"""The shared test corpus: well-formed programs with numpy oracles, malformed programs, and
the comparison helpers every backend's tests use.

    from corpus import assert_outputs_close, poisoned_like, run_program, check_against_reference
    from corpus.programs import CASES
    from corpus.malformed import MALFORMED, CALL_ERRORS

Conventions (see DESIGN.md §7):
* comparisons are done in float64; a float output matches when every element is within
  ``rtol * max|expected|`` of the expected value (ints and bools must match exactly);
* outputs passed with ``outputs=`` are poisoned first (NaN for floats, a sentinel for ints) so
  that an element a backend forgot to write shows up.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = [
    "DEFAULT_RTOL",
    "INT_POISON",
    "as_tuple",
    "assert_outputs_close",
    "check_against_reference",
    "default_rtol",
    "poisoned_like",
    "run_program",
]

# Sentinel written into integer outputs before a run (fits every signed and unsigned type).
INT_POISON = 0x5A

DEFAULT_RTOL = {
    np.dtype(np.float16): 1e-2,
    np.dtype(np.float32): 1e-4,
    np.dtype(np.float64): 1e-10,
}


def default_rtol(dtype: np.dtype) -> float:
    if is_float(dtype) and np.dtype(dtype).itemsize == 2 and np.dtype(dtype).kind != "f":
        return 1e-2  # bfloat16 (ml_dtypes): 8 significant bits
    return DEFAULT_RTOL.get(np.dtype(dtype), 1e-4)


def is_float(dtype: np.dtype) -> bool:
    """A floating-point dtype, ml_dtypes' bfloat16 (numpy kind "V") included."""
    dtype = np.dtype(dtype)
    return dtype.kind == "f" or dtype.name == "bfloat16"


def as_tuple(result) -> tuple[np.ndarray, ...]:
    """A call's result as a tuple (one output comes back bare, several as a tuple)."""
    if isinstance(result, tuple):
        return result
    if isinstance(result, list):
        return tuple(result)
    return (result,)


def poisoned_like(expected: np.ndarray) -> np.ndarray:
    """A fresh C-contiguous array of the expected shape and dtype, filled with poison."""
    out = np.empty(expected.shape, dtype=expected.dtype)
    if is_float(out.dtype):
        out.fill(np.nan)
    elif out.dtype.kind == "b":
        out.fill(True)
    else:
        out.fill(INT_POISON)
    return out


def _describe_mismatch(got: np.ndarray, exp: np.ndarray, bad: np.ndarray) -> str:
    where = np.argwhere(bad)
    shown = ", ".join(
        f"{tuple(int(v) for v in w)}: got {got[tuple(w)]!r} expected {exp[tuple(w)]!r}"
        for w in where[:5]
    )
    return f"{int(bad.sum())} of {bad.size} elements differ (first: {shown})"


def assert_outputs_close(
    got: Sequence[np.ndarray],
    expected: Sequence[np.ndarray],
    rtol: float | None = None,
    *,
    context: str = "",
) -> None:
    """Same count, shapes and dtypes; floats within ``rtol * max|expected|``; ints exact."""
    got = as_tuple(got)
    expected = as_tuple(expected)
    prefix = f"{context}: " if context else ""
    assert len(got) == len(expected), f"{prefix}{len(got)} outputs, expected {len(expected)}"
    for k, (g, e) in enumerate(zip(got, expected, strict=True)):
        g = np.asarray(g)
        e = np.asarray(e)
        what = f"{prefix}output {k}"
        assert g.shape == e.shape, f"{what}: shape {g.shape}, expected {e.shape}"
        assert g.dtype == e.dtype, f"{what}: dtype {g.dtype}, expected {e.dtype}"
        if is_float(e.dtype):
            tol = default_rtol(e.dtype) if rtol is None else rtol
            g64 = g.astype(np.float64)
            e64 = e.astype(np.float64)
            finite = np.isfinite(e64)
            # non-finite expectations (rare: an intended inf) must match exactly
            bad_special = ~finite & ~((g64 == e64) | (np.isnan(g64) & np.isnan(e64)))
            scale = float(np.max(np.abs(e64[finite]))) if finite.any() else 0.0
            scale = scale if scale > 0 else 1.0
            with np.errstate(invalid="ignore"):
                bad = finite & ~(np.abs(g64 - e64) <= tol * scale)
            bad |= bad_special
            assert not bad.any(), (
                f"{what} (rtol {tol:g} of max|expected| {scale:g}): "
                + _describe_mismatch(g, e, bad)
            )
        else:
            bad = g != e
            assert not bad.any(), f"{what}: " + _describe_mismatch(g, e, bad)


def run_program(fn, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray] | None = None,
                options=None) -> tuple[np.ndarray, ...]:
    """Call a `tc.define`d function and return its outputs as a tuple."""
    kwargs = {}
    if outputs is not None:
        kwargs["outputs"] = tuple(outputs)
    if options is not None:
        kwargs["options"] = options
    return as_tuple(fn(*inputs, **kwargs))


def assert_case_matches(fn, inputs: Sequence[np.ndarray], reference: Sequence[np.ndarray], *,
                        full_write: bool, rtol: float | None, options=None,
                        context: str = "") -> None:
    """A compiled ``fn`` against ``reference`` outputs: with fresh outputs, and (when the
    program writes every element) into poisoned ``outputs=`` arrays, which must be the ones
    written."""
    got = run_program(fn, inputs, options=options)
    assert_outputs_close(got, reference, rtol, context=f"{context} (fresh outputs)")
    if full_write:
        outs = tuple(poisoned_like(r) for r in reference)
        got = run_program(fn, inputs, outputs=outs, options=options)
        assert_outputs_close(got, reference, rtol, context=f"{context} (outputs=)")
        assert_outputs_close(outs, reference, rtol, context=f"{context} (arrays passed)")


def check_against_reference(
    source: str,
    inputs: Sequence[np.ndarray],
    target: str,
    options=None,
    *,
    name: str | None = None,
    rtol: float | None = None,
    poison: bool = True,
) -> tuple[np.ndarray, ...]:
    """Run ``source`` on ``target`` and on the reference interpreter and compare.

    With ``poison`` (the default) the target writes into poisoned ``outputs=`` arrays, so an
    element it forgets shows up; turn it off for programs that do not write every element of
    their outputs (or read them: ``+=`` without ``!``). Returns the target's outputs.
    """
    import tcmlir as tc

    reference = run_program(tc.define(source, name=name, target="numpy"),
                            [np.copy(x) for x in inputs])
    fn = tc.define(source, name=name, target=target)
    outs = tuple(poisoned_like(r) for r in reference) if poison else None
    got = run_program(fn, inputs, outputs=outs, options=options)
    assert_outputs_close(got, reference, rtol, context=f"target {target!r} vs numpy")
    if outs is not None:
        assert_outputs_close(outs, reference, rtol,
                             context=f"target {target!r}: arrays passed with outputs=")
    return got
