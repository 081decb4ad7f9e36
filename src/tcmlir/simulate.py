"""A CUDA machine without a GPU: run a GPU-mapped schedule's isl AST thread by thread.

`simulate_cuda(state, arrays)` executes what the NVPTX backend would launch: every kernel
mark of the (annotated) isl AST, every block of its grid and every thread of its block, with
the block/thread parameters bound, promoted accesses going to per-block shared buffers and
per-thread register buffers, copy statements and barriers (``sync_*``) as the code generator
lowers them. Threads of a block run as coroutines that stop at each barrier; the simulator
checks what CUDA leaves undefined and the promotion passes must rule out:

* every thread of a block reaches the same barriers (no barrier under a thread-dependent
  branch);
* no shared-memory slot is written by one thread and read or written by another between two
  barriers (a race);
* no shared or register slot is read before it is written (an unwritten value), and every
  access stays inside its buffer.

Statement bodies are evaluated with the reference interpreter's expression evaluator on single
instances, so results compare with `tcmlir.reference`. A ``reduction S<k> threads=B`` mark
(`map-reduction`) runs as the code generator lowers it: each thread folds its instances into a
private accumulator, then the block combines them and thread 0 updates the element (the
threads must agree on which one). Blocks run one after the other. It is slow (pure Python, one
instance at a time): meant for tests on small sizes and tiles, the way a NULL device tests code
generation without hardware.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator, Mapping
from typing import Any

import islpy as isl
import numpy as np

from . import ir
from .poly.loops import annotation_of, build_ast
from .poly.node_accesses import CopyAccess
from .poly.promotion import COPY_STMT, SYNC_STMT
from .reference import _Eval

__all__ = ["SimulationError", "simulate_cuda"]

_T = isl.ast_expr_op_type
_STMT = re.compile(r"^S(\d+)(_init)?$")
_REDUCTION_MARK = re.compile(r"^reduction S(\d+) threads=(\d+)( atomic)?$")
_NODE = isl.ast_node_type


class SimulationError(AssertionError):
    """The simulated kernel did something CUDA leaves undefined (a race, a divergent barrier,
    an unwritten or out-of-box buffer read)."""


def _c_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _expr(e: isl.AstExpr, env: Mapping[str, int]) -> int:
    kind = e.get_type()
    if kind == isl.ast_expr_type.int:
        return int(e.get_val().to_python())
    if kind == isl.ast_expr_type.id:
        return env[e.get_id().get_name()]
    op = e.get_op_type()
    args = [_expr(e.get_op_arg(i), env) for i in range(e.get_op_n_arg())]
    if op == _T.add:
        return args[0] + args[1]
    if op == _T.sub:
        return args[0] - args[1]
    if op == _T.mul:
        return args[0] * args[1]
    if op == _T.minus:
        return -args[0]
    if op in (_T.div, _T.pdiv_q):
        return _c_div(args[0], args[1])
    if op == _T.fdiv_q:
        return args[0] // args[1]
    if op in (_T.pdiv_r, _T.zdiv_r):
        return args[0] - _c_div(args[0], args[1]) * args[1]
    if op == _T.min:
        return min(args)
    if op == _T.max:
        return max(args)
    if op in (_T.select, _T.cond):
        return args[1] if args[0] else args[2]
    if op in (_T.and_, _T.and_then):
        return int(bool(args[0]) and bool(args[1]))
    if op in (_T.or_, _T.or_else):
        return int(bool(args[0]) or bool(args[1]))
    cmp = {_T.eq: lambda a, b: a == b, _T.le: lambda a, b: a <= b, _T.lt: lambda a, b: a < b,
           _T.ge: lambda a, b: a >= b, _T.gt: lambda a, b: a > b}
    if op in cmp:
        return int(cmp[op](args[0], args[1]))
    raise NotImplementedError(f"isl AST operation {op} in {e.to_C_str()}")


class _Buffer:
    """One shared (per block) or private (per thread) buffer: values and written flags."""

    def __init__(self, buf: Any, dtype: np.dtype):
        self.buf = buf
        self.values = np.zeros(buf.slots, dtype=dtype)
        self.written = np.zeros(buf.slots, dtype=bool)
        self.strides = buf.strides()

    def slot(self, local: list[int]) -> int:
        coords = local[1:] if self.buf.stages > 1 else local
        if self.buf.stages > 1 and not 0 <= local[0] < self.buf.stages:
            raise SimulationError(f"buffer {self.buf.name}: stage {local[0]} of {self.buf.stages}")
        for d, (v, extent) in enumerate(zip(coords, self.buf.box.extent, strict=True)):
            if not 0 <= v < extent:
                raise SimulationError(f"buffer {self.buf.name}: index {local} outside the box "
                                      f"{self.buf.box.extent} (dimension {d})")
        return int(self.buf.flat_offset(local))


class _Phase:
    """Shared-memory accesses of one block between two barriers: slot -> (writers, readers)."""

    def __init__(self) -> None:
        self.writers: dict[tuple[str, int], set[int]] = {}
        self.readers: dict[tuple[str, int], set[int]] = {}

    def access(self, name: str, slot: int, thread: int, write: bool) -> None:
        key = (name, slot)
        writers = self.writers.get(key, set())
        if write:
            others = (writers | self.readers.get(key, set())) - {thread}
            if others:
                raise SimulationError(f"race on shared {name}[{slot}]: written by thread {thread}, "
                                      f"also used by thread(s) {sorted(others)[:4]} before a barrier")
            self.writers.setdefault(key, set()).add(thread)
        else:
            if writers - {thread}:
                raise SimulationError(f"race on shared {name}[{slot}]: read by thread {thread}, "
                                      f"written by thread(s) {sorted(writers - {thread})[:4]} "
                                      "before a barrier")
            self.readers.setdefault(key, set()).add(thread)


class _Thread:
    """One thread of one block: walks the kernel's AST as a generator that yields at barriers."""

    def __init__(self, sim: _Kernel, env: dict[str, int], tid: int):
        self.sim, self.env, self.tid = sim, env, tid
        self.private: dict[str, _Buffer] = {}
        self.reduction: list | None = None  # [statement, accumulator, lhs element] under a mark

    def guarded(self, node: isl.AstNode, guards: tuple) -> Iterator[None]:
        """The kernel under the ``if`` conditions isl put above its mark (as the code generator
        does, evaluated by each thread: they may name thread indices)."""
        for cond, taken in guards:
            if bool(_expr(cond, self.env)) != taken:
                return
        yield from self.run(node)

    def run(self, node: isl.AstNode, rows: bool = False) -> Iterator[None]:
        """Run ``node``; with ``rows``, it lies below a ``rows`` mark and above its row body
        (the row loop, a uniform guard): the first other node is the body."""
        kind = node.get_type()
        if rows and kind not in (_NODE.for_, _NODE.if_):
            yield from self.row_body(node)
        elif rows and kind == _NODE.for_:
            name = node.for_get_iterator().get_id().get_name()
            self.env[name] = _expr(node.for_get_init(), self.env)
            while _expr(node.for_get_cond(), self.env):
                yield from self.run(node.for_get_body(), rows)
                self.env[name] += _expr(node.for_get_inc(), self.env)
        elif rows:
            if _expr(node.if_get_cond(), self.env):
                yield from self.run(node.if_get_then_node(), rows)
            elif node.if_has_else_node():
                yield from self.run(node.if_get_else_node(), rows)
        elif kind == _NODE.block:
            kids = node.block_get_children()
            for i in range(kids.n_ast_node()):
                yield from self.run(kids.get_at(i))
        elif kind == _NODE.for_:
            name = node.for_get_iterator().get_id().get_name()
            self.env[name] = _expr(node.for_get_init(), self.env)
            while _expr(node.for_get_cond(), self.env):
                yield from self.run(node.for_get_body())
                self.env[name] += _expr(node.for_get_inc(), self.env)
        elif kind == _NODE.if_:
            if _expr(node.if_get_cond(), self.env):
                yield from self.run(node.if_get_then_node())
            elif node.if_has_else_node():
                yield from self.run(node.if_get_else_node())
        elif kind == _NODE.mark:
            name = node.mark_get_id().get_name()
            red = _REDUCTION_MARK.match(name)
            if red is None:
                yield from self.run(node.mark_get_node(), name.startswith("rows threads="))
                return
            if self.reduction is not None:
                raise SimulationError(f"reduction mark {name!r} inside another one")
            k = int(red.group(1))
            st = self.sim.fn.statements[k]
            dt = self.sim.fn.tensor(st.tensor).dtype.compute
            self.reduction = [k, np.asarray(st.reduction.identity(dt), dtype=dt.numpy), None]
            yield from self.run(node.mark_get_node())
            _, acc, where = self.reduction
            self.reduction = None
            yield ("reduce", k, acc, where)  # the block combine (warp shuffles, barriers)
        elif kind == _NODE.user:
            call = node.user_get_expr()
            name = call.get_op_arg(0).get_id().get_name()
            if SYNC_STMT.match(name):
                if not name.startswith("commit_"):  # a barrier (after waiting for copies)
                    yield None
                return
            args = [_expr(call.get_op_arg(i), self.env) for i in range(1, call.get_op_n_arg())]
            payload = annotation_of(node)
            if COPY_STMT.match(name):
                self.copy(payload)
            else:
                self.statement(name, args, payload or {})
        else:
            raise NotImplementedError(f"isl AST node {kind}")

    def row_body(self, node: isl.AstNode) -> Iterator[None]:
        """A row body's phases with the block barriers `codegen.gpu_rows` puts between them."""
        from .codegen.gpu_rows import barrier_after, flat_phases, phase_statements

        phases = flat_phases(node)
        touched = [phase_statements(p) for p in phases]
        for i, phase in enumerate(phases):
            yield from self.run(phase)
            if barrier_after(phases, touched, i):
                yield None

    # ---- buffers

    def buffer(self, name: str) -> _Buffer:
        buf = self.sim.promotion.buffer(name)
        if buf.space == "shared":
            return self.sim.shared[name]
        if name not in self.private:
            self.private[name] = _Buffer(buf, self.sim.arrays[buf.tensor].dtype)
        return self.private[name]

    def read_slot(self, name: str, local: list[int]) -> Any:
        b = self.buffer(name)
        slot = b.slot(local)
        if not b.written[slot]:
            raise SimulationError(f"thread {self.tid} reads {name}[{local}] before anything "
                                  "wrote it")
        if b.buf.space == "shared":
            self.sim.phase.access(name, slot, self.tid, write=False)
        return b.values[slot]

    def write_slot(self, name: str, local: list[int], value: Any) -> None:
        b = self.buffer(name)
        slot = b.slot(local)
        if b.buf.space == "shared":
            self.sim.phase.access(name, slot, self.tid, write=True)
        b.values[slot] = value
        b.written[slot] = True

    def copy(self, payload: CopyAccess) -> None:
        buf = self.sim.promotion.buffer(payload.buffer)
        tensor = self.sim.arrays[buf.tensor]
        g = tuple(_expr(e, self.env) for e in payload.global_index)
        local = [_expr(e, self.env) for e in payload.local_index]
        if payload.kind == "init":
            st = self.sim.fn.statements[buf.fill]
            dt = self.sim.fn.tensor(st.tensor).dtype
            value = np.asarray(st.reduction.identity(dt.compute)).astype(dt.compute.numpy)
            self.write_slot(buf.name, local, value.astype(tensor.dtype))
        elif payload.kind in ("in", "next"):  # cp.async copies complete before the next wait
            self.write_slot(buf.name, local, tensor[g])
        elif payload.kind in ("vin", "vnext"):  # copy_lanes elements from an aligned leader
            lanes = buf.copy_lanes
            if (int(np.ravel_multi_index(g, tensor.shape)) % lanes
                    or (not buf.copy_scatter and buf.flat_offset(local) % lanes)):
                raise SimulationError(f"thread {self.tid}: vector copy of {buf.name} from "
                                      f"{buf.tensor}{list(g)} to {local} is not {lanes}-aligned")
            for j in range(lanes):
                self.write_slot(buf.name, [*local[:-1], local[-1] + j],
                                tensor[(*g[:-1], g[-1] + j)])
        else:
            tensor[g] = self.read_slot(buf.name, local)

    # ---- statements

    def statement(self, name: str, args: list[int], redirects: dict) -> None:
        m = _STMT.match(name)
        assert m, name
        fn = self.sim.fn
        st = fn.statements[int(m.group(1))]
        init = m.group(2) is not None
        dims = st.lhs if init else st.index_names
        env = {d: np.asarray(v, dtype=np.int64) for d, v in zip(dims, args, strict=True)}
        tensor = self.sim.arrays[st.tensor]
        dtype = fn.tensor(st.tensor).dtype
        comp = dtype.compute.numpy
        where = tuple(args[dims.index(n)] for n in st.lhs)
        lhs = redirects.get("lhs")

        def load() -> Any:
            if lhs is not None:
                return self.read_slot(lhs[0], [_expr(e, self.env) for e in lhs[1]])
            return tensor[where]

        def store(value: Any) -> None:
            value = np.asarray(value).astype(comp).astype(tensor.dtype)
            if lhs is not None:
                self.write_slot(lhs[0], [_expr(e, self.env) for e in lhs[1]], value)
            else:
                tensor[where] = value

        if init:
            store(st.reduction.identity(dtype.compute))
            return
        value = _Redirected(self, redirects, fn, self.sim.arrays, self.sim.sizes, env).value(st.rhs)
        if self.reduction is not None and self.reduction[0] == int(m.group(1)):
            if self.reduction[2] not in (None, where):
                raise SimulationError(f"S{m.group(1)} under its reduction mark writes two "
                                      f"elements in one thread: {self.reduction[2]} and {where}")
            self.reduction[1] = _COMBINE[st.reduction](self.reduction[1], np.asarray(value).astype(comp))
            self.reduction[2] = where
            return
        if st.reduction is not None:
            old = np.asarray(load()).astype(comp)
            value = _COMBINE[st.reduction](old, np.asarray(value).astype(comp))
        store(value)


