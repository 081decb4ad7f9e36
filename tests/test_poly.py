"""Polyhedral core: scops, dependences, isl scheduling under TC's fusion strategies, legality."""

from __future__ import annotations

import islpy as isl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tcmlir.passes import PassManager, parse_pipeline

import tcmlir.lang as lang
from tcmlir.poly.deps import compute_dependences
from tcmlir.poly.legality import check_legal, member_is_parallel
from tcmlir.poly.loops import build_ast, format_loops
from tcmlir.poly.scheduler import (
    FUSION_STRATEGIES,
    compute_schedule,
    has_negative_coefficient,
    is_skewed,
)
from tcmlir.poly.scop import build_scop, maps_of
from tcmlir.poly.state import CompileState
from tcmlir.poly.tree import bands

MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
CONV = """
def conv(float(B,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) {
    O(b,f,h,w) +=! I(b,c,h+kh,w+kw) * Wt(f,c,kh,kw)
}"""
SOFTMAX = """
def softmax(float(N,M) X) -> (O, mx, e, s) {
    mx(i) max=! X(i,j)
    e(i,j) = exp(X(i,j) - mx(i))
    s(i) +=! e(i,j)
    O(i,j) = e(i,j) / s(i)
}"""
SUM_ALL = "def sum(float(N) A) -> (s) { s +=! A(i) }"
SUBRANGE = "def skip(float(M,N) A) -> (O) { O(i) +=! A(i,j) where j in 1:N }"
GATHER = "def g(float(N) A, int32(M) idx) -> (O) { O(i) = A(idx(i)) }"
SCALED = "def sc(float a, float(N) X) -> (Y) { Y(i) = a * X(i) }"
REVERSE = """
def rev(float(N) A) -> (C, B) {
    B(i) = A(i)
    C(i) = B(N - 1 - i)
}"""
CHAIN = """
def chain(float(N,M) A) -> (D, T1, T2) {
    T1(i,j) = A(i,j) * 2.0
    T2(j,i) = T1(i,j) + 1.0
    D(i) +=! T2(j,i)
}"""
PROGRAMS = {"matmul": MATMUL, "conv": CONV, "softmax": SOFTMAX, "sum": SUM_ALL,
            "subrange": SUBRANGE, "gather": GATHER, "scaled": SCALED, "reverse": REVERSE,
            "chain": CHAIN}


def fn_of(src: str):
    return lang.check(lang.parse(src))


def run(src: str, pipeline: str, sizes=None) -> CompileState:
    return PassManager(parse_pipeline(pipeline)).run(CompileState.initial(fn_of(src), sizes))


def umap(ctx, text: str) -> isl.UnionMap:
    return isl.UnionMap.read_from_str(ctx, text)


# ---------------------------------------------------------------- scop


def test_matmul_scop_statements_domains_accesses():
    scop = build_scop(fn_of(MATMUL))
    assert scop.params == ("M", "K", "N")
    assert list(scop.statements) == ["S0_init", "S0"]
    assert scop.statements["S0"].dims == ("m", "n", "k")
    assert scop.statements["S0_init"].dims == ("m", "n") and scop.statements["S0_init"].is_init
    ctx = scop.ctx
    dom = isl.UnionSet.read_from_str(
        ctx, "[M,K,N] -> { S0[m,n,k] : 0 <= m < M and 0 <= n < N and 0 <= k < K and M > 0 and "
             "N > 0 and K > 0; S0_init[m,n] : 0 <= m < M and 0 <= n < N and K > 0 }")
    assert scop.domain.is_equal(dom.intersect_params(scop.context))
    reads = umap(ctx, "[M,K,N] -> { S0[m,n,k] -> A[m,k]; S0[m,n,k] -> B[k,n]; S0[m,n,k] -> C[m,n] }")
    assert scop.reads.is_equal(reads.intersect_domain(scop.domain))
    writes = umap(ctx, "[M,K,N] -> { S0[m,n,k] -> C[m,n]; S0_init[m,n] -> C[m,n] }")
    assert scop.writes.is_equal(writes.intersect_domain(scop.domain))
    assert scop.may_reads.is_empty()


def test_program_order_schedule_is_init_then_update_in_index_order():
    scop = build_scop(fn_of(MATMUL))
    text = format_loops(build_ast(CompileState.initial(scop.fn)))
    assert text.index("S0_init(") < text.index("S0(c0, c1, c2)")
    sched = scop.schedule.get_map().intersect_domain(scop.domain)
    assert sched.is_equal(umap(scop.ctx, "[M,K,N] -> { S0_init[m,n] -> [0,m,n,0]; "
                                         "S0[m,n,k] -> [1,m,n,k] }").intersect_domain(scop.domain))


