"""Arrays (issue 13, item 5): torch CPU tensors in → torch tensors out, 0-size dimensions give
empty (or identity) outputs on every target without compiling or launching, and dtype hints
in the input's library."""

from __future__ import annotations

import numpy as np
import pytest

import tcmlir as tc
from tcmlir import compiler

MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }\n"
ROWMAX = "def rowmax(float(M,K) A) -> (C) { C(m) max=! A(m,k) }\n"
TWO = "def two(float(N) A) -> (B, S) { B(i) = A(i) + 1\n S(j) +=! A(j) }\n"
HOST_TARGETS = ["cpu", "numpy"]


@pytest.mark.parametrize("target", HOST_TARGETS)
def test_torch_cpu_in_torch_out(target):
    torch = pytest.importorskip("torch")
    fn = tc.define(MATMUL, target=target)
    a, b = torch.randn(5, 3), torch.randn(3, 4)
    out = fn(a, b)
    assert isinstance(out, torch.Tensor) and out.device.type == "cpu"
    assert out.dtype == torch.float32 and tuple(out.shape) == (5, 4)
    torch.testing.assert_close(out, a @ b, rtol=1e-5, atol=1e-5)
    again = fn(a, b)  # the second call (the prepared plan on cpu) keeps the kind
    assert isinstance(again, torch.Tensor)
    # numpy in: numpy out, as before
    assert isinstance(fn(a.numpy(), b.numpy()), np.ndarray)


def test_torch_cpu_several_outputs_and_bfloat16():
    torch = pytest.importorskip("torch")
    b_out, s = tc.define(TWO, target="cpu")(torch.arange(4, dtype=torch.float32))
    assert isinstance(b_out, torch.Tensor) and isinstance(s, torch.Tensor)
    assert b_out.tolist() == [1.0, 2.0, 3.0, 4.0] and s.tolist() == [0.0, 1.0, 2.0, 3.0]
    half = tc.define("def inc(bfloat16(N) A) -> (B) { B(i) = A(i) + 1 }", target="numpy")
    out = half(torch.ones(3, dtype=torch.bfloat16))
    assert out.dtype == torch.bfloat16 and out.tolist() == [2.0, 2.0, 2.0]


def test_dtype_hints_name_the_inputs_library():
    torch = pytest.importorskip("torch")
    fn = tc.define(MATMUL, target="cpu")
    with pytest.raises(tc.CallError, match=r"got float64 \(convert it, e.g. A.float\(\)\)"):
        fn(torch.ones(2, 2, dtype=torch.float64), torch.ones(2, 2))
    ints = tc.define("def f(int64(N) A) -> (B) { B(i) = A(i) }", target="cpu")
    with pytest.raises(tc.CallError, match=r"A.long\(\)"):
        ints(torch.ones(2, dtype=torch.int32))
    with pytest.raises(tc.CallError, match=r"A.astype\(np.float32\)"):
        fn(np.ones((2, 2)), np.ones((2, 2), np.float32))


@pytest.mark.parametrize("target", ["cpu", "numpy", "cuda"])
def test_zero_size_gives_empty_outputs_without_compiling(target):
    """No GPU needed even for cuda: nothing is compiled, nothing launched."""
    fn = tc.define(MATMUL, target=target)
    before = compiler.COMPILE_COUNTS["compile_kernel"]
    out = fn(np.ones((0, 3), np.float32), np.ones((3, 4), np.float32))
    assert isinstance(out, np.ndarray) and out.shape == (0, 4) and out.dtype == np.float32
    out = fn(np.ones((2, 3), np.float32), np.ones((3, 0), np.float32))
    assert out.shape == (2, 0)
    # only the reduced extent is 0: the reduction's identity, as numpy's a @ b gives
    out = fn(np.ones((2, 0), np.float32), np.ones((0, 3), np.float32))
    np.testing.assert_array_equal(out, np.zeros((2, 3), np.float32))
    assert compiler.COMPILE_COUNTS["compile_kernel"] == before


