"""128-bit global access (`MappingOptions.vector_access`, `split_lanes`) and the alignment
specialisation it relies on (`Signature`'s ``align``, `codegen.nvptx.aligned_tensors`).

Without a GPU: the lane-split mappings give the reference results on the CUDA simulator at
extents the lanes divide and at ones they do not; the default softmax, layernorm and
elementwise kernels at the benchmark's sizes have vector loads and stores in their PTX (which
ptxas accepts) when the call's pointers are aligned, and no 16-byte alignment claim for an input
whose signature records less; signatures and options round-trip. With a GPU (``gpu`` mark):
misaligned input views and a misaligned given output give the reference results.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import tcmlir as tc
from tcmlir.codegen.nvptx import aligned_tensors, compile_cuda
from tcmlir.codegen.ptx_tools import find_ptxas, ptxas_check
from tcmlir.compiler import lower
from tcmlir.errors import OptionsError
from tcmlir.signature import ArgSpec, Signature, pointer_alignment
from tcmlir.simulate import simulate_call

MO = tc.MappingOptions
SOFTMAX = """def softmax(float(N, D) X) -> (O) {
    mx(n) max=! X(n, d)
    e(n, d) = exp(X(n, d) - mx(n))
    s(n) +=! e(n, d)
    O(n, d) = e(n, d) / s(n)
}"""
LAYERNORM = """def layernorm(float(N, D) X) -> (O) {
    mean(n) +=! X(n, d) / D
    c(n, d) = X(n, d) - mean(n)
    var(n) +=! c(n, d) * c(n, d) / D
    O(n, d) = c(n, d) * rsqrt(var(n) + 1e-5)
}"""
ROWSUM = "def rowsum({t}(N, D) X) -> (S) {{ S(n) +=! X(n, d) }}"
CHAIN = "def chain({t}(N) X) -> (O) {{ O(i) = ((X(i) * 2 + 1) * X(i) - 3) * 0.5 }}"


def _softmax(x):
    e = np.exp(x - x.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def _layernorm(x):
    c = x - x.mean(1, keepdims=True)
    return c / np.sqrt((c * c).mean(1, keepdims=True) + 1e-5)


def _loops(fn, sizes, options) -> str:
    from tcmlir.poly.loops import build_ast, format_loops

    return format_loops(build_ast(lower(fn.ir, sizes, options, "cuda")))


def _has_lanes(loops: str, lanes: int) -> bool:
    """Each thread takes ``lanes`` adjacent elements: unrolled by isl (``4 * _tx + 3``) or, as
    the row kernels now leave them for the code generator to unroll, a lane loop of ``lanes``
    trips whose counter is added to ``lanes * _tx``."""
    if f"{lanes} * _tx + {lanes - 1}" in loops:
        return True
    return re.search(rf"for \(int (c\d+) = 0; \1 <= {lanes - 1}; \1 \+= 1\)\n\s*"
                     rf"S\d+\([^;]*{lanes} \* _tx \+ [^;]*\1\);", loops) is not None


@pytest.mark.parametrize("d", [8, 16, 33, 64])
@pytest.mark.parametrize(("src", "ref"), [(SOFTMAX, _softmax), (LAYERNORM, _layernorm)],
                         ids=["softmax", "layernorm"])
def test_row_lanes_on_the_simulator(src, ref, d, rng):
    fn = tc.define(src)
    x = rng.standard_normal((3, d)).astype(np.float32)
    opts = MO().map_rows(4).vector_access(16)
    (o,) = simulate_call(fn.ir, [x], opts)
    np.testing.assert_allclose(o, ref(x), rtol=1e-5, atol=1e-6)
    lanes = _has_lanes(_loops(fn, {"N": 3, "D": d}, opts), 4)
    # 4 lanes must divide the row and leave every one of the 4 threads a group (a partial
    # last stride is guarded)
    assert lanes == (d % 4 == 0 and d // 4 >= 4)


@pytest.mark.parametrize(("t", "lanes"), [("float", 4), ("double", 2), ("int32", 4), ("int64", 2)])
def test_row_sum_lanes_follow_the_element_size(t, lanes, rng):
    fn = tc.define(ROWSUM.format(t=t))
    dtype = fn.ir.inputs[0].dtype.numpy
    x = (rng.standard_normal((2, 32)) * 10).astype(dtype)
    opts = MO().map_rows(4).vector_access(16)
    (s,) = simulate_call(fn.ir, [x], opts)
    np.testing.assert_allclose(s, x.sum(1), rtol=1e-5)
    loops = _loops(fn, {"N": 2, "D": 32}, opts)
    assert _has_lanes(loops, lanes) and f"{lanes} * _tx + {lanes})" not in loops


@pytest.mark.parametrize("n", [1, 100, 4096, 4099])
@pytest.mark.parametrize("t", ["float", "double"])
def test_elementwise_lanes_on_the_simulator(t, n, rng):
    fn = tc.define(CHAIN.format(t=t))
    x = rng.standard_normal(n).astype(fn.ir.inputs[0].dtype.numpy)
    opts = MO.default_for(fn, "cuda").tile(64).map_to_threads(4).map_to_blocks(3)
    assert opts.vector_bytes == 16
    (o,) = simulate_call(fn.ir, [x], opts)
    np.testing.assert_allclose(o, ((x * 2 + 1) * x - 3) * 0.5, rtol=1e-6)
    lanes = 4 if t == "float" else 2
    # a tile of 64 takes the lanes even when the last tile is partial (then guarded)
    assert (f"{lanes} * c1 + {lanes - 1}" in _loops(fn, {"N": n}, opts)) == (n >= 64)


def test_lanes_need_the_member_last_and_divisible():
    fn = tc.define(CHAIN.format(t="float"))
    base = MO.default_for(fn, "cuda").map_to_blocks(3)
    assert "4 * c1" in _loops(fn, {"N": 4096}, base.tile(64).map_to_threads(4))
    # 4 lanes x 32 threads do not divide a tile of 64: one element per thread access
    assert "4 * c1" not in _loops(fn, {"N": 4096}, base.tile(64).map_to_threads(32))
    assert "4 * c1" not in _loops(fn, {"N": 4096}, base.tile(64).map_to_threads(4).vector_access(0))


def _ptx(src: str, sizes: dict[str, int], aligned=None) -> str:
    fn = tc.define(src)
    state = lower(fn.ir, sizes, MO.default_for(fn, "cuda", sizes), "cuda")
    names = [t.name for t in fn.ir.tensors] if aligned is None else aligned
    ptx = compile_cuda(state, "sm_90", aligned=names).ptx
    if find_ptxas() is not None:
        ptxas_check(ptx, "sm_90")
    return ptx


@pytest.mark.parametrize(("src", "sizes"), [(SOFTMAX, {"N": 32768, "D": 4096}),
                                            (LAYERNORM, {"N": 32768, "D": 4096}),
                                            (CHAIN.format(t="float"), {"N": 1 << 28})],
                         ids=["softmax", "layernorm", "chain"])
def test_defaults_load_and_store_128_bits_when_aligned(src, sizes):
    ptx = _ptx(src, sizes)
    assert re.search(r"ld\.global\.nc\.v4\.(b|f)32", ptx)
    assert re.search(r"st\.global\.v4\.(b|f)32", ptx)
    assert not re.search(r"ld\.global\.nc\.(b|f)32", ptx)  # no scalar load left
    scalar = _ptx(src, sizes, aligned=[])
    assert ".align 16" not in scalar and ".v4." not in scalar


def test_unaligned_input_signature_drops_the_claim():
    fn = tc.define(SOFTMAX)
    aligned = Signature((ArgSpec((4, 64), "float32", (64, 1)),))
    off = Signature((ArgSpec((4, 64), "float32", (64, 1), 4),))
    assert aligned_tensors(fn.ir, aligned, MO()) == ("X", "O", "mx", "e", "s")
    assert aligned_tensors(fn.ir, None, MO()) == ("X", "O", "mx", "e", "s")
    assert aligned_tensors(fn.ir, off, MO()) == ("O", "mx", "e", "s")
    assert aligned_tensors(fn.ir, aligned, MO().with_parametric()) == ()
    mm = tc.define("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }")
    # register-tiled outputs stay scalar stores (fewer registers: see aligned_tensors)
    assert aligned_tensors(mm.ir, None, MO.cuda_contraction()) == ("A", "B")
    ptx = _ptx(SOFTMAX, {"N": 4, "D": 64}, aligned=aligned_tensors(fn.ir, off, MO()))
    params = re.findall(r"\.param \.u64 \.ptr \.global \.align (\d+) softmax_k0_param_(\d+)", ptx)
    assert dict((int(p), int(a)) for a, p in params)[0] == 1  # X: no claim
    assert dict((int(p), int(a)) for a, p in params)[1] == 16  # O: tcmlir allocates it


def test_signature_alignment_round_trips_and_keeps_aligned_text():
    aligned = Signature((ArgSpec((4, 64), "float32", (64, 1)),))
    off = Signature((ArgSpec((4, 64), "float32", (64, 1), 4),))
    assert aligned.to_json() == "[[[4,64],\"float32\",[64,1]]]"  # the text of before
    assert Signature.from_json(off.to_json()) == off != aligned
    assert Signature.from_json(aligned.to_json()) == aligned
    assert [pointer_alignment(p) for p in (0, 4, 8, 12, 16, 2, 1 << 20)] == [16, 4, 8, 4, 16, 2, 16]


def test_vector_option_round_trips_and_checks():
    opts = MO().map_rows(256).vector_access(16)
    assert MO.from_json(opts.to_json()) == opts
    assert "vector_bytes" not in MO().to_json()  # off: the JSON (and cache keys) of before
    assert "map-rows{threads=256,grid=256,vector-bytes=16}" in opts.to_pipeline("cuda")
    with pytest.raises(OptionsError, match="vector_bytes"):
        MO().vector_access(12)


def test_torch_call_key_records_the_pointer_alignment():
    torch = pytest.importorskip("torch")
    from tcmlir.signature import call_key

    base = torch.zeros(65)
    assert call_key([base[:64]]) != call_key([base[1:]])
    assert call_key([base[:64]]) == call_key([torch.zeros(64)])


# ---------------------------------------------------------------- on the GPU


@pytest.mark.gpu
@pytest.mark.parametrize("offset", [0, 1, 2, 3])
@pytest.mark.parametrize(("src", "ref"), [(SOFTMAX, _softmax), (LAYERNORM, _layernorm)],
                         ids=["softmax", "layernorm"])
def test_misaligned_views_on_gpu(src, ref, offset):
    torch = pytest.importorskip("torch")
    n, d = 64, 4096
    flat = torch.randn(n * d + 4, device="cuda")
    x = flat[offset:offset + n * d].view(n, d)
    got = tc.define(src)(x)
    torch.testing.assert_close(got.cpu(), torch.from_numpy(ref(x.cpu().numpy())), rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("offset", [0, 1])
def test_elementwise_misaligned_input_and_output_on_gpu(offset):
    torch = pytest.importorskip("torch")
    n = 1 << 20
    fn = tc.define(CHAIN.format(t="float"))
    x = torch.randn(n + 4, device="cuda")[offset:offset + n]
    out = torch.full((n + 4,), 7.0, device="cuda")
    given = out[offset:offset + n]
    fn(x, outputs=[given])
    torch.testing.assert_close(given, ((x * 2 + 1) * x - 3) * 0.5)
    assert bool((out[:offset] == 7).all()) and bool((out[offset + n:] == 7).all())
