"""The corpus on the GPU (``target="cuda"``) against each case's independent numpy oracle.

Every case at every size assignment under the naive options, and at its last size assignment
under option sets that stress the mapping (a block that divides nothing, 1-D and 3-D blocks,
small grids so the strided loops wrap), and under skewing, no positive orthant and TC's presets
(`corpus.option_sets`). Outputs are compared in float64 with the corpus
tolerances; programs that write every element get poisoned ``outputs=``. The oracle is
`Case.expected` (numpy alone), not ``target="numpy"``: the reference interpreter shares the IR,
type and range inference and the reduction identities with the compiler, so a bug there would
be invisible to a comparison with it. Also: torch CUDA
tensors in -> torch CUDA tensors out with no host copy, out-of-range gathers, benchmarks.
Marked ``gpu``: skipped where no GPU is visible (a failure under ``TCMLIR_REQUIRE_GPU=1``).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from corpus import assert_case_matches, assert_outputs_close, run_program
from corpus.option_sets import SCHEDULE_CASES, SCHEDULE_SETS
from corpus.programs import CASES, case_by_name

import tcmlir as tc
from tcmlir.errors import CallError

pytestmark = pytest.mark.gpu

OPTION_SETS = {
    "naive": tc.MappingOptions.naive(),
    "block7x5-grid3x2": tc.MappingOptions.naive().map_to_threads(7, 5).map_to_blocks(3, 2),
    "block128-grid5": tc.MappingOptions.naive().map_to_threads(128).map_to_blocks(5),
    "block8x4x2-grid3x2x2": tc.MappingOptions.naive().map_to_threads(8, 4, 2).map_to_blocks(3, 2, 2),
    "untiled-block32x8": tc.MappingOptions.naive().tile(0).map_to_threads(32, 8).map_to_blocks(2, 2),
    # memory promotion and register tiles (passes/register_tile, promote_shared, promote_private)
    "contraction": tc.MappingOptions.cuda_contraction(),
    "promo-16x16x8-r2x2-grid3x3": tc.MappingOptions.cuda_contraction().tile(16, 16, 8)
    .register_tiling(2, 2).map_to_blocks(3, 3),
    "promo-32x32x4-r4x2": tc.MappingOptions.cuda_contraction().tile(32, 32, 4).register_tiling(4, 2),
    "promo-8x8x8-r2x4-grid2x2": tc.MappingOptions.cuda_contraction().tile(8, 8, 8)
    .register_tiling(2, 4).map_to_blocks(2, 2),
    "shared-naive": tc.MappingOptions.naive().shared_memory(True),
    "shared-block7x5-grid3x2": tc.MappingOptions.naive().map_to_threads(7, 5).map_to_blocks(3, 2)
    .shared_memory(True),
    "promo-256x64x8-r8x8": tc.MappingOptions.cuda_contraction().tile(256, 64, 8).register_tiling(8, 8),
    "promo-16x16x8-r2x2-single": tc.MappingOptions.cuda_contraction().tile(16, 16, 8)
    .register_tiling(2, 2).double_buffering(False),
}

PARAMS = [
    pytest.param(case, sizes, opts, id=f"{case.name}[{','.join(f'{k}={v}' for k, v in sizes.items())}]-{opts}")
    for case in CASES
    for opts in OPTION_SETS
    for sizes in (case.sizes if opts == "naive" else case.sizes[-1:])
]


@functools.cache
def _define(source: str, entry: str | None, target: str):
    return tc.define(source, name=entry, target=target)


@pytest.mark.parametrize(("case", "sizes", "opts"), PARAMS)
def test_corpus_cuda_vs_oracle(case, sizes, opts, rng):
    options = OPTION_SETS[opts]
    inputs = case.make_inputs(rng, **sizes)
    originals = [np.copy(x) for x in inputs]
    expected = case.expected(*[np.copy(x) for x in inputs])
    fn = _define(case.source, case.entry, "cuda")
    what = f"{case.name} {sizes} {opts}"

    assert_case_matches(fn, inputs, expected, full_write=case.full_write, rtol=case.rtol,
                        options=options, context=what)
    for k, (x, x0) in enumerate(zip(inputs, originals, strict=True)):
        assert np.array_equal(x, x0, equal_nan=True), f"{what}: input {k} was modified"


@pytest.mark.parametrize("option_set", list(SCHEDULE_SETS))
@pytest.mark.parametrize("case_name", SCHEDULE_CASES)
def test_skewing_orthant_and_presets_on_cuda(case_name, option_set, rng):
    """Skewed and negative-coefficient schedules and TC's presets, against the oracle."""
    case = case_by_name(case_name)
    options = SCHEDULE_SETS[option_set]
    for sizes in case.sizes:
        inputs = case.make_inputs(rng, **sizes)
        assert_case_matches(_define(case.source, case.entry, "cuda"), inputs,
                            case.expected(*[np.copy(x) for x in inputs]),
                            full_write=case.full_write, rtol=case.rtol, options=options,
                            context=f"{case.name} {sizes} {option_set}")


