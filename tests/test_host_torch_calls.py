"""Calls on the cpu target with torch CPU tensors: the warm call takes the prepared host plan
(`runtime.host_calls`), as numpy inputs do, with the same results and the same errors; and
`Kernel.benchmark` / `fn.profile` time that warm call and say so."""

import numpy as np
import pytest

import tcmlir as tc
import tcmlir.api as api
from tcmlir.errors import CallError
from tcmlir.runtime.host_calls import WARM_CALL

torch = pytest.importorskip("torch")

ADD = "def add(float(N) A, float(N) B) -> (C) { C(i) = A(i) + B(i) }"
TWO = "def two(float(N) A, float S) -> (C, D) { C(i) = A(i) * S\n D(i) = A(i) + S }"


@pytest.fixture
def binds(monkeypatch):
    """Counts the full binder's calls (each call that does not take a prepared plan)."""
    count = {"n": 0}
    real = api.bind_host_inputs

    def counting(*args, **kwargs):
        count["n"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(api, "bind_host_inputs", counting)
    return count


def _pair(n=37):
    rng = np.random.default_rng(n)
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    return a, b


def test_warm_torch_call_takes_the_plan(binds):
    fn = tc.define(ADD, target="cpu")
    a, b = _pair()
    ta, tb = torch.from_numpy(a.copy()), torch.from_numpy(b.copy())
    first = fn(ta, tb)
    assert binds["n"] == 1
    for _ in range(3):
        out = fn(ta, tb)
    assert binds["n"] == 1  # no full binding after the first call
    assert type(out) is torch.Tensor and out.dtype is torch.float32
    np.testing.assert_array_equal(out.numpy(), fn(a, b))
    np.testing.assert_array_equal(first.numpy(), out.numpy())
    # new tensors with the same key (other data pointers): still the plan
    tc2 = torch.from_numpy(b.copy() * 2)
    np.testing.assert_array_equal(fn(ta, tc2).numpy(), a + 2 * b)
    assert binds["n"] == 2  # (the numpy call above bound once)


def test_torch_outputs_share_the_plans_arrays_and_mixed_kinds(binds):
    fn = tc.define(TWO, target="cpu")
    a = torch.arange(11, dtype=torch.float32)
    fn(a, 2.0)
    c, d = fn(a, 3.0)
    assert binds["n"] == 1
    assert type(c) is torch.Tensor and type(d) is torch.Tensor
    np.testing.assert_array_equal(c.numpy(), a.numpy() * 3)
    np.testing.assert_array_equal(d.numpy(), a.numpy() + 3)
    # numpy first: outputs are numpy even with a torch tensor later (as in the full path)
    add = tc.define(ADD, target="cpu")
    x, y = _pair(8)
    out1 = add(x, torch.from_numpy(y))
    out2 = add(x, torch.from_numpy(y))
    assert type(out1) is np.ndarray and type(out2) is np.ndarray
    np.testing.assert_array_equal(out2, x + y)


def test_errors_are_the_same_on_a_warm_function():
    fn = tc.define(ADD, target="cpu")
    a, b = (torch.from_numpy(x) for x in _pair(16))
    fn(a, b)
    fn(a, b)
    with pytest.raises(CallError, match=r"input A must have dtype float32, got float64 "
                                        r"\(convert it, e\.g\. A\.float\(\)\)"):
        fn(a.double(), b)
    with pytest.raises(CallError, match="size N is 16 from A dimension 0 but 15"):
        fn(a, b[:15])
    with pytest.raises(CallError, match="input A must be rank 1"):
        fn(a.reshape(4, 4), b)
    # same key as the warm call's but on the meta device: the full path refuses it
    with pytest.raises(CallError, match=r"cannot view torch\.Tensor as an array"):
        fn(torch.empty(16, device="meta"), b)
    with pytest.raises(CallError, match="stream= is for target='cuda'"):
        fn(a, b, stream=1)


def test_non_contiguous_torch_inputs_bind_in_full(binds):
    fn = tc.define(ADD, target="cpu")
    base = torch.arange(40, dtype=torch.float32)
    a, b = base[::2], torch.ones(20)
    for _ in range(3):
        out = fn(a, b)
        np.testing.assert_array_equal(out.numpy(), a.numpy() + 1)
    assert binds["n"] == 3  # copied on every call, as a non-contiguous numpy array is
    assert base[0] == 0 and a.stride() == (2,)  # the input itself untouched


def test_tensors_that_require_grad_are_read_detached(binds):
    fn = tc.define(ADD, target="cpu")
    a = torch.ones(9, requires_grad=True)
    b = torch.full((9,), 2.0)
    for _ in range(3):
        out = fn(a, b)
        assert not out.requires_grad and out.grad_fn is None
        np.testing.assert_array_equal(out.numpy(), np.full(9, 3, np.float32))
    assert binds["n"] == 1


def test_outputs_given_as_torch_cpu_tensors():
    fn = tc.define(ADD, target="cpu")
    a, b = (torch.from_numpy(x) for x in _pair(12))
    c = torch.empty(12)
    got = fn(a, b, outputs=c)
    assert got is c
    np.testing.assert_array_equal(c.numpy(), a.numpy() + b.numpy())
    two = tc.define(TWO, target="cpu")
    c2, d2 = torch.empty(12), torch.empty(12)
    got = two(a, 2.0, outputs=[c2, d2])
    assert got[0] is c2 and got[1] is d2
    np.testing.assert_array_equal(d2.numpy(), a.numpy() + 2)
    with pytest.raises(CallError, match="output C requires grad"):
        fn(a, b, outputs=torch.empty(12, requires_grad=True))
    with pytest.raises(CallError, match="output C must be a writable C-contiguous array"):
        fn(a, b, outputs=torch.empty(24)[::2])
    with pytest.raises(CallError, match="must have dtype float32, got float64"):
        fn(a, b, outputs=torch.empty(12, dtype=torch.float64))
    with pytest.raises(CallError, match=r"output C .* shares memory with input A"):
        fn(a, b, outputs=a)
    with pytest.raises(CallError, match="numpy array or a torch CPU tensor here"):
        fn(a, b, outputs=torch.empty(12, device="meta"))


def test_benchmark_and_profile_time_the_warm_call(monkeypatch):
    fn = tc.define(ADD, target="cpu")
    a, b = (torch.from_numpy(x) for x in _pair(64))
    kernel = fn.compile(a, b)
    # the slow per-call packing of HostKernel.run must not be what is timed
    monkeypatch.setattr(type(kernel.runner), "run", lambda *a, **k: pytest.fail("slow path"))
    result = kernel.benchmark(a, b, runs=3)
    assert result.runs == 3 and result.path == WARM_CALL
    assert kernel.benchmark(a.numpy(), b.numpy(), runs=2).path == WARM_CALL
    full = kernel.benchmark(torch.arange(128.0)[::2], b, runs=2)
    assert full.path.startswith("full call")
    prof = fn.profile(a, b, runs=2, ceilings={"flops": 1e10, "bandwidth": 1e10,
                                              "launch_s": 1e-6})
    assert prof.timed == WARM_CALL
    assert f"timed: {WARM_CALL}" in str(prof) and prof.to_dict()["timed"] == WARM_CALL


@pytest.mark.parametrize("tc_type, dtype", [("bfloat16", "bfloat16"), ("float16", "float16"),
                                             ("double", "float64"), ("int32", "int32")])
def test_warm_torch_call_keeps_the_dtype(binds, tc_type, dtype):
    fn = tc.define(ADD.replace("float", tc_type), target="cpu")
    a = torch.arange(13).to(getattr(torch, dtype))
    b = torch.ones(13).to(getattr(torch, dtype))
    fn(a, b)
    out = fn(a, b)
    assert binds["n"] == 1
    assert out.dtype == a.dtype
    assert torch.equal(out, a + b)


def test_buffer_protocol_inputs_bind_and_take_the_plan(binds):
    import array

    fn = tc.define(ADD, target="cpu")
    a = array.array("f", range(10))
    b = memoryview(np.full(10, 0.5, np.float32))
    first = fn(a, b)
    out = fn(a, b)
    assert binds["n"] == 1
    assert type(out) is np.ndarray
    np.testing.assert_array_equal(out, np.arange(10, dtype=np.float32) + 0.5)
    np.testing.assert_array_equal(first, out)
    # a strided memoryview binds (copied) in full every call; a wrong format is the usual error
    strided = memoryview(np.arange(20, dtype=np.float32))[::2]
    np.testing.assert_array_equal(fn(strided, b), np.arange(0, 20, 2) + 0.5)
    np.testing.assert_array_equal(fn(strided, b), np.arange(0, 20, 2) + 0.5)
    assert binds["n"] == 3
    with pytest.raises(CallError, match="input A must have dtype float32, got float64"):
        fn(array.array("d", range(10)), b)
    u8 = tc.define(ADD.replace("float", "uint8"), target="cpu")
    np.testing.assert_array_equal(u8(bytes(range(5)), bytearray(5)), np.arange(5))
    with pytest.raises(CallError, match=r"input A must be an array, got builtins\.str"):
        fn("abc", b)


def test_the_guarded_entry_serves_torch_cpu_calls_and_sees_the_knobs(binds, monkeypatch):
    fn = tc.define(ADD, target="cpu")
    a, b = (torch.from_numpy(x) for x in _pair(20))
    fn(a, b)
    assert fn._fast is not None
    # the entry alone serves the warm call: the key's lookup is never reached
    monkeypatch.setattr(api, "call_key", lambda inputs: pytest.fail("looked the key up"))
    np.testing.assert_array_equal(fn(a, b).numpy(), a.numpy() + b.numpy())
    assert binds["n"] == 1
    monkeypatch.undo()  # (both patches)
    monkeypatch.setattr(api, "bind_host_inputs", lambda *x, **k: pytest.fail("bound"))
    fn(a, b)
    # a hot knob changed: the entry misses, the call binds in full again
    monkeypatch.setenv("TCMLIR_GATHER_CHECK", "async")
    with pytest.raises(pytest.fail.Exception, match="bound"):
        fn(a, b)
