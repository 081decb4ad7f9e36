"""Per-kernel mappings (`MappingOptions.kernels`, `kernel_mapping`, `poly.kernel_select`): a
program of several kernels maps each its own way; checked on the host emulator against the
reference (`test_gpu_emulated.emulate`), plus the options' JSON, the pipeline and the errors."""

from __future__ import annotations

import re

import numpy as np
import pytest
from tcmlir.passes import PassManager, parse_pipeline
from test_gpu_emulated import _zoo_inputs, emulate

import tcmlir as tc
from tcmlir.cuda_defaults import contraction_choice
from tcmlir.defaults import statements_function
from tcmlir.errors import OptionsError, PipelineError
from tcmlir.kernel_mapping import KernelMapping
from tcmlir.poly.gpu_mapping import kernel_marks
from tcmlir.poly.state import CompileState

ATTENTION = """def attention(float(B,S,D) Q, float(B,S,D) K, float(B,S,D) V) -> (O) {
    P(b, i, j) +=! Q(b, i, d) * K(b, j, d) * 0.125
    mx(b, i) max=! P(b, i, j)
    e(b, i, j) = exp(P(b, i, j) - mx(b, i))
    s(b, i) +=! e(b, i, j)
    O(b, i, d) +=! e(b, i, j) * V(b, j, d) / s(b, i)
}"""


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setenv("TCMLIR_ALWAYS_COMPILE", "1")


def _attention_defaults(b: int, s: int, d: int) -> tc.MappingOptions:
    return tc.MappingOptions.default_for(tc.define(ATTENTION).ir, "cuda", {"B": b, "S": s, "D": d})


def test_attention_defaults_map_each_kernel_by_its_class():
    opts = _attention_defaults(128, 256, 64)
    assert opts.fusion == "min"
    by = {km.statements: km for km in opts.kernels}
    assert set(by) == {(0,), (1,), (3,), (4,)}          # the exp (S2) keeps the shared knobs
    scores, out = by[(0,)], by[(4,)]
    # the scores: the register-tiled lead contraction of a batched matmul standing alone
    alone = tc.MappingOptions.default_for(
        tc.define("def p(float(B,S,D) Q, float(B,S,D) K) -> (P) {\n"
                  " P(b, i, j) +=! Q(b, i, d) * K(b, j, d) * 0.125\n}").ir,
        "cuda", {"B": 128, "S": 256, "D": 64})
    assert scores == KernelMapping.of((0,), alone) and scores.register_tile
    # the output: the same, its per-row scale ``/ s(b, i)`` riding along
    assert out.use_shared_memory and out.use_private_memory and out.register_tile
    for row in (by[(1,)], by[(3,)]):  # a block per 8 rows, map-reduction over j
        assert row.tile_sizes == (1, 8, 0) and row.block == (256,)
    pipe = opts.to_pipeline("cuda")
    sizes = ",".join(map(str, scores.register_tile))  # (the contraction model's choice)
    assert any(step.startswith(f"register-tile{{sizes={sizes},") and step.endswith("only=0}")
               for step in pipe.split("},")) or f"register-tile{{sizes={sizes},only=0}}" in pipe
    assert "tile{sizes=1,32,32,skip=0,1,3,4}" in pipe
    assert pipe.index("promote-shared") > pipe.rindex("map-to-threads")  # promotion last


def test_options_with_kernels_round_trip_and_keep_old_json():
    opts = _attention_defaults(4, 40, 24)
    assert opts.kernels
    assert tc.MappingOptions.from_json(opts.to_json()) == opts
    plain = tc.MappingOptions.naive()
    assert "kernels" not in plain.to_json()            # cache keys of before unchanged
    assert tc.MappingOptions.from_json(plain.to_json()).kernels == ()


@pytest.mark.parametrize("text, what", [
    ('{"kernels": 3}', "list of objects"),
    ('{"kernels": [{"tile_sizes": [1]}]}', "'statements'"),
    ('{"kernels": [{"statements": ["a"]}]}', "list of integers"),
    ('{"kernels": [{"statements": [0], "fusion": "max"}]}', "unknown per-kernel option"),
    ('{"kernels": [{"statements": [0], "block": [0]}]}', "block values"),
    ('{"kernels": [{"statements": [0]}, {"statements": [0, 1]}]}', "two per-kernel mappings"),
])
def test_bad_per_kernel_json_is_an_options_error(text, what):
    with pytest.raises(OptionsError, match=re.escape(what)):
        tc.MappingOptions.from_json(text)


