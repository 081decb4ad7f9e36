"""Passes: registry, pipeline strings (and their located errors), the pass manager, each pass."""

from __future__ import annotations

import io

import islpy as isl
import pytest
from tcmlir.passes import PASSES, PassManager, format_pass, parse_pipeline
from tcmlir.passes.mark_parallel import PARALLEL, PARALLEL_END
from tcmlir.passes.schedule import Schedule
from tcmlir.passes.specialize import Specialize
from tcmlir.passes.tile import Tile

import tcmlir.lang as lang
from tcmlir.errors import PipelineError
from tcmlir.poly.legality import check_legal
from tcmlir.poly.loops import build_ast, format_loops
from tcmlir.poly.state import CompileState
from tcmlir.poly.tree import bands, mark_name, node_at, outermost_band_paths

MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
SUM_ALL = "def sum(float(N) A) -> (s) { s +=! A(i) }"
ROWSUM = "def rowsum(float(N,M) A) -> (s) { s(i) +=! A(i,j) }"
SOFTMAX = """
def softmax(float(N,M) X) -> (O, mx, e, s) {
    mx(i) max=! X(i,j)
    e(i,j) = exp(X(i,j) - mx(i))
    s(i) +=! e(i,j)
    O(i,j) = e(i,j) / s(i)
}"""
CONV = """
def conv(float(B,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) {
    O(b,f,h,w) +=! I(b,c,h+kh,w+kw) * Wt(f,c,kh,kw)
}"""


def initial(src: str, sizes=None) -> CompileState:
    return CompileState.initial(lang.check(lang.parse(src)), sizes)


def run(src: str, pipeline: str, sizes=None, **kw) -> CompileState:
    return PassManager(parse_pipeline(pipeline), **kw).run(initial(src, sizes))


def reparses(state: CompileState) -> bool:
    text = str(state.schedule)
    again = isl.Schedule.read_from_str(state.ctx, text)
    return again.get_map().is_equal(state.schedule.get_map()) and \
        str(isl.Schedule.read_from_str(state.ctx, str(again))) == str(again)


# ---------------------------------------------------------------- registry and parsing


def test_registry_has_the_first_passes():
    assert {"schedule", "tile", "specialize", "verify", "mark-parallel"} <= set(PASSES)
    for cls in PASSES.values():
        assert cls.__doc__ and cls.name == cls.name.lower()


def test_parse_pipeline_typed_options():
    passes = parse_pipeline("schedule{fusion=min, skew=true, positive-orthant=false},"
                            "tile{sizes=32,0,16},specialize{N=64,K=3},verify,mark-parallel")
    assert passes[0] == Schedule(fusion="min", skew=True, positive_orthant=False)
    assert passes[1] == Tile(sizes=(32, 0, 16))
    assert passes[2] == Specialize(sizes=(("N", 64), ("K", 3)))
    assert [p.name for p in passes[3:]] == ["verify", "mark-parallel"]


@pytest.mark.parametrize("text", [
    "schedule", "schedule{fusion=preserve3coincident,positive-orthant=false}",
    "tile{sizes=3,5},mark-parallel", "specialize{N=64,K=3},schedule{skew=true}",
])
def test_format_pass_round_trips(text):
    passes = parse_pipeline(text)
    assert parse_pipeline(",".join(map(format_pass, passes))) == passes


@pytest.mark.parametrize("text, col, what", [
    ("schedul", 1, "unknown pass 'schedul'"),
    ("schedule,tilee{sizes=3}", 10, "unknown pass 'tilee'"),
    ("schedule{fusion=maxx}", 17, "bad value 'maxx' for option 'fusion'"),
    ("schedule{x=1}", 10, "pass 'schedule' has no option 'x'"),
    ("tile{sizes=a}", 12, "expects an integer"),
    ("schedule{skew=maybe}", 15, "expects true or false"),
    ("schedule{", 10, "expected an option name"),
    ("schedule{fusion=max}}", 21, "expected ',' or end of pipeline"),
    ("schedule,,tile", 10, "expected a pass name"),
    ("schedule{fusion=max,fusion=min}", 21, "given twice"),
    ("tile{sizes=-1}", 1, "tile sizes must be >= 0"),
    ("", 1, "empty pipeline"),
])
def test_pipeline_errors_are_located(text, col, what):
    with pytest.raises(PipelineError) as info:
        parse_pipeline(text)
    err = info.value
    assert err.col == col, str(err)
    assert what in str(err)
    assert str(err).startswith(f"<pipeline>:1:{col}: error:")
    lines = str(err).splitlines()
    assert lines[2].index("^") - 2 == col - 1  # the caret under the culprit


