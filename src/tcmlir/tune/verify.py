"""Verified tuning: a candidate's outputs are checked against a reference before its time counts.

Used by the evaluators (`tune.evaluate`, in-process and inside GPU worker processes) and by the
cache-serving paths (`factories.make_load_from_cache_options_factory`, `fn.autotune`'s cache
hit), which re-verify a stored row the first time this process uses it for a signature.

* The reference (`compute_reference`) is computed once per tuning run on the tuning inputs: by
  the reference interpreter (``target="numpy"``) when the iteration domain is at most
  `REFERENCE_MAX_OPS` statement instances, otherwise by the kernel of the default options
  (`MappingOptions.default_for`) on the tuning target, since the interpreter would take minutes.
* Before a checked run the outputs are poisoned (NaN for floats, `INT_POISON` for integers,
  True for bools), and the reference is computed from the same poison, so an element a candidate
  forgets to write shows up. A program that reads its outputs' prior contents (``+=`` without
  ``!``, a read of an output before it is written) starts from zeros instead, as a plain call does.
* Floats are compared in float64 within ``tol * max|expected|``, ``tol`` by dtype and scaled up
  with the reduction length behind the output (`tolerance`); a NaN or inf where the reference has
  a finite value (or the reverse) is wrong; integers and bools must match exactly.
* A wrong candidate gets the reason ``wrong result: max rel error 3.2e-01 at C[4, 7] (...)``.

Test hook: ``TCMLIR_TUNE_MISCOMPILE=FIELD=VALUE`` (read through `tcmlir.config`) spoils one
output element after every checked run of options whose FIELD has that JSON VALUE, so such
candidates go through the real comparison and must be rejected.
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import ir
from ..errors import TCError
from ..options import MappingOptions

__all__ = ["INT_POISON", "REFERENCE_MAX_OPS", "Reference", "TuneError", "WrongResultWarning",
           "check_outputs", "compile_candidate", "compute_reference", "estimated_ops", "is_verified",
           "mark_verified", "planted_miscompile", "reads_outputs", "run_checked",
           "tolerance", "verify_for_call"]

REFERENCE_MAX_OPS = 10**8  # statement instances the interpreter is asked to run, at most
INT_POISON = 0x5A  # fits every signed and unsigned integer type
_BASE_RTOL = {"float16": 1e-2, "bfloat16": 5e-2, "float32": 1e-4, "float64": 1e-10}


class TuneError(TCError):
    """The tuner found no usable candidate (none compiled, ran and computed the right result)."""


class WrongResultWarning(UserWarning):
    """Cached tuned options computed a wrong result and were dropped from the cache."""


def _is_float(dtype: np.dtype) -> bool:
    return dtype.kind == "f" or dtype.name == "bfloat16"


# ---------------------------------------------------------------- what the program does


def reads_outputs(fn: ir.Function) -> bool:
    """Whether a statement reads an output's prior contents (then outputs cannot be poisoned)."""
    outputs = {t.name for t in fn.outputs}
    written: set[str] = set()
    for st in fn.statements:
        reads = {e.tensor for e in ir.walk(st.rhs) if isinstance(e, ir.Read)}
        if st.reduction is not None and not st.init:
            reads.add(st.tensor)
        if (reads & outputs) - written:
            return True
        written.add(st.tensor)
    return False


def _extent(r: ir.IndexRange, sizes: dict[str, int]) -> int:
    return max(0, r.hi.evaluate(sizes) - r.lo.evaluate(sizes))


def estimated_ops(fn: ir.Function, sizes: dict[str, int]) -> int:
    """Statement instances of the whole program at these sizes (what the interpreter runs)."""
    return ir.instance_count(fn, sizes)


