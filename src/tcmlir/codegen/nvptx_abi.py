"""The NVPTX kernel ABI: which kernels a mapped AST holds and the ``ptx_kernel`` entry of each.

`find_kernels` finds every mark named ``kernel grid=GX,GY,GZ block=BX,BY,BZ`` of the isl AST
(`parse_kernel_mark`); `KernelLowerer` lowers the subtree under each with the shared walk of
`lower.py` (through the target strategy of `nvptx.NvptxTarget`) into one body function and
wraps it in a ``ptx_kernel`` entry with its launch bounds. `KernelLaunch` and
`CudaKernelImage` are what the runtime launches.

Kernel ABI (the k-th kernel mark, in program order; kernels run in that order on one stream)::

    .entry {entry}_k{k}(T0*, ..., Tn*,  i64 size0, ..., i64 sizem,  i32* err)

* one ``ptr addrspace(1)`` per tensor the kernel reads or writes (`KernelLaunch.tensors`: its
  statements' tensors and those its promoted buffers copy, in `ir.Function.tensors` order),
  row-major, C-contiguous, storage types of `exprs.memory_type`;
* one ``i64`` per size the kernel reads (`KernelLaunch.sizes`, in `ir.Function.sizes` order):
  sizes fixed at compile time are folded into the code as constants and not passed, so only a
  parametric kernel takes sizes;
* ``err``: a device ``i32`` set to ``1 + c`` when gather site ``c`` (`CudaKernelImage.gathers`)
  reads outside its tensor (the offending thread then stops).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import islpy as isl
from llvmlite import ir

from ..errors import CodegenError
from ..signature import ALIGN_BYTES
from .ast_groups import communicated_tensors, group_tensors
from .exprs import I64
from .lower import PTR, GatherSite, Lowerer
from .param_space import check_kernel_parameters

__all__ = ["MINCTASM_ROW_VALUES", "CudaKernelImage", "Guard", "KernelLaunch", "KernelLowerer",
           "find_kernels", "parse_kernel_mark", "parse_reduction_mark"]

_KERNEL_MARK = re.compile(r"kernel\s+grid=(\d+),(\d+),(\d+)\s+block=(\d+),(\d+),(\d+)\s*$")


@dataclass(frozen=True)
class KernelLaunch:
    """One kernel of the sequence: its PTX entry name and launch configuration."""

    name: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    has_gathers: bool = False
    shared_bytes: int = 0  # dynamic shared memory per block (tensor-core rings above 48 KB)
    tensors: tuple[str, ...] = ()  # its tensor parameters, in `CudaKernelImage.arg_order` order
    sizes: tuple[str, ...] = ()    # its size parameters, in `CudaKernelImage.sizes_order` order

    @property
    def parameter_count(self) -> int:
        """Its parameters: the tensors, the sizes, the error flag."""
        return len(self.tensors) + len(self.sizes) + 1


@dataclass(frozen=True)
class CudaKernelImage:
    """Everything needed to launch a compiled TC function on a GPU (no GPU needed to build it).

    ``kernels`` run in order; each takes its own tensors (`KernelLaunch.tensors`, a part of
    ``arg_order``: the function's tensors), then its sizes (`KernelLaunch.sizes`, a part of
    ``sizes_order``) as i64, then the error flag. ``sizes`` are the values fixed at compile time.
    """

    entry: str
    arch: str
    ptx: str
    llvm_ir: str
    kernels: tuple[KernelLaunch, ...]
    arg_order: tuple[str, ...]
    sizes_order: tuple[str, ...]
    gathers: tuple[GatherSite, ...] = ()
    sizes: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    on_chip: tuple[str, ...] = ()  # temporaries without a global buffer (codegen.gpu_rows)
    aligned: tuple[str, ...] = ()  # tensors whose pointers must be ALIGN_BYTES-aligned at launch

    @property
    def uses_libdevice(self) -> bool:
        return "__nv_" in self.llvm_ir


def parse_kernel_mark(name: str) -> tuple[tuple[int, int, int], tuple[int, int, int]] | None:
    """(grid, block) of a ``kernel grid=GX,GY,GZ block=BX,BY,BZ`` mark name, else None."""
    m = _KERNEL_MARK.match(name.strip())
    if m is None:
        return None
    v = tuple(int(x) for x in m.groups())
    grid, block = v[:3], v[3:]
    if min(v) < 1:
        raise CodegenError(f"kernel mark {name!r}: grid and block extents must be at least 1")
    return grid, block  # type: ignore[return-value]


def parse_reduction_mark(name: str) -> tuple[int, int, bool] | None:
    """(statement, threads, atomic) of a ``reduction S<k> threads=B[ atomic]`` mark
    (passes/map_reductions, passes/map_full_reduction)."""
    m = re.match(r"^reduction S(\d+) threads=(\d+)( atomic)?$", name.strip())
    return (int(m.group(1)), int(m.group(2)), m.group(3) is not None) if m else None


# ---------------------------------------------------------------- finding the kernels

Guard = tuple[isl.AstExpr, bool]


def find_kernels(ast: isl.AstNode) -> list[tuple[str, isl.AstNode, tuple[Guard, ...]]]:
    """The ``kernel`` marks of ``ast`` in program order: (mark name, subtree, the ``if``
    conditions above it with the branch taken). A loop above a kernel mark is an error."""
    found: list[tuple[str, isl.AstNode, tuple[Guard, ...]]] = []

    def visit(node: isl.AstNode, guards: tuple[Guard, ...]) -> None:
        kind = node.get_type()
        if kind == isl.ast_node_type.mark:
            name = node.mark_get_id().get_name()
            if parse_kernel_mark(name) is not None:
                found.append((name, node.mark_get_node(), guards))
            else:
                visit(node.mark_get_node(), guards)
        elif kind == isl.ast_node_type.block:
            kids = node.block_get_children()
            for i in range(kids.n_ast_node()):
                visit(kids.get_at(i), guards)
        elif kind == isl.ast_node_type.if_:
            cond = node.if_get_cond()
            visit(node.if_get_then_node(), (*guards, (cond, True)))
            if node.if_has_else_node():
                visit(node.if_get_else_node(), (*guards, (cond, False)))
        elif kind == isl.ast_node_type.for_:
            if _has_kernel_mark(node.for_get_body()):
                raise CodegenError("a kernel mark lies inside a loop: the GPU mapping must put "
                                   "every kernel at the top of the schedule")
            raise CodegenError("statement instances outside every kernel mark (a loop above "
                               "the kernels): run the GPU mapping passes on the whole tree")
        elif kind == isl.ast_node_type.user:
            raise CodegenError(f"statement {node.user_get_expr().to_C_str()} lies outside every "
                               "kernel mark")

    visit(ast, ())
    return found


def _has_row_mark(node: isl.AstNode) -> bool:
    """True if a ``rows`` or ``reduction`` mark (a bandwidth-bound row kernel) lies in ``node``
    and no ``accumulate ... over-rows`` mark: a row kernel that also keeps column partials in
    registers across its rows (`passes/row_partials.py`) spilled under the 32-register budget
    (a 128-byte frame at 1024 threads; 62 registers without it), so it gets no ``minctasm``;
    nor does one whose threads hold more than `MINCTASM_ROW_VALUES` row elements each, nor a
    full reduction. (isl hands each node to the callback for that call only: counted there.)"""
    hit, partials = [], []

    def fn(n: isl.AstNode) -> bool:
        if n.get_type() == isl.ast_node_type.mark:
            name = n.mark_get_id().get_name()
            if name.startswith(("rows ", "reduction ")):
                # a full reduction (`map_full_reduction`, folded atomically) walks long
                # strides: 32 registers cost it 6% (2^28 float32 on the H200: 0.288 ms with
                # minctasm, 0.271 without, 0.267 with 128-bit lanes)
                full = name.startswith("reduction ") and name.endswith(" atomic")
                hit.append(MINCTASM_ROW_VALUES + 1 if full else _unrolled_calls(n))
            if name.startswith("accumulate ") and "over-rows" in name:
                partials.append(n)
        return True

    node.foreach_descendant_top_down(fn)
    return bool(hit) and not partials and max(hit) <= MINCTASM_ROW_VALUES


#: a row kernel whose threads hold at most this many row elements each (straight-line phase
#: code) gets ``minctasm``; with more, the 32-register budget spills (softmax 4096 wide on 256
#: threads: 16 values, a 32-byte frame) and the larger register file per thread is the point
MINCTASM_ROW_VALUES = 8


def _unrolled_calls(mark: isl.AstNode) -> int:
    """Statement calls below a ``reduction`` mark (one phase of a row) in straight-line code:
    the row elements a thread holds at once when its stride loop is unrolled (0 for a
    ``rows`` mark, and below a loop: a thread then walks its elements and holds few)."""
    from ..poly.llvm_unroll import unrolled_calls

    if not mark.mark_get_id().get_name().startswith("reduction "):
        return 0
    calls, loops = unrolled_calls(mark.mark_get_node())
    return 0 if loops else calls


def _has_kernel_mark(node: isl.AstNode) -> bool:
    hit = []

    def fn(n: isl.AstNode) -> bool:
        if n.get_type() == isl.ast_node_type.mark and parse_kernel_mark(n.mark_get_id().get_name()):
            hit.append(n)
        return True

    node.foreach_descendant_top_down(fn)
    return bool(hit)


def _has_statement(node: isl.AstNode) -> bool:
    found: list[isl.AstNode] = []

    def visit(n: isl.AstNode) -> bool:
        if n.get_type() == isl.ast_node_type.user:
            found.append(n)
        return not found

    node.foreach_descendant_top_down(visit)
    return bool(found)


class KernelLowerer(Lowerer):
    """The shared `Lowerer`, emitting one ``ptx_kernel`` per kernel mark instead of groups."""

    needs_sm90a = False  # a generator used sm_90a-only instructions (wgmma)

    def target_arch_number(self) -> int:
        return self.target.arch_number

    def kernels(self, ast: isl.AstNode) -> tuple[KernelLaunch, ...]:
        if not _has_kernel_mark(ast):
            if _has_statement(ast):
                raise CodegenError("cuda target needs the mapping passes map-to-blocks/map-to-threads")
            return ()  # every statement's domain is empty at these sizes: nothing to launch
        from .gpu_rows import phase_statements

        found = find_kernels(ast)
        launches = []
        for k, (mark, node, guards) in enumerate(found):
            grid, block = parse_kernel_mark(mark)  # type: ignore[misc]
            name = f"{self.name}_k{k}"
            before = len(self.gathers)
            self.kernel_shared_bytes = 0  # set by a generator that needs dynamic shared memory
            statements = phase_statements(node)
            self.shared_tensors = communicated_tensors(self.fn, statements)
            # the kernel takes only what it touches: a definition of many kernels and many
            # tensors lowers, and launches, in time linear in its size
            tensors = group_tensors(self.fn, node, self.promotion)
            body, sizes = self.kernel_body(name, node, guards, tensors)
            check_kernel_parameters(self.fn, name, statements, tensors, sizes)
            self.kernel_entry(name, body, tensors, sizes)
            self.launch_bounds(name, block, _has_row_mark(node))
            launches.append(KernelLaunch(name, grid, block, len(self.gathers) > before,
                                         self.kernel_shared_bytes, tensors, sizes))
        return tuple(launches)

    def launch_bounds(self, name: str, block: tuple[int, int, int], bandwidth_bound: bool) -> None:
        """``nvvm.annotations`` for kernel ``name``: its exact block size (``maxntid``: ptxas
        budgets registers for it) and, for row kernels of at least 256 threads, as many
        blocks per SM as fill its 2048 thread slots (``minctasm``: ptxas keeps registers at
        or under 32 per thread; measured on the H200, softmax's 34 registers left a quarter
        of the thread slots empty)."""
        fn = self.module.get_global(name)
        i32 = ir.IntType(32)
        md = self.module.add_named_metadata("nvvm.annotations")
        entries = [("maxntidx", block[0]), ("maxntidy", block[1]), ("maxntidz", block[2])]
        threads = block[0] * block[1] * block[2]
        if bandwidth_bound and threads >= 256:
            entries.append(("minctasm", 2048 // threads))
        for key, value in entries:
            md.add(self.module.add_metadata([fn, ir.MetaDataString(self.module, key),
                                             ir.Constant(i32, value)]))

    def kernel_body(self, name: str, node: isl.AstNode, guards: Sequence[Guard],
                    tensors: tuple[str, ...]) -> tuple[ir.Function, tuple[str, ...]]:
        """The kernel's body over ``tensors``, and the sizes it reads (the others are folded)."""
        body = self.new_body(name, tensors)
        from .gpu_rows import RowWalker

        walker = RowWalker(self, body, parallel=False, tensors=tensors)
        b = walker.builder
        for cond, taken in guards:
            c = walker.expr(cond)
            if not taken:
                c = b.not_(c)
            inside = b.append_basic_block("guard")
            b.cbranch(c, inside, walker.exit)
            b.position_at_end(inside)
        walker.node(node)
        walker.finish()
        self.local_tensors = getattr(self, "local_tensors", set()) | walker.local_seen
        return body, walker.sizes_read()

    def kernel_entry(self, name: str, body: ir.Function, tensors: tuple[str, ...],
                     sizes: tuple[str, ...]) -> None:
        """The ``ptx_kernel`` ``name(tensors..., sizes..., err)`` calling ``body``."""
        nbuf, nsize = len(tensors), len(sizes)
        gptr = self.target.pointer
        fnty = ir.FunctionType(ir.VoidType(), [gptr] * nbuf + [I64] * nsize + [gptr])
        fn = ir.Function(self.module, fnty, name)
        fn.calling_convention = "ptx_kernel"
        fn.attributes.add("nounwind")
        names = [*tensors, *sizes, "err"]
        for a, n in zip(fn.args, names, strict=True):
            a.name = n
        for a in fn.args[:nbuf]:
            if a.name not in self.shared_tensors:  # (`ast_groups.communicated_tensors`)
                a.add_attribute("noalias")
            if a.name in self.aligned:  # the call guarantees it (`Signature`'s alignment)
                a.attributes.align = ALIGN_BYTES
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        # the body reads sizes from memory (the host ABI: at their `ir.Function.sizes`
        # positions); after inlining, SROA makes them registers again
        slots = b.alloca(I64, size=max(1, len(self.fn.sizes)), name="sizes")
        for size, a in zip(sizes, fn.args[nbuf:nbuf + nsize], strict=True):
            at = ir.Constant(I64, self.fn.sizes.index(size))
            b.store(a, b.gep(slots, [at], inbounds=True, source_etype=I64))
        sizes_ptr = b.bitcast(slots, PTR)
        err = b.addrspacecast(fn.args[-1], PTR)
        b.call(body, [*fn.args[:nbuf], sizes_ptr, ir.Constant(I64, 0), ir.Constant(I64, 0), err])
        b.ret_void()
