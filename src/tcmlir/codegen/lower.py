"""The target-neutral walk: an isl AST over the statements of an `ir.Function` -> an LLVM module.

Kernel ABI (one LLVM function per *group*, i.e. per top-level child of the AST's root block, or
the whole AST when the root is not a block; groups run in order)::

    void {name}_{g}(ptr buffers, ptr sizes, i64 lo, i64 hi, ptr err)

* ``buffers``: one data pointer per tensor in `ir.Function.tensors` order (inputs, outputs,
  temporaries), row-major, C-contiguous, elements in `exprs.memory_type`;
* ``sizes``: one i64 per size parameter in `ir.Function.sizes` order. Sizes given at compile time
  are folded into the code as constants (loop bounds, strides); the others are read from here, so
  the same ABI serves a parametric kernel;
* ``lo``, ``hi``: the chunk of the group's *parallel loop* (below) this call runs: iterations
  whose iterator value lies in ``[lo, hi)``; ignored by groups without one;
* ``err``: an ``i32`` set to ``1 + c`` when gather site ``c`` (`LoweredModule.gathers`) reads
  outside its tensor; the function then returns at once. On a target that records the index
  (`Target.records_index`, the host), ``err`` points at ``{i32 code, i32 pad, i64 index,
  i64 extent}`` and the failed check also writes the index value and the dimension's extent.

A group has a parallel loop when its root reaches a ``parallel`` mark through marks and ``if``s
only (no loop or block above it) and the marked loop's condition is ``c <= e``/``c < e``; it then
also gets a range function ``void {name}_{g}_range(ptr sizes, ptr out)`` writing ``out[0:3]
= first, end, stride`` of that loop, which the runtime splits into chunks (`Group.range_name`:
groups whose loops have the same bounds share the first one's). The body is an internal
function with ``noalias`` tensor arguments, inlined into the exported wrapper; groups of the
same code on other tensors call the first one's body instead, not inlined (`shared_groups`).

What the AST holds (its groups, their parallel loop, the tensors a group touches) is read by
`ast_groups`, without LLVM; isl AST expressions become LLVM values in `isl_exprs`; loops and
branches become LLVM control flow in `ast_loops` (`LoopLowering`, which `GroupWalker` mixes in).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import islpy as isl
from llvmlite import ir

from .. import ir as tc
from ..errors import CodegenError, Span
from ..poly.llvm_unroll import PARTIAL_MARK, UNROLL_MARK, WALK_MARK
from ..poly.loops import annotation_of
from ..poly.promotion import COPY_STMT, SYNC_STMT
from .ast_groups import (
    STATEMENT_NAME,
    communicated_tensors,
    find_parallel_loop,
    group_tensors,
    statement_tensors,
    top_level_groups,
    upper_bound,
)
from .ast_loops import LoopLowering
from .exprs import I32, I64, emit_statement, memory_type
from .host_rows import row_local_temporaries
from .isl_exprs import isl_expr
from .shared_groups import group_key
from .target import Target

# group_tensors, statement_tensors, communicated_tensors, isl_expr: re-exported (`ast_groups`,
# `isl_exprs` are their homes)
__all__ = [
    "PTR",
    "GatherSite",
    "Group",
    "GroupWalker",
    "LoweredModule",
    "Lowerer",
    "communicated_tensors",
    "group_tensors",
    "isl_expr",
    "lower_function",
    "statement_tensors",
]

_T = isl.ast_expr_op_type
PTR = ir.PointerType()


@dataclass(frozen=True)
class GatherSite:
    """A bounds-checked gather: the tensor read, the statement, where in the source."""

    tensor: str
    statement: int
    span: Span | None = field(default=None, compare=False)
    dim: int = -1  # the dimension checked (-1: not recorded, an image cached before it was)


@dataclass(frozen=True)
class Group:
    """An exported function; ``range_name`` is set when it has a chunkable parallel loop."""

    name: str
    range_name: str | None = None

    @property
    def parallel(self) -> bool:
        return self.range_name is not None


@dataclass
class LoweredModule:
    module: ir.Module
    groups: tuple[Group, ...]
    gathers: tuple[GatherSite, ...]
    buffers: tuple[str, ...]
    sizes: tuple[str, ...]
    # temporaries that get no buffer: each lives in a row on a group's stack (`host_rows`)
    on_chip: tuple[str, ...] = ()


class _Function:
    """An LLVM function under construction: entry block (allocas, sizes), exit block, builder."""

    def __init__(self, owner: Lowerer, llfn: ir.Function, sizes_arg: ir.Value):
        self.owner = owner
        self.llfn = llfn
        self.sizes_arg = sizes_arg
        self.entry = ir.IRBuilder(llfn.append_basic_block("entry"))
        self.first = llfn.append_basic_block("body")
        self.builder = ir.IRBuilder(self.first)
        self.exit = llfn.append_basic_block("exit")
        self._params: dict[str, ir.Value] = {}

    def param(self, name: str) -> ir.Value:
        known = self.owner.sizes.get(name)
        if known is not None:
            return ir.Constant(I64, int(known))
        if name not in self._params:
            try:
                k = self.owner.fn.sizes.index(name)
            except ValueError:
                special = self.owner.target.parameter(self.entry, name)
                if special is None:
                    raise CodegenError(f"unknown name {name} in the loop AST of {self.owner.fn.name}") from None
                self._params[name] = special
                return special
            slot = self.entry.gep(self.sizes_arg, [ir.Constant(I64, k)], source_etype=I64)
            self._params[name] = self.entry.load(slot, name=name, typ=I64)
        return self._params[name]

    def sizes_read(self) -> tuple[str, ...]:
        """The size parameters the function loads from its ``sizes`` argument, in
        `ir.Function.sizes` order (sizes fixed at compile time are folded, never loaded)."""
        return tuple(s for s in self.owner.fn.sizes if s in self._params)

    def finish(self) -> None:
        self.entry.branch(self.first)
        if not self.builder.block.is_terminated:
            self.builder.branch(self.exit)
        ir.IRBuilder(self.exit).ret_void()


class GroupWalker(_Function, LoopLowering):
    """Walks one group's AST into its body function; implements `exprs.KernelContext`."""

    def __init__(self, owner: Lowerer, llfn: ir.Function, parallel: bool,
                 tensors: tuple[str, ...] | None = None, row_local: Mapping[str, int] | None = None):
        names = tuple(t.name for t in owner.fn.tensors) if tensors is None else tensors
        nbuf = len(names)
        super().__init__(owner, llfn, llfn.args[nbuf])
        self.target: Target = owner.target
        self.fn = owner.fn
        self.buffers = {name: llfn.args[i] for i, name in enumerate(names)}
        # row-local temporaries (`host_rows`): a row on this call's stack, addressed without
        # the first index (`exprs.ExprEmitter.offset`)
        self.row_local = frozenset(row_local or ())
        for name, elements in (row_local or {}).items():
            ty = memory_type(self.fn.tensor(name).dtype)
            row = self.entry.alloca(ty, size=ir.Constant(I64, elements), name=f"{name}.row")
            row.align = 64
            self.buffers[name] = row
        self.lo, self.hi, self.err = llfn.args[nbuf + 1], llfn.args[nbuf + 2], llfn.args[nbuf + 3]
        self.env: dict[str, ir.Value] = {}
        self.parallel = parallel
        self.loop_depth = 0
        self.chunk_next_for = False
        self._chunked = False
        self._extents: dict[tuple[str, int], ir.Value] = {}
        self.redirects: dict = {}
        self.pinned: dict = {}  # redirect key -> the register slot it is emitted for
        self.buffers_made: dict[str, ir.Value] = {}
        self.unrolled = 0  # depth of ``unroll`` marks (`poly.llvm_unroll`) around the walk
        self.partial = 0  # of those, ``unroll-partial`` marks (`poly.partial_tiles`)
        self.walked = 0  # depth of ``unroll-walk`` marks: their loops are unrolled here

    # ---- KernelContext

    @property
    def chunkable(self) -> bool:
        return self.parallel and not self._chunked and self.loop_depth == 0

    def pointer(self, tensor: str) -> ir.Value:
        if tensor not in self.buffers:  # `group_tensors` missed an access: a compiler bug
            raise AssertionError(f"tensor {tensor} is not a parameter of {self.llfn.name} "
                                 f"(it has {', '.join(self.buffers)})")
        return self.buffers[tensor]

    def extent(self, tensor: str, dim: int) -> ir.Value:
        key = (tensor, dim)
        if key not in self._extents:
            self._extents[key] = self.owner.extent_value(self, self.fn.tensor(tensor).shape[dim])
        return self._extents[key]

    def gather_code(self, tensor: str, statement: int, span: Span | None, dim: int = -1) -> int:
        return self.owner.gather_code(tensor, statement, span, dim)

    def fail(self, code: int, index: ir.Value | None = None,
             extent: ir.Value | None = None) -> None:
        b = self.builder
        b.store(ir.Constant(I32, code), self.err)
        if index is not None and extent is not None and self.target.records_index:
            b.store(index, b.gep(self.err, [ir.Constant(I64, 1)], source_etype=I64))
            b.store(extent, b.gep(self.err, [ir.Constant(I64, 2)], source_etype=I64))
        self.builder.branch(self.exit)

    def lookup(self, name: str) -> ir.Value:
        return self.env[name] if name in self.env else self.param(name)

    # ---- the walk

    def node(self, node: isl.AstNode) -> None:
        kind = node.get_type()
        if kind == isl.ast_node_type.block:
            kids = node.block_get_children()
            for i in range(kids.n_ast_node()):
                self.node(kids.get_at(i))
        elif kind == isl.ast_node_type.for_:
            self.loop(node)
        elif kind == isl.ast_node_type.if_:
            self.branch(node)
        elif kind == isl.ast_node_type.user:
            self.user(node)
        elif kind == isl.ast_node_type.mark:
            name = node.mark_get_id().get_name()
            if name in (UNROLL_MARK, WALK_MARK, PARTIAL_MARK):  # LLVM unrolls its loops, or we do
                depths = {UNROLL_MARK: ("unrolled",), WALK_MARK: ("walked",),
                          PARTIAL_MARK: ("unrolled", "partial")}[name]
                for depth in depths:
                    setattr(self, depth, getattr(self, depth) + 1)
                try:
                    self.node(node.mark_get_node())
                finally:
                    for depth in depths:
                        setattr(self, depth, getattr(self, depth) - 1)
                return
            self.target.mark(self, name, node.mark_get_node())
        else:
            raise CodegenError(f"cannot lower isl AST node of type {kind}")

    def expr(self, e: isl.AstExpr) -> ir.Value:
        return isl_expr(self.builder, e, self.lookup)

    def user(self, node: isl.AstNode) -> None:
        call = node.user_get_expr()
        if call.get_type() != isl.ast_expr_type.op or call.get_op_type() != _T.call:
            raise CodegenError(f"isl AST user node is not a call: {call.to_C_str()}")
        name = call.get_op_arg(0).get_id().get_name()
        if COPY_STMT.match(name) or SYNC_STMT.match(name):
            self.target.promoted_statement(self, name, annotation_of(node))
            return
        m = STATEMENT_NAME.match(name)
        if m is None or int(m.group(1)) >= len(self.fn.statements):
            raise CodegenError(f"isl AST calls unknown statement {name} of {self.fn.name}")
        k, init = int(m.group(1)), m.group(2) is not None
        st = self.fn.statements[k]
        dims = st.lhs if init else st.index_names
        args = [self.expr(call.get_op_arg(i + 1)) for i in range(call.get_op_n_arg() - 1)]
        if len(args) != len(dims):
            raise CodegenError(f"isl AST call {call.to_C_str()} has {len(args)} arguments, "
                               f"{name} has dims {list(dims)}")
        self.redirects = annotation_of(node) or {}
        try:
            env = dict(zip(dims, args, strict=True))
            self._emit_pinned(k, init, env, self._dynamic_registers() if self.partial else [])
        finally:
            self.redirects = {}
            self.pinned = {}

    def _dynamic_registers(self) -> list[tuple[object, int, int]]:
        """``(redirect key, coordinate, extent)`` of each register-buffer coordinate of the
        current statement that isl gave as an expression of more than its loop iterators."""
        out = []
        for key, (buf_name, index) in self.redirects.items():
            buf = self.owner.promotion.buffer(buf_name)
            if buf.space != "private":
                continue
            lead = len(index) - len(buf.box.extent)
            for p, e in enumerate(index):
                if any(not _REGISTER_ID.match(x) for x in _ids(e)):
                    out.append((key, p, buf.box.extent[p - lead] if p >= lead else buf.stages))
        return out

    def _emit_pinned(self, k: int, init: bool, env: dict, dynamic: list) -> None:
        """Emit statement ``k``, each register coordinate of ``dynamic`` one case per value:
        in a partial tile isl may give one in the thread ids (a padded convolution's border
        column, `affine.domain_guard`), and a computed index would put the whole register
        tile in local memory; under a switch every register has a constant address again."""
        if not dynamic:
            emit_statement(self, k, init, env)
            return
        (key, p, extent), rest = dynamic[0], dynamic[1:]
        b = self.builder
        done = b.append_basic_block("reg.done")
        cases = [b.append_basic_block(f"reg.{value}") for value in range(extent)]
        # a slot (0 .. extent - 1) by construction: the last is the default (a trap made ptxas spill)
        switch = b.switch(self.expr(self.redirects[key][1][p]), cases[-1])
        for value, case in enumerate(cases):
            if value < extent - 1:
                switch.add_case(ir.Constant(I64, value), case)
            b.position_at_end(case)
            self.pinned.setdefault(key, {})[p] = value
            self._emit_pinned(k, init, env, rest)
            b.branch(done)
        del self.pinned[key][p]
        b.position_at_end(done)

    def redirect(self, key: object) -> ir.Value | None:
        """The buffer element an access of the current statement instance goes to (promotion,
        `poly.promotion`), or None: the access goes to the tensor in global memory."""
        hit = self.redirects.get(key)
        if hit is None:
            return None
        buf_name, index = hit
        pinned = self.pinned.get(key, {})
        return self.buffer_element(buf_name, [ir.Constant(I64, pinned[p]) if p in pinned
                                              else self.expr(e) for p, e in enumerate(index)])

    def buffer_element(self, buf_name: str, local: list[ir.Value]) -> ir.Value:
        buf = self.owner.promotion.buffer(buf_name)
        base = self.target.buffer_base(self, buf)
        b = self.builder
        terms = list(zip(local[-len(buf.box.extent):], buf.strides(), strict=True))
        if buf.stages > 1:  # the stage coordinate comes first
            terms.insert(0, (local[0], buf.stage_slots))
        off: ir.Value = ir.Constant(I64, 0)
        for d, (v, stride) in enumerate(terms):
            term = v if stride == 1 else b.mul(v, ir.Constant(I64, stride))
            off = term if d == 0 else b.add(off, term)
        return self.builder.gep(base, [ir.Constant(I64, 0), off], inbounds=True)


