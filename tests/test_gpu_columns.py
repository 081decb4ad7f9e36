"""Column reductions with outputs outside the column index (`passes/map_columns.py`): a middle
or leading axis reduced (``S(a, c) +=! X(a, b, c)``, ``S(b, c) +=! X(a, b, c)``).

The outer output index goes to ``blockIdx.z`` (before: every thread walked every value of it
while the blocks split the reduction down to one value each, one atomic per element read).
Without a GPU: the launch shapes at the zoo's sizes, the PTX through ptxas, and the kernels run
on the host machine (`mma_emulator`) against the reference at awkward sizes, under the default
options and under options that leave fewer blocks than outer outputs (each thread then walks a
stride of them).
"""

from __future__ import annotations

import islpy as isl
import mma_emulator as emu
import numpy as np
import pytest

import tcmlir as tc
from tcmlir.binding import bind_sizes
from tcmlir.codegen.ptx_tools import find_ptxas, ptxas_check
from tcmlir.poly.gpu_mapping import kernel_marks

MID = "def ms(float(A,B,C) X) -> (S) { S(a,c) +=! X(a,b,c) }"
FIRST = "def fs(float(A,B,C) X) -> (S) { S(b,c) +=! X(a,b,c) }"
FOUR = "def f4({t}(A,B,R,C) X) -> (S) {{ S(a,b,c) {op}=! X(a,b,r,c) }}"


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setenv("TCMLIR_ALWAYS_COMPILE", "1")


def _grids(kernel: tc.Kernel) -> list[tuple[int, ...]]:
    tree = isl.Schedule.read_from_str(isl.Context(), kernel.schedule)
    return [m.grid for _, m in kernel_marks(tree)]


def _run(src: str, x: np.ndarray, options=None, rtol: float = 1e-5) -> tc.Kernel:
    """Compile ``src`` for cuda at ``x``'s sizes, run it on the host machine with its outputs
    poisoned (NaN), compare with the reference; the kernel."""
    fn = tc.define(src, target="cuda")
    kernel = fn.compile(x, target="cuda", arch="sm_90", options=options)
    if find_ptxas() is not None:
        ptxas_check(kernel.ptx, "sm_90")
    sizes = bind_sizes(fn.ir, [x.shape])
    (out,) = fn.ir.outputs
    shape = tuple(s.evaluate(sizes) for s in out.shape)
    poison = np.nan if np.issubdtype(out.dtype.numpy, np.floating) else 0x5A5A5A5A
    arrays = {fn.ir.inputs[0].name: x.copy(), out.name: np.full(shape, poison).astype(out.dtype.numpy)}
    emu.run_kernel(kernel, arrays, sizes)
    want = np.asarray(tc.define(src, target="numpy")(x), np.float64)
    got = arrays[out.name].astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * max(float(np.abs(want).max()), 1e-30),
                               err_msg=f"{src} at {sizes}")
    return kernel


@pytest.mark.parametrize(("src", "dims", "grid", "call"), [
    (MID, (256, 512, 256), (1, 4, 256), "S0(_bz, _tx, _by + 4 * c2)"),
    (FIRST, (512, 256, 256), (1, 4, 256), "S0(_bz, _tx, _by + 4 * c2)"),
    (MID, (512, 1000, 512), (1, 1, 512), "S0(_bz, _tx, c2)"),
])
def test_outer_outputs_go_to_blocks(src, dims, grid, call):
    """At the zoo's medium and large sizes: a block per outer output (``blockIdx.z``), the
    reduction split over ``blockIdx.y`` only as far as the SMs need (4 chunks of 128, one atomic
    per chunk; none at 512 x 512 outputs), instead of grid (1, 512) with one atomic per element."""
    fn = tc.define(src)
    sizes = dict(zip("ABC", dims, strict=True))
    opts = tc.MappingOptions.default_for(fn, "cuda", sizes)
    kernel = fn.compile(np.empty(dims, np.float32), target="cuda", arch="sm_90", options=opts)
    assert _grids(kernel) == [(1, 1, grid[2]), grid]  # the identity, then the sums
    assert call in kernel.loops
    ptx = kernel.ptx
    if find_ptxas() is not None:
        ptxas_check(ptx, "sm_90")
    assert ptx.count("atom.global.add.f32") == 1 and "ctaid.z" in ptx


@pytest.mark.parametrize("dims", [(3, 5, 7), (1, 9, 33), (7, 1, 1), (5, 300, 1), (2, 3, 70), (13, 2, 129)],
                         ids=str)
@pytest.mark.parametrize("src", [MID, FIRST], ids=["mid", "first"])
def test_outer_output_columns_on_the_host_machine(src, dims, rng):
    x = rng.standard_normal(dims).astype(np.float32)
    kernel = _run(src, x)
    assert "accumulate S0 atomic" in kernel.schedule


@pytest.mark.parametrize(("t", "op"), [("float", "+"), ("float", "max"), ("int32", "min"),
                                       ("double", "+"), ("int64", "+")])
def test_four_dimensional_columns_with_fewer_blocks_than_outer_outputs(t, op, rng):
    """``S(a, b, c) op=! X(a, b, r, c)``: the widest outer output index on ``blockIdx.z``; with a
    grid of 3 blocks each thread walks every third value of it (and every ``a``)."""
    src = FOUR.format(t=t, op=op)
    dtype = {"float": np.float32, "double": np.float64, "int32": np.int32, "int64": np.int64}[t]
    x = (rng.standard_normal((3, 7, 11, 20)) * 50).astype(dtype)
    kernel = _run(src, x)
    assert max(g[2] for g in _grids(kernel)) == 7
    opts = tc.MappingOptions().map_rows(32).map_to_blocks(3)
    kernel = _run(src, x, options=opts)
    assert max(g[2] for g in _grids(kernel)) == 3
    assert "_bz + 3 * c1" in kernel.loops  # b = _bz, _bz + 3, ... in one thread