def test_kernels_do_not_combine_with_the_whole_program_mappers():
    opts = tc.MappingOptions.naive().per_kernel(((0,), tc.MappingOptions.naive()))
    for other in (opts.map_rows(256), opts.split_reduction(2), opts.tensor_cores()):
        with pytest.raises(OptionsError, match="per-kernel"):
            other.to_pipeline("cuda")


def test_each_selection_maps_only_its_kernels():
    fn = tc.define(ATTENTION).ir
    sizes = {"B": 2, "S": 40, "D": 24}
    state = PassManager(parse_pipeline(
        "schedule{fusion=min},tile{sizes=1,8,8,only=2},tile{sizes=1,32,skip=2},"
        "map-to-blocks{grid=64,only=2},map-to-blocks{grid=16,16,skip=2},"
        "map-to-threads{block=8,8,only=2},map-to-threads{block=32,skip=2}"
    )).run(CompileState.initial(fn, sizes))
    blocks = [km.block for _, km in kernel_marks(state.schedule)]
    assert blocks.count((8, 8, 1)) == 1 and len(blocks) == 9  # S2 alone got 8 x 8 threads


def test_a_group_no_per_kernel_mapping_holds_whole_is_an_error():
    # per-kernel mappings of S0 and S1 made for fusion=min; under max fusion softmax's
    # statements share one kernel, which neither holds whole
    src = "def f(float(N, D) X) -> (O) {\n O(n, d) = exp(X(n, d))\n O(n, d) = O(n, d) * 2\n}"
    fn = tc.define(src).ir
    with pytest.raises(PipelineError, match="none of them maps it whole"):
        PassManager(parse_pipeline(
            "schedule{fusion=max},tile{sizes=4,4,only=0},tile{sizes=4,4,only=1},"
            "map-to-blocks{grid=8,only=0},map-to-blocks{grid=8,only=1},"
            "map-to-blocks{grid=8,skip=0,1}")).run(CompileState.initial(fn, {"N": 8, "D": 8}))


def test_tuner_candidates_keep_the_per_kernel_part():
    import random

    from tcmlir.tune.space import SearchSpace

    base = _attention_defaults(4, 40, 24)
    space = SearchSpace("cuda", 4, 2)
    rng = random.Random(1)
    other = tc.MappingOptions.naive()
    for _ in range(20):  # the per-kernel part and the fusion it was made for stay
        for cand in (space.mutate(rng, base, 0.9), space.crossover(rng, base, other),
                     space.sample(rng, base)):
            assert cand.kernels == base.kernels and cand.fusion == base.fusion
    assert {space.mutate(rng, other, 0.9).fusion for _ in range(30)} != {other.fusion}


# ---------------------------------------------------------------- on the host emulator


@pytest.mark.parametrize("b, s, d", [(3, 33, 24), (1, 7, 5), (2, 40, 32)])
def test_attention_per_kernel_on_the_host_machine(b, s, d, rng):
    inputs = [rng.standard_normal((b, s, d)).astype(np.float32) for _ in range(3)]
    kernel = emulate(ATTENTION, inputs, rtol=1e-4)
    assert kernel.options.kernels, "the per-kernel defaults were not used"
    if min(s, d) >= 32:  # both matmuls register-tiled (lead contractions)
        assert all(km.register_tile for km in kernel.options.kernels if km.statements in ((0,), (4,)))
    if s >= 32:
        assert re.search(r"reduction S1 threads=\d+", kernel.schedule)


def test_attention_with_hand_written_kernels_on_the_host_machine(rng):
    """Every kernel its own mapping, the shared knobs for none: the exp gets shared memory."""
    fn = tc.define(ATTENTION, target="cuda")
    mm = tc.MappingOptions.cuda_batched_contraction()
    opts = tc.MappingOptions(fusion="min").per_kernel(
        ((0,), mm), ((4,), mm),
        ((1,), tc.MappingOptions(tile_sizes=(1, 1, 0), block=(64,))),
        ((3,), tc.MappingOptions(tile_sizes=(1, 1, 0), block=(32,))),
        ((2,), tc.MappingOptions(tile_sizes=(1, 16, 16), block=(16, 16))))
    inputs = [rng.standard_normal((2, 37, 20)).astype(np.float32) for _ in range(3)]
    kernel = fn.compile(*inputs, options=opts, target="cuda", arch="sm_90")
    assert "block=16,16,1" in kernel.schedule and "reduction S3 threads=32" in kernel.schedule
    got = _run(fn, kernel, inputs)
    want = tc.define(ATTENTION, target="numpy")(*inputs)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def _run(fn, kernel, inputs):
    import mma_emulator as emu

    from tcmlir.binding import bind_sizes

    sizes = bind_sizes(fn.ir, [x.shape for x in inputs])
    arrays = emu.stage_arrays(fn.ir, kernel, inputs, sizes)
    emu.run_kernel(kernel, arrays, sizes)
    return arrays["O"]


