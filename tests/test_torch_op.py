"""`tcmlir.torch.op`: TC definitions as torch custom ops with derived gradients.

CPU tensors run on the host target: gradcheck in float64 for the differentiable corpus
programs, ``torch.library.opcheck`` (schema, fake implementation, autograd registration),
``torch.compile(fullgraph=True)`` (``aot_eager`` here: it traces the fake implementations and
the autograd formula without inductor's C++ compile; the inductor variant is marked
``slow``), and a small model with two tcmlir ops (an MLP block, a layernorm) that trains with
the same losses as its eager torch equivalent. GPU tests (marked ``gpu``) repeat the checks
on CUDA tensors and check the launch on torch's current stream.
"""

from __future__ import annotations

import re
import sys

import numpy as np
import pytest
from corpus.programs import case_by_name

torch = pytest.importorskip("torch")

import tcmlir as tc  # noqa: E402
import tcmlir.torch as tt  # noqa: E402
from tcmlir.grad import GradError  # noqa: E402

GRADCHECK = ["matmul", "batch_matmul", "conv2d", "group_conv", "softmax_temporaries",
             "layernorm", "maxpool", "unary_builtins", "binary_builtins", "mlp2_temporary"]


def double(source: str) -> str:
    return re.sub(r"\bfloat\b", "double", source)


def corpus_op(name: str, target: str = "cpu") -> tt.TorchOp:
    case = case_by_name(name)
    return tt.op(tc.define(double(case.source), case.entry, target=target))


def corpus_inputs(name: str, rng, device: str = "cpu") -> list:
    case = case_by_name(name)
    sizes = case.sizes[1] if len(case.sizes) > 1 else case.sizes[0]
    return [torch.tensor(np.asarray(x, np.float64), device=device, requires_grad=True)
            for x in case.make_inputs(rng, **sizes)]


def test_the_subpackage_does_not_shadow_torch():
    assert tt.torch is sys.modules["torch"]
    assert "tcmlir" not in torch.__file__.replace("\\", "/").split("/site-packages/")[-1]
    assert hasattr(torch, "library") and hasattr(torch, "compile")


@pytest.mark.parametrize("name", GRADCHECK)
def test_gradcheck_float64_cpu(name, rng):
    op = corpus_op(name)
    args = corpus_inputs(name, rng)
    assert torch.autograd.gradcheck(op, tuple(args), fast_mode=True)


def test_full_jacobian_gradcheck(rng):
    """Every column of the Jacobian (the other checks use gradcheck's random projections)."""
    case = case_by_name("layernorm")
    args = [torch.tensor(np.asarray(x, np.float64), requires_grad=True)
            for x in case.make_inputs(rng, T=3, D=5)]
    assert torch.autograd.gradcheck(corpus_op("layernorm"), tuple(args))


def test_forward_matches_torch_and_returns_tensors(rng):
    op = corpus_op("batch_matmul")
    x, y = corpus_inputs("batch_matmul", rng)
    out = op(x, y)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float64
    torch.testing.assert_close(out, torch.bmm(x, y), rtol=1e-12, atol=1e-12)
    out.sum().backward()
    torch.testing.assert_close(x.grad, torch.ones_like(out) @ y.detach().transpose(1, 2))


def test_opcheck_schema_fake_and_autograd(rng):
    op = corpus_op("conv2d")
    result = torch.library.opcheck(op._custom, tuple(corpus_inputs("conv2d", rng)),
                                   test_utils=("test_schema", "test_autograd_registration",
                                               "test_faketensor"))
    assert set(result.values()) == {"SUCCESS"}, result


def test_fake_shapes_come_from_range_inference(rng):
    from torch._subclasses.fake_tensor import FakeTensorMode

    op = corpus_op("strided_conv_inferred")
    with FakeTensorMode():
        out = op(torch.empty(2, 3, 9, 8, dtype=torch.float64),
                 torch.empty(4, 3, 3, 2, dtype=torch.float64))
    assert tuple(out.shape) == (2, 4, 4, 4) and out.dtype == torch.float64


def test_scalar_inputs_and_several_outputs(rng):
    op = corpus_op("softmax_outputs")
    (x,) = corpus_inputs("softmax_outputs", rng)
    o, s, m = op(x)
    torch.testing.assert_close(o, torch.softmax(x, 1))
    torch.testing.assert_close(s, torch.exp(x - x.max(1, keepdim=True).values).sum(1))
    torch.testing.assert_close(m, x.max(1).values)
    ln = corpus_op("layernorm")
    x = x.detach().requires_grad_()
    y = ln(x, 1e-5)  # a Python float for the scalar input
    torch.testing.assert_close(y, torch.nn.functional.layer_norm(x, (x.shape[1],), eps=1e-5))


def test_compile_fullgraph_matches_eager(rng):
    op = corpus_op("layernorm")
    x = corpus_inputs("layernorm", rng)[0]

    def f(x):
        return (op(x, torch.tensor(1e-5, dtype=torch.float64)) ** 2).sum()

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    loss = compiled(x)
    (grad,) = torch.autograd.grad(loss, x)
    x2 = x.detach().requires_grad_()
    (want,) = torch.autograd.grad(f(x2), x2)
    torch.testing.assert_close(loss, f(x2))
    torch.testing.assert_close(grad, want)


MLP = """
def mlp_block(double(B, M) I, double(N, M) W1, double(N) B1) -> (O) {
    O(b, n) +=! I(b, m) * W1(n, m)
    O(b, n) = fmax(O(b, n) + B1(n), 0)
}
"""
LAYERNORM = """
def layernorm_affine(double(T, D) I, double(D) G, double(D) Bt) -> (O) {
    mean(t) +=! I(t, d) / D
    c(t, d) = I(t, d) - mean(t)
    var(t) +=! c(t, d) * c(t, d) / D
    O(t, d) = c(t, d) * rsqrt(var(t) + 1e-5) * G(d) + Bt(d)
}
"""