_COMBINE = {ir.Reduction.ADD: np.add, ir.Reduction.MUL: np.multiply,
            ir.Reduction.MIN: np.fmin, ir.Reduction.MAX: np.fmax}


class _Redirected(_Eval):
    """The reference evaluator with promoted reads served from the simulated buffers."""

    def __init__(self, thread: _Thread, redirects: dict, *args: Any):
        super().__init__(*args)
        self.thread, self.redirects = thread, redirects

    def _read(self, e: ir.Read) -> np.ndarray:
        hit = self.redirects.get(e)
        if hit is None:
            return super()._read(e)
        if self.mask is not None and not np.any(self.mask):  # the untaken arm of `?:`: the
            return np.zeros((), dtype=self.arrays[e.tensor].dtype)  # kernel does not load it
        return np.asarray(self.thread.read_slot(hit[0], [_expr(x, self.thread.env) for x in hit[1]]))


class _Kernel:
    def __init__(self, fn: ir.Function, promotion: Any, arrays: dict[str, np.ndarray],
                 sizes: Mapping[str, int]):
        self.fn, self.promotion, self.arrays, self.sizes = fn, promotion, arrays, sizes
        self.shared: dict[str, _Buffer] = {}
        self.phase = _Phase()

    def run_block(self, node: isl.AstNode, guards: tuple, grid_env: dict[str, int],
                  block: tuple[int, int, int], k: int) -> None:
        self.shared = {b.name: _Buffer(b, self.arrays[b.tensor].dtype)
                       for b in (self.promotion.buffers if self.promotion else ())
                       if b.space == "shared" and b.kernel == k}
        self.phase = _Phase()
        threads = []
        for tz, ty, tx in itertools.product(range(block[2]), range(block[1]), range(block[0])):
            env = dict(grid_env, _tx=tx, _ty=ty, _tz=tz)
            tid = tx + block[0] * (ty + block[1] * tz)
            t = _Thread(self, env, tid)
            threads.append((tid, t.guarded(node, guards)))
        live = threads
        while live:
            waiting, done, events = [], [], []
            for tid, gen in live:
                try:
                    events.append(next(gen))
                    waiting.append((tid, gen))
                except StopIteration:
                    done.append(tid)
            if waiting and done:
                raise SimulationError(f"threads {done[:4]} finished while threads "
                                      f"{[t for t, _ in waiting][:4]} wait at a barrier "
                                      f"(block {grid_env})")
            kinds = {e if e is None else e[:2] for e in events}
            if len(kinds) > 1:
                raise SimulationError(f"threads of block {grid_env} wait at different barriers: "
                                      f"{sorted(map(str, kinds))}")
            if events and events[0] is not None:
                self.combine(events)
            self.phase = _Phase()
            live = waiting


    def combine(self, events: list) -> None:
        """A reduction mark's block combine: fold every thread's accumulator (thread order),
        then thread 0 does ``lhs = op(lhs, total)`` when some thread ran an instance."""
        k = events[0][1]
        st = self.fn.statements[k]
        dtype = self.fn.tensor(st.tensor).dtype
        comp = dtype.compute.numpy
        op = _COMBINE[st.reduction]
        wheres = {e[3] for e in events if e[3] is not None}
        if len(wheres) > 1:
            raise SimulationError(f"reduction of S{k}: the threads of one block write different "
                                  f"elements {sorted(wheres)[:3]}")
        if not wheres:
            return
        total = np.asarray(st.reduction.identity(dtype.compute), dtype=comp)
        for e in events:
            total = op(total, e[2])
        tensor = self.arrays[st.tensor]
        where = wheres.pop()
        tensor[where] = np.asarray(op(np.asarray(tensor[where]).astype(comp), total)).astype(tensor.dtype)


