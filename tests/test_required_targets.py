"""Skips that cannot hide a broken backend (issue 19, point 2).

`runtime.probe` tells "no GPU here" from "CUDA is broken"; ``tests/conftest.py`` skips GPU
tests only for the first, and not even then under ``TCMLIR_REQUIRE_GPU=1``/``--require-gpu``;
``target="auto"`` raises rather than run on the CPU when CUDA is broken; environment flags
with a value that is not understood are TCErrors. Fake drivers stand in for cuda-python.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from conftest import TESTS_DIR, gpu_unusable

import tcmlir as tc
from tcmlir import api
from tcmlir.config import get_config
from tcmlir.errors import CudaError
from tcmlir.runtime import probe


class DynamicLibNotFoundError(RuntimeError):
    """Named like cuda-pathfinder's: what cuInit raises when libcuda is not installed."""


class FakeDriver:
    def __init__(self, init=0, count=1, init_raises=None):
        self.init, self.count, self.init_raises = init, count, init_raises

    def cuInit(self, flags):
        if self.init_raises is not None:
            raise self.init_raises
        return (self.init,)

    def cuDeviceGetCount(self):
        return (0, self.count)


@pytest.fixture
def fake_driver(monkeypatch):
    """Install a fake driver module: ``fake_driver(...)`` returns the fresh probe."""

    def install(driver=None, import_error=None):
        def import_driver():
            if import_error is not None:
                raise import_error
            return driver

        monkeypatch.setattr(probe, "_import_driver", import_driver)
        probe.probe_gpu.cache_clear()
        return probe.probe_gpu()

    yield install
    probe.probe_gpu.cache_clear()


@pytest.mark.parametrize(("driver", "import_error", "state"), [
    (FakeDriver(), None, "ok"),
    (FakeDriver(count=0), None, "absent"),
    (FakeDriver(init=100), None, "absent"),  # CUDA_ERROR_NO_DEVICE
    (FakeDriver(init_raises=DynamicLibNotFoundError("libcuda.so not found")), None, "absent"),
    (None, ModuleNotFoundError("No module named 'cuda'", name="cuda"), "absent"),
    (FakeDriver(init=999), None, "broken"),  # CUDA_ERROR_UNKNOWN
    (FakeDriver(init=35), None, "broken"),  # CUDA_ERROR_INSUFFICIENT_DRIVER
    (FakeDriver(init_raises=RuntimeError("planted: cuInit exploded")), None, "broken"),
    (None, ImportError("libnvrtc.so: undefined symbol"), "broken"),
    (None, ModuleNotFoundError("No module named 'numpy.core'", name="numpy.core"), "broken"),
], ids=["ok", "zero-devices", "no-device", "no-libcuda", "no-cuda-python", "unknown-error",
        "old-driver", "cuinit-raises", "import-broken", "import-dependency-missing"])
def test_probe_states(fake_driver, driver, import_error, state):
    result = fake_driver(driver, import_error)
    assert result.state == state, result
    assert result.ok == (state == "ok")
    assert (result.reason == "") == (state == "ok")


def test_broken_cuda_fails_gpu_tests_even_when_not_required(fake_driver):
    fake_driver(FakeDriver(init_raises=RuntimeError("planted")))
    action, reason = gpu_unusable(required=False)
    assert action == "fail" and "planted" in reason


def test_absent_gpu_skips_unless_required(fake_driver):
    fake_driver(FakeDriver(count=0))
    assert gpu_unusable(required=False)[0] == "skip"
    action, reason = gpu_unusable(required=True)
    assert action == "fail" and "TCMLIR_REQUIRE_GPU" in reason
    fake_driver(FakeDriver())
    assert gpu_unusable(required=True) is None


def test_auto_target_raises_when_cuda_is_broken(fake_driver, monkeypatch):
    monkeypatch.delenv("TCMLIR_TARGET", raising=False)
    fake_driver(FakeDriver(init_raises=RuntimeError("planted: cuInit exploded")))
    with pytest.raises(CudaError, match=r"(?s)target='auto'.*planted.*TCMLIR_TARGET=cpu"):
        api.resolve_target("auto")
    fn = tc.define("def f(float(N) A) -> (B) { B(i) = A(i) + 1 }")
    import numpy as np

    with pytest.raises(CudaError, match="unusable"):
        fn(np.zeros(3, np.float32))
    assert api.resolve_target("cpu") == "cpu"  # an explicit target is not probed
    monkeypatch.setenv("TCMLIR_TARGET", "cpu")
    assert api.resolve_target("auto") == "cpu"  # the documented way out