def test_specialised_scop_fixes_parameters():
    scop = build_scop(fn_of(MATMUL), {"M": 4, "K": 3, "N": 5})
    assert scop.context.is_equal(isl.Set.read_from_str(scop.ctx, "[M,K,N] -> { : M = 4 and K = 3 and N = 5 }"))
    points: list = []
    scop.domain.foreach_point(points.append)
    assert len(points) == 4 * 5 + 4 * 5 * 3


def test_gather_is_may_read_of_whole_extent_and_scalar_is_0d():
    scop = build_scop(fn_of(GATHER))
    ctx = scop.ctx
    assert scop.may_reads.is_equal(umap(ctx, "[N,M] -> { S0[i] -> A[o] : 0 <= o < N }")
                                   .intersect_domain(scop.domain))
    assert scop.reads.is_equal(umap(ctx, "[N,M] -> { S0[i] -> idx[i] }").intersect_domain(scop.domain))
    scop = build_scop(fn_of(SCALED))
    assert any(m.range().get_tuple_name() == "a" and m.range().dim(isl.dim_type.set) == 0
               for m in maps_of(scop.reads))


def test_subrange_domain_and_empty_statement():
    scop = build_scop(fn_of(SUBRANGE))
    dom = scop.domains["S0"]
    assert dom.is_equal(isl.Set.read_from_str(
        scop.ctx, "[M,N] -> { S0[i,j] : 0 <= i < M and 1 <= j < N }").intersect_params(scop.context))
    scop = build_scop(fn_of(SUBRANGE), {"M": 3, "N": 1})
    assert scop.domains["S0"].is_empty()
    compute_dependences(scop)  # no statement instances: still fine


# ---------------------------------------------------------------- dependences


def test_matmul_dependences_and_reduction_split():
    scop = build_scop(fn_of(MATMUL))
    deps = compute_dependences(scop)
    ctx = scop.ctx
    red = umap(ctx, "[M,K,N] -> { S0[m,n,k] -> S0[m,n,k+1] : 0 <= m < M and 0 <= n < N "
                    "and 0 <= k < K - 1 }")
    init = umap(ctx, "[M,K,N] -> { S0_init[m,n] -> S0[m,n,0] : 0 <= m < M and 0 <= n < N and K > 0 }")
    assert deps.reduction.is_equal(red)
    assert deps.raw.is_equal(red.union(init))
    assert deps.coincidence.is_equal(init)
    assert deps.validity.is_equal(red.union(init))


def test_softmax_dependences_chain():
    scop = build_scop(fn_of(SOFTMAX))
    deps = compute_dependences(scop)
    # e(i,j) needs the final max of row i, O(i,j) the final sum.
    need = umap(scop.ctx, "[N,M] -> { S0[i, M - 1] -> S1[i, j] : 0 <= i < N and 0 <= j < M; "
                          "S2[i, M - 1] -> S3[i, j] : 0 <= i < N and 0 <= j < M }")
    assert need.is_subset(deps.raw)
    assert not deps.reduction.is_empty()
    assert deps.reduction.is_subset(umap(scop.ctx, "{ S0[i,j] -> S0[i,j2]; S2[i,j] -> S2[i,j2] }"))


def test_war_dependence_on_temporary_reuse():
    src = """
    def reuse(float(N) A) -> (B, T) {
        T(i) = A(i)
        B(i) = T(N - 1 - i)
    }"""
    deps = compute_dependences(build_scop(fn_of(src)))
    assert not deps.raw.is_empty()


# ---------------------------------------------------------------- scheduling, legality


@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("fusion", FUSION_STRATEGIES)
@pytest.mark.parametrize("sized", [False, True])
def test_schedules_are_legal(name, fusion, sized):
    fn = fn_of(PROGRAMS[name])
    sizes = {s: 3 if s.startswith("K") else 3 + i for i, s in enumerate(fn.sizes)} \
        if sized else None
    state = CompileState.initial(fn, sizes)
    schedule = compute_schedule(state.scop, state.deps, fusion)
    check_legal(schedule, state.deps)
    assert not is_skewed(schedule) and not has_negative_coefficient(schedule)
    assert schedule.get_domain().is_equal(state.scop.domain)


def test_fusion_strategies_differ_on_softmax():
    fn = fn_of(SOFTMAX)
    state = CompileState.initial(fn)
    loops = {f: format_loops(build_ast(state.__class__(fn, state.scop, state.deps,
                                                       compute_schedule(state.scop, state.deps, f))))
             for f in FUSION_STRATEGIES}
    nests = {f: text.count("for (int c0") for f, text in loops.items()}
    # max fuses everything under one loop over i; min gives each statement its own nest.
    assert loops["max"].startswith("for (int c0 = 0; c0 < N; c0 += 1)")
    assert nests == {"max": 1, "preserve3coincident": 3, "min": 6}


