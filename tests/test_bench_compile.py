"""tools/bench_compile.py (issue 31): the compile-time benchmark runs, and its stages are the
pipeline's (`tcmlir.log.stage_times`), which add up to no more than the compile."""

from __future__ import annotations

import json
import os
import sys
import time

from tcmlir.log import stage_times, timed

TOOLS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools")
if TOOLS not in sys.path:
    sys.path.insert(0, TOOLS)


def test_the_tool_reports_each_stage_of_a_tiny_cuda_compile(capsys):
    import bench_compile

    assert bench_compile.main(["--tiny", "--json"]) == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["case"] == "add 64"
    for stage in ("scop", "schedule", "isl AST", "LLVM IR", "LLVM opt", "PTX"):
        assert row["stages"][stage] > 0, stage
    assert sum(row["stages"].values()) <= row["total"]
    assert bench_compile.main(["--tiny"]) == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0].split()[:3] == ["case", "total", "load"]
    assert table.splitlines()[1].startswith("add 64")
    assert bench_compile.main(["--tiny", "--tuner", "2", "--limit", "60", "--json"]) == 0
    rate = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rate["candidates"] == 2 and rate["per_minute"] > 0
    assert rate["failed"] == rate["timed_out"] == 0


def test_nested_stages_are_exclusive_and_every_collector_sees_them():
    with stage_times() as outer:
        with stage_times() as inner:
            with timed("isl AST"):
                with timed("access expressions"):
                    time.sleep(0.05)
    assert set(outer) == set(inner) == {"isl AST", "access expressions"}
    assert outer == inner
    assert inner["access expressions"] >= 0.05 > inner["isl AST"]  # not counted twice
    with stage_times() as alone:  # a stage outside any open one: its whole time
        with timed("PTX"):
            pass
    assert list(alone) == ["PTX"]


def test_the_tool_leaves_the_process_cached():
    """Running the tool in-process (as the test above does) must not leave
    TCMLIR_ALWAYS_COMPILE set: every later compile of the test session then missed the kernel
    caches (43 tests of the full suite failed after this file)."""
    import bench_compile

    before = os.environ.get("TCMLIR_ALWAYS_COMPILE")
    assert bench_compile.main(["--tiny", "--json"]) == 0
    assert os.environ.get("TCMLIR_ALWAYS_COMPILE") == before