@pytest.mark.parametrize("name, dims", [("mlp2", {"B": 5, "M": 37, "N": 33, "P": 19}),
                                        ("grad_matmul", None)])
def test_other_multi_statement_programs_on_the_host_machine(name, dims):
    src, inputs = _zoo_inputs(name, dims)
    if name == "grad_matmul":  # the gradient definition (A_grad, B_grad) at awkward sizes
        from tcmlir.grad import derive

        src = derive(tc.define(src).ir).source
        rng = np.random.default_rng(3)
        a, b = (rng.standard_normal(s).astype(np.float32) for s in ((37, 19), (19, 35)))
        inputs = [a, b, rng.standard_normal((37, 35)).astype(np.float32)]
    emulate(src, inputs, rtol=1e-4)


def test_per_kernel_mlp2_on_the_host_machine(rng):
    """mlp2 with each matmul (and its epilogue) a kernel of its own mapping."""
    src, _ = _zoo_inputs("mlp2")
    fn = tc.define(src, target="cuda")
    shapes = {"I": (6, 37), "W1": (33, 37), "B1": (33,), "W2": (19, 33), "B2": (19,)}
    inputs = [rng.standard_normal(shapes[t.name]).astype(np.float32) for t in fn.ir.inputs]
    opts = tc.MappingOptions(fusion="min").per_kernel(
        ((0,), tc.MappingOptions.cuda_contraction((32, 32, 16), (2, 2))),
        ((2, 3), tc.MappingOptions.cuda_contraction((32, 32, 16), (4, 2))))
    kernel = fn.compile(*inputs, options=opts, target="cuda", arch="sm_90")
    assert kernel.runner.image.kernels  # (compiled with both mappings)
    want = tc.define(src, target="numpy")(*inputs)
    np.testing.assert_allclose(_run(fn, kernel, inputs), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rhs, lead", [
    ("E(b, i, j) * V(b, j, d) / s(b, i)", True),           # a per-row scale rides along
    ("0.5 * E(b, i, j) * s(b, i) * V(b, j, d)", True),
    ("E(b, i, j) / V(b, j, d)", False),                     # a divisor that carries j
    ("E(b, i, j) * V(b, j, d) / W(b, j)", False),           # a "scale" of the reduction index
    ("E(b, i, j) * V(b, j, d) + s(b, i)", False),
])
def test_lead_contractions_take_per_output_scales(rhs, lead):
    from tcmlir.contraction_shape import lead_contraction

    src = ("def pv(float(B,S,S) E, float(B,S,D) V, float(B,S) s, float(B,S) W) -> (O) {\n"
           f" O(b, i, d) +=! {rhs}\n}}")
    fn = tc.define(src).ir
    assert (lead_contraction(fn, {"B": 4, "S": 64, "D": 64}) is not None) is lead


def test_per_kernel_options_go_through_the_options_cache(tmp_path):
    fn = tc.define(ATTENTION, target="cuda")
    inputs = [np.zeros((2, 40, 32), np.float32) for _ in range(3)]
    opts = _attention_defaults(2, 40, 32)
    cache = tc.OptionsCache(tmp_path / "opts.db")
    assert cache.record(fn, *inputs, options=opts, time_s=1e-3, runs=3)
    assert cache.lookup(fn, *inputs) == opts


def test_mlp2_gives_each_matmul_its_own_tiles():
    """mlp2 (1024 x 1024 -> 4096 -> 1024): one set of tiles for both matmuls left the second
    too few blocks for 132 SMs; each now takes what the contraction model gives it alone.
    Where the tiles agree (small sizes, a matmul's gradient) the program keeps one mapping."""
    src, _ = _zoo_inputs("mlp2")
    fn = tc.define(src).ir
    opts = tc.MappingOptions.default_for(fn, "cuda", {"B": 1024, "M": 1024, "N": 4096, "P": 1024})
    by = {km.statements: km for km in opts.kernels}
    # each matmul's tiles are those the contraction model gives it standing alone, unsplit
    sizes = {"B": 1024, "M": 1024, "N": 4096, "P": 1024}
    for k in (0, 2):
        tile, reg, _ = contraction_choice(statements_function(fn, (k,)), sizes, split=False)
        assert by[(k,)].tile_sizes == tile and by[(k,)].register_tile == reg, k
    assert by[(0,)].tile_sizes != by[(2,)].tile_sizes
    small = tc.MappingOptions.default_for(fn, "cuda", {"B": 5, "M": 37, "N": 33, "P": 19})
    assert not small.kernels and small.register_tile