@pytest.mark.parametrize("target", HOST_TARGETS)
def test_zero_size_identities_outputs_and_kinds(target):
    rowmax = tc.define(ROWMAX, target=target)
    np.testing.assert_array_equal(rowmax(np.ones((3, 0), np.float32)), np.full(3, -np.inf))
    b_out, s = tc.define(TWO, target=target)(np.ones(0, np.float32))
    assert b_out.shape == (0,) and s.shape == (0,)
    fn = tc.define(MATMUL, target=target)
    given = np.full((2, 3), 7.0, np.float32)
    out = fn(np.ones((2, 0), np.float32), np.ones((0, 3), np.float32), outputs=[given])
    assert out is given and not given.any()
    kernel = fn.compile(np.ones((2, 2), np.float32), np.ones((2, 2), np.float32))
    assert kernel.launch(np.ones((0, 2), np.float32), np.ones((2, 2), np.float32)).shape == (0, 2)


def test_zero_size_checks_what_a_call_checks():
    fn = tc.define(MATMUL, target="cpu")
    with pytest.raises(tc.CallError, match="dtype float32"):
        fn(np.ones((0, 3), np.float64), np.ones((3, 4), np.float32))
    with pytest.raises(tc.CallError, match="size K is 3"):
        fn(np.ones((0, 3), np.float32), np.ones((2, 4), np.float32))
    shrink = tc.define("def d(float(N) A) -> (B) { B(i) = A(i) + A(i + 1) }", target="cpu")
    with pytest.raises(tc.CallError, match=r"give output B the shape \(-1,\): a negative"):
        shrink(np.ones(0, np.float32))  # B has N - 1 elements
    with pytest.raises(tc.CallError, match="must be rank 1"):
        shrink(np.ones((2, 0), np.float32))


def test_zero_size_torch_cpu_in_torch_out():
    torch = pytest.importorskip("torch")
    out = tc.define(MATMUL, target="cpu")(torch.ones(0, 3), torch.ones(3, 4))
    assert isinstance(out, torch.Tensor) and tuple(out.shape) == (0, 4)


@pytest.mark.gpu
def test_zero_size_torch_cuda_returns_torch_cuda_without_a_launch(monkeypatch):
    torch = pytest.importorskip("torch")
    from tcmlir.runtime import cuda_launch

    def no_launch(*args, **kwargs):
        raise AssertionError("a 0-size call must not launch a kernel")

    monkeypatch.setattr(cuda_launch, "launch_cuda", no_launch)
    fn = tc.define(MATMUL, target="cuda")
    a, b = torch.ones(0, 3, device="cuda"), torch.ones(3, 4, device="cuda")
    out = fn(a, b)
    assert out.is_cuda and tuple(out.shape) == (0, 4)
    out = fn(torch.ones(2, 0, device="cuda"), torch.ones(0, 3, device="cuda"))
    assert out.is_cuda and torch.equal(out.cpu(), torch.zeros(2, 3))
    # after a real call, a 0-size one through the kernel does not launch either
    monkeypatch.undo()
    kernel = fn.compile(torch.ones(2, 3, device="cuda"), torch.ones(3, 4, device="cuda"))
    monkeypatch.setattr(cuda_launch, "launch_cuda", no_launch)
    assert tuple(kernel.launch(a, b).shape) == (0, 4)


@pytest.mark.gpu
def test_torch_cpu_in_torch_out_on_cuda():
    torch = pytest.importorskip("torch")
    a, b = torch.randn(5, 3), torch.randn(3, 4)
    out = tc.define(MATMUL, target="cuda")(a, b)
    assert isinstance(out, torch.Tensor) and out.device.type == "cpu"
    torch.testing.assert_close(out, a @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_a_torch_cuda_input_on_a_host_target_names_cpu():
    torch = pytest.importorskip("torch")
    fn = tc.define(MATMUL, target="cpu")
    with pytest.raises(tc.CallError, match=r"copy the input to the host: A.cpu\(\)"):
        fn(torch.ones(2, 2, device="cuda"), torch.ones(2, 2))
