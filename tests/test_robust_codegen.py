"""Issue 12, code generation limits and defaults: empty iteration domains on cuda (item 12),
the kernel parameter space (item 18), identifier lengths (item 19) and the CPU default of
batched matmul with its parallel loop (item 27). GPU code is checked with ``ptxas`` where it
is installed; the no-op call runs over the fake driver."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
from fake_cuda import install_fake

import tcmlir as tc
from tcmlir.runtime.cuda_launch import CudaRunner

PARAM_SPACE_BYTES = 4352  # codegen.nvptx.PARAM_SPACE_BYTES: ptxas's 0x1100 at PTX ISA 8.0
MAX_IDENTIFIER = 256  # lang.lexer.MAX_IDENTIFIER (docs/language.md, "Limits")

needs_ptxas = pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas not installed")


def _ptxas(ptx: str, tmp_path) -> subprocess.CompletedProcess:
    path = tmp_path / "k.ptx"
    path.write_text(ptx)
    return subprocess.run(["ptxas", "-arch=sm_90", str(path), "-o", str(tmp_path / "k.cubin")],
                          capture_output=True, text=True, timeout=120)


# ---------------------------------------------------------------- item 12: empty domains

EMPTY = "def shift(float(N) A) -> (float(N) O) { O(i) = A(i) where i in 0:N-1 }"


@needs_ptxas
def test_empty_iteration_domain_compiles_to_a_valid_no_op_on_cuda(tmp_path):
    fn = tc.define(EMPTY, target="cuda")
    kernel = fn.compile(np.ones(1, np.float32), arch="sm_90")
    assert kernel.runner.image.kernels == ()  # nothing to launch
    proc = _ptxas(kernel.ptx, tmp_path)
    assert proc.returncode == 0, proc.stderr
    bigger = fn.compile(np.ones(5, np.float32), arch="sm_90")  # not empty: one kernel
    assert len(bigger.runner.image.kernels) == 1


def test_empty_iteration_domain_call_zero_fills_and_launches_nothing(monkeypatch):
    driver, runtime = install_fake(monkeypatch)
    import tcmlir.cache.artifacts as artifacts

    monkeypatch.setattr(artifacts, "make_cuda_runner",
                        lambda image, key, device=0: CudaRunner(image, device, runtime=runtime))
    x = np.full(1, 7.0, np.float32)
    out = tc.define(EMPTY, target="cuda")(x)
    np.testing.assert_array_equal(out, tc.define(EMPTY, target="cpu")(x))
    np.testing.assert_array_equal(out, [0.0])
    assert not [c for c in driver.calls if c[0] == "cuLaunchKernel"]


# ---------------------------------------------------------------- item 18: parameter space


def _many_inputs(n: int) -> str:
    def tree(lo: int, hi: int) -> str:
        if hi - lo == 1:
            return f"a{lo}(i)"
        mid = (lo + hi) // 2
        return f"({tree(lo, mid)} + {tree(mid, hi)})"

    args = ", ".join(f"float(N) a{k}" for k in range(n))
    return f"def many({args}) -> (O) {{ O(i) = {tree(0, n)} }}"


def test_documented_limits_are_the_ones_in_force():
    from tcmlir.codegen import nvptx
    from tcmlir.lang import lexer

    assert nvptx.PARAM_SPACE_BYTES == PARAM_SPACE_BYTES
    assert lexer.MAX_IDENTIFIER == MAX_IDENTIFIER


# the most inputs of one statement: besides them its kernel takes the output and the error
# flag (a size fixed at compile time is folded into the code, not passed)
MOST_INPUTS = (PARAM_SPACE_BYTES - 16) // 8


def test_too_many_parameters_is_a_located_error_before_ptxas():
    fn = tc.define(_many_inputs(MOST_INPUTS + 1), target="cuda")
    with pytest.raises(tc.CodegenError) as info:
        fn.compile(*[np.ones(2, np.float32)] * (MOST_INPUTS + 1), arch="sm_90")
    text = str(info.value)
    assert text.startswith("<string>:1:") and "4360 bytes, more than the 4352 bytes" in text
    assert "statement S0 of many would take 544 tensor, 0 size and 1 flag" in text
    assert "O is tensor 544 of at most 543" in text and "fix:" in text


@needs_ptxas
def test_the_parameter_limit_is_what_ptxas_accepts(tmp_path):
    most = MOST_INPUTS
    fn = tc.define(_many_inputs(most), target="cuda")
    kernel = fn.compile(*[np.ones(2, np.float32)] * most, arch="sm_90")
    proc = _ptxas(kernel.ptx, tmp_path)
    assert proc.returncode == 0, proc.stderr
    # one parameter more is what ptxas refuses at this PTX ISA
    # (inputs are claimed 16-byte aligned at fixed sizes: `codegen.nvptx.aligned_tensors`)
    first = ".param .u64 .ptr .global .align 16 many_k0_param_0,"
    grown = kernel.ptx.replace(first, first + "\n\t.param .u64 many_k0_param_extra,", 1)
    assert grown != kernel.ptx
    proc = _ptxas(grown, tmp_path)
    assert proc.returncode != 0 and "too much parameter space" in proc.stderr


# ---------------------------------------------------------------- item 19: identifiers


def _long_names(length: int) -> str:
    a, b = "x" * length, "x" * (length - 1) + "y"  # equal but for the last character
    i, o = "i" * length, "o" * length
    return f"def {'f' * length}(float(N) {a}, float(N) {b}) -> ({o}) {{ {o}({i}) = {a}({i}) - {b}({i}) }}"


@needs_ptxas
def test_longest_identifiers_compile_on_cpu_and_cuda(tmp_path):
    src = _long_names(MAX_IDENTIFIER)
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(tc.define(src, target="cpu")(x, 2 * x), -x)
    kernel = tc.define(src, target="cuda").compile(x, x, arch="sm_90")
    proc = _ptxas(kernel.ptx, tmp_path)
    assert proc.returncode == 0, proc.stderr


def test_longer_identifiers_are_a_located_parse_error():
    with pytest.raises(tc.ParseError, match=rf"identifier is too long \({MAX_IDENTIFIER + 1} "
                                            rf"characters; at most {MAX_IDENTIFIER}\)"):
        tc.define(_long_names(MAX_IDENTIFIER + 1))
    with pytest.raises(tc.ParseError, match="<string>:1:"):
        tc.define(_long_names(2000))


# ---------------------------------------------------------------- item 27: batched matmul

BMM = "def bmm(float(B, M, K) X, float(B, K, N) Y) -> (Z) { Z(b, m, n) +=! X(b, m, k) * Y(b, k, n) }"
MM = "def mm(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }"


def _first_loop_after_parallel(loops: str) -> str:
    """The line right under the ``// parallel`` mark (the loop the host threads split; a
    ``// parallel-end`` there would mean the mark wraps no loop)."""
    lines = [ln.strip() for ln in loops.splitlines()]
    return lines[lines.index("// parallel") + 1]