def test_accumulate_into_given_outputs(rng):
    case = case_by_name("accumulate_into_fresh_output")
    fn = _define(case.source, case.entry, "cuda")
    (A,) = case.make_inputs(rng, M=77, N=5)
    start = rng.uniform(-1, 1, size=77).astype(np.float32)
    out = start.copy()
    got = run_program(fn, [A], outputs=[out])
    expected = (start.astype(np.float64) + A.astype(np.float64).sum(1)).astype(np.float32)
    assert_outputs_close(got, (expected,))
    assert_outputs_close((out,), (expected,))


def test_torch_cuda_in_torch_cuda_out(rng):
    torch = pytest.importorskip("torch")
    case = case_by_name("softmax_temporaries")
    sizes = case.sizes[-1]
    host = case.make_inputs(rng, **sizes)
    fn = _define(case.source, case.entry, "cuda")
    reference = case.expected(*host)
    dev = [torch.from_numpy(np.ascontiguousarray(x)).to("cuda") for x in host]
    got = fn(*dev)
    for g in (got if isinstance(got, tuple) else (got,)):
        assert isinstance(g, torch.Tensor) and g.is_cuda and g.device == dev[0].device
    got_np = tuple(g.cpu().numpy() for g in (got if isinstance(got, tuple) else (got,)))
    assert_outputs_close(got_np, reference, case.rtol)
    # outputs= given as torch CUDA tensors are written in place
    outs = tuple(torch.full(tuple(r.shape), float("nan"), device="cuda") for r in reference)
    fn(*dev, outputs=outs)
    assert_outputs_close(tuple(o.cpu().numpy() for o in outs), reference, case.rtol)


def test_torch_inputs_are_not_copied_to_the_host(rng, monkeypatch):
    torch = pytest.importorskip("torch")
    from tcmlir.runtime import cuda_memory

    case = case_by_name("matmul")
    fn = _define(case.source, case.entry, "cuda")
    A, B = (torch.from_numpy(x).to("cuda") for x in case.make_inputs(rng, M=33, K=17, N=45))
    fn(A, B)  # compile and load first

    def no_copy(*args, **kwargs):
        raise AssertionError("a host<->device copy happened for torch CUDA tensors")

    monkeypatch.setattr(cuda_memory.DeviceBuffer, "copy_from_host", no_copy)
    monkeypatch.setattr(cuda_memory.DeviceBuffer, "copy_to_host", no_copy)
    C = fn(A, B)
    torch.cuda.synchronize()
    assert C.is_cuda
    np.testing.assert_allclose(C.cpu().numpy(), (A @ B).cpu().numpy(), rtol=1e-4, atol=1e-4)


def test_gather_out_of_range_is_a_call_error(rng):
    case = case_by_name("embedding_gather")
    fn = _define(case.source, case.entry, "cuda")
    E, idx = case.make_inputs(rng, V=13, D=7, L=31)
    idx = idx.copy()
    idx[5] = 13
    with pytest.raises(CallError, match=r"out of bounds.*tensor E"):
        fn(E, idx)
    idx[5] = -1
    with pytest.raises(CallError, match="out of bounds"):
        fn(E, idx)
    idx[5] = 3
    assert_outputs_close((fn(E, idx),), (E[idx],))  # still usable afterwards


def test_benchmark_and_cubin(rng):
    case = case_by_name("matmul")
    fn = _define(case.source, case.entry, "cuda")
    inputs = case.make_inputs(rng, M=64, K=64, N=64)
    kernel = fn.compile(*inputs)
    times = kernel.benchmark(*inputs, runs=3)
    assert len(times) == 3 and all(t > 0 for t in times)
    assert kernel.runner.cubin  # kept from the driver's linker


def test_size_mismatch_is_a_call_error(rng):
    case = case_by_name("matmul")
    fn = _define(case.source, case.entry, "cuda")
    kernel = fn.compile(*case.make_inputs(rng, M=8, K=8, N=8))
    with pytest.raises(CallError):
        kernel.launch(*case.make_inputs(rng, M=9, K=8, N=8))
