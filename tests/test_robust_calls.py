"""Issue 12, call-time robustness: ``outputs=`` aliasing (item 5), byte-swapped arrays (item
7), huge broadcast views (item 17) and ``tcmlir run`` at sizes that do not fit (item 22).

Every rule holds on the numpy and cpu targets and in the CUDA binder; the CUDA launch path
runs over the fake driver of ``fake_cuda`` (no GPU needed), and a GPU test checks device
pointer ranges of real torch tensors.
"""

from __future__ import annotations

import os
import tracemalloc

import numpy as np
import pytest
from fake_cuda import device_array, install_fake

import tcmlir as tc
from tcmlir import binding
from tcmlir.cli import main, random_inputs
from tcmlir.errors import CallError
from tcmlir.runtime.arrays import bind_device_inputs
from tcmlir.runtime.cuda_launch import CudaRunner

MM = "def mm(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }"
ADD = "def add(float(N) x, float(N) y) -> (z) { z(i) = x(i) + y(i) }"
TWO = "def two(float(N) x) -> (a, b) { a(i) = x(i) + 1 \n b(i) = x(i) * 2 }"
ROWSUM = "def rowsum(float(N, M) A) -> (S) { S(i) +=! A(i, j) }"
HOST_TARGETS = ("numpy", "cpu")


def _faked_cuda(monkeypatch, source):
    driver, runtime = install_fake(monkeypatch)
    import tcmlir.cache.artifacts as artifacts

    monkeypatch.setattr(artifacts, "make_cuda_runner",
                        lambda image, key, device=0: CudaRunner(image, device, runtime=runtime))
    return tc.define(source, target="cuda"), driver


# ---------------------------------------------------------------- item 5: outputs= aliasing


@pytest.mark.parametrize("target", HOST_TARGETS)
def test_output_aliasing_an_input_is_a_call_error_naming_both(target, rng):
    X = rng.standard_normal((4, 4)).astype(np.float32)
    eye = np.eye(4, dtype=np.float32)
    mm = tc.define(MM, target=target)
    with pytest.raises(CallError, match=r"output C \(given with outputs=\) shares memory with "
                                        r"input A"):
        mm(X, eye, outputs=(X,))
    with pytest.raises(CallError, match=r"output C .* shares memory with input B"):
        mm(eye, X, outputs=X)
    base = rng.standard_normal(16).astype(np.float32)
    add = tc.define(ADD, target=target)
    with pytest.raises(CallError, match=r"output z .* input x"):  # partial overlap of slices
        add(base[0:8], np.ones(8, np.float32), outputs=base[4:12])
    out = base[8:16]  # adjacent, not overlapping: fine
    expected = base[0:8] + 1
    assert add(base[0:8], np.ones(8, np.float32), outputs=out) is out
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("target", HOST_TARGETS)
def test_two_outputs_sharing_memory_are_refused(target):
    fn = tc.define(TWO, target=target)
    buf = np.zeros(5, np.float32)
    with pytest.raises(CallError, match=r"output b .* shares memory with output a"):
        fn(np.ones(5, np.float32), outputs=(buf, buf))
    a, b = np.zeros(5, np.float32), np.zeros(5, np.float32)
    fn(np.ones(5, np.float32), outputs=(a, b))
    assert (a == 2).all() and (b == 2).all()


def test_overlap_test_is_exact_for_interleaved_views():
    base = np.zeros(16, np.float32)
    assert not binding.arrays_overlap(base[0::2], base[1::2])  # bounds overlap, elements don't
    assert binding.arrays_overlap(base[0::2], base[2:3])
    assert not binding.arrays_overlap(base[:0], base)


def test_cuda_outputs_aliasing_device_or_host_inputs_are_refused(monkeypatch, rng):
    fn, driver = _faked_cuda(monkeypatch, ADD)
    x = rng.standard_normal(8).astype(np.float32)
    y = rng.standard_normal(8).astype(np.float32)
    dx, dy = device_array(x), device_array(y)
    with pytest.raises(CallError, match=r"output z .* shares memory with input x"):
        fn(dx, dy, outputs=device_array(x))  # the same device memory as x
    with pytest.raises(CallError, match=r"output z .* shares memory with input y"):
        fn(x, y, outputs=y)  # numpy arrays
    assert not [c for c in driver.calls if c[0] == "cuLaunchKernel"], "refused before launching"
    out = np.zeros(8, np.float32)
    kernel = fn.compile(dx, dy)
    from fake_cuda import simulate_with_host
    simulate_with_host(driver, kernel.runner.image, tc.define(ADD, target="cpu").compile(x, y))
    fn(dx, dy, outputs=device_array(out))  # separate memory: runs
    np.testing.assert_array_equal(out, x + y)


@pytest.mark.gpu
def test_torch_cuda_outputs_aliasing_inputs_are_refused():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device for torch")
    fn = tc.define(ADD, target="cuda")
    base = torch.randn(16, device="cuda")
    with pytest.raises(CallError, match=r"output z .* input x"):
        fn(base[0:8], base[8:16], outputs=base[4:12])
    out = torch.empty(8, device="cuda")
    fn(base[0:8], base[8:16], outputs=out)
    torch.testing.assert_close(out, base[0:8] + base[8:16])


