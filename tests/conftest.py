"""Shared pytest configuration: the tests directory on sys.path, a per-test seeded rng, the
targets tests run on, and the `gpu` marker's skip-or-fail logic (``--require-gpu``).

Helpers for backend tests (re-exported from `corpus`):

    from conftest import check_against_reference, target_params
    check_against_reference(source, inputs, "cpu", options=None)   # compiled == reference
"""

from __future__ import annotations

import os
import subprocess
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
    "gpu_required",
    "gpu_unusable",
    "gpu_visible",
    "poisoned_like",
    "run_program",
    "target_params",
    "target_unavailable_reason",
]

# ---------------------------------------------------------------- GPU detection
#
# A GPU test is skipped for one reason only: no CUDA device is visible (`runtime.probe` state
# "absent": cuda-python or the driver library not installed, CUDA_ERROR_NO_DEVICE, zero
# devices). A CUDA stack that is there but fails ("broken") makes every GPU test fail with the
# probe's reason. With TCMLIR_REQUIRE_GPU=1 (or ``pytest --require-gpu``) an absent GPU fails
# them too: a GPU run can then not turn green by skipping. The host JIT and the reference
# interpreter are always required: nothing is skipped because ``target="cpu"`` raised.


def pytest_addoption(parser):
    parser.addoption("--require-gpu", action="store_true", default=False,
                     help="fail (do not skip) GPU tests when no GPU is usable; the same as "
                          "TCMLIR_REQUIRE_GPU=1")


def pytest_configure(config):
    if config.getoption("--require-gpu"):
        os.environ["TCMLIR_REQUIRE_GPU"] = "1"  # read through tcmlir.config, by subprocesses too


def gpu_required() -> bool:
    from tcmlir.config import get_config

    return get_config().require_gpu


def gpu_visible() -> bool:
    """True when a CUDA GPU is usable (the driver initialised and sees a device)."""
    from tcmlir.runtime.probe import probe_gpu

    return probe_gpu().ok


def gpu_unusable(required: bool | None = None) -> tuple[str, str] | None:
    """None when GPU tests can run; else ``("skip" | "fail", reason)``: skip only when no
    device is visible and a GPU is not required."""
    from tcmlir.runtime.probe import probe_gpu

    probe = probe_gpu()
    if probe.ok:
        return None
    required = gpu_required() if required is None else required
    if probe.state == "broken":
        return "fail", f"CUDA is installed but broken: {probe.reason}"
    if required:
        return "fail", f"a GPU is required (TCMLIR_REQUIRE_GPU=1) but none is visible: {probe.reason}"
    return "skip", f"needs a visible CUDA GPU ({probe.reason})"


# ---------------------------------------------------------------- targets


def target_unavailable_reason(target: str) -> str | None:
    """Why tests of ``target`` cannot run here (None: they run). Only cuda can be unavailable,
    and only for want of a visible device; numpy and cpu are always required."""
    if target != "cuda":
        return None
    verdict = gpu_unusable()
    return None if verdict is None else verdict[1]


def available_targets() -> list[str]:
    """The targets tests run on here: numpy and cpu always, cuda when a GPU is usable."""
    return ["numpy", "cpu"] + (["cuda"] if gpu_visible() else [])


def target_params() -> list:
    """pytest params for ``target``: numpy, cpu, and cuda with the ``gpu`` marker (skipped or
    failed by `pytest_runtest_setup` when no GPU is usable)."""
    return [pytest.param("numpy", id="numpy"), pytest.param("cpu", id="cpu"),
            pytest.param("cuda", id="cuda", marks=[pytest.mark.gpu])]


# ---------------------------------------------------------------- hooks and fixtures


def pytest_runtest_setup(item):
    if item.get_closest_marker("gpu") is None:
        return
    verdict = gpu_unusable()
    if verdict is None:
        return
    action, reason = verdict
    if action == "skip":
        pytest.skip(reason)
    pytest.fail(reason, pytrace=False)


_SKIPPED_GPU_TESTS: list[str] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and item.get_closest_marker("gpu") is not None:
        _SKIPPED_GPU_TESTS.append(item.nodeid)


def pytest_sessionfinish(session, exitstatus):
    """Under TCMLIR_REQUIRE_GPU=1 a GPU test that skipped for any reason (a missing optional
    module, a skip inside the test) fails the run."""
    if _SKIPPED_GPU_TESTS and gpu_required() and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if _SKIPPED_GPU_TESTS and gpu_required():
        terminalreporter.section("GPU tests skipped under TCMLIR_REQUIRE_GPU=1 (a failure)")
        for nodeid in _SKIPPED_GPU_TESTS:
            terminalreporter.line(nodeid)


def seed_for(nodeid: str) -> int:
    return zlib.crc32(nodeid.encode())


@pytest.fixture
def rng(request) -> np.random.Generator:
    """A numpy Generator seeded from the test id: fresh per test, reproducible per test."""
    return np.random.default_rng(seed_for(request.node.nodeid))


def ptxas_verbose(tmp_path, ptx: str, name: str = "kernel", arch: str = "sm_90") -> str:
    """Assemble ``ptx`` with ``ptxas -v`` (which must succeed) and return its report
    (registers, shared memory, spills) for the test to check."""
    path = tmp_path / f"{name}.ptx"
    path.write_text(ptx)
    r = subprocess.run(["ptxas", f"-arch={arch}", "-v", str(path), "-o", str(tmp_path / f"{name}.cubin")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stderr
