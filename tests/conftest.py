"""Shared pytest configuration: the tests directory on sys.path, a per-test seeded rng, the
targets available on this machine, and the `gpu` marker's skip logic.

Helpers for backend tests (re-exported from `corpus`):

    from conftest import check_against_reference, target_params
    check_against_reference(source, inputs, "cpu", options=None)   # compiled == reference
"""

from __future__ import annotations

import functools
import os
import sys
import zlib

import numpy as np
import pytest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))

# The test run gets a cache database of its own: it neither reads the user's tuned options or
# compiled kernels nor fills the user's cache directory (tests that need a specific cache set
# TCMLIR_CACHE_DIR or pass a path themselves).
if "TCMLIR_CACHE_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["TCMLIR_CACHE_DIR"] = tempfile.mkdtemp(prefix="tcmlir-test-cache-")
    atexit.register(shutil.rmtree, os.environ["TCMLIR_CACHE_DIR"], True)

if TESTS_DIR not in sys.path:
    sys.path.insert(0, TESTS_DIR)

from corpus import (  # noqa: E402  (needs the sys.path entry above)
    as_tuple,
    assert_outputs_close,
    check_against_reference,
    poisoned_like,
    run_program,
)

__all__ = [
    "as_tuple",
    "assert_outputs_close",
    "available_targets",
    "check_against_reference",
    "gpu_visible",
    "poisoned_like",
    "run_program",
    "target_params",
    "target_unavailable_reason",
]

_TRIVIAL = "def trivial(float(N) A) -> (B) { B(i) = A(i) + 1 }"


# ---------------------------------------------------------------- GPU detection


@functools.lru_cache(maxsize=1)
def gpu_visible() -> bool:
    """True when a CUDA GPU is visible: tcmlir's runtime if it says, else the driver API."""
    try:
        from tcmlir.runtime import cuda as tc_cuda  # type: ignore[attr-defined]

        is_available = getattr(tc_cuda, "is_available", None)
        if is_available is not None:
            return bool(is_available())
    except Exception:  # noqa: BLE001  (any failure here means: ask the driver instead)
        pass
    try:
        try:
            from cuda.bindings import driver
        except ImportError:
            from cuda import cuda as driver  # older cuda-python
        (err,) = driver.cuInit(0)
        if int(err) != 0:
            return False
        err, count = driver.cuDeviceGetCount()
        return int(err) == 0 and int(count) > 0
    except Exception:  # noqa: BLE001  (no driver, no library, no device: no GPU)
        return False


# ---------------------------------------------------------------- targets


@functools.cache
def target_unavailable_reason(target: str) -> str | None:
    """None when ``target`` compiles and runs a trivial program here, else why not."""
    if target == "cuda" and not gpu_visible():
        return "no CUDA GPU visible"
    import tcmlir as tc

    try:
        fn = tc.define(_TRIVIAL, target=target)
        fn(np.arange(5, dtype=np.float32))
    except (ImportError, NotImplementedError, tc.TCError) as exc:
        # not implemented yet (or refused on purpose): skip, never fake a result
        return f"target {target!r} not available: {type(exc).__name__}: {str(exc)[:200]}"
    except Exception:  # noqa: BLE001
        # a crash is not "unavailable": keep the target so each test fails with the traceback
        return None
    return None  # (a wrong result is for the tests to report, not a reason to skip)


def available_targets() -> list[str]:
    """The targets that work here: numpy (always listed), cpu and cuda when they compile."""
    return ["numpy"] + [t for t in ("cpu", "cuda") if target_unavailable_reason(t) is None]


def target_params() -> list:
    """pytest params for ``target``: numpy always; cpu/cuda skip (with the reason) when not
    available; cuda carries the ``gpu`` marker."""
    params = [pytest.param("numpy", id="numpy")]
    for target in ("cpu", "cuda"):
        marks = [pytest.mark.gpu] if target == "cuda" else []
        reason = target_unavailable_reason(target)
        if reason is not None:
            marks.append(pytest.mark.skip(reason=reason))
        params.append(pytest.param(target, id=target, marks=marks))
    return params


# ---------------------------------------------------------------- hooks and fixtures


def pytest_collection_modifyitems(config, items):
    if gpu_visible():
        return
    skip_gpu = pytest.mark.skip(reason="needs a visible CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


def seed_for(nodeid: str) -> int:
    return zlib.crc32(nodeid.encode())


@pytest.fixture
def rng(request) -> np.random.Generator:
    """A numpy Generator seeded from the test id: fresh per test, reproducible per test."""
    return np.random.default_rng(seed_for(request.node.nodeid))
