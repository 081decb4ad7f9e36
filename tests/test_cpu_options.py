"""target="cpu" under the option sets a CPU honours (issue 4), against independent oracles.

Every corpus case runs on the host JIT under at least two option sets out of: tile sizes 1,
3,3,3 and 32,32,32, no tiling, each fusion strategy, threads 1 and 2, unroll 4 (and 3 with
odd tiles), with fresh random inputs and, where the case writes every element of its outputs,
poisoned ``outputs=``; comparisons in float64 (`assert_outputs_close`). The option sets rotate
over the cases (case i gets sets i, i + 4 and i + 8, each at one of its awkward size
assignments), so the file stays quick while every set meets over a quarter of the corpus. Random programs from
`strategies_programs` run under a random option set too. The CPU passes (`vectorize`,
`unroll`) are checked for what they do to the loops. Corpus cases are compared with their
independent numpy oracle (`Case.expected`), never with ``target="numpy"``, which shares the IR,
type inference and reduction identities with the compiler; random programs with the numpy model
built beside their source.
"""

from __future__ import annotations

import functools
import re

import numpy as np
import pytest
from corpus import assert_case_matches
from corpus.option_sets import SCHEDULE_CASES, SCHEDULE_SETS, SHAPE_CASES
from corpus.programs import CASES, case_by_name
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies_programs import check_against_model, programs

import tcmlir as tc

_BASE = tc.MappingOptions.naive()
OPTION_SETS: dict[str, tc.MappingOptions] = {
    "tile1": _BASE.tile(1),
    "tile3": _BASE.tile(3, 3, 3),
    "tile32": _BASE.tile(32, 32, 32),
    "untiled": _BASE.tile(0),
    "fusion-max": _BASE.outer_schedule_fusion_strategy("max").tile(3, 3, 3),
    "fusion-p3c": _BASE.outer_schedule_fusion_strategy("preserve3coincident").tile(0),
    "fusion-min": _BASE.outer_schedule_fusion_strategy("min"),
    "threads1": _BASE.with_threads(1),
    "threads2": _BASE.with_threads(2).tile(0),
    "unroll4": _BASE.unroll(4),
    "unroll3-tile5": _BASE.tile(5, 5, 5).unroll(3).with_threads(2),
}
_NAMES = list(OPTION_SETS)


def _rotation() -> list:
    params = []
    for i, case in enumerate(CASES):
        for j, shift in enumerate((0, 4, 8)):
            name = _NAMES[(i + shift) % len(_NAMES)]
            sizes = case.sizes[(i + j) % len(case.sizes)]
            label = ",".join(f"{k}={v}" for k, v in sizes.items())
            params.append(pytest.param(case, sizes, name, id=f"{case.name}[{label}]-{name}"))
    return params


@functools.cache
def _define(source: str, entry: str | None, target: str):
    return tc.define(source, name=entry, target=target)


def test_rotation_covers_every_case_and_option_set():
    seen_cases: dict[str, int] = {}
    seen_sets = set()
    for p in _rotation():
        case, _, name = p.values
        seen_cases[case.name] = seen_cases.get(case.name, 0) + 1
        seen_sets.add(name)
    assert all(n >= 3 for n in seen_cases.values()) and len(seen_cases) == len(CASES)
    assert seen_sets == set(_NAMES)


@pytest.mark.parametrize(("case", "sizes", "option_set"), _rotation())
def test_case_cpu_matches_oracle(case, sizes, option_set, rng):
    options = OPTION_SETS[option_set]
    inputs = case.make_inputs(rng, **sizes)
    reference = case.expected(*[np.copy(x) for x in inputs])
    fn = _define(case.source, case.entry, "cpu")
    context = f"{case.name} {sizes} {option_set}: {options.to_pipeline('cpu')}"
    assert_case_matches(fn, inputs, reference, full_write=case.full_write, rtol=case.rtol,
                        options=options, context=context)


def _schedule_rotation() -> list:
    """Each schedule/preset set on three of `SCHEDULE_CASES` (every case meets two or more),
    and the sets that skew or drop the positive orthant also on the cases they change."""
    params = []
    for i, name in enumerate(SCHEDULE_SETS):
        names = {SCHEDULE_CASES[(3 * i + j) % len(SCHEDULE_CASES)] for j in range(3)}
        names |= {case for key, case in SHAPE_CASES.items() if key in name}
        for case_name in sorted(names):
            params.append(pytest.param(case_by_name(case_name), name, id=f"{case_name}-{name}"))
    return params


