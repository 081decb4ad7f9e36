"""The static cliff check (tools/cliffs.py): on PTX compiles (no GPU), it finds planted cliffs
(a grid of one block for large work, a thread that walks a whole reduction alone), leaves a
well-mapped kernel alone, and prints the zoo's current cliffs without failing on them (they
are the project's known gaps, issue 30)."""

from __future__ import annotations

import dataclasses
import os
import sys

import numpy as np
import pytest

pytest.importorskip("torch")

TOOLS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools")
if TOOLS not in sys.path:
    sys.path.insert(0, TOOLS)

import cliffs  # noqa: E402
import zoo_workloads as zw  # noqa: E402

import tcmlir as tc  # noqa: E402

ELEMENTWISE = "def scale2(float(N,D) X) -> (O) { O(n,d) = X(n,d) * 2 + 1 }"
ROW_SUM = "def rows(float(N,D) X) -> (S) { S(n) +=! X(n,d) }"


def compiled(source: str, shape: tuple[int, ...], options=None):
    x = np.zeros(shape, np.float32)
    return tc.define(source).compile(x, target="cuda", arch="sm_90", options=options)


def test_a_grid_of_one_block_on_large_elementwise_work_is_found():
    kernel = compiled(ELEMENTWISE, (4096, 1024), dataclasses.replace(tc.MappingOptions.naive(), grid=(1, 1)))
    work = cliffs.kernel_work(kernel)
    assert [(k.grid, k.instances, k.outputs) for k in work] == [((1, 1, 1), 4096 * 1024, 4096 * 1024)]
    found = cliffs.find_cliffs("planted", work)
    assert {c.kind for c in found} == {"few-blocks", "serial"}
    serial = next(c for c in found if c.kind == "serial")
    assert "a mapping with" in serial.detail and "the threads exists" in serial.detail


def test_the_same_program_on_a_full_grid_is_not_a_cliff():
    kernel = compiled(ELEMENTWISE, (4096, 1024), tc.MappingOptions.naive())
    work = cliffs.kernel_work(kernel)
    assert work[0].blocks >= 132 and work[0].per_thread <= 64
    assert cliffs.find_cliffs("control", work) == []


def test_a_thread_that_walks_a_whole_long_reduction_is_found():
    # four rows of 2^20: the naive mapping gives each row one thread, which reduces it alone
    kernel = compiled(ROW_SUM, (4, 1 << 20), tc.MappingOptions.naive())
    work = cliffs.kernel_work(kernel)
    assert sum(k.instances for k in work) == 4 * (1 << 20) + 4   # the updates and the inits
    found = cliffs.find_cliffs("planted", work)
    serial = [c for c in found if c.kind == "serial"]
    assert serial and "split reduction" in serial[0].detail
    assert any(c.kind == "few-blocks" for c in found)


def test_limits_decide_what_counts():
    k = cliffs.KernelWork("k", (8, 1, 1), (256, 1, 1), ("S0",), instances=50_000_000, outputs=1 << 20)
    assert {c.kind for c in cliffs.find_cliffs("w", [k])} == {"few-blocks", "serial"}
    assert {c.kind for c in cliffs.find_cliffs("w", [k], sms=16)} == {"serial"}  # 8 blocks fill 16 SMs/2
    assert cliffs.find_cliffs("w", [k], big_work=10**9, serial_limit=10**6) == []
    # a matmul's thread: a register tile of 32 outputs over K = 4096 on a full grid
    mm = cliffs.KernelWork("mm", (32, 32, 1), (16, 16, 1), ("S0", "S1"),
                           instances=4096 * 4096 * 4097, outputs=4096 * 4096)
    assert mm.per_thread > cliffs.SERIAL_LIMIT
    assert cliffs.find_cliffs("mm", [mm]) == []


# the worst held-out cases and two that map well, at their medium sizes
ZOO_SAMPLE = ("full_sum_where", "full_sum_scalar", "kron3_1", "perm4_heads", "mm_square",
              "softmax_1000", "grad_layernorm")


def test_report_the_zoo_s_cliffs(capsys):
    found = []
    for name in ZOO_SAMPLE:
        kernels, cl = cliffs.check_workload(zw.by_name(name), "medium")
        assert kernels and all(k.instances > 0 for k in kernels), name
        if name.startswith("grad_"):   # the derived gradient program's kernels are checked too
            assert any(k.name.startswith("grad:") for k in kernels)
        found += cl
    with capsys.disabled():
        print(f"\nzoo cliffs (medium, sm_90) among {', '.join(ZOO_SAMPLE)}:")
        for c in found:
            print(f"  {c.workload}/{c.kernel}: {c.kind}: {c.detail}")
    assert all(c.workload in ZOO_SAMPLE and c.kind in ("few-blocks", "serial") for c in found)


def test_cli_runs_and_writes_json(tmp_path, capsys):
    out = tmp_path / "cliffs.json"
    assert cliffs.main(["--only", "row_max", "--size", "tiny", "--verbose", "--json", str(out)]) == 0
    import json

    data = json.loads(out.read_text())
    assert list(data["workloads"]) == ["row_max"] and data["failed"] == []
    assert "rmax_k0" in capsys.readouterr().out
