"""NVPTX code generation without a GPU: every corpus program compiles to PTX that ptxas accepts.

For each corpus case (first size assignment) and a few mapping option sets, ``fn.compile(...,
target="cuda", arch="sm_90")`` must give one ``.entry`` per kernel mark of the mapped schedule,
link libdevice only when a math built-in needs it, and pass ``ptxas -arch=sm_90`` (skipped when
ptxas is absent). Also: the kernel ABI, the sreg reads of mapped kernels, unmapped trees and
kernel-mark parsing.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from corpus.programs import CASES, case_by_name

import tcmlir as tc
from tcmlir.codegen.nvptx import (
    CudaKernelImage,
    compile_cuda,
    compile_cuda_from_ast,
    find_kernels,
    parse_kernel_mark,
)
from tcmlir.codegen.ptx_tools import find_ptxas, ptxas_check
from tcmlir.errors import CodegenError
from tcmlir.poly.loops import build_ast
from tcmlir.poly.state import CompileState

OPTION_SETS = {
    "naive": tc.MappingOptions.naive(),
    "odd-block": tc.MappingOptions.naive().map_to_threads(7, 5).map_to_blocks(3, 2),
    "1d-block": tc.MappingOptions.naive().map_to_threads(128).map_to_blocks(64),
    "3d-block": tc.MappingOptions.naive().map_to_threads(8, 4, 2).map_to_blocks(5, 3, 2),
}
_ENTRY = re.compile(r"\.entry\s+(\w+)")


def _inputs(case):
    return case.make_inputs(np.random.default_rng(0), **case.sizes[0])


def _compile(case, options=None) -> tc.Kernel:
    fn = tc.define(case.source, case.entry)
    return fn.compile(*_inputs(case), target="cuda", arch="sm_90", options=options)


def _kernel_marks(kernel: tc.Kernel) -> list[str]:
    return re.findall(r"kernel grid=[\d,]+ block=[\d,]+", kernel.schedule)


def _image(kernel: tc.Kernel) -> CudaKernelImage:
    return kernel.runner.image


def _ptxas(ptx: str) -> None:
    if find_ptxas() is not None:
        ptxas_check(ptx, "sm_90")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_corpus_ptx(case):
    kernel = _compile(case)
    image = _image(kernel)
    marks = _kernel_marks(kernel)
    assert marks, "the mapped schedule has no kernel marks"
    entries = _ENTRY.findall(kernel.ptx)
    assert entries == [k.name for k in image.kernels]
    assert len(entries) == len(marks)
    for k, mark in zip(image.kernels, marks, strict=True):
        assert parse_kernel_mark(mark) == (k.grid, k.block)
    # libdevice only where a math built-in needs it: its functions are linked in, none left over
    assert ("__nv_" in image.llvm_ir) == image.uses_libdevice
    assert "__nv_" not in kernel.ptx  # inlined (or dropped), never an external call
    assert "__nvvm_reflect" not in kernel.ptx
    if not image.uses_libdevice:
        assert ".func" not in kernel.ptx
    _ptxas(kernel.ptx)


@pytest.mark.parametrize("opts", list(OPTION_SETS), ids=list(OPTION_SETS))
@pytest.mark.parametrize("name", ["matmul", "softmax_temporaries", "conv2d_bias", "embedding_bag",
                                  "group_conv", "reduce_int32", "float16_annotated", "transpose"])
def test_option_sets_ptx(name, opts):
    kernel = _compile(case_by_name(name), OPTION_SETS[opts])
    image = _image(kernel)
    assert len(_ENTRY.findall(kernel.ptx)) == len(image.kernels) == len(_kernel_marks(kernel))
    _ptxas(kernel.ptx)


def test_kernel_abi_and_sregs():
    case = case_by_name("matmul")
    fn = tc.define(case.source)
    inputs = case.make_inputs(np.random.default_rng(0), M=33, K=17, N=45)
    kernel = fn.compile(*inputs, target="cuda", arch="sm_90", options=OPTION_SETS["odd-block"])
    image = _image(kernel)
    fn = kernel.function.ir
    assert image.arg_order == tuple(t.name for t in fn.tensors)
    assert image.sizes_order == tuple(fn.sizes)
    assert image.arch == "sm_90" and ".target sm_90" in kernel.ptx
    # the kernel takes the tensors it touches; sizes fixed at compile time are folded, and a
    # parametric kernel takes those it reads
    parametric = tc.define(case.source).compile(*inputs, target="cuda", arch="sm_90",
                                                options=OPTION_SETS["odd-block"].with_parametric())
    for compiled, sizes in ((kernel, ()), (parametric, ("M", "N", "K"))):
        k0 = _image(compiled).kernels[0]
        assert k0.tensors == image.arg_order and sorted(k0.sizes) == sorted(sizes)
        params = re.search(rf"\.entry\s+{k0.name}\((.*?)\)", compiled.ptx, re.S).group(1)
        kinds = re.findall(r"\.param\s+\.u64(\s+\.ptr\s+\.global)?", params)
        ntensor, nsize = len(k0.tensors), len(k0.sizes)
        assert len(kinds) == ntensor + nsize + 1 == k0.parameter_count
        assert all(kinds[i] for i in range(ntensor))                       # global pointers
        assert not any(kinds[ntensor + i] for i in range(nsize))           # i64 sizes
        assert kinds[-1]                                                   # the error flag
    assert re.search(r"%(ctaid|tid)\.x", kernel.ptx)
    assert "ptx_kernel" in kernel.llvm_ir


def test_libdevice_linked_only_when_used():
    plain = _image(_compile(case_by_name("matmul")))
    mathy = _image(_compile(case_by_name("unary_builtins")))
    assert not plain.uses_libdevice
    assert mathy.uses_libdevice and "__nv_" in mathy.llvm_ir
    assert len(mathy.ptx) < 400_000  # linkonce_odr: the unused libdevice functions are dropped


def test_libdevice_subset_gives_the_ptx_of_the_whole_library():
    """Only the functions a module calls (and theirs) are parsed from libdevice (issue 31):
    the PTX is the one linking the whole library with unused definitions dropped gave."""
    import llvmlite.binding as llvm

    from tcmlir.codegen import nvptx_link

    if nvptx_link.find_libdevice() is None:
        pytest.skip("no libdevice")
    text = _image(_compile(case_by_name("unary_builtins"))).llvm_ir
    tm = nvptx_link.nvptx_target_machine()
    names = frozenset(re.findall(r"declare [^@]*@\"?(__nv_\w+)", text))
    subset = llvm.parse_bitcode(nvptx_link._libdevice_subset(names, str(tm.target_data)))
    defined = {f.name for f in subset.functions if not f.is_declaration}
    assert names and names <= defined and len(defined) < 100  # of libdevice's ~500

    def whole(mod: llvm.ModuleRef, tm: llvm.TargetMachine) -> None:  # the former linking
        lib = llvm.parse_bitcode(nvptx_link._libdevice_bitcode())
        lib.triple, lib.data_layout = nvptx_link.TRIPLE, str(tm.target_data)
        for f in lib.functions:
            if not f.is_declaration:
                f.linkage = llvm.Linkage.linkonce_odr
        mod.link_in(lib)

    ours = tm.emit_assembly(nvptx_link._optimized(text, tm))
    original = nvptx_link._link_libdevice
    try:
        nvptx_link._link_libdevice = whole
        theirs = tm.emit_assembly(nvptx_link._optimized(text, tm))
    finally:
        nvptx_link._link_libdevice = original
    assert ours == theirs


def test_gather_kernel_flagged():
    image = _image(_compile(case_by_name("embedding_gather")))
    assert image.gathers and any(k.has_gathers for k in image.kernels)
    assert not any(k.has_gathers for k in _image(_compile(case_by_name("matmul"))).kernels)


def test_unmapped_tree_is_refused():
    fn = tc.define(case_by_name("matmul").source)
    state = CompileState.initial(fn.ir, {"M": 4, "K": 5, "N": 6})
    with pytest.raises(CodegenError, match="map-to-blocks/map-to-threads"):
        compile_cuda(state, "sm_90")


def test_hand_marked_tree_one_thread():
    """A kernel mark with grid=block=1 over the unmapped tree: one thread runs everything."""
    import islpy as isl

    fn = tc.define(case_by_name("softmax_temporaries").source)
    state = CompileState.initial(fn.ir, None)
    sched = state.scop.schedule
    node = sched.get_root().child(0).insert_mark(isl.Id("kernel grid=1,1,1 block=1,1,1",
                                                        context=sched.get_ctx()))
    ast = isl.AstBuild.from_context(state.scop.context).node_from_schedule(node.get_schedule())
    assert len(find_kernels(ast)) == 1
    image = compile_cuda_from_ast(fn.ir, ast)
    assert [k.grid for k in image.kernels] == [(1, 1, 1)]
    _ptxas(image.ptx)


def test_build_ast_of_mapped_state_has_kernels():
    from tcmlir.compiler import lower

    case = case_by_name("matmul")
    fn = tc.define(case.source)
    state = lower(fn.ir, case.sizes[0], tc.MappingOptions.naive(), "cuda")
    assert find_kernels(build_ast(state))


@pytest.mark.parametrize("text, expected", [
    ("kernel grid=3,2,1 block=7,5,1", ((3, 2, 1), (7, 5, 1))),
    ("kernel grid=1,1,1 block=128,1,1", ((1, 1, 1), (128, 1, 1))),
    ("kernel", None), ("blocks[256,256]", None), ("kernel grid=1,1 block=1,1,1", None),
])
def test_parse_kernel_mark(text, expected):
    assert parse_kernel_mark(text) == expected


def test_bad_arch():
    with pytest.raises(CodegenError, match="sm_90"):
        _compile(case_by_name("transpose")).function.compile(
            *_inputs(case_by_name("transpose")), target="cuda", arch="compute_90")


def test_grid_launches_only_blocks_with_work():
    """The grid option is an upper bound: 16 tiles of a specialised kernel launch 16 blocks,
    not a 1024 x 1024 grid of which all but 16 exit at once; a parametric kernel keeps it."""
    fn = tc.define("def tmm(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,k) * B(n,k) }")
    a, b = np.ones((128, 64), np.float32), np.ones((1024, 64), np.float32)
    opts = tc.MappingOptions.cuda_contraction()  # tiles 128 x 64, grid (1024, 1024)
    kernel = fn.compile(a, b, target="cuda", arch="sm_90", options=opts)
    assert [k.grid for k in _image(kernel).kernels] == [(16, 1, 1)]
    naive = fn.compile(a, b, target="cuda", arch="sm_90", options=tc.MappingOptions.naive())
    assert all(g <= 1024 for k in _image(naive).kernels for g in k.grid)
    param = fn.compile(a, b, target="cuda", arch="sm_90", options=opts.with_parametric())
    assert [k.grid for k in _image(param).kernels] == [(1024, 1024, 1)]
