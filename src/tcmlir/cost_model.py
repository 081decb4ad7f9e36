"""An analytic cost model of GPU kernels, and the general mapping `default_for` derives from it.

Programs that no specialised mapping claims (row programs, contractions, convolutions, 1-D
elementwise chains: `gpu_defaults`, `MappingOptions.default_for`) used to get TC's naive
options — 32³ tiles and 32×8 threads whatever the shape — which made one thread walk most of
the work of a rank-4 permutation (0.03× eager) or a Kronecker-style contraction (0.001×).
`generic_mapping` chooses their tiles, threads and grid instead, from what isl computes:

1. **The schedule** (the `schedule` pass, as a compile runs it): each kernel group's first
   band, and per member its extent at the call's sizes, whether it carries a dependence,
   and which statement dimensions it moves.
2. **Candidates**: the innermost parallel member that gives the most contiguous accesses on
   ``threadIdx.x`` (tile ``tx`` ∈ 32..256), the next parallel member on ``.y`` (``ty`` ∈
   1..32), every other parallel member tiled by 1 (so it lands on ``blockIdx``, one block per
   value), dependence-carrying members untiled (each thread walks them: a reduction).
3. **The model** (`kernel_time`) estimates each candidate's time from counts, not tables:
   blocks and waves over the SMs, resident warps per SM (occupancy from threads per block),
   the instances each thread runs, warp instructions issued, and the bytes each access moves
   — a warp access that is contiguous along ``.x`` moves its 32-byte sectors once, a strided
   one a sector per thread, a broadcast one sector — against the HBM and L2 bandwidths. The
   candidate with the least predicted time wins.

The constants (`GPU`) are an H100/H200-class card's (132 SMs; the copy and FMA ceilings that
docs/perf.md measures); the defaults must not depend on which GPU is visible (they are part
of the compile-cache key), so they are fixed here and documented. Predictions rank mappings;
they are not a timer (`fn.profile` measures).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import islpy as isl

from . import ir as tc
from .gpu_device import SM_COUNT

__all__ = ["GPU", "Access", "GenericMapping", "GpuModel", "KernelShape", "MemberInfo",
           "generic_mapping", "kernel_statement_groups", "kernel_time"]


@dataclass(frozen=True)
class GpuModel:
    """The machine the model prices: an H100 SXM / H200-class GPU (sm_90)."""

    sms: int = SM_COUNT                  # streaming multiprocessors
    clock_hz: float = 1.755e9            # sustained SM clock under load
    issue_per_sm: int = 4                # warp instructions issued per cycle per SM
    max_threads_per_sm: int = 2048
    max_blocks_per_sm: int = 32
    warps_to_hide_latency: int = 48      # resident warps per SM a memory-bound kernel needs
    block_cycles: int = 600              # an SM's cost of starting and retiring a block
    dram_bytes_per_s: float = 3.0e12     # the copy ceiling docs/perf.md measures (H100: ~3.0 TB/s)
    l2_bytes_per_s: float = 7.0e12       # L2 -> SM sectors
    l2_bytes: int = 50 * 2**20
    l1_bytes_per_s: float = 29.6e12      # 128 B per cycle per SM
    l1_resident: int = 64 * 2**10        # a tensor this small stays in every SM's L1
    sector_bytes: int = 32
    launch_s: float = 2.5e-6             # a kernel launch inside a call


GPU = GpuModel()


@dataclass(frozen=True)
class Access:
    """One access of a statement: bytes per element, the address stride (in elements) along
    the thread-x member, the tensor's footprint in bytes, and whether it is a write."""

    tensor: str
    itemsize: int
    stride_x: int | None     # None: not affine along x (a gather)
    footprint: int
    write: bool = False


@dataclass(frozen=True)
class KernelShape:
    """What the model needs of one kernel: launch shape, work per thread, its accesses."""

    blocks: int
    threads: int             # per block
    instances: int           # statement instances the kernel runs
    per_thread: float        # instances the busiest thread runs
    accesses: tuple[Access, ...]
    ops_per_instance: int = 2