def _reduction_lengths(fn: ir.Function, sizes: dict[str, int]) -> dict[str, int]:
    """Per tensor: how many terms (through earlier reductions too) one element may sum."""
    length: dict[str, int] = {}
    for st in fn.statements:
        red = math.prod(_extent(st.range_of(i), sizes) for i in st.reduction_indices)
        feeding = max((length.get(e.tensor, 1) for e in ir.walk(st.rhs)
                       if isinstance(e, ir.Read)), default=1)
        length[st.tensor] = max(length.get(st.tensor, 1), max(1, red) * feeding)
    return length


def tolerance(dtype: np.dtype | str, reduction_length: int) -> float:
    """Allowed ``|got - expected| / max|expected|``: the dtype's base tolerance (f16 1e-2,
    bf16 5e-2, f32 1e-4, f64 1e-10), times ``sqrt(L) / 8`` for a reduction of L > 64 terms
    (summation order changes the rounding), at most 5e-2 above the base."""
    base = _BASE_RTOL.get(np.dtype(dtype).name, 1e-4)
    scaled = base * max(1.0, math.sqrt(max(1, reduction_length)) / 8)
    return min(scaled, base + 5e-2)


# ---------------------------------------------------------------- the reference


@dataclass(frozen=True)
class Reference:
    """Expected outputs (float64 for float outputs), in ``->`` order, and how to compare."""

    names: tuple[str, ...]
    dtypes: tuple[str, ...]  # the outputs' storage dtypes
    expected: tuple[np.ndarray, ...]
    tolerances: tuple[float, ...]  # 0 for integer and bool outputs (exact)
    poison: bool
    source: str  # "interpreter" or "default kernel"

    def fresh_outputs(self) -> tuple[np.ndarray, ...]:
        """Output arrays to run a candidate into: poisoned, or zeros (see the module doc)."""
        return _fresh(self.dtypes, [e.shape for e in self.expected], self.poison)

    def save(self, path: str) -> None:
        meta = {"names": self.names, "dtypes": self.dtypes, "tolerances": self.tolerances,
                "poison": self.poison, "source": self.source}
        np.savez(path, meta=np.array(json.dumps(meta)),
                 **{f"out{i}": e for i, e in enumerate(self.expected)})

    @classmethod
    def load(cls, path: str) -> Reference:
        with np.load(path) as data:
            meta = json.loads(str(data["meta"]))
            expected = tuple(data[f"out{i}"] for i in range(len(meta["names"])))
        return cls(tuple(meta["names"]), tuple(meta["dtypes"]), expected,
                   tuple(meta["tolerances"]), bool(meta["poison"]), meta["source"])


def _fresh(dtypes: Sequence[str], shapes: Sequence[tuple[int, ...]], poison: bool
           ) -> tuple[np.ndarray, ...]:
    outs = []
    for dtype_name, shape in zip(dtypes, shapes, strict=True):
        out = np.zeros(shape, dtype=_np_dtype(dtype_name))
        if poison:
            out.fill(np.nan if _is_float(out.dtype) else
                     (True if out.dtype.kind == "b" else INT_POISON))
        outs.append(out)
    return tuple(outs)


def _np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _expected_form(arr: np.ndarray) -> np.ndarray:
    arr = np.asarray(arr)
    return arr.astype(np.float64) if _is_float(arr.dtype) else arr.copy()


def to_host(x: Any) -> Any:
    """``x`` as host data; device arrays of any kind copied (`input_spec.host_copy`)."""
    from ..input_spec import host_copy

    return host_copy(x)


