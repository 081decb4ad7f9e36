"""The `map-mma` pass: a contraction as one tensor-core kernel (``mma.sync``, half operands).

Requires the tree `schedule` made and nothing mapped yet, and a function that
`poly.contraction.contraction_plan` accepts at the state's fixed sizes (one ``+=!`` product of
two float16/bfloat16 reads into float32, optionally rounded into a half output). The tree
becomes::

    mark "kernel grid=GX,GY,GZ block=T,1,1"          one launch, T = 32 * WM * WN threads
      filter  floor(n / BN) mod GX = _bx,             the block that owns each instance:
              floor(m / BM) mod GY = _by,             its output tile and batch entry, for
              batch mod GZ = _bz                      every statement (S<k>, S<k>_init, the rounding);
                                                      m, n, batch: row-major flattenings of
                                                      their index groups (`ContractionPlan`)
        mark "mma S<k> tile=BM,BN,BK warps=WM,WN stages=S grid=GX,GY,GZ"
          ... the tree as `schedule` made it

A function whose contraction reads operand copies (`contraction.operand_copies`: the padded
temporaries of `passes/pad_operands.py`) gets a kernel for those first::

    sequence
      filter  the copies                             one elementwise kernel: the innermost
        mark "kernel grid=CX,CY,1 block=256,1,1"     index i in groups of 16 bytes (L
          filter  floor(i / L) mod 256 = _tx,        elements) on threads and x blocks
                  floor(i / 256L) mod CX = _bx,      (a thread's group adjacent to the next
                  outer mod CY = _by, _bz = 0        thread's), the outer indices flattened
                                                     on y blocks
            sequence                                 the copies one after the other (what
              filter  S0                             `schedule` made of them is replaced)
                schedule  [outer, floor(i / L), i mod L]    the last unrolled: the loads of
              ...                                           a group are in flight together
      filter  the contraction's statements
        mark "kernel ..." / filter / mark "mma ..."  as above

The pass manager proves the tree legal (a sequence, filters, marks and the copies' band, which
no dependence constrains) and `check_coverage` that every instance belongs to exactly one block (and every copy to one
thread). Below the ``mma`` mark, `codegen/gpu_mma.py`
emits the block's work: its tiles in the order of the filters, the warps' fragments and the
``cp.async`` ring of ``stages`` operand tiles (see there). A function that is not such a
contraction is refused with the reason (a `PipelineError`): the tuner discards the candidate.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import islpy as isl

from ..errors import PipelineError
from ..poly.contraction import MmaMark, contraction_plan, wgmma_problem
from ..poly.gpu_mapping import BLOCK_PARAMS, KernelMark, with_params
from ..poly.scop import sets_of
from ..poly.state import CompileState
from .base import Pass, register

__all__ = ["MapMma"]

_MAX_GRID_YZ = 65535
COPY_THREADS = 256  # per block of the operand copies' kernel
COPY_BYTES = 16     # per thread and row of that kernel: adjacent elements, loads in flight


@register
@dataclass(frozen=True)
class MapMma(Pass):
    """Map a half-precision contraction onto tensor cores (see the module docstring):
    ``tile`` = BM, BN, BK; ``warps`` = warps along m and n; ``stages`` operand tiles in flight;
    ``tf32``: a float32 contraction too (mma.sync m16n8k8 in TF32)."""

    name = "map-mma"
    requires_schedule = True
    tile: tuple[int, ...] = (128, 128, 32)
    warps: tuple[int, ...] = (2, 2)
    stages: int = 3
    wgmma: bool = False
    tf32: bool = False  # float32 operands too, their products in TF32 (on request only)

    def __post_init__(self):
        if len(self.tile) != 3 or len(self.warps) != 2:
            raise ValueError(f"map-mma takes tile=BM,BN,BK and warps=WM,WN, got {self.tile}, {self.warps}")
        bm, bn, bk = self.tile
        wm, wn = self.warps
        if min(wm, wn) < 1 or bm % (16 * wm) or bn % (16 * wn) or bk % 16 or bk < 16:
            raise ValueError(f"map-mma: each warp's tile ({bm}/{wm} x {bn}/{wn}) must be a "
                             f"multiple of 16 x 16 and BK ({bk}) of 16")
        if any(x & (x - 1) for x in (*self.tile, *self.warps)):
            raise ValueError(f"map-mma: tile and warps must be powers of two, got {self.tile}, {self.warps}")
        if self.stages < 2:
            raise ValueError(f"map-mma: stages must be >= 2, got {self.stages}")
        smem = self.stages * (bm + bn) * bk * 2
        if smem > 227 * 1024:
            raise ValueError(f"map-mma: {self.stages} stages of {bm}x{bk} and {bn}x{bk} halves "
                             f"need {smem} bytes of shared memory (227 KB at most)")

    def run(self, state: CompileState) -> CompileState:
        schedule = state.schedule
        assert schedule is not None
        if "kernel grid=" in str(schedule):
            raise PipelineError("map-mma: the tree is already mapped")
        plan = contraction_plan(state.fn, state.sizes, tf32=self.tf32)
        if isinstance(plan, str):
            raise PipelineError(f"map-mma: {state.fn.name} is not a tensor-core contraction: {plan}")
        bm, bn, bk = self.tile
        tiles_m = math.ceil(plan.extent(plan.m) / bm)
        tiles_n = math.ceil(plan.extent(plan.n) / bn)
        grid = (min(tiles_n, 2**31 - 1), min(tiles_m, _MAX_GRID_YZ),
                min(plan.batch_count, _MAX_GRID_YZ))
        copies = plan.statement  # operand copies run first, in a kernel of their own
        schedule = with_params(schedule, BLOCK_PARAMS + (("_tx",) if copies else ()))
        domain = schedule.get_domain()
        params = [domain.get_space().get_dim_name(isl.dim_type.param, i)
                  for i in range(domain.get_space().dim(isl.dim_type.param))]
        def flat(indices, names: dict[str, str]) -> str:  # row-major, outermost first
            expr, inner = "0", 1
            for name in reversed(indices):
                expr = f"{names[name]} * {inner} + {expr}"
                inner *= plan.index_extent(name)
            return expr

        def cond(names: dict[str, str]) -> str:  # the plan's lhs names -> a statement's
            return (f"floor(({flat(plan.members(plan.n), names)}) / {bn}) mod {grid[0]} = _bx and "
                    f"floor(({flat(plan.members(plan.m), names)}) / {bm}) mod {grid[1]} = _by and "
                    f"({flat(plan.batch, names)}) mod {grid[2]} = _bz")

        st = state.fn.statements[plan.statement]
        same = {i: i for i in st.lhs}
        pieces = [f"S{plan.statement}[{', '.join(st.index_names)}] : {cond(same)}",
                  f"S{plan.statement}_init[{', '.join(st.lhs)}] : {cond(same)}"]
        for j in ((plan.cast,) if plan.cast is not None else ()) + plan.epilogue:
            lhs = state.fn.statements[j].lhs
            pieces.append(f"S{j}[{', '.join(lhs)}] : {cond(dict(zip(st.lhs, lhs, strict=True)))}")
        text = f"[{', '.join(params)}] -> {{ {'; '.join(pieces)} }}"
        filt = isl.UnionSet.read_from_str(state.ctx, text).intersect(domain)
        mark = MmaMark(plan.statement, (bm, bn, bk), (self.warps[0], self.warps[1]), self.stages, grid,
                       self.wgmma, self.tf32)
        if self.wgmma:
            why = wgmma_problem(plan, mark.tile, mark.warps)
            if why is not None:
                raise PipelineError(f"map-mma: {why}")
        smem = self.stages * (bm + bn) * bk * (plan.dtype.bits // 8)
        if smem > 227 * 1024:
            raise PipelineError(f"map-mma: {self.stages} stages of {bm}x{bk} and {bn}x{bk} "
                                f"{plan.dtype.name.lower()} need {smem} bytes of shared memory "
                                "(227 KB at most): fewer stages or a smaller tile")
        kernel = KernelMark(grid, (mark.threads, 1, 1))
        node = schedule.get_root().child(0)
        if copies:
            names = {f"S{j}" for j in range(copies)}
            first = isl.UnionSet.empty(domain.get_space())
            for s in sets_of(domain):
                if s.get_tuple_name() in names:
                    first = first.union(isl.UnionSet.from_set(s))
            parts = isl.UnionSetList.alloc(state.ctx, 2).add(first).add(domain.subtract(first))
            node = node.insert_sequence(parts).child(0).child(0)
            band, cfilt, ckernel = _copy_mapping(state, params, copies)
            each = sets_of(first)  # one loop nest per copy, one after the other
            node = node.cut()
            if len(each) > 1:
                lst = isl.UnionSetList.alloc(state.ctx, len(each))
                for s in each:
                    lst = lst.add(isl.UnionSet.from_set(s))
                node = node.insert_sequence(lst).child(0).child(0)
            for i, s in enumerate(each):
                node = node.insert_partial_schedule(band.intersect_domain(isl.UnionSet.from_set(s)))
                node = node.band_set_permutable(1)
                for m in range(3):
                    node = node.band_member_set_coincident(m, 1)
                node = node.band_member_set_ast_loop_type(2, isl.ast_loop_type.unroll)
                if i + 1 < len(each):
                    node = node.parent().parent().child(i + 1).child(0)
            if len(each) > 1:
                node = node.parent().parent()
            node = node.insert_filter(cfilt.intersect(domain))
            node = node.insert_mark(isl.Id(ckernel.name, context=state.ctx))
            node = node.parent().parent().child(1).child(0)
        node = node.insert_mark(isl.Id(mark.name, context=state.ctx))
        node = node.insert_filter(filt)
        node = node.insert_mark(isl.Id(kernel.name, context=state.ctx))
        return dataclasses.replace(state, schedule=node.get_schedule())


def _copy_mapping(state: CompileState, params: list[str], copies: int
                  ) -> tuple[isl.MultiUnionPwAff, isl.UnionSet, KernelMark]:
    """The first ``copies`` statements' band (their outer indices flattened, the innermost
    index ``i`` in groups of 16 bytes, ``i`` within its group: unrolled, so that a thread
    has a group's loads in flight at once), their thread and block filter (a group per
    thread: see the module docstring) and their kernel's mark."""
    assert state.sizes is not None
    lanes = COPY_BYTES // state.fn.tensor(state.fn.statements[0].tensor).dtype.itemsize
    span = lanes * COPY_THREADS  # elements of a row per block
    members: list[list[str]] = [[], [], []]
    pieces, gx, gy = [], 1, 1
    for j in range(copies):
        st = state.fn.statements[j]
        extents = [st.range_of(i).hi.evaluate(state.sizes) for i in st.lhs]
        *outer, last = st.lhs
        gx = max(gx, min(math.ceil(extents[-1] / span), 2**31 - 1))
        gy = max(gy, min(math.prod(extents[:-1]), _MAX_GRID_YZ))
        flat, inner = "0", 1
        for name, ext in zip(reversed(outer), reversed(extents[:-1]), strict=True):
            flat, inner = f"{name} * {inner} + {flat}", inner * ext
        point = f"S{j}[{', '.join(st.lhs)}]"
        for k, expr in enumerate((flat, f"floor({last} / {lanes})", f"{last} mod {lanes}")):
            members[k].append(f"{point} -> [({expr})]")
        pieces.append((point, last, flat))
    head = f"[{', '.join(params)}] -> "
    band = isl.MultiUnionPwAff.read_from_str(
        state.ctx, head + "[" + ", ".join("{ " + "; ".join(m) + " }" for m in members) + "]")
    text = "; ".join(
        f"{point} : floor({last} / {lanes}) mod {COPY_THREADS} = _tx and "
        f"floor({last} / {span}) mod {gx} = _bx and ({flat}) mod {gy} = _by and _bz = 0"
        for point, last, flat in pieces)
    filt = isl.UnionSet.read_from_str(state.ctx, f"{head}{{ {text} }}")
    return band, filt, KernelMark((gx, gy, 1), (COPY_THREADS, 1, 1))