def kernel_time(k: KernelShape, gpu: GpuModel = GPU) -> float:
    """Predicted seconds of one kernel (see the module docstring): the larger of the issue
    time of its busiest SM and its memory time, each slowed when too few warps are resident
    to hide latency, plus the launch."""
    warps_per_block = max(1, math.ceil(k.threads / 32))
    resident = max(1, min(gpu.max_blocks_per_sm, gpu.max_threads_per_sm // (32 * warps_per_block)))
    blocks_per_sm = math.ceil(k.blocks / gpu.sms)
    active_warps = warps_per_block * min(resident, blocks_per_sm)
    hide = min(1.0, active_warps / gpu.warps_to_hide_latency)
    # warp instructions per instance: its operations, an address and a load or store per access
    per_instance = k.ops_per_instance + 2 * len(k.accesses) + 2
    issue = (blocks_per_sm * warps_per_block * k.per_thread * per_instance / gpu.issue_per_sm
             + blocks_per_sm * gpu.block_cycles / min(resident, blocks_per_sm)) / gpu.clock_hz
    l1 = l2 = dram = 0.0
    warp_instances = k.instances / 32
    for a in k.accesses:
        if a.stride_x == 0:
            sectors = 1.0
        elif a.stride_x is not None and abs(a.stride_x) == 1:
            sectors = max(1.0, 32 * a.itemsize / gpu.sector_bytes)
        else:  # a sector per thread
            sectors = 32.0
        moved = warp_instances * sectors * gpu.sector_bytes
        if a.footprint <= gpu.l1_resident and not a.write:
            l1 += moved  # a small table: every SM keeps it in L1
            dram += a.footprint
            continue
        l2 += moved
        # each element comes from memory once, unless strided sectors of a tensor that
        # does not stay in L2 are fetched again
        dram += a.footprint if (sectors < 32 or a.footprint <= gpu.l2_bytes) else max(moved, a.footprint)
    memory = max(dram / gpu.dram_bytes_per_s, l2 / gpu.l2_bytes_per_s, l1 / gpu.l1_bytes_per_s)
    spread = min(1.0, k.blocks / gpu.sms)  # fewer blocks than SMs: the rest of the GPU idles
    return max(issue, memory / spread) / hide + gpu.launch_s


# ---------------------------------------------------------------- the schedule's view


@dataclass
class MemberInfo:
    """A member of a kernel group's first band at the call's sizes."""

    extent: int | None
    parallel: bool
    dims: dict[str, set[int]] = field(default_factory=dict)  # statement -> dims it moves


@dataclass(frozen=True)
class GenericMapping:
    """The chosen tiles, block and grid, with the model's prediction (seconds)."""

    tile_sizes: tuple[int, ...]
    block: tuple[int, ...]
    grid: tuple[int, ...]
    predicted_s: float
    fusion: str = "preserve3coincident"


def _schedule(fn: tc.Function, sizes: Mapping[str, int], fusion: str):
    from .passes import PassManager, parse_pipeline
    from .poly.state import CompileState

    state = CompileState.initial(fn, sizes)
    passes = parse_pipeline(f"schedule{{fusion={fusion},skew=false,positive-orthant=true}}")
    return PassManager(passes, verify_each=False).run(state)


def _members(band: isl.ScheduleNode, validity: isl.UnionMap) -> list[MemberInfo]:
    from .poly.gpu_mapping import member_extent
    from .poly.legality import member_is_parallel
    from .poly.scheduler import band_members

    out = []
    for m, affs in enumerate(band_members(band)):
        info = MemberInfo(member_extent(band, m), member_is_parallel(band, m, validity))
        for aff in affs:
            name = aff.get_domain_space().get_tuple_name(isl.dim_type.set)
            info.dims.setdefault(name, set()).update(
                d for d in range(aff.dim(isl.dim_type.in_))
                if not aff.get_coefficient_val(isl.dim_type.in_, d).is_zero())
        out.append(info)
    return out


def _row_major(shape: list[int]) -> list[int]:
    strides, step = [], 1
    for extent in reversed(shape):
        strides.append(step)
        step *= max(1, extent)
    return strides[::-1]


def _pieces(m: isl.Map) -> list[isl.MultiAff | None]:
    """The affine functions of the accesses in ``m`` (None for one that is not a function)."""
    pieces: list[isl.MultiAff | None] = []
    for bm in m.get_basic_maps():
        one = isl.Map.from_basic_map(bm)
        if one.is_single_valued():
            isl.PwMultiAff.from_map(one).foreach_piece(lambda _s, ma: pieces.append(ma))
        else:
            pieces.append(None)
    return pieces


def _accesses(state, names: set[str], x_dims: dict[str, set[int]]) -> dict[str, list[Access]]:
    """Per statement of ``names``: its accesses with their stride along the x member."""
    from .poly.scop import maps_of

    fn, sizes = state.fn, state.sizes
    out: dict[str, list[Access]] = {n: [] for n in names}
    for umap, write in ((state.scop.reads, False), (state.scop.writes, True)):
        for m in maps_of(umap):
            stmt = m.get_tuple_name(isl.dim_type.in_)
            if stmt not in names:
                continue
            tname = m.get_tuple_name(isl.dim_type.out)
            tensor = fn.tensor(tname)
            shape = [s.evaluate(sizes) for s in tensor.shape]
            strides = _row_major(shape)
            foot = math.prod(shape) * tensor.dtype.itemsize
            dims = x_dims.get(stmt, set())
            pieces = _pieces(m)
            for ma in pieces or [None]:
                stride: int | None = 0
                if ma is None:
                    stride = None
                else:
                    for j in range(ma.dim(isl.dim_type.out)):
                        aff = ma.get_aff(j)
                        for d in dims:
                            c = aff.get_coefficient_val(isl.dim_type.in_, d)
                            if not c.is_int():
                                stride = None
                                break
                            stride += int(c.to_python()) * strides[j]
                        if stride is None:
                            break
                out[stmt].append(Access(tname, tensor.dtype.itemsize, stride, foot, write))
    return out


def _instances(state, name: str) -> int:
    dom = state.scop.domains[name]
    n = 1
    for d in range(dom.dim(isl.dim_type.set)):
        lo, hi = dom.dim_min_val(d), dom.dim_max_val(d)
        if not (lo.is_int() and hi.is_int()):
            return 0
        n *= max(0, int(hi.to_python()) - int(lo.to_python()) + 1)
    return n


TX_CHOICES = (32, 64, 128, 256)
TY_CHOICES = (1, 2, 4, 8, 16, 32)
GRID_CAPS = (2**31 - 1, 65535, 65535)


FUSIONS = ("preserve3coincident", "min")


def generic_mapping(fn: tc.Function, sizes: Mapping[str, int] | None,
                    gpu: GpuModel = GPU, fusions: tuple[str, ...] = FUSIONS
                    ) -> GenericMapping | None:
    """The model's choice for ``fn`` at ``sizes`` (see the module docstring), or None when the
    sizes are not all known or no schedule has a band with a parallel member. A program of
    several statements is priced under each of `FUSIONS` (fusing a reduction with the
    statement that feeds it can make the fused band's inner members sequential: a fused
    attention's scores and row maximum left one thread per row walking 256 x 64 products);
    ``fusions`` narrows the choice (a per-kernel mapping's groups hold at one fusion)."""
    if sizes is None or any(p not in sizes for p in fn.sizes):
        return None
    best: GenericMapping | None = None
    for fusion in fusions if len(fn.statements) > 1 else fusions[:1]:
        cand = _generic_for(fn, sizes, fusion, gpu)
        if cand is not None and (best is None or _better(cand, best)):
            best = cand
    return best


def kernel_statement_groups(fn: tc.Function, sizes: Mapping[str, int], fusion: str
                            ) -> list[frozenset[int]] | None:
    """The statement numbers of each kernel ``fn`` compiles to under ``fusion`` at ``sizes``
    (the top-level groups of the schedule, `poly.gpu_mapping.kernel_groups`; a statement
    and its initialisation in two groups, as under ``min``, count as one kernel: groups that
    share a statement are merged), in schedule order; None when isl cannot schedule it."""
    from .poly.gpu_mapping import kernel_groups
    from .poly.kernel_select import statement_numbers
    from .poly.tree import node_at

    try:
        schedule = _schedule(fn, sizes, fusion).schedule
    except Exception:  # noqa: BLE001 - no schedule: the caller keeps its own default
        return None
    groups: list[frozenset[int]] = []
    for path in kernel_groups(schedule):
        numbers = statement_numbers(node_at(schedule, path))
        for g in [g for g in groups if g & numbers]:
            groups.remove(g)
            numbers |= g
        if numbers:
            groups.append(frozenset(numbers))
    return groups


def _generic_for(fn: tc.Function, sizes: Mapping[str, int], fusion: str,
                 gpu: GpuModel) -> GenericMapping | None:
    from .poly.gpu_mapping import first_band_below, kernel_groups
    from .poly.scop import sets_of
    from .poly.tree import node_at

    try:
        state = _schedule(fn, sizes, fusion)
    except Exception:  # noqa: BLE001 - no model: the caller keeps its own default
        return None
    schedule = state.schedule
    groups = []
    for path in kernel_groups(schedule):
        band = first_band_below(node_at(schedule, path))
        if band is None:
            continue
        names = {s.get_tuple_name() for s in sets_of(band.get_domain())}
        members = _members(band, state.deps.validity)
        work = {n: _instances(state, n) for n in names}
        groups.append((members, work))
    if not groups:
        return None
    main_members, _ = max(groups, key=lambda g: sum(g[1].values()))
    n = len(main_members)
    lead: list[int] = []  # leading parallel members, as map-to-blocks/threads take them
    for m, info in enumerate(main_members):
        if not info.parallel:
            break
        lead.append(m)
    wide = [m for m in lead if (main_members[m].extent or 2) > 1]
    if not wide:
        return None

    def stride_score(m: int) -> float:
        # bytes moved per warp along member m, over every group's statements (lower is better)
        total = 0.0
        for members, work in groups:
            if m >= len(members):
                continue
            acc = _accesses(state, set(work), members[m].dims)
            for stmt, accesses in acc.items():
                for a in accesses:
                    s = 1 if a.stride_x == 0 else (4 if a.stride_x in (1, -1) else 32)
                    total += work[stmt] * s
        return total

    x = min(reversed(wide), key=stride_score)  # ties: the innermost
    # map-to-threads puts the later of the two thread members on .x: .y's comes before it
    rest = [m for m in wide if m < x]
    y = rest[-1] if rest else None
    best: GenericMapping | None = None
    ext = {m: (main_members[m].extent or 1024) for m in range(n)}
    for tx in TX_CHOICES:
        if tx > 32 and tx >= 2 * ext[x]:
            continue
        for ty in TY_CHOICES if y is not None else (1,):
            if tx * ty > 1024 or (y is not None and ty > 1 and ty >= 2 * ext[y]):
                continue
            tiles = []
            for m in range(n):
                if m == x:
                    tiles.append(tx)
                elif m == y:
                    tiles.append(ty)
                elif m in lead:
                    tiles.append(1)
                else:
                    tiles.append(0)
            cand = _price(state, groups, tiles, x, y, tx, ty, lead, gpu, fusion)
            if best is None or _better(cand, best):
                best = cand
    return best


def _better(a: GenericMapping, b: GenericMapping) -> bool:
    """``a`` predicted faster than ``b`` by more than 1%, or as fast with more threads per
    block (within 1% the model cannot tell them apart; bigger blocks leave more warps
    resident where its occupancy model is coarse)."""
    if a.predicted_s < b.predicted_s * 0.99:
        return True
    return a.predicted_s <= b.predicted_s * 1.01 and math.prod(a.block) > math.prod(b.block)


def _price(state, groups, tiles: list[int], x: int, y: int | None, tx: int, ty: int,
           lead: list[int], gpu: GpuModel, fusion: str) -> GenericMapping:
    """The candidate's tiles with the block and grid map-to-blocks/threads would give, priced."""
    total = 0.0
    block = (tx, ty) if y is not None else (tx,)
    for members, work in groups:
        counts = []  # tiles per leading parallel member of this group
        for m in lead:
            if m >= len(members) or not members[m].parallel:
                break
            e = members[m].extent or 1024
            t = tiles[m] or e
            counts.append((m, math.ceil(e / t)))
        mapped = [c for c in counts if c[1] > 1][:3]
        grid = [min(c, cap) for (_, c), cap in zip(reversed(mapped), GRID_CAPS, strict=False)]
        blocks = math.prod(grid) if grid else 1
        # threads with work: along x and y, as the member extents fill the tiles
        ex = members[x].extent if x < len(members) else 1
        ey = members[y].extent if y is not None and y < len(members) else 1
        busy_x = min(tx, ex or tx)
        busy_y = min(ty, ey or ty) if y is not None else 1
        threads = tx * ty
        instances = sum(work.values())
        per_thread = instances / max(1, blocks * busy_x * busy_y)
        x_dims = members[x].dims if x < len(members) else {}
        acc = _accesses(state, set(work), x_dims)
        accesses = tuple(a for lst in acc.values() for a in lst)
        shape = KernelShape(blocks=blocks, threads=threads, instances=instances,
                            per_thread=per_thread, accesses=accesses)
        total += kernel_time(shape, gpu)
    return GenericMapping(tuple(tiles), block, GRID_CAPS, total, fusion)