def test_unknown_pass_lists_known_passes_and_bad_option_lists_options():
    with pytest.raises(PipelineError, match=r"known passes: .*mark-parallel.*schedule"):
        parse_pipeline("nope")
    with pytest.raises(PipelineError, match="options of schedule: fusion, skew, positive-orthant"):
        parse_pipeline("schedule{fusoin=max}")
    with pytest.raises(PipelineError, match="choose one of max, preserve3coincident, min"):
        parse_pipeline("schedule{fusion=all}")


# ---------------------------------------------------------------- the pass manager


def test_pass_needing_a_schedule_fails_before_schedule():
    for pipeline in ("tile{sizes=32}", "mark-parallel", "verify"):
        with pytest.raises(PipelineError, match="run `schedule` first"):
            run(MATMUL, pipeline)


def test_print_after_all_time_passes_and_callbacks():
    out = io.StringIO()
    seen = []
    state = run(MATMUL, "schedule,tile{sizes=4,4}", print_after_all=True, time_passes=True,
                out=out, callbacks=[lambda p, s: seen.append((p.name, s.schedule is not None))])
    text = out.getvalue()
    assert "after schedule" in text and "after tile{sizes=4,4}" in text
    assert "pass execution timing" in text and "total" in text
    assert seen == [("schedule", True), ("tile", True)]
    from tcmlir.pretty import format_schedule  # the tree in isl's block style

    printed = text.split("after tile{sizes=4,4} //----- //\n")[1]
    assert printed.startswith(format_schedule(state.schedule) + "\n")


def test_verify_each_catches_an_illegal_pass():
    from dataclasses import dataclass, replace

    from tcmlir.passes.base import Pass

    @dataclass(frozen=True)
    class Reverse(Pass):
        """Reverse the reduction loop of matmul (illegal)."""

        name = "reverse-test"
        requires_schedule = True

        def run(self, state):
            text = str(state.scop.schedule).replace("S0[m, n, k] -> [(k)]", "S0[m, n, k] -> [(-k)]")
            return replace(state, schedule=isl.Schedule.read_from_str(state.ctx, text))

    state = initial(MATMUL)
    passes = (*parse_pipeline("schedule"), Reverse())
    with pytest.raises(AssertionError, match="violates dependences"):
        PassManager(passes).run(state)
    PassManager(passes, verify_each=False).run(state)  # no verification asked: no error
    with pytest.raises(AssertionError, match="violates dependences"):
        PassManager((*passes, *parse_pipeline("verify")), verify_each=False).run(state)
    # a schedule map proved legal before does not hide a later illegal one
    with pytest.raises(AssertionError, match="violates dependences"):
        PassManager((*parse_pipeline("schedule,mark-parallel"), Reverse())).run(state)


def test_verify_each_proves_each_schedule_map_once(monkeypatch):
    """Passes that keep the schedule map (marks, loop types, promotion on the proof schedule)
    are not proved again: a cuda matmul's 8 passes need 6 proofs (issue 31: the proofs were
    a seventh of fc + bias + relu's compile)."""
    from tcmlir.passes import manager

    proved = []
    real = manager.check_legal
    monkeypatch.setattr(manager, "check_legal",
                        lambda s, d, m=None: (proved.append(s), real(s, d, m))[1])
    pipeline = ("schedule,tile{sizes=32,32,8},map-to-blocks{grid=8,8},register-tile{sizes=2,2},"
                "map-to-threads{block=16,16},unroll{factor=8},promote-shared,promote-private")
    PassManager(parse_pipeline(pipeline)).run(initial(MATMUL, {"M": 64, "N": 64, "K": 64}))
    assert len(proved) == 6


# ---------------------------------------------------------------- schedule, tile


@pytest.mark.parametrize("src", [MATMUL, SOFTMAX, CONV, ROWSUM])
@pytest.mark.parametrize("size", [1, 3, 32])
@pytest.mark.parametrize("fusion", ["max", "preserve3coincident", "min"])
@pytest.mark.parametrize("sized", [False, True])
def test_tiling_keeps_schedules_legal_and_printable(src, size, fusion, sized):
    fn = lang.check(lang.parse(src))
    sizes = {s: 3 if s.startswith("K") else 5 + 2 * i for i, s in enumerate(fn.sizes)} \
        if sized else None
    pipeline = f"schedule{{fusion={fusion}}},tile{{sizes={size},{size},{size}}},verify"
    state = PassManager(parse_pipeline(pipeline)).run(CompileState.initial(fn, sizes))
    check_legal(state.schedule, state.deps)
    assert reparses(state)
    assert "for" in format_loops(build_ast(state))


