"""Issue 12 item 15 and issue 36: limits that answer at once, and compile time that scales with
the number of statements and outputs (`tools/fuzz_scale.py` times each stage).

The linear versions of the isl proofs and analyses (per-dependence legality, per-array
dataflow, band parallelism in one time space, the program order built in one step, the
scheduler in chunks of statements) are checked against the direct (quadratic) formulations
on the corpus, and a chain of statements beyond the old limit of 200 compiles and runs.
"""

from __future__ import annotations

import re
import time

import islpy as isl
import numpy as np
import pytest
from corpus.programs import CASES

import tcmlir as tc
from tcmlir.lang.sema import MAX_RANK, MAX_STATEMENTS
from tcmlir.poly import scheduler
from tcmlir.poly.deps import compute_dependences
from tcmlir.poly.legality import (
    band_is_permutable,
    member_is_parallel,
    same_prefix,
    violations,
)
from tcmlir.poly.scop import build_scop, maps_of
from tcmlir.poly.tree import bands, node_at, path_of

# ---------------------------------------------------------------- the direct formulations


def _direct_active(node, deps):
    prefix = node.get_prefix_schedule_union_map()
    same = prefix.apply_range(prefix.reverse())
    dom = node.get_domain()
    return deps.intersect_domain(dom).intersect_range(dom).intersect(same)


def _member(node, m):
    return isl.UnionMap.from_union_pw_aff(node.band_get_partial_schedule().get_at(m))


def _direct_parallel(node, member, deps):
    pairs = _direct_active(node, deps)
    for m in range(member):
        mm = _member(node, m)
        pairs = pairs.intersect(mm.apply_range(mm.reverse()))
    mm = _member(node, member)
    return pairs.is_subset(mm.apply_range(mm.reverse()))


def _direct_permutable(node, deps):
    pairs = _direct_active(node, deps)
    for m in range(node.band_n_member()):
        mm = _member(node, m)
        for t in maps_of(pairs.apply_domain(mm).apply_range(mm)):
            if not t.subtract(isl.Map.lex_le(t.get_space().domain())).is_empty():
                return False
    return True


def _direct_flow(scop):
    sched = scop.schedule
    raw = (isl.UnionAccessInfo.from_sink(scop.all_reads).set_must_source(scop.writes)
           .set_schedule(sched).compute_flow().get_may_dependence())
    waw = (isl.UnionAccessInfo.from_sink(scop.writes).set_must_source(scop.writes)
           .set_schedule(sched).compute_flow().get_may_dependence())
    war = (isl.UnionAccessInfo.from_sink(scop.writes).set_may_source(scop.all_reads)
           .set_kill(scop.writes).set_schedule(sched).compute_flow().get_may_dependence())
    return raw, war.subtract(scop.domain.identity()), waw


def _states():
    from tcmlir.compiler import lower

    for case in CASES[::5]:  # a fifth of the corpus keeps this test at a few seconds
        fn = tc.define(case.source, case.entry, target="cpu")
        for target in ("cpu", "cuda"):
            opts = tc.MappingOptions.default_for(fn, target)
            yield case.name, lower(fn.ir, case.sizes[0], opts, target, verify=False)


def test_linear_analyses_agree_with_the_direct_ones_on_the_corpus():
    checked = 0
    for name, state in _states():
        scop = state.scop
        for new, old in zip((state.deps.raw, state.deps.war, state.deps.waw), _direct_flow(scop),
                            strict=True):
            assert new.is_equal(old), name
        schedule = state.proof_schedule
        validity = state.deps.validity
        for node in bands(schedule):
            assert band_is_permutable(node, validity) == _direct_permutable(node, validity), name
            for deps in (validity, state.deps.reduction):
                assert same_prefix(node, deps).is_equal(_direct_active(node, deps)), name
            for m in range(node.band_n_member()):
                for deps in (validity, state.deps.coincidence):
                    assert member_is_parallel(node, m, deps) == _direct_parallel(node, m, deps), \
                        (name, m)
                    checked += 1
        assert violations(schedule, validity).is_empty(), name
    assert checked > 50


def test_violations_reports_the_instance_pairs_a_schedule_breaks():
    fn = tc.define("def f(float(N) A) -> (B, C) { B(i) = A(i) \n C(i) = B(i) + 1 }", target="cpu")
    scop = build_scop(fn.ir, {"N": 4})
    deps = compute_dependences(scop)
    reversed_order = isl.Schedule.read_from_str(
        scop.ctx, '{ domain: "[N] -> { S0[i] : N = 4 and 0 <= i < 4; S1[i] : N = 4 and 0 <= i < 4 }", '
        'child: { sequence: [ { filter: "{ S1[i] }" }, { filter: "{ S0[i] }" } ] } }')
    bad = violations(reversed_order, deps.validity)
    assert bad.is_equal(deps.raw), bad  # every B(i) read before its write