@pytest.mark.parametrize("key", sorted(SHAPE_CASES))
def test_skewing_and_orthant_change_the_schedule(key):
    """Not vacuous: on its case, each option yields another schedule than fusion=max alone."""
    case = case_by_name(SHAPE_CASES[key])
    inputs = case.make_inputs(np.random.default_rng(0), **case.sizes[-1])
    fn = _define(case.source, case.entry, "cpu")
    plain = tc.MappingOptions.naive().outer_schedule_fusion_strategy("max")
    changed = (plain.outer_schedule_allow_skewing(True) if key == "skew"
               else plain.outer_schedule_positive_orthant(False))
    before = fn.compile(*inputs, options=plain).schedule
    after = fn.compile(*inputs, options=changed).schedule
    assert before != after, after
    assert ("i + j" in after) if key == "skew" else ("- i" in after), after


@pytest.mark.parametrize(("case", "option_set"), _schedule_rotation())
def test_skewing_orthant_and_presets_match_oracle(case, option_set, rng):
    options = SCHEDULE_SETS[option_set]
    sizes = case.sizes[-1]
    inputs = case.make_inputs(rng, **sizes)
    assert_case_matches(_define(case.source, case.entry, "cpu"), inputs,
                        case.expected(*[np.copy(x) for x in inputs]), full_write=case.full_write,
                        rtol=case.rtol, options=options,
                        context=f"{case.name} {sizes} {option_set}: {options.to_pipeline('cpu')}")