def train(step_fn, params, x, y, steps=4, lr=0.1) -> list[float]:
    losses = []
    for _ in range(steps):
        loss = step_fn(x, y, *params)
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads, strict=True):
                p -= lr * g
        losses.append(float(loss.detach()))
    return losses


def model_losses(device: str, backend: str | None, target: str = "cpu") -> tuple[list, list]:
    gen = torch.Generator().manual_seed(0)
    B, M, N, P = 8, 6, 5, 3

    def init():
        return [(torch.randn(N, M, generator=gen, dtype=torch.float64) * 0.5),
                torch.randn(N, generator=gen, dtype=torch.float64) * 0.1,
                torch.ones(N, dtype=torch.float64), torch.zeros(N, dtype=torch.float64),
                torch.randn(P, N, generator=gen, dtype=torch.float64) * 0.5]

    x = torch.randn(B, M, generator=gen, dtype=torch.float64).to(device)
    y = torch.randn(B, P, generator=gen, dtype=torch.float64).to(device)
    start = init()
    mlp = tt.op(tc.define(MLP, target=target))
    ln = tt.op(tc.define(LAYERNORM, target=target))

    def tcmlir_step(x, y, w1, b1, g, bt, w2):
        h = ln(mlp(x, w1, b1), g, bt)
        return ((h @ w2.t() - y) ** 2).mean()

    def torch_step(x, y, w1, b1, g, bt, w2):
        h = torch.relu(x @ w1.t() + b1)
        h = torch.nn.functional.layer_norm(h, (h.shape[1],), g, bt, eps=1e-5)
        return ((h @ w2.t() - y) ** 2).mean()

    step = tcmlir_step if backend is None else torch.compile(
        tcmlir_step, fullgraph=True, backend=backend)
    ours = train(step, [p.clone().to(device).requires_grad_() for p in start], x, y)
    reference = train(torch_step, [p.clone().to(device).requires_grad_() for p in start], x, y)
    return ours, reference


def test_compiled_model_with_two_tcmlir_ops_trains_like_torch():
    ours, reference = model_losses("cpu", "aot_eager")
    assert ours[-1] < ours[0]
    np.testing.assert_allclose(ours, reference, rtol=1e-10)


@pytest.mark.slow
def test_inductor_compiled_model_trains_like_torch():
    ours, reference = model_losses("cpu", "inductor")
    np.testing.assert_allclose(ours, reference, rtol=1e-10)


def test_gather_input_is_refused_at_definition_and_guarded_at_backward(rng):
    case = case_by_name("embedding_gather")
    fn = tc.define(double(case.source), target="cpu")
    with pytest.raises(GradError, match=r"input E.*gather"):
        tt.op(fn, "embedding_test")
    forward_only = tt.op(fn, "embedding_test", wrt=())  # the failed attempt registered nothing
    E = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    idx = torch.tensor([4, 0, 2], dtype=torch.int32)
    out = forward_only(E, idx)
    torch.testing.assert_close(out, E.detach()[idx.long()])
    with pytest.raises(GradError, match="input E requires a gradient"):
        out.sum().backward()


def test_wrong_dtype_is_a_call_error_under_compile_too():
    op = corpus_op("matmul")
    a, b = torch.ones(2, 3), torch.ones(3, 4)  # float32 for a float64 definition
    with pytest.raises(tc.CallError, match="input A must have dtype float64"):
        op(a, b)
    compiled = torch.compile(lambda a, b: op(a, b), fullgraph=True, backend="aot_eager")
    with pytest.raises(Exception, match="input A must have dtype float64"):
        compiled(a, b)


def test_op_names_are_unique_and_reused():
    fn = tc.define("def twice(double(N) A) -> (O) { O(i) = 2 * A(i) }", target="cpu")
    assert tt.op(fn, "twice_test") is tt.op(fn, "twice_test")
    other = tc.define("def twice(double(N) A) -> (O) { O(i) = 3 * A(i) }", target="cpu")
    with pytest.raises(tc.TCError, match="taken"):
        tt.op(other, "twice_test")
    assert torch.ops.tcmlir.twice_test(torch.ones(2, dtype=torch.float64)).tolist() == [2, 2]


# ---------------------------------------------------------------- GPU (the lead runs these)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["matmul", "softmax_temporaries", "layernorm", "conv2d", "maxpool"])
def test_gradcheck_float64_cuda(name, rng):
    op = corpus_op(name, target="cuda")
    args = corpus_inputs(name, rng, device="cuda")
    assert torch.autograd.gradcheck(op, tuple(args), fast_mode=True)


@pytest.mark.gpu
def test_cuda_launch_on_the_current_stream(rng):
    op = corpus_op("matmul", target="cuda")
    a, b = (t.detach() for t in corpus_inputs("matmul", rng, device="cuda"))
    op(a, b)  # compile and plan outside the timed region
    big = torch.randn(4096, 4096, device="cuda", dtype=torch.float64)
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        # x is ready only after a long matmul on the side stream: an op launched on any other
        # stream would read it too early
        x = (big @ big)[: a.shape[0], : a.shape[1]] * 0 + a
        out = op(x, b)
    stream.synchronize()
    torch.testing.assert_close(out, a @ b)
    assert out.is_cuda


@pytest.mark.gpu
def test_compiled_model_trains_like_torch_on_cuda():
    ours, reference = model_losses("cuda", "aot_eager", target="cuda")
    np.testing.assert_allclose(ours, reference, rtol=1e-9)