# ---------------------------------------------------------------- many statements


def _chain(n: int) -> str:
    body = "\n".join(f"  T{k}(i) = {'A' if k == 0 else f'T{k - 1}'}(i) + 1.0" for k in range(n))
    return f"def chain(float(N) A) -> (T{n - 1}) {{\n{body}\n}}"


def test_a_chain_beyond_200_statements_compiles_and_runs_on_the_cpu(monkeypatch, rng):
    """Beyond the old limit of 200; the scheduler runs on chunks of statements (smaller
    chunks here than by default, to keep the test short)."""
    n = 210
    monkeypatch.setattr(scheduler, "SCHEDULE_WHOLE_UP_TO", 100)
    monkeypatch.setattr(scheduler, "CHUNK_STATEMENTS", 64)
    assert n <= MAX_STATEMENTS
    fn = tc.define(_chain(n), target="cpu")
    a = rng.integers(-8, 8, 37).astype(np.float32)
    kernel = fn.compile(a)
    np.testing.assert_array_equal(kernel.launch(a), a + n)
    # one fused loop per chunk of statements, run in sequence
    chunks = -(-n // scheduler.CHUNK_STATEMENTS)
    assert kernel.loops.count("parallel") >= chunks


def test_chunked_schedule_keeps_dependences_across_chunks(monkeypatch, rng):
    """Small chunks on a program whose statements read across chunk boundaries."""
    monkeypatch.setattr(scheduler, "SCHEDULE_WHOLE_UP_TO", 2)
    monkeypatch.setattr(scheduler, "CHUNK_STATEMENTS", 2)
    src = """def f(float(N) A) -> (D) {
        B(i) = A(i) * 2.0
        S +=! B(i)
        C(i) = B(N - 1 - i) + S
        D(i) +=! C(j) * B(i) where j in 0:N
    }"""
    fn = tc.define(src, target="cpu")
    a = rng.standard_normal(11).astype(np.float32)
    ref = tc.define(src, target="numpy")(a)
    np.testing.assert_allclose(fn(a), ref, rtol=1e-5)


def test_limits_answer_at_once():
    started = time.process_time()
    dims = ", ".join(f"N{k}" for k in range(64))
    with pytest.raises(tc.SemaError, match="rank 64; tcmlir supports at most"):
        tc.define(f"def f(float({dims}) A) -> (O) {{ O(i) = A(i) }}")
    with pytest.raises(tc.SemaError, match=f"{MAX_STATEMENTS + 1} statements"):
        tc.define(_chain(MAX_STATEMENTS + 1))
    assert MAX_RANK == 16
    assert time.process_time() - started < 10


# ---------------------------------------------------------------- issue 36: cost linear in the program


def _same(n: int) -> str:
    body = "\n".join("  O(i) = A(i)" for _ in range(n))
    return f"def f(float(N) A) -> (O) {{\n{body}\n}}"


def _outputs(n: int) -> str:
    outs = ", ".join(f"O{k}" for k in range(n))
    body = "\n".join(f"  O{k}(i) = A(i)" for k in range(n))
    return f"def f(float(N) A) -> ({outs}) {{\n{body}\n}}"


def _cuda_compile_seconds(n: int, a: np.ndarray) -> float:
    fn = tc.define(_same(n), target="cuda")
    started = time.process_time()
    kernel = fn.compile(a, arch="sm_90")
    spent = time.process_time() - started
    assert kernel.ptx.count("st.global") >= 1
    return spent


def test_a_cuda_compile_grows_about_linearly_with_the_statements(monkeypatch):
    """A definition of many statements ``O(i) = A(i)`` mapped to threads: isl built the AST of
    its degenerate thread band in time quadratic in the statements with a large constant, and
    map-reduction paired every statement with every other (~1,000 statements: 224 s). A
    ratio of CPU times (4x the statements must cost well under 16x), not a wall-clock bound."""
    monkeypatch.setenv("TCMLIR_ALWAYS_COMPILE", "1")
    a = np.ones(37, np.float32)
    _cuda_compile_seconds(8, a)  # imports, LLVM's initialisation
    small = _cuda_compile_seconds(60, a)
    large = _cuda_compile_seconds(240, a)
    assert large < 10 * max(small, 0.05), (small, large)


def test_single_point_bands_sink_below_the_sequence_with_the_same_loops():
    from tcmlir.compiler import lower
    from tcmlir.poly.loops import sink_single_point_bands

    fn = tc.define(_same(5), target="cuda")
    state = lower(fn.ir, {"N": 37}, tc.MappingOptions.default_for(fn, "cuda"), "cuda")
    sunk = sink_single_point_bands(state.schedule)
    assert not sunk.plain_is_equal(state.schedule)
    # above the sequence of the 5 statements only the kernel mark and filters remain
    seq = [p for p in _paths(sunk) if node_at(sunk, p).get_type() == isl.schedule_node_type.sequence]
    assert len(seq) == 1 and node_at(sunk, seq[0]).n_children() == 5
    for depth in range(len(seq[0])):
        assert node_at(sunk, seq[0][:depth]).get_type() != isl.schedule_node_type.band
    context = isl.AstBuild.from_context(state.scop.context.params())
    before = context.node_from_schedule(state.schedule).to_C_str()
    assert "S4(" in before
    # the same loops, whatever the build context (the GPU one adds the thread ranges)
    assert context.node_from_schedule(sunk).to_C_str() == before


def _paths(schedule: isl.Schedule) -> list[tuple[int, ...]]:
    found: list[tuple[int, ...]] = []

    def visit(node: isl.ScheduleNode) -> bool:
        found.append(path_of(node))
        return True

    schedule.get_root().foreach_descendant_top_down(visit)
    return found


def test_host_groups_take_only_the_tensors_they_touch(rng):
    """n independent outputs are n host groups: each group's body took every tensor (IR and
    LLVM time in groups x tensors: ~1,000 outputs took 248 s and 4.8 GB for a cpu call)."""
    loads = {}
    a = rng.standard_normal(13).astype(np.float32)
    for n in (20, 40):
        fn = tc.define(_outputs(n), target="cpu")
        kernel = fn.compile(a)
        out = kernel.launch(a)
        for o in out:
            np.testing.assert_array_equal(o, a)
        loads[n] = kernel.llvm_ir.count(" = load ptr")
    assert loads[40] <= 2 * loads[20] + 8, loads


def _entry_parameters(ptx: str) -> dict[str, int]:
    return {m.group(1): m.group(2).count(".param")
            for m in re.finditer(r"\.entry\s+(\w+)\(([^)]*)\)", ptx)}


def test_each_cuda_kernel_takes_only_its_tensors():
    """n independent outputs are n kernels; each took every tensor of the function as a
    parameter (n + 1 of them: IR, PTX, compile and launch quadratic in n; 300 outputs took
    9.6 s to compile). Now each takes the tensors it reads or writes and the flag: the
    parameters, and the IR, grow linearly with the outputs."""
    a = np.ones(37, np.float32)
    params, ir_bytes = {}, {}
    for n in (24, 48):
        kernel = tc.define(_outputs(n), target="cuda").compile(a, arch="sm_90")
        image = kernel.runner.image
        assert len(image.kernels) == n
        assert sorted(k.tensors for k in image.kernels) == sorted(("A", f"O{k}") for k in range(n))
        assert all(k.sizes == () and k.parameter_count == 3 for k in image.kernels)
        entries = [ln for ln in kernel.llvm_ir.splitlines() if ln.startswith("define ptx_kernel")]
        assert len(entries) == n and all(ln.count("ptr addrspace(1)") == 3 for ln in entries)
        assert set(_entry_parameters(kernel.ptx).values()) == {3}
        params[n] = sum(k.parameter_count for k in image.kernels)
        ir_bytes[n] = len(kernel.llvm_ir)
    assert params[48] == 2 * params[24]
    assert ir_bytes[48] < 2.2 * ir_bytes[24], ir_bytes


def test_a_parametric_kernel_takes_the_sizes_it_reads():
    fn = tc.define("def f(float(N) A, float(M) B) -> (O, P) { O(i) = A(i) \n P(j) = B(j) }",
                   target="cuda")
    opts = tc.MappingOptions.default_for(fn, "cuda").with_parametric()
    kernel = fn.compile(np.ones(5, np.float32), np.ones(7, np.float32), arch="sm_90",
                        options=opts)
    got = sorted((k.tensors, k.sizes) for k in kernel.runner.image.kernels)
    assert got == [(("A", "O"), ("N",)), (("B", "P"), ("M",))]
    assert sorted(_entry_parameters(kernel.ptx).values()) == [4, 4]


def test_a_thousand_outputs_or_temporaries_pass_the_check_before_the_passes():
    """The parameter space is per kernel: before the passes each statement's tensors are
    counted (2 here), not the definition's (1,001 refused them all)."""
    from tcmlir.codegen.nvptx import check_parameter_space

    for source in (_outputs(1000), _chain(1000)):
        check_parameter_space(tc.define(source, target="cuda").ir)


def _wide_sum(name: str, n: int) -> str:
    def tree(lo: int, hi: int) -> str:
        if hi - lo == 1:
            return f"{name}{lo}(i)"
        mid = (lo + hi) // 2
        return f"({tree(lo, mid)} + {tree(mid, hi)})"

    return tree(0, n)


def test_a_kernel_of_fused_statements_over_the_parameter_space_is_a_located_error(monkeypatch):
    """Two statements of 281 tensors each fuse into one kernel of 561: refused when the kernel
    is lowered, before LLVM, with the way out (they fit as two kernels)."""
    monkeypatch.setenv("TCMLIR_ALWAYS_COMPILE", "1")
    n = 280
    args = ", ".join([f"float(N) a{k}" for k in range(n)] + [f"float(N) b{k}" for k in range(n)])
    src = (f"def f({args}) -> (O) {{\n  O(i) = {_wide_sum('a', n)}\n"
           f"  O(i) = O(i) + {_wide_sum('b', n)}\n}}")
    fn = tc.define(src, target="cuda")
    inputs = [np.ones(4, np.float32)] * (2 * n)
    with pytest.raises(tc.CodegenError) as info:
        fn.compile(*inputs, arch="sm_90")
    text = str(info.value)
    assert text.startswith("<string>:1:"), text
    assert "the CUDA kernel f_k0 (S0, S1) would take 561 tensor, 0 size and 1 flag" in text
    assert "b263 is tensor 544 of at most 543" in text and "fusion='min'" in text
    opts = tc.MappingOptions.default_for(fn, "cuda").outer_schedule_fusion_strategy("min")
    kernel = fn.compile(*inputs, arch="sm_90", options=opts)
    assert [len(k.tensors) for k in kernel.runner.image.kernels] == [n + 1, n + 1]


_OVERWRITES = """def f(float(N) A) -> (O, P) {
  O(i) = A(i)
  O(j) = A(j) + 1 where j in 0:3
  P(i) +=! O(k) * A(i) where k in 0:N
  O(i) = O(i) + 2
  O(i) +=! A(k) where k in 0:N
  P(i) = O(i)
}"""


@pytest.mark.filterwarnings("ignore:.*stays in bounds only when")
def test_windowed_dataflow_agrees_with_the_whole_array_analysis(monkeypatch):
    """An array many statements access is analysed one sink statement at a time against the
    sources since its writes are covered; forced on every array, the dependences are the
    same relations as the analysis of the whole array."""
    from tcmlir.poly import deps as deps_module

    programs = [(case.source, case.entry, case.sizes[0]) for case in CASES[::3]]
    programs += [(_OVERWRITES, None, {"N": 7}), (_same(30), None, {"N": 5}),
                 (_chain(30), None, None)]
    for source, entry, sizes in programs:
        scop = build_scop(tc.define(source, entry, target="cpu").ir, sizes)
        monkeypatch.setattr(deps_module, "WINDOW_FROM", 10**9)
        whole = compute_dependences(scop)
        monkeypatch.setattr(deps_module, "WINDOW_FROM", 0)
        windowed = compute_dependences(scop)
        for kind in ("raw", "war", "waw", "reduction", "validity", "coincidence"):
            assert getattr(whole, kind).is_equal(getattr(windowed, kind)), (source[:40], kind)


def test_a_statement_overwritten_many_times_is_analysed_against_its_last_writer(monkeypatch):
    """``O(i) = A(i)`` 200 times: each write of O is compared with the one before it, not with
    all 199 (isl's dataflow over every source was quadratic: 10 s for 1,000 statements)."""
    from tcmlir.poly import deps as deps_module

    sources: list[int] = []
    real = deps_module._PerArrayFlow._flow

    def counted(self, sink_maps, must_maps, may_maps, kill_maps):
        sources.append(len(must_maps) + len(may_maps) + len(kill_maps))
        return real(self, sink_maps, must_maps, may_maps, kill_maps)

    monkeypatch.setattr(deps_module._PerArrayFlow, "_flow", counted)
    deps = compute_dependences(build_scop(tc.define(_same(200), target="cpu").ir, {"N": 5}))
    assert len(maps_of(deps.waw)) == 199
    assert sources and max(sources) <= 2, max(sources)


def test_single_point_bands_below_promotion_copies_stay():
    """Below an extension node (promotion's copies) isl computes no prefix schedule in general
    ("cannot handle extension nodes" on promoted corpus trees): such a band stays."""
    from tcmlir.poly.loops import sink_single_point_bands

    tree = isl.Schedule.read_from_str(isl.DEFAULT_CONTEXT, """{
      domain: "{ S0[i] : 0 <= i < 4; S1[i] : 0 <= i < 4 }",
      child: { schedule: "[{ S0[i] -> [(i)]; S1[i] -> [(i)] }]",
        child: { extension: "{ [t] -> C[t] }",
          child: { sequence: [ { filter: "{ C[t] }" },
            { filter: "{ S0[i]; S1[i] }",
              child: { schedule: "[{ S0[i] -> [(0)]; S1[i] -> [(0)] }]",
                child: { sequence: [ { filter: "{ S0[i] }" }, { filter: "{ S1[i] }" } ] } } } ]
    } } } }""")
    assert sink_single_point_bands(tree).plain_is_equal(tree)


def _bodies(llvm_ir: str) -> list[str]:
    return [ln for ln in llvm_ir.splitlines() if ln.startswith("define internal")]


def test_host_groups_of_the_same_code_share_one_body(rng):
    """n independent outputs ``O_k(i) = A(i)`` are n host groups of the same loop on other
    pointers: LLVM optimised and compiled each (~15 ms a group: a cpu call of 1,000 outputs
    took ~37 s). Groups of equal code now call one body; each keeps its own entry point."""
    a = rng.standard_normal(13).astype(np.float32)
    kernel = tc.define(_outputs(40), target="cpu").compile(a)
    bodies = _bodies(kernel.llvm_ir)
    assert len(bodies) == 1 and "noinline" in bodies[0], bodies
    assert kernel.llvm_ir.count("define void @\"f_") == 40 + 1  # the groups and one range
    for o in kernel.launch(a):
        np.testing.assert_array_equal(o, a)


def test_groups_share_a_body_only_when_their_code_is_the_same(rng):
    src = """def f(float(N) A, float(M) B, float(N) C) -> (O0, O1, O2, O3, O4, O5) {
      O0(i) = A(i) * 2.0
      O1(i) = A(i) * 3.0
      O2(i) = C(i) * 2.0
      O3(j) = B(j) * 2.0
      O4(i) = C(i) * 3.0
      O5(i) +=! A(i) * C(k) where k in 0:N
    }"""
    a, b, c = (rng.standard_normal(7).astype(np.float32) for _ in range(3))
    kernel = tc.define(src, target="cpu").compile(a, b, c)
    # O0/O2 and O1/O4 share (same code on other tensors of the same shape); O3's tensors
    # have another shape (M), O5 is a reduction
    assert len(_bodies(kernel.llvm_ir)) == 4, _bodies(kernel.llvm_ir)
    # every group's parallel loop runs over 0..6: one range function serves them all
    assert kernel.llvm_ir.count("_range\"(") == 1
    got = kernel.launch(a, b, c)
    want = (a * 2, a * 3, c * 2, b * 2, c * 3, a * c.sum())
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5)