_REGISTER_ID = re.compile(r"c[0-9]+\Z")  # loop iterators (register loops are unrolled)


def _ids(e: isl.AstExpr) -> list[str]:
    """The names of the identifiers ``e`` reads."""
    kind = e.get_type()
    if kind == isl.ast_expr_type.id:
        return [e.get_id().get_name()]
    if kind == isl.ast_expr_type.op:
        return [x for i in range(e.get_op_n_arg()) for x in _ids(e.get_op_arg(i))]
    return []


# ---------------------------------------------------------------- the module


class Lowerer:
    def __init__(self, fn: tc.Function, target: Target, sizes: Mapping[str, int], name: str):
        self.fn, self.target, self.name = fn, target, name
        self.sizes = {k: int(v) for k, v in sizes.items() if k in fn.sizes}
        self.module = ir.Module(name=name)
        self.gathers: list[GatherSite] = []
        self.promotion = None  # poly.promotion.Promotion of the compiled state, if any
        self._param_space = f"[{', '.join(fn.sizes)}] -> {{ : }}"
        # host groups of the same code share a body (`shared_groups`): key -> (body, range)
        self.shared_bodies: dict[tuple, tuple[ir.Function, str | None]] = {}
        self.shared_ranges: dict[tuple[str, ...], str] = {}  # loop bounds -> range function
        self.on_chip: list[str] = []  # row-local temporaries (`host_rows`), in no group's ABI
        self._group_tensors: list[tuple[str, ...]] = []

    def gather_code(self, tensor: str, statement: int, span: Span | None, dim: int = -1) -> int:
        self.gathers.append(GatherSite(tensor, statement, span, dim))
        return len(self.gathers)

    def extent_value(self, f: _Function, size: tc.SizeExpr) -> ir.Value:
        params = size.params
        if all(p in self.sizes for p in params):
            return ir.Constant(I64, size.evaluate(self.sizes))
        pa = size.pw_aff()
        build = isl.AstBuild.from_context(isl.Set.read_from_str(pa.get_ctx(), self._param_space))
        return isl_expr(f.entry, build.expr_from_pw_aff(pa), f.param)

    def lower(self, ast: isl.AstNode) -> LoweredModule:
        nodes = top_level_groups(ast)
        self._group_tensors = [group_tensors(self.fn, node, self.promotion) for node in nodes]
        groups = [self.group(g, node) for g, node in enumerate(nodes)]
        return LoweredModule(self.module, tuple(groups), tuple(self.gathers),
                             tuple(t.name for t in self.fn.tensors), self.fn.sizes,
                             tuple(t.name for t in self.fn.temporaries if t.name in self.on_chip))

    def row_local(self, g: int, node: isl.AstNode, loop: isl.AstNode | None) -> dict[str, int]:
        """The temporaries group ``g`` keeps in a stack row (`host_rows`; targets with
        `Target.row_local_temporaries` only)."""
        if not self.target.row_local_temporaries or self.promotion is not None:
            return {}
        elsewhere = {t for h, names in enumerate(self._group_tensors) if h != g for t in names}
        return row_local_temporaries(self.fn, node, loop, elsewhere, self.sizes)

    def new_body(self, name: str, tensors: tuple[str, ...] | None = None) -> ir.Function:
        """The internal, always-inlined body ``{name}.body(tensors..., sizes, lo, hi, err)``:
        one noalias pointer per tensor (the target's address space; ``tensors``: only those,
        by name, else all of the function's) except the ``shared_tensors`` of the kernel being
        built (`communicated_tensors`), then the group ABI."""
        names = tuple(t.name for t in self.fn.tensors) if tensors is None else tensors
        nbuf = len(names)
        body_ty = ir.FunctionType(ir.VoidType(), [self.target.pointer] * nbuf + [PTR, I64, I64, PTR])
        body = ir.Function(self.module, body_ty, f"{name}.body")
        body.linkage = "internal"
        body.attributes.add("alwaysinline")
        body.attributes.add("nounwind")
        shared = getattr(self, "shared_tensors", frozenset())
        for i, tensor in enumerate(names):
            body.args[i].name = tensor
            if tensor not in shared:
                body.args[i].add_attribute("noalias")
        for a, n in zip(body.args[nbuf:], ("sizes", "lo", "hi", "err"), strict=True):
            a.name = n
        return body

    def group(self, g: int, node: isl.AstNode) -> Group:
        name = f"{self.name}_{g}"
        tensors = (self._group_tensors[g] if g < len(self._group_tensors)
                   else group_tensors(self.fn, node, self.promotion))
        loop = find_parallel_loop(node)
        local = self.row_local(g, node, loop)
        # a body with stack rows is its own (the same code on other tensors may need buffers)
        key = group_key(self.fn, node, tensors) if self.promotion is None and not local else None
        shared = self.shared_bodies.get(key) if key is not None else None
        if shared is not None:  # the same code as an earlier group: call its body
            body, range_name = shared
            if "alwaysinline" in body.attributes:
                body.attributes.discard("alwaysinline")
                body.attributes.add("noinline")
            self.wrapper(name, body, tensors)
            return Group(name, range_name)
        body = self.new_body(name, tensors)
        walker = GroupWalker(self, body, parallel=loop is not None, tensors=tensors,
                             row_local=local)
        self.on_chip.extend(local)
        gathers = len(self.gathers)
        walker.node(node)
        walker.finish()
        self.wrapper(name, body, tensors)
        range_name = None
        if loop is not None and walker._chunked:
            # loops of the same bounds share one range function (n groups of one shape)
            bounds = tuple(e.to_C_str() for e in (loop.for_get_init(), loop.for_get_cond(),
                                                  loop.for_get_inc()))
            range_name = self.shared_ranges.get(bounds)
            if range_name is None:
                range_name = self.shared_ranges[bounds] = f"{name}_range"
                self.range_function(range_name, loop)
        if key is not None and len(self.gathers) == gathers:
            self.shared_bodies[key] = (body, range_name)
        return Group(name, range_name)

    def wrapper(self, name: str, body: ir.Function, tensors: tuple[str, ...]) -> None:
        """The group's entry point (the host ABI: all tensors' pointers in one array): loads
        the pointers of ``tensors`` and calls ``body`` with them."""
        fnty = ir.FunctionType(ir.VoidType(), [PTR, PTR, I64, I64, PTR])
        fn = ir.Function(self.module, fnty, name)
        buffers, sizes, lo, hi, err = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        ptrs = []
        for tensor in tensors:
            slot = b.gep(buffers, [ir.Constant(I64, self.fn.tensor_position(tensor))], inbounds=True,
                         source_etype=PTR)
            p = b.load(slot, typ=PTR, name=tensor)
            if self.target.pointer.addrspace != 0:
                p = b.addrspacecast(p, self.target.pointer)
            ptrs.append(p)
        b.call(body, [*ptrs, sizes, lo, hi, err])
        b.ret_void()

    def range_function(self, name: str, loop: isl.AstNode) -> None:
        fn = ir.Function(self.module, ir.FunctionType(ir.VoidType(), [PTR, PTR]), name)
        f = _Function(self, fn, fn.args[0])
        b = f.builder
        bound, inclusive = upper_bound(loop)  # type: ignore[misc]
        first = isl_expr(b, loop.for_get_init(), f.param)
        end = isl_expr(b, bound, f.param)
        if inclusive:
            end = b.add(end, ir.Constant(I64, 1))
        inc = isl_expr(b, loop.for_get_inc(), f.param)
        for i, v in enumerate((first, end, inc)):
            b.store(v, b.gep(fn.args[1], [ir.Constant(I64, i)], inbounds=True, source_etype=I64))
        f.finish()


def lower_function(fn: tc.Function, ast: isl.AstNode, target: Target,
                   sizes: Mapping[str, int] | None = None, name: str | None = None) -> LoweredModule:
    """Lower ``fn`` scheduled as ``ast`` for ``target`` (see the module docstring for the ABI)."""
    return Lowerer(fn, target, sizes or {}, name or fn.name).lower(ast)

