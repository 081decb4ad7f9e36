"""A torch.distributed job (gloo, CPU) that runs tcmlir ops on DTensors; started by
tests/test_dtensor.py as ``python dtensor_job.py WORLD PORT OUT [CHECK ...]`` (default: every
check).

Each rank runs every check and the job writes ``OUT`` (one line per check, ``name ok`` or
``name FAIL why``) from rank 0 after all ranks agree. Every check compares the DTensor result
(forward and gradients) with the same tcmlir op on plain tensors and asserts the output
placements DTensor chose.
"""

from __future__ import annotations

import functools
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

MM = "def mm(double(M,K) A, double(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
ROWMAX = "def rowmax(double(N,D) X) -> (m) { m(n) max=! X(n,d) }"
SOFTMAX = """def softmax(double(N, D) I) -> (O) {
    mx(n) max=! I(n, d)
    e(n, d) = exp(I(n, d) - mx(n))
    s(n) +=! e(n, d)
    O(n, d) = e(n, d) / s(n)
}"""
STENCIL = "def stencil(double(N) A) -> (O) { O(i) = A(i) + A(i + 1) }"


def _checks(world: int):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

    import tcmlir as tc
    import tcmlir.torch as tt
    from tcmlir.torch.dtensor import strategies

    mesh = init_device_mesh("cpu", (world,))

    def lazy(source, **kw):   # made on first use: a job runs only the checks it is given
        return functools.cache(lambda: tt.op(tc.define(source, target="cpu"), **kw))

    mm_op, rowmax_op = lazy(MM), lazy(ROWMAX, wrt=())
    softmax_op, stencil_op = lazy(SOFTMAX), lazy(STENCIL)

    def mm(*args):
        return mm_op()(*args)

    def softmax(*args):
        return softmax_op()(*args)

    gen = torch.Generator().manual_seed(7)   # the same data on every rank

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    def dist_(x, *placements):
        return distribute_tensor(x.detach(), mesh, list(placements)).requires_grad_()

    def close(a, b, what):
        a = a.full_tensor() if hasattr(a, "full_tensor") else a
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9, msg=what)

    def matmul(a_place, b_place, want):
        A, B = rand(10, 7).requires_grad_(), rand(7, 5).requires_grad_()
        C = mm(A, B)
        (C * C).sum().backward()
        dA, dB = dist_(A, a_place), dist_(B, b_place)
        dC = mm(dA, dB)
        assert dC.placements == (want,), dC.placements
        close(dC, C.detach(), "C")
        (dC * dC).sum().backward()
        close(dA.grad, A.grad, "A.grad")
        close(dB.grad, B.grad, "B.grad")

    def matmul_rows():            # a parallel dimension: Shard(0) in and out
        matmul(Shard(0), Replicate(), Shard(0))

    def matmul_columns():
        matmul(Replicate(), Shard(1), Shard(1))

    def matmul_reduction():       # the reduction dimension: a partial sum
        matmul(Shard(1), Shard(0), Partial("sum"))

    def row_max_reduction():      # max=! over a sharded dimension: Partial(max)
        X = rand(6, 11)
        rowmax = rowmax_op()
        dm = rowmax(distribute_tensor(X, mesh, [Shard(1)]))
        assert dm.placements == (Partial("max"),), dm.placements
        close(dm, rowmax(X), "m")

    def mlp_softmax_rows():       # matmul then softmax, rows sharded, gradients
        X, W = rand(9, 6).requires_grad_(), rand(6, 8).requires_grad_()
        g = rand(9, 8)  # the same on every rank: same seed, same order of draws
        Y = softmax(mm(X, W))
        (Y * g).sum().backward()
        dX, dW = dist_(X, Shard(0)), dist_(W, Replicate())
        dY = softmax(mm(dX, dW))
        assert dY.placements == (Shard(0),), dY.placements
        close(dY, Y.detach(), "Y")
        (dY * distribute_tensor(g, mesh, [Shard(0)])).sum().backward()
        close(dX.grad, X.grad, "X.grad")
        close(dW.grad, W.grad, "W.grad")

    def softmax_columns():        # the reduced dimension is not local: DTensor gathers it
        X = rand(5, 12)
        refused = [s for s in strategies(softmax_op().function.ir, [(5, 12)], world)
                   if s.inputs == ("Shard(1)",)]
        assert refused and refused[0].reason is not None, refused
        dY = softmax(distribute_tensor(X, mesh, [Shard(1)]))
        assert dY.placements == (Replicate(),), dY.placements
        close(dY, softmax(X), "Y")

    def stencil_redistributed():  # O(i) = A(i) + A(i+1) reads a neighbour's chunk
        stencil = stencil_op()
        A = rand(13).requires_grad_()
        out = stencil(A)
        out.sum().backward()
        (st,) = strategies(stencil.function.ir, [(13,)], world)
        assert st.reason is not None and "neighbour" in st.reason, st
        dA = dist_(A, Shard(0))
        dO = stencil(dA)
        assert dO.placements == (Replicate(),), dO.placements
        close(dO, out.detach(), "O")
        dO.sum().backward()
        close(dA.grad, A.grad, "A.grad")

    return [matmul_rows, matmul_columns, matmul_reduction, row_max_reduction,
            mlp_softmax_rows, softmax_columns, stencil_redistributed]


def _rank(rank: int, world: int, port: int, out: str, names: list[str]) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)   # several ranks share the machine's cores
    t0 = time.perf_counter()
    dist.init_process_group("gloo", rank=rank, world_size=world)
    t1 = time.perf_counter()
    checks = [c for c in _checks(world) if not names or c.__name__ in names]
    lines = [f"setup ok (init {t1 - t0:.1f} s, ops {time.perf_counter() - t1:.1f} s)"]
    for check in checks:
        try:
            t0 = time.perf_counter()
            check()
            lines.append(f"{check.__name__} ok ({time.perf_counter() - t0:.1f} s)")
        except Exception:  # noqa: BLE001  (reported to the test, with the rank)
            why = traceback.format_exc().strip().splitlines()
            lines.append(f"{check.__name__} FAIL rank {rank}: {' | '.join(why[-6:])}")
    gathered: list = [None] * world
    dist.all_gather_object(gathered, lines)
    if rank == 0:
        with open(out, "w") as f:
            for rank_lines in zip(*gathered, strict=True):
                bad = [x for x in rank_lines if " FAIL " in x]
                f.write((bad[0] if bad else max(rank_lines)) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    world, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    torch.set_num_threads(1)
    mp.spawn(_rank, args=(world, port, out, sys.argv[4:]), nprocs=world, join=True)
