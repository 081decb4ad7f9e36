"""tcmlir ops on DTensors (`tcmlir.torch.dtensor`, `tcmlir.multi.axes`).

The axes isl proves or refuses are checked here without a process group; the torch.distributed
jobs (gloo, CPU, 2 and 4 ranks, started as subprocesses with a timeout) run
tests/dtensor_job.py: tcmlir ops on DTensors sharded along parallel and reduction dimensions,
forward and backward, equal to the same ops on plain tensors, with the placements DTensor chose.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():
    pytest.skip("this torch has no torch.distributed", allow_module_level=True)

import tcmlir as tc  # noqa: E402
from tcmlir.multi.axes import chunk_bounds, prove_axis, shard_axes  # noqa: E402
from tcmlir.torch.dtensor import strategies  # noqa: E402

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
SOFTMAX = """def softmax(float(N, D) I) -> (O) {
    mx(n) max=! I(n, d)
    e(n, d) = exp(I(n, d) - mx(n))
    s(n) +=! e(n, d)
    O(n, d) = e(n, d) / s(n)
}"""


def by_inputs(source, shapes, ranks):
    fn = tc.define(source, target="cpu")
    return {s.inputs: s for s in strategies(fn.ir, shapes, ranks)}


def test_matmul_axes_parallel_and_reduction():
    got = by_inputs(MM, [(10, 7), (7, 10)], 4)
    assert got[("Shard(0)", "Replicate()")].outputs == ("Shard(0)",)
    assert got[("Replicate()", "Shard(1)")].outputs == ("Shard(1)",)
    assert got[("Shard(1)", "Shard(0)")].outputs == ("Partial(sum)",)
    assert all(s.reason is None for s in got.values())


@pytest.mark.parametrize("op, partial", [("+=!", "sum"), ("max=!", "max"), ("min=!", "min"),
                                         ("*=!", "product")])
def test_reduction_ops_give_their_partial(op, partial):
    got = by_inputs(f"def r(float(N,D) X) -> (m) {{ m(n) {op} X(n,d) }}", [(4, 6)], 2)
    assert got[("Shard(1)",)].outputs == (f"Partial({partial})",)
    assert got[("Shard(1)",)].reason is None


def test_softmax_rows_proved_reduced_dimension_refused():
    got = by_inputs(SOFTMAX, [(6, 8)], 2)
    assert got[("Shard(0)",)].reason is None and got[("Shard(0)",)].outputs == ("Shard(0)",)
    assert "mx" in got[("Shard(1)",)].reason   # the row max is read before it is combined


def test_stencil_refused_neighbour_chunk():
    (st,) = strategies(tc.define("def st(float(N) A) -> (O) { O(i) = A(i) + A(i+1) }",
                                 target="cpu").ir, [(9,)], 2)
    assert "neighbour" in st.reason


@pytest.mark.parametrize("source, needle", [
    ("def io(float(N) A) -> (O) { O(i) = A(i) + i }", "axis index i as a value"),
    ("def sz(float(N) A) -> (O) { O(i) = A(i) * N }", "size N as a value"),
    ("def rv(float(N) A) -> (O) { O(i) = A(N - 1 - i) }", "not on the axis"),
])
def test_values_that_change_per_rank_are_refused(source, needle):
    fn = tc.define(source, target="cpu").ir
    reasons = [prove_axis(fn, ax, [(8,)], 2) for ax in shard_axes(fn)]
    assert reasons and all(r is not None for r in reasons)
    assert any(needle in r for r in reasons), reasons


def test_empty_chunk_refused_and_chunks_are_torch_chunks():
    for n, ranks in [(10, 4), (6, 4), (7, 3), (1, 2)]:
        want = [len(c) for c in torch.arange(n).chunk(ranks)]
        got = [hi - lo for lo, hi in chunk_bounds(n, ranks)]
        assert got[:len(want)] == want and not any(got[len(want):])
    got = by_inputs(MM, [(6, 7), (7, 5)], 4)  # 6 rows over 4 ranks: 2, 2, 2, 0
    assert "without a chunk" in got[("Shard(0)", "Replicate()")].reason


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(world: int, tmp_path, *checks: str) -> list[str]:
    out = tmp_path / f"dtensor-{world}.txt"

    def run() -> subprocess.CompletedProcess:
        cmd = [sys.executable, os.path.join(TESTS_DIR, "dtensor_job.py"), str(world),
               str(free_port()), str(out), *checks]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=240)

    def aborted(p: subprocess.CompletedProcess) -> bool:
        return p.returncode != 0 and "terminated with signal SIGABRT" in p.stderr \
            and "terminate called without an active exception" in p.stderr

    # a rank of the gloo job sometimes aborts in C++ ("terminate called without an active
    # exception", no Python error): once in a CI run of the eleventh session, twice in a row in
    # one of the twelfth (a loaded 2-core runner), never in 8 reruns alone or beside a CPU
    # burner. Three aborts in a row fail the test with their outputs (a crash that repeats is
    # a bug to find)
    proc, seen = run(), []
    while aborted(proc) and len(seen) < 2:
        seen.append(proc.stderr[-1500:])
        proc = run()
    assert proc.returncode == 0, "\n---\n".join([*seen, proc.stderr[-3000:]])
    lines = out.read_text().splitlines()
    bad = [x for x in lines if " FAIL " in x]
    assert not bad, "\n".join(bad)
    return lines


def test_two_ranks(tmp_path):
    lines = run_job(2, tmp_path)
    assert len(lines) == 8   # setup and every check


def test_four_ranks(tmp_path):
    # a parallel and the reduction dimension sharded (uneven chunks: 10 rows, 7 = 2+2+2+1),
    # forward and backward, and a stencil DTensor must gather; the other checks run at 2
    # ranks (starting the processes dominates the time)
    lines = run_job(4, tmp_path, "matmul_rows", "matmul_reduction", "stencil_redistributed")
    assert len(lines) == 4