def test_auto_target_is_cpu_only_without_a_device(fake_driver, monkeypatch):
    monkeypatch.delenv("TCMLIR_TARGET", raising=False)
    fake_driver(FakeDriver(count=0))
    assert api.resolve_target("auto") == "cpu"
    fake_driver(FakeDriver())
    assert api.resolve_target("auto") == "cuda"


@pytest.mark.parametrize("name", ["TCMLIR_ALWAYS_COMPILE", "TCMLIR_REQUIRE_GPU"])
def test_flags_reject_values_they_do_not_understand(monkeypatch, name):
    field = name.removeprefix("TCMLIR_").lower()
    for value, want in (("1", True), ("on", True), ("0", False), ("off", False), ("", False)):
        monkeypatch.setenv(name, value)
        assert getattr(get_config(), field) is want
    monkeypatch.setenv(name, "bogus")
    with pytest.raises(tc.TCError, match=rf"{name}='bogus'.*use 1"):
        get_config()


def test_always_compile_bogus_fails_a_call(monkeypatch):
    import numpy as np

    monkeypatch.setenv("TCMLIR_ALWAYS_COMPILE", "bogus")
    fn = tc.define("def f(float(N) A) -> (B) { B(i) = A(i) + 1 }", target="cpu")
    with pytest.raises(tc.TCError, match="TCMLIR_ALWAYS_COMPILE"):
        fn(np.zeros(3, np.float32))


# ---------------------------------------------------------------- the hooks, in a sub-session

_PRETEND = {
    "ok": 'probe.GpuProbe("ok", devices=1)',
    "absent": 'probe.GpuProbe("absent", "pretend: no device")',
    "broken": 'probe.GpuProbe("broken", "pretend: cuInit exploded")',
}


def _sub_session(tmp_path, state: str, *args: str) -> subprocess.CompletedProcess:
    """pytest on two gpu-marked tests (one skips itself) with the project's conftest as a
    plugin and the GPU probe pretending ``state``."""
    (tmp_path / "test_pretend.py").write_text(textwrap.dedent(f"""
        import pytest
        import tcmlir.runtime.probe as probe

        probe.probe_gpu = lambda: {_PRETEND[state]}

        @pytest.mark.gpu
        def test_runs():
            pass

        @pytest.mark.gpu
        def test_skips_itself():
            pytest.skip("an optional module is missing")

        def test_cpu():
            pass
    """))
    env = {k: v for k, v in os.environ.items() if k != "TCMLIR_REQUIRE_GPU"}
    env["PYTHONPATH"] = TESTS_DIR + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-p", "conftest",
         "-W", "ignore::pytest.PytestUnknownMarkWarning", "--rootdir", str(tmp_path),
         str(tmp_path / "test_pretend.py"), *args],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)


def test_hooks_skip_fail_and_require(tmp_path):
    absent = _sub_session(tmp_path, "absent")
    assert absent.returncode == 0, absent.stdout
    assert "1 passed, 2 skipped" in absent.stdout and "pretend: no device" in absent.stdout

    required = _sub_session(tmp_path, "absent", "--require-gpu")
    assert required.returncode == 1, required.stdout
    assert "1 passed, 2 errors" in required.stdout and "TCMLIR_REQUIRE_GPU=1" in required.stdout

    broken = _sub_session(tmp_path, "broken")
    assert broken.returncode == 1 and "pretend: cuInit exploded" in broken.stdout, broken.stdout

    ok_required = _sub_session(tmp_path, "ok", "--require-gpu")
    assert ok_required.returncode == 1, ok_required.stdout  # a skip inside a GPU test counts
    assert "GPU tests skipped under TCMLIR_REQUIRE_GPU=1" in ok_required.stdout
    assert "test_skips_itself" in ok_required.stdout

    ok = _sub_session(tmp_path, "ok")
    assert ok.returncode == 0 and "2 passed, 1 skipped" in ok.stdout, ok.stdout