def test_positive_orthant_forbids_reversal():
    state = CompileState.initial(fn_of(REVERSE))
    free = compute_schedule(state.scop, state.deps, "max", positive_orthant=False)
    kept = compute_schedule(state.scop, state.deps, "max", positive_orthant=True)
    assert has_negative_coefficient(free)  # isl fuses B and C by reversing C
    assert not has_negative_coefficient(kept)
    check_legal(free, state.deps)
    check_legal(kept, state.deps)


def test_check_legal_detects_reversed_reduction_loop():
    state = CompileState.initial(fn_of(MATMUL))
    text = str(state.scop.schedule).replace("S0[m, n, k] -> [(k)]", "S0[m, n, k] -> [(-k)]")
    assert text != str(state.scop.schedule)
    bad = isl.Schedule.read_from_str(state.ctx, text)
    with pytest.raises(AssertionError, match="violates dependences"):
        check_legal(bad, state.deps)
    check_legal(state.scop.schedule, state.deps)


def test_check_legal_detects_statement_order_swap():
    state = CompileState.initial(fn_of(SOFTMAX))
    doms = state.scop.domains
    order = ["S3", "S0_init", "S0", "S1", "S2_init", "S2"]  # O = e / s first: illegal
    bad = isl.Schedule.from_domain(isl.UnionSet.from_set(doms[order[0]]))
    for name in order[1:]:
        bad = bad.sequence(isl.Schedule.from_domain(isl.UnionSet.from_set(doms[name])))
    with pytest.raises(AssertionError, match="S3"):
        check_legal(bad, state.deps)
    good = isl.Schedule.from_domain(isl.UnionSet.from_set(doms["S0_init"]))
    for name in ["S0", "S1", "S2_init", "S2", "S3"]:
        good = good.sequence(isl.Schedule.from_domain(isl.UnionSet.from_set(doms[name])))
    with pytest.raises(AssertionError):  # no loops: S0's instances are unordered
        check_legal(good, state.deps)


def test_member_parallelism_considers_reductions():
    state = run(MATMUL, "schedule{fusion=min}")
    update = next(b for b in bands(state.schedule) if b.band_n_member() == 3)
    assert member_is_parallel(update, 0, state.deps.validity)
    assert member_is_parallel(update, 1, state.deps.validity)
    assert not member_is_parallel(update, 2, state.deps.validity)
    assert member_is_parallel(update, 2, state.deps.coincidence)  # only the reduction carries k


# ---------------------------------------------------------------- corpus and random programs


def _corpus_cases():
    from corpus.programs import CASES

    return list(CASES)


@pytest.mark.parametrize("case", _corpus_cases(), ids=lambda c: c.name)
def test_corpus_programs_schedule_legally(case):
    fn = lang.check(lang.parse(case.source), case.entry)  # the corpus is valid: never skipped
    for sizes in (None, dict(case.sizes[0])):
        for fusion in FUSION_STRATEGIES:
            pipeline = f"schedule{{fusion={fusion}}},tile{{sizes=3,3,3}},mark-parallel"
            state = PassManager(parse_pipeline(pipeline)).run(CompileState.initial(fn, sizes))
            build_ast(state)
            again = isl.Schedule.read_from_str(state.ctx, str(state.schedule))
            assert again.get_map().is_equal(state.schedule.get_map())


@st.composite
def random_programs(draw):
    """Chains of statements over N x M / N / M tensors: maps, transposes, reductions."""
    shapes = {"A": ("i", "j")}
    lines = []
    for k in range(draw(st.integers(1, 4))):
        lhs = draw(st.sampled_from([("i", "j"), ("j", "i"), ("i",), ("j",)]))
        reads = draw(st.lists(st.sampled_from(sorted(shapes)), min_size=1, max_size=2))
        terms = [f"{t}({','.join(shapes[t])})" for t in reads]
        used = {i for t in reads for i in shapes[t]}
        lhs = tuple(i for i in lhs if i in used) or tuple(sorted(used))[:1]
        op = "+=!" if used - set(lhs) else draw(st.sampled_from(["=", "+=!"]))
        name = f"T{k}"
        lines.append(f"{name}({','.join(lhs)}) {op} {' + '.join(terms)}")
        shapes[name] = lhs
    outs = [n for n in shapes if n != "A"]
    src = (f"def r(float(N,M) A) -> ({', '.join(outs)}) {{\n  " + "\n  ".join(lines) + "\n}")
    return src


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_programs(), st.sampled_from(FUSION_STRATEGIES), st.sampled_from([1, 3, 32]))
def test_random_programs_schedule_legally(src, fusion, tile):
    state = run(src, f"schedule{{fusion={fusion}}},tile{{sizes={tile},{tile}}},mark-parallel,verify")
    check_legal(state.schedule, state.deps)