@settings(max_examples=50, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(program=programs(), option_set=st.sampled_from(_NAMES), seed=st.integers(0, 2**32 - 1))
def test_random_program_cpu_matches_model(program, option_set, seed):
    inputs = program.make_inputs(np.random.default_rng(seed))
    check_against_model(program, inputs, "cpu", OPTION_SETS[option_set])


# ---------------------------------------------------------------- what the CPU passes do

MATMUL = case_by_name("matmul")


def _loops(options: tc.MappingOptions, **sizes: int) -> str:
    fn = tc.define(MATMUL.source, target="cpu")
    inputs = MATMUL.make_inputs(np.random.default_rng(0), **sizes)
    return fn.compile(*inputs, options=options).loops


def test_cpu_pipeline_has_the_cpu_passes():
    assert _BASE.to_pipeline("cpu").endswith("mark-parallel,vectorize")
    assert _BASE.unroll(4).to_pipeline("cpu").endswith("vectorize,unroll{factor=4}")
    assert "vectorize" not in _BASE.to_pipeline("cuda")


def test_vectorize_puts_the_unit_stride_member_innermost():
    # untiled matmul: the schedule's m, n, k becomes m, k, n (n walks C and B contiguously)
    loops = _loops(_BASE.tile(0), M=4, K=40, N=6)  # k spans more than 32: moved out
    innermost = [line for line in loops.splitlines() if "S0(" in line]
    assert innermost, loops
    assert all(re.fullmatch(r"S0\(c0, c2, (c1|0)\);", line.strip()) for line in innermost), loops


def test_vectorize_keeps_a_short_innermost_point_loop():
    # tiled 32: the k point loop (32 values) stays innermost for LLVM to unroll
    loops = _loops(_BASE.tile(32, 32, 32), M=64, K=64, N=64)
    assert "S0(32 * c0 + c3, 32 * c1 + c4, 32 * c2 + c5)" in loops, loops


def test_unroll_leaves_no_innermost_loop():
    plain = _loops(_BASE.tile(0), M=8, K=9, N=12)
    unrolled = _loops(_BASE.tile(0).unroll(4), M=8, K=9, N=12)
    assert unrolled.count("S0(") == 4 * plain.count("S0("), unrolled
    assert unrolled.count("for (") == plain.count("for ("), unrolled  # a strip loop per loop


@pytest.mark.parametrize("factor", [1, 2, 4, 7])
def test_unroll_factors_agree_with_the_oracle(factor, rng):
    case = case_by_name("softmax_outputs")
    inputs = case.make_inputs(rng, **case.sizes[-1])
    assert_case_matches(_define(case.source, case.entry, "cpu"), inputs, case.expected(*inputs),
                        full_write=case.full_write, rtol=case.rtol,
                        options=_BASE.tile(3, 3).unroll(factor), context=f"unroll {factor}")


def test_small_calls_run_on_the_calling_thread():
    """Below SERIAL_INSTANCES a cached host call runs as one chunk (no thread-pool hand-off);
    above it the parallel loop is cut into `CHUNKS_PER_THREAD` chunks per thread."""
    import numpy as np

    from tcmlir.runtime.host import CHUNKS_PER_THREAD
    from tcmlir.runtime.host_plan import SERIAL_INSTANCES, host_plan

    fn = tc.define("def add(float(N) x, float(N) y) -> (z) { z(i) = x(i) + y(i) }", target="cpu")
    small, big = 1024, 4 * SERIAL_INSTANCES
    for n, serial in ((small, True), (big, False)):
        x = np.arange(n, dtype=np.float32)
        np.testing.assert_array_equal(fn(x, x), 2 * x)
        kernel = fn.compile(x, x, options=tc.MappingOptions.naive().with_threads(2))
        plan = host_plan(kernel.runner, fn.ir, {"N": n})
        chunks = [len(c) for _, c in plan._groups]
        assert (chunks == [1]) if serial else max(chunks) == 2 * CHUNKS_PER_THREAD, (n, chunks)


def _timed_plan(monkeypatch, seconds):
    """An add's plan above SERIAL_INSTANCES whose calls take ``seconds(plan, call_index)``
    by a fake clock."""
    import types

    import numpy as np

    import tcmlir.runtime.host_plan as hp

    fn = tc.define("def add(float(N) x, float(N) y) -> (z) { z(i) = x(i) + y(i) }", target="cpu")
    n = 4 * hp.SERIAL_INSTANCES
    x = np.arange(n, dtype=np.float32)
    kernel = fn.compile(x, x, options=tc.MappingOptions.naive().with_threads(2))
    plan = hp.host_plan(kernel.runner, fn.ir, {"N": n})
    assert not plan.split and plan._times is not None
    clock, ticks = [0.0], [0]

    def perf_counter():  # called twice per call: the second tick closes the call
        ticks[0] += 1
        clock[0] += seconds(plan, (ticks[0] - 1) // 2) if ticks[0] % 2 == 0 else 0.0
        return clock[0]

    monkeypatch.setattr(hp, "time", types.SimpleNamespace(perf_counter=perf_counter))

    def calls(count):
        modes = []
        for _ in range(count):
            modes.append(plan.split)
            np.testing.assert_array_equal(plan.call((x, x)), 2 * x)
        return modes

    return hp, calls


@pytest.mark.parametrize("split_faster", [True, False])
def test_a_plan_splits_its_loops_only_where_measured_faster(monkeypatch, split_faster):
    """Above SERIAL_INSTANCES a plan times unsplit and split calls (PROBE_CALLS of each, in
    ABBA order), then runs the faster way, and looks at the other way again once the calls since took
    EXPLORE_FIRST times its time (then twice as long); results are the same either way."""
    import tcmlir.runtime.host_plan as hp

    monkeypatch.setattr(hp, "EXPLORE_FIRST", 2)
    hp, calls = _timed_plan(monkeypatch, lambda plan, i: 0.25 if plan.split == split_faster
                            else 0.5)
    c = split_faster
    modes = calls(2 * hp.PROBE_CALLS + 18)
    assert modes[: 2 * hp.PROBE_CALLS] == [False, True, True, False] * (hp.PROBE_CALLS // 2)
    # the chosen way until its calls took more than 2 x 0.5 s (5 calls of 0.25 s; 4 when the
    # last measuring call already ran that way), then one look at the other way
    after = modes[2 * hp.PROBE_CALLS:]
    first = after.index(not c)
    assert set(after[:first]) == {c} and first == (5 if c else 4)
    # the look confirmed the choice: the next one after twice as long (9 calls of 0.25 s > 2 s)
    looks = [i for i, mode in enumerate(after) if mode != c]
    assert looks == [first, first + 10]


def test_a_choice_made_while_the_machine_was_busy_is_revisited(monkeypatch):
    """Split calls slow while the plan first measures (another library's threads on the
    cores), fast afterwards: the next look at the split way finds it and switches."""
    import tcmlir.runtime.host_plan as hp

    monkeypatch.setattr(hp, "EXPLORE_FIRST", 2)
    hp, calls = _timed_plan(monkeypatch, lambda plan, i: 0.25 if not plan.split
                            else 0.5 if i < 2 * hp.PROBE_CALLS else 0.1)
    modes = calls(2 * hp.PROBE_CALLS + 8)
    after = modes[2 * hp.PROBE_CALLS:]
    look = after.index(True)  # the look at the split way, after 1 s of unsplit calls
    assert look == 4 and after[look:] == [True] * (len(after) - look)  # kept: now faster