def compute_reference(fn: Any, inputs: Sequence[Any], target: str, *,
                      max_ops: int = REFERENCE_MAX_OPS) -> Reference:
    """The expected outputs of ``fn`` on ``inputs`` (see the module docstring for which)."""
    from ..binding import bind_host_inputs, output_shapes

    host = [np.asarray(to_host(x)) for x in inputs]
    bound = bind_host_inputs(fn.ir, host)
    sizes = dict(bound.sizes)
    shapes = output_shapes(fn.ir, sizes)
    lengths = _reduction_lengths(fn.ir, sizes)
    names = tuple(t.name for t in fn.ir.outputs)
    dtypes = tuple(np.dtype(t.dtype.numpy).name for t in fn.ir.outputs)
    tols = tuple(tolerance(d, lengths.get(n, 1)) if _is_float(_np_dtype(d)) else 0.0
                 for n, d in zip(names, dtypes, strict=True))
    poison = not reads_outputs(fn.ir)
    outs = _fresh(dtypes, [shapes[n] for n in names], poison)
    if estimated_ops(fn.ir, sizes) <= max_ops:
        from ..reference import run

        run(fn.ir, bound.arrays, sizes, dict(zip(names, outs, strict=True)))
        source = "interpreter"
    else:
        kernel = compile_candidate(fn, host, MappingOptions.default_for(fn.ir, target, sizes), target)
        outs = _as_tuple(kernel.launch(*host, outputs=outs))
        source = "default kernel"
    return Reference(names, dtypes, tuple(_expected_form(o) for o in outs), tols, poison, source)


# ---------------------------------------------------------------- comparing


def _as_tuple(result: Any) -> tuple[Any, ...]:
    return tuple(result) if isinstance(result, tuple | list) else (result,)


def _where(name: str, shape: tuple[int, ...], flat: int) -> str:
    if not shape:
        return name
    return f"{name}[{', '.join(str(int(i)) for i in np.unravel_index(flat, shape))}]"


def check_outputs(got: Sequence[Any], reference: Reference) -> str | None:
    """None when every output matches the reference, else the reason (the worst element)."""
    if len(got) != len(reference.expected):
        return f"wrong result: {len(got)} outputs, expected {len(reference.expected)}"
    for name, g, exp, tol in zip(reference.names, got, reference.expected,
                                 reference.tolerances, strict=True):
        g = np.asarray(to_host(g))
        if g.shape != exp.shape:
            return f"wrong result: {name} has shape {g.shape}, expected {exp.shape}"
        if _is_float(exp.dtype):
            g64 = g.astype(np.float64)
            finite = np.isfinite(exp)
            scale = float(np.max(np.abs(exp[finite]))) if finite.any() else 0.0
            scale = scale if scale > 0 else 1.0
            with np.errstate(invalid="ignore", over="ignore"):
                err = np.abs(g64 - exp) / scale
            err[np.isnan(err)] = np.inf  # NaN where a number was expected (or the reverse)
            same_special = ~finite & ((g64 == exp) | (np.isnan(g64) & np.isnan(exp)))
            err[same_special] = 0.0
            err[~finite & ~same_special] = np.inf
            bad = err > tol
            if bad.any():
                flat = int(np.argmax(err))
                return (f"wrong result: max rel error {err.flat[flat]:.1e} at "
                        f"{_where(name, exp.shape, flat)} (got {g64.flat[flat]:.6g}, expected "
                        f"{exp.flat[flat]:.6g}; {int(bad.sum())} of {bad.size} elements off, "
                        f"tolerance {tol:.0e} of max|{name}| {scale:.3g})")
        else:
            bad = g != exp
            if bad.any():
                diff = np.abs(g.astype(np.int64) - exp.astype(np.int64))
                flat = int(np.argmax(np.where(bad, diff, -1)))
                return (f"wrong result: max abs error {int(diff.flat[flat])} at "
                        f"{_where(name, exp.shape, flat)} (got {g.flat[flat]!r}, expected "
                        f"{exp.flat[flat]!r}; {int(bad.sum())} of {bad.size} elements differ)")
    return None


def planted_miscompile(options: MappingOptions) -> bool:
    """Whether the ``TCMLIR_TUNE_MISCOMPILE`` test hook names these options."""
    from ..config import get_config

    spec = get_config().tune_miscompile
    if spec is None:
        return False
    name, wanted = spec
    have = json.loads(options.to_json()).get(name)
    return have == wanted


