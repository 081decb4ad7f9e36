"""The `host-contraction` pass: a contraction on the host as one packed, register-blocked kernel.

For each outermost band (or sequence, when every loop has one iteration) whose statements
are exactly one host contraction ``S<k>`` (and its ``S<k>_init``;
`poly.host_contraction.host_contraction` at the state's fixed sizes: a float ``+=`` product
of two affine reads), the tree becomes::

    band  [floor(m / MC) + R * (b_n + E_n * (b_n-1 + ...))]   batch entries x row blocks
      mark "host-gemm S<k> tile=MC,NC,KC register=MR,NR vector=VW init"
        band ... the band `schedule` made, with its statements

``R`` is the number of row blocks of ``MC`` rows, ``E_i`` the extent of batch index ``b_i``;
``init`` when ``S<k>_init`` is under the mark (one scheduled apart runs before, and the kernel
adds to what it wrote). `mark-parallel` then splits the one outer member, every (batch entry,
row block) pair, across the threads in equal chunks. Below the mark,
`codegen/host_gemm.py` emits one row block's work: for each ``KC`` slice of the reduction the
block's rows of the ``a`` operand are packed into ``MR``-row panels, for each ``NC`` slice of
``n`` the ``b`` operand into ``NR``-column panels (zero-padded: edges need no guard in the
inner loop), and a micro-kernel keeps ``MR x NR`` outputs in vector registers of ``VW``
elements (``llvm.fma`` on ``<VW x float>``) while it walks the slice. The statements under the
mark are not walked. Only an outer band was added, so the pass manager's legality proof covers
the tree; the blocking changes the order of the float sums (as a tolerance allows).

A 0 in ``tile`` or ``register`` takes the default (`DEFAULT_TILE`, `DEFAULT_REGISTER`);
``vector=0`` takes the host's vector width (`host_defaults.host_vector_bytes`); ``NR`` is
rounded up to a multiple of it. A band that is not such a contraction is left alone; a tree
with none is refused with the reasons (a `PipelineError`). Requires a schedule.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import islpy as isl

from ..errors import PipelineError
from ..poly.host_contraction import HostGemmMark, host_contraction
from ..poly.state import CompileState
from ..poly.tree import node_at
from .base import Pass, register

__all__ = ["DEFAULT_REGISTER", "DEFAULT_TILE", "HostContractionPass"]

DEFAULT_TILE = (256, 512, 256)   # MC, NC, KC (host_defaults.contraction_blocking sizes them)
DEFAULT_REGISTER = (8, 32)       # MR, NR


@register
@dataclass(frozen=True)
class HostContractionPass(Pass):
    """Block a host contraction for the caches and the registers (see the module docstring):
    ``tile`` = MC, NC, KC; ``register`` = MR, NR; ``vector``: elements per vector (0: the
    host's)."""

    name = "host-contraction"
    requires_schedule = True
    tile: tuple[int, ...] = DEFAULT_TILE
    register: tuple[int, ...] = DEFAULT_REGISTER
    vector: int = 0

    def __post_init__(self):
        if len(self.tile) != 3 or len(self.register) != 2 or min(*self.tile, *self.register) < 0:
            raise ValueError("host-contraction takes tile=MC,NC,KC and register=MR,NR (0: the "
                             f"default), got {self.tile}, {self.register}")
        if self.vector < 0:
            raise ValueError(f"host-contraction vector must be >= 0, got {self.vector}")

    def run(self, state: CompileState) -> CompileState:
        schedule = state.schedule
        assert schedule is not None
        reasons: list[str] = []
        done = 0
        for path, k, looped in _single_statement_paths(schedule):
            if looped:
                reasons.append(f"statement {k}: scheduled inside a loop of other statements "
                               "(the fusion option fused them; fusion=min keeps it apart)")
                continue
            node = node_at(schedule, path)
            plan = host_contraction(state.fn, k, state.sizes)
            if isinstance(plan, str):
                reasons.append(f"statement {k}: {plan}")
                continue
            # an initialisation scheduled apart (fusion=min) runs before: the kernel adds
            init = f"S{k}_init" in _names(node)
            mark = self._mark(k, plan.dtype.bits // 8, plan.extent(plan.m), init)
            schedule = _rewrite(node, plan, mark).get_schedule()
            done += 1
        if not done:
            raise PipelineError("host-contraction: no statement is a host contraction"
                                + (f" ({'; '.join(reasons)})" if reasons else ""))
        return dataclasses.replace(state, schedule=schedule)

    def _mark(self, k: int, elt: int, m_extent: int, init: bool) -> HostGemmMark:
        from ..host_defaults import host_vector_bytes

        vw = self.vector or max(1, host_vector_bytes() // elt)
        (mc, nc, kc), (mr, nr) = (
            tuple(v or d for v, d in zip(given, default, strict=True))
            for given, default in ((self.tile, DEFAULT_TILE), (self.register, DEFAULT_REGISTER)))
        nr = -(-nr // vw) * vw
        mc = -(-min(mc, max(m_extent, 1)) // mr) * mr  # whole panels, no larger than the rows
        return HostGemmMark(k, (mc, nc, kc), (mr, nr), vw, init)


def _names(node: isl.ScheduleNode) -> set[str]:
    out: set[str] = set()
    node.get_domain().foreach_set(lambda s: out.add(s.get_tuple_name()))
    return out


_INNER = (isl.schedule_node_type.band, isl.schedule_node_type.sequence,
          isl.schedule_node_type.set, isl.schedule_node_type.leaf)


def _single_statement_paths(schedule: isl.Schedule) -> list[tuple[tuple[int, ...], int, bool]]:
    """(path, k, looped) of each outermost band, sequence, set or leaf whose instances all
    belong to statement ``k`` (``S<k>``, with or without ``S<k>_init``): where the outer band
    goes (a band when `schedule` made one; a sequence of the two when every loop had one
    iteration); ``looped``: below a band, a loop of other statements too (no kernel there)."""
    found: list[tuple[tuple[int, ...], int, bool]] = []

    def walk(node: isl.ScheduleNode, path: tuple[int, ...], looped: bool) -> None:
        if node.get_type() in _INNER:
            names = _names(node)
            ks = {n.removesuffix("_init") for n in names}
            if len(ks) == 1:
                k = next(iter(ks))
                # the kernel runs the whole product: not below a loop of other statements
                # (fusion=max put matmul's k loop inside the m, n loops of a row sum: a kernel
                # there ran the product once per (m, n)); an initialisation alone (fusion=min)
                # stays a plain loop (made a kernel, it ran the product too)
                if k in names:
                    found.append((path, int(k[1:]), looped))
                return
        looped = looped or node.get_type() == isl.schedule_node_type.band
        for i in range(node.n_children()):
            walk(node.child(i), (*path, i), looped)

    walk(schedule.get_root(), (), False)
    return found


def _rewrite(node: isl.ScheduleNode, plan, mark: HostGemmMark) -> isl.ScheduleNode:
    """Insert the outer band and the mark above band ``node``; returns the outer band."""
    ctx = node.get_ctx()
    space = node.get_domain().get_space()
    params = [space.get_dim_name(isl.dim_type.param, i) for i in range(space.dim(isl.dim_type.param))]
    prefix = f"[{', '.join(params)}] -> "
    mc = mark.tile[0]
    k = plan.statement
    # one member: the batch entries and row blocks numbered in order, so that the threads
    # split all of them evenly (a batch of 3 on 2 threads is not a 2:1 split)
    unit, terms = -(-plan.extent(plan.m) // mc), [f"floor(({plan.m})/{mc})"]
    for b in reversed(plan.batch):
        terms.append(f"{unit}*{b}")
        unit *= plan.extent(b)
    members = [" + ".join(terms)]
    st_dims = {f"S{k}": None, f"S{k}_init": None}
    names = _names(node)
    pieces = []
    for member in members:
        parts = []
        for name in st_dims:
            if name not in names:
                continue
            dims = _dims(node, name)
            parts.append(f"{name}[{', '.join(dims)}] -> [({member})]")
        pieces.append("{ " + "; ".join(parts) + " }")
    mupa = isl.MultiUnionPwAff.read_from_str(ctx, prefix + "[" + ", ".join(pieces) + "]")
    node = node.insert_mark(isl.Id(str(mark), context=ctx))
    node = node.insert_partial_schedule(mupa)
    node = node.band_set_permutable(1)
    for i in range(len(members)):
        node = node.band_member_set_coincident(i, 1)
    return node


def _dims(node: isl.ScheduleNode, name: str) -> list[str]:
    found: list[str] = []

    def visit(s: isl.Set) -> None:
        if s.get_tuple_name() == name:
            found.extend(s.get_dim_name(isl.dim_type.set, i) for i in range(s.dim(isl.dim_type.set)))

    node.get_domain().foreach_set(visit)
    return found