def simulate_cuda(state: Any, arrays: dict[str, np.ndarray], sizes: Mapping[str, int]) -> None:
    """Run the GPU-mapped ``state`` on ``arrays`` (every tensor of the function by name, outputs
    and temporaries included, modified in place) for ``sizes``; raises `SimulationError` on
    undefined behaviour (see the module docstring)."""
    from .codegen.nvptx_abi import find_kernels, parse_kernel_mark

    ast = build_ast(state)
    env0 = {name: int(v) for name, v in sizes.items()}
    for k, (mark, node, guards) in enumerate(find_kernels(ast)):
        grid, block = parse_kernel_mark(mark)  # type: ignore[misc]
        sim = _Kernel(state.fn, getattr(state, "promotion", None), arrays, env0)
        for bz, by, bx in itertools.product(range(grid[2]), range(grid[1]), range(grid[0])):
            sim.run_block(node, guards, dict(env0, _bx=bx, _by=by, _bz=bz), block, k)


def simulate_call(fn: ir.Function, inputs: list[np.ndarray], options: Any) -> tuple[np.ndarray, ...]:
    """Compile ``fn`` for cuda with ``options`` (no GPU needed), bind ``inputs`` as a call would
    and run it on the simulator. Fresh outputs and temporaries start at zero where the
    language needs it and hold NaN (or a sentinel) where the first statement writes every
    element, as the runtime leaves them unwritten there. Returns the outputs in ``->`` order."""
    from .binding import bind_sizes, needs_zero_fill
    from .compiler import lower

    sizes = bind_sizes(fn, [np.shape(x) for x in inputs])
    state = lower(fn, sizes, options, "cuda")
    arrays: dict[str, np.ndarray] = {}
    for t, x in zip(fn.inputs, inputs, strict=True):
        arrays[t.name] = np.array(x, dtype=t.dtype.numpy)
    for t in state.fn.tensors:  # the compiled function's: IR passes (split-k) add temporaries
        if t.name in arrays:
            continue
        shape = tuple(e.evaluate(sizes) for e in t.shape)
        arr = np.zeros(shape, dtype=t.dtype.numpy)
        if not needs_zero_fill(state.fn, t, sizes):
            arr.fill(np.nan if t.dtype.is_float else 0x5A)
        arrays[t.name] = arr
    simulate_cuda(state, arrays, sizes)
    return tuple(arrays[t.name] for t in fn.outputs)