def test_groups_with_gathers_keep_their_own_bodies_and_messages(rng):
    src = """def f(float(V) E, int32(L) idx, int32(L) jdx) -> (O0, O1) {
      O0(i) = E(idx(i))
      O1(i) = E(jdx(i))
    }"""
    fn = tc.define(src, target="cpu")
    e = rng.standard_normal(5).astype(np.float32)
    good, bad = np.array([0, 4, 2], np.int32), np.array([1, 9, 0], np.int32)
    kernel = fn.compile(e, good, good)
    assert len(_bodies(kernel.llvm_ir)) == 2
    np.testing.assert_array_equal(fn(e, good, good)[1], e[good])
    with pytest.raises(tc.CallError, match="jdx"):
        fn(e, good, bad)


def test_map_reduction_tries_only_kernels_that_run_a_reduction(monkeypatch):
    """Each attempt rebuilt the schedule tree (about 5 ms a kernel at 1,000 kernels, more
    the more kernels): kernels without a reduction update are left before any attempt."""
    from tcmlir.passes import map_reductions

    from tcmlir.compiler import lower

    tried = []
    real = map_reductions._map_kernel

    def counted(state, schedule, path, km, *args):
        tried.append(km)
        return real(state, schedule, path, km, *args)

    monkeypatch.setattr(map_reductions, "_map_kernel", counted)
    src = _outputs(12).replace("O11(i) = A(i)", "O11 +=! A(r)")
    fn = tc.define(src, target="cuda")
    state = lower(fn.ir, {"N": 37}, tc.MappingOptions.default_for(fn, "cuda"), "cuda")
    assert len(tried) == 1
    assert "reduction S11" in str(state.schedule)