def _spoil(out: np.ndarray) -> None:
    """The planted miscompile: one element (the middle one) changed beyond any tolerance."""
    if out.size == 0:
        return
    k = out.size // 2
    if _is_float(out.dtype):
        values = np.asarray(out, dtype=np.float64)
        finite = values[np.isfinite(values)]
        bump = 1.0 + (float(np.max(np.abs(finite))) if finite.size else 0.0)
        out.flat[k] = float(values.flat[k]) + bump if np.isfinite(values.flat[k]) else 1.0
    elif out.dtype.kind == "b":
        out.flat[k] = not out.flat[k]
    else:
        out.flat[k] = out.flat[k] + 1


def run_checked(kernel: Any, inputs: Sequence[Any], reference: Reference) -> str | None:
    """Run ``kernel`` once into fresh (poisoned) outputs and compare with ``reference``."""
    outs = reference.fresh_outputs()
    got = list(_as_tuple(kernel.launch(*inputs, outputs=outs)))
    if planted_miscompile(kernel.options):
        for g in got[:1]:
            _spoil(g)
    return check_outputs(got, reference)


# ---------------------------------------------------------------- re-verification of cached rows

_VERIFIED: set[tuple[str, ...]] = set()
_VERIFIED_LOCK = threading.Lock()


def _verified_key(fn: Any, target: str, signature_json: str, options: MappingOptions
                  ) -> tuple[str, ...]:
    return (fn.canonical_source, fn.entry, target, signature_json, options.to_json(),
            str(os.getpid()))


def mark_verified(fn: Any, target: str, signature_json: str, options: MappingOptions) -> None:
    """Record that ``options`` computed the right result for this signature in this process."""
    with _VERIFIED_LOCK:
        _VERIFIED.add(_verified_key(fn, target, signature_json, options))


def is_verified(fn: Any, target: str, signature_json: str, options: MappingOptions) -> bool:
    with _VERIFIED_LOCK:
        return _verified_key(fn, target, signature_json, options) in _VERIFIED


def verify_for_call(fn: Any, inputs: Sequence[Any], options: MappingOptions,
                    target: str | None = None) -> str | None:
    """Check cached ``options`` on the inputs of the call about to use them, once per process
    and signature: None when right (or already checked), else the reason.

    The kernel is compiled with ``fn.compile`` (it enters the function's kernel table, so the
    call that follows reuses it: no extra compile) and run once, on the call's own inputs
    (device arrays in place), into poisoned outputs; the reference is `compute_reference` on
    a host copy of the inputs (device inputs are copied once, and the log says so).
    """
    from ..input_spec import host_copies
    from ..targets import resolve_target

    target = resolve_target(target or fn.target)
    if target == "numpy":
        return None
    sig = fn.input_spec(inputs, target).signature.to_json()
    if is_verified(fn, target, sig, options):
        return None
    host = host_copies(fn.ir, inputs, "checking the cached options against the reference")
    # a failing reference (bad inputs) is the call's error, not the row's: it propagates
    reference = compute_reference(fn, host, target)
    try:
        kernel = fn.compile(*inputs, options=options, target=target)
        reason = run_checked(kernel, inputs, reference)
    except TCError as exc:
        return f"failed to compile or run: {str(exc).splitlines()[0]}"
    if reason is None:
        mark_verified(fn, target, sig, options)
    return reason


def compile_candidate(fn: Any, inputs: Sequence[Any], opts: MappingOptions, target: str) -> Any:
    """A `Kernel` for ``opts`` (through the artifact cache, not the in-memory kernel table)."""
    from .. import compiler

    if target == "cuda":
        from ..runtime.arrays import bind_device_inputs

        bound = bind_device_inputs(fn.ir, inputs)
    else:
        from ..binding import bind_host_inputs

        bound = bind_host_inputs(fn.ir, inputs)
    return compiler.compile_kernel(fn, target, opts, bound.signature, bound.sizes, None)