# ---------------------------------------------------------------- item 7: byte order


@pytest.mark.parametrize("target", HOST_TARGETS)
def test_byte_swapped_arrays_are_refused_by_every_host_target(target):
    fn = tc.define(ADD, target=target)
    swapped = np.arange(4, dtype=">f4")
    with pytest.raises(CallError, match=r"input x has byte-swapped elements \(dtype >f4\)"):
        fn(swapped, np.ones(4, np.float32))
    with pytest.raises(CallError, match="output z has byte-swapped"):
        fn(np.ones(4, np.float32), np.ones(4, np.float32), outputs=np.zeros(4, ">f4"))
    native = swapped.astype(swapped.dtype.newbyteorder("="))  # the fix the message names
    np.testing.assert_array_equal(fn(native, np.ones(4, np.float32)), np.arange(4) + 1)


def test_byte_swapped_arrays_are_refused_by_the_cuda_binder(monkeypatch):
    fn = tc.define(ADD, target="cuda")
    with pytest.raises(CallError, match="input x has byte-swapped elements"):
        bind_device_inputs(fn.ir, [np.arange(4, dtype=">f4"), np.ones(4, np.float32)])
    faked, _ = _faked_cuda(monkeypatch, ADD)
    x = np.ones(4, np.float32)
    with pytest.raises(CallError, match="output z has byte-swapped"):
        faked(x, x, outputs=np.zeros(4, ">f4"))

    class BigEndianDevice:  # a __cuda_array_interface__ producer with '>f4' elements
        @property
        def __cuda_array_interface__(self):
            return {"shape": (4,), "typestr": ">f4", "data": (x.ctypes.data, False),
                    "version": 3, "strides": None}

    with pytest.raises(CallError, match="big-endian"):
        bind_device_inputs(fn.ir, [BigEndianDevice(), x])


# ---------------------------------------------------------------- item 17: broadcast views


@pytest.mark.parametrize("target", HOST_TARGETS)
def test_huge_broadcast_view_is_refused_with_the_copy_size(target, monkeypatch):
    monkeypatch.setattr(binding, "host_memory_available", lambda: 2**30)
    fn = tc.define(ROWSUM, target=target)
    huge = np.broadcast_to(np.ones(1, np.float32), (16, 2**30))  # 64 GiB as a copy
    with pytest.raises(CallError, match=r"copy of input A 64\.0 GiB.*more than the 1\.0 GiB"):
        fn(huge)
    small = np.broadcast_to(np.arange(5, dtype=np.float32), (3, 5))  # fits: copied, right
    np.testing.assert_array_equal(fn(small), np.full(3, 10, np.float32))


def test_huge_broadcast_view_is_refused_by_the_cuda_binder(monkeypatch):
    monkeypatch.setattr(binding, "host_memory_available", lambda: 2**30)
    fn = tc.define(ROWSUM, target="cuda")
    huge = np.broadcast_to(np.ones(1, np.float32), (2**20, 2**20))
    with pytest.raises(CallError, match=r"broadcast \(zero-stride\) view .* 4\.0 TiB"):
        bind_device_inputs(fn.ir, [huge])


def test_outputs_that_do_not_fit_are_refused_before_allocating(monkeypatch):
    monkeypatch.setattr(binding, "host_memory_available", lambda: 2**20)
    fn = tc.define("def outer(float(N) x, float(M) y) -> (O) { O(i, j) = x(i) * y(j) }",
                   target="cpu")
    x = np.ones(4096, np.float32)
    with pytest.raises(CallError, match=r"output O 64\.0 MiB.*more than the 1\.0 MiB"):
        fn(x, x)


def test_host_memory_available_reads_the_machine():
    available = binding.host_memory_available()
    assert available is None or available > 2**20


# ---------------------------------------------------------------- item 22: tcmlir run


EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def test_run_at_sizes_that_do_not_fit_is_a_clean_error(capsys):
    code = main(["run", os.path.join(EXAMPLES, "matmul.tc"), "--sizes",
                 "M=100000,K=100000,N=100000", "--target", "cpu"])
    err = capsys.readouterr().err
    assert code == 2
    assert "Traceback" not in err
    assert "input A 37.3 GiB, input B 37.3 GiB, output C 37.3 GiB" in err
    assert "111.8 GiB of host memory" in err


def test_random_inputs_are_made_in_their_dtype_without_a_float64_copy():
    fn = tc.define("def f(float(N, M) A, float16(N) h, int8(N) c, bool(N) b) -> (O) "
                   "{ O(i, j) = A(i, j) + float(h(i)) + float(c(i)) + (b(i) ? 1.0 : 0.0) }")
    tracemalloc.start()
    try:
        arrays = random_inputs(fn.ir, {"N": 1000, "M": 1000})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    A, h, c, _ = arrays
    assert [a.dtype for a in arrays] == [np.float32, np.float16, np.int8, np.bool_]
    assert A.min() >= -1 and A.max() < 1 and abs(float(A.mean())) < 0.01
    assert h.min() >= -1 and h.max() <= 1 and c.min() >= 0 and c.max() < 8
    # 4 MB of float32 (a float64 draw first would peak at 12 MB)
    assert peak < 6 * 2**20, peak