def test_cpu_default_leaves_batch_dimensions_untiled():
    assert tc.MappingOptions.default_for(tc.define(BMM), "cpu").tile_sizes == (0, 32, 32, 32)
    assert tc.MappingOptions.default_for(tc.define(MM), "cpu") == tc.MappingOptions.naive()


def test_cpu_bmm_default_runs_the_batch_loop_in_parallel(rng):
    fn = tc.define(BMM, target="cpu")
    X = rng.standard_normal((16, 40, 24)).astype(np.float32)
    Y = rng.standard_normal((16, 24, 36)).astype(np.float32)
    kernel = fn.compile(X, Y)
    assert _first_loop_after_parallel(kernel.loops).startswith("for (int c0 = 0; c0 <= 15;")
    np.testing.assert_allclose(kernel.launch(X, Y), X @ Y, rtol=1e-4, atol=1e-4)


def test_parallel_mark_skips_members_with_a_single_value(rng):
    """The naive 32^3 tiling makes a batch of 16 one tile: the parallel loop is the next."""
    fn = tc.define(BMM, target="cpu")
    X = rng.standard_normal((16, 70, 24)).astype(np.float32)
    Y = rng.standard_normal((16, 24, 36)).astype(np.float32)
    kernel = fn.compile(X, Y, options=tc.MappingOptions.naive())
    assert _first_loop_after_parallel(kernel.loops).startswith("for (int c1 = 0; c1 <= 2;")
    np.testing.assert_allclose(kernel.launch(X, Y), X @ Y, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- on the GPU


@pytest.mark.gpu
def test_empty_domain_and_widest_parameter_list_run_on_the_gpu():
    """What the driver does with them: the no-op call zero-fills, and a kernel whose
    parameters fill the 4352 bytes ptxas accepts also loads and launches."""
    x = np.full(1, 7.0, np.float32)
    np.testing.assert_array_equal(tc.define(EMPTY, target="cuda")(x), [0.0])
    most = MOST_INPUTS
    inputs = [np.full(3, k, np.float32) for k in range(most)]
    out = tc.define(_many_inputs(most), target="cuda")(*inputs)
    np.testing.assert_array_equal(out, np.full(3, sum(range(most)), np.float32))