def test_tile_splits_band_into_tile_and_point_bands():
    state = run(MATMUL, "schedule{fusion=min},tile{sizes=32,16}")
    sizes = [b.band_n_member() for b in bands(state.schedule)]
    assert sizes == [2, 2, 3, 2]  # init: tile + point; update: tile(m,n,k untiled) + point
    loops = format_loops(build_ast(state))
    assert "(M - 1) / 32" in loops and "(N - 1) / 16" in loops


def test_tile_zero_leaves_member_untiled():
    state = run(MATMUL, "schedule{fusion=min},tile{sizes=0,8,0}")
    tile_band, point_band = bands(state.schedule)[-2:]
    assert tile_band.band_n_member() == 3 and point_band.band_n_member() == 1
    loops = format_loops(build_ast(state))
    assert "(N - 1) / 8" in loops and "/ 0" not in loops


def test_tile_keeps_coincidence_flags():
    state = run(MATMUL, "schedule{fusion=min},tile{sizes=4,4,4}")
    for b in bands(state.schedule):
        assert b.band_get_permutable()
        assert b.band_member_get_coincident(0)


# ---------------------------------------------------------------- mark-parallel


def _marks(state) -> list[str]:
    found = []

    def visit(node):
        if mark_name(node) is not None:
            found.append(mark_name(node))
        return True

    state.schedule.get_root().foreach_descendant_top_down(visit)
    return found


def test_mark_parallel_matmul_outer_loops():
    for fusion in ("max", "min"):
        state = run(MATMUL, f"schedule{{fusion={fusion}}},mark-parallel")
        assert PARALLEL in _marks(state)
        loops = format_loops(build_ast(state))
        assert "// parallel" in loops
        assert reparses(state)
    state = run(MATMUL, "schedule,mark-parallel,mark-parallel")  # idempotent
    assert _marks(state).count(PARALLEL) == 1


def test_mark_parallel_skips_reduction_only_loops():
    state = run(SUM_ALL, "schedule,mark-parallel")
    assert PARALLEL not in _marks(state)
    state = run(SUM_ALL, "schedule,tile{sizes=32},mark-parallel")
    assert PARALLEL not in _marks(state)
    state = run(ROWSUM, "schedule,mark-parallel")  # rows are independent
    assert _marks(state) == [PARALLEL, PARALLEL_END]


def test_mark_parallel_marks_only_parallel_outermost_bands():
    state = run(SOFTMAX, "schedule{fusion=min},mark-parallel")
    for path in outermost_band_paths(state.schedule):
        band = node_at(state.schedule, path)
        assert mark_name(band.parent()) == PARALLEL
    assert _marks(state).count(PARALLEL) == 6


# ---------------------------------------------------------------- specialize


def test_specialize_before_and_after_scheduling():
    before = run(MATMUL, "specialize{M=64,N=32,K=8},schedule,tile{sizes=16,16}")
    after = run(MATMUL, "schedule,specialize{M=64,N=32,K=8},tile{sizes=16,16}")
    for state in (before, after):
        assert state.sizes == {"M": 64, "N": 32, "K": 8}
        fixed = isl.Set.read_from_str(state.ctx, "[M,K,N] -> { : M = 64 and K = 8 and N = 32 }")
        assert state.scop.context.is_equal(fixed)
        check_legal(state.schedule, state.deps)
        loops = format_loops(build_ast(state))
        assert "c0 <= 3" in loops  # 64 / 16 tiles, constant bounds


def test_specialize_rejects_unknown_size():
    with pytest.raises(PipelineError, match="Q is not a size of mm"):
        run(MATMUL, "specialize{Q=3}")
    with pytest.raises(PipelineError, match="must be >= 1"):
        parse_pipeline("specialize{N=0}")


def test_sizes_outside_the_context_are_an_error():
    from tcmlir.errors import CallError

    with pytest.raises(CallError, match="do not satisfy the constraints of conv"):
        initial(CONV, {"B": 1, "C": 1, "H": 2, "W": 2, "F": 1, "KH": 3, "KW": 3})
