"""Tensor-core fragment layouts: which lane of a warp holds which matrix element.

One place for the layouts of ``mma.sync.aligned.m16n8k16.row.col`` (f16/bf16 operands, f32
accumulators) and of ``ldmatrix.sync.aligned.m8n8.x4[.trans].b16``, as PTX's ISA documents
them. The code generator (`codegen/gpu_mma.py`) evaluates the same functions on LLVM values
(`Lane` arithmetic builds IR), and `simulate_warp_tile` evaluates them on integers with numpy,
so a wrong lane mapping fails a CPU test (`tests/test_mma.py`) before a GPU ever runs it.

Conventions: ``g = lane // 4`` (the group), ``t = lane % 4`` (the thread in the group).

* A fragment (16×16, row-major): register ``i`` (0..3) holds the pair ``e`` (0, 1) at row
  ``g + 8*(i % 2)``, column ``k = 2t + e + 8*(i // 2)``.
* B fragment (16×8, column-major): register ``i`` (0, 1) holds ``k = 2t + e + 8*i``, column ``g``.
* TF32 (``m16n8k8.row.col.tf32``, one 32-bit element per register): A (16×8) register ``i``
  holds row ``g + 8*(i % 2)``, k ``t + 4*(i // 2)``; B (8×8) register ``i`` holds k ``t + 4*i``,
  column ``g``. Stored k-major, a 32-bit element is two 16-bit units, so ``ldmatrix`` (non-
  ``.trans``) at the same lane addresses as the A and B fragments of 16-bit types loads exactly
  these registers; stored row-major, each lane reads its four (two) elements one by one.
* C/D fragment (16×8, f32): register ``i`` (0..3) holds row ``g + 8*(i // 2)``, column
  ``2t + i % 2``.
* ``ldmatrix .x4``: lane ``l`` gives the address of row ``l % 8`` of matrix ``l // 8`` (16
  contiguous bytes: 8 halves); register ``j`` of every lane then holds, of matrix ``j``, the
  pair at (row ``l // 4``, columns ``2(l % 4) + e``), or with ``.trans`` the pair at (rows
  ``2(l % 4) + e``, column ``l // 4``).

Operand tiles live in shared memory in one of two orders, chosen by which index of the operand
is contiguous in global memory (so the copies from global memory move 16 contiguous bytes):
``k-major`` (``[rows][k]``: k contiguous, read with ``ldmatrix``) or ``row-major`` (``[k][rows]``:
the row index contiguous, read with ``ldmatrix.trans``). `lane_row_address` gives the element
(storage row, storage column) whose 16 bytes a lane hands to ``ldmatrix`` for each case.
Storage is swizzled (`swizzle`): the 16-byte chunk of a row is XOR-ed with a few bits of the row,
so the eight rows one ``ldmatrix`` phase reads fall in eight different bank groups.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["MMA_K", "MMA_M", "MMA_N", "a_element", "a_element_tf32", "b_element", "b_element_tf32",
           "c_element", "lane_row_address", "ldmatrix_element", "simulate_warp_tile",
           "simulate_warp_tile_tf32", "swizzle", "swizzled_offset"]

MMA_M, MMA_N, MMA_K = 16, 8, 16
CHUNK = 8  # halves per 16-byte chunk (one ldmatrix row, one cp.async)


def a_element(lane: Any, reg: int, e: int) -> tuple[Any, Any]:
    """(row, k) of the A element lane ``lane`` holds in register ``reg``, half ``e``."""
    return lane // 4 + 8 * (reg % 2), (lane % 4) * 2 + e + 8 * (reg // 2)


def b_element(lane: Any, reg: int, e: int) -> tuple[Any, Any]:
    """(k, column) of the B element lane ``lane`` holds in register ``reg``, half ``e``."""
    return (lane % 4) * 2 + e + 8 * reg, lane // 4


def a_element_tf32(lane: Any, reg: int) -> tuple[Any, Any]:
    """(row, k) of the TF32 A element lane ``lane`` holds in register ``reg``."""
    return lane // 4 + 8 * (reg % 2), lane % 4 + 4 * (reg // 2)


def b_element_tf32(lane: Any, reg: int) -> tuple[Any, Any]:
    """(k, column) of the TF32 B element lane ``lane`` holds in register ``reg``."""
    return lane % 4 + 4 * reg, lane // 4


def c_element(lane: Any, reg: int) -> tuple[Any, Any]:
    """(row, column) of the accumulator lane ``lane`` holds in register ``reg``."""
    return lane // 4 + 8 * (reg // 2), (lane % 4) * 2 + reg % 2


def ldmatrix_element(lane: int, e: int, trans: bool) -> tuple[int, int]:
    """(row, column) within its 8×8 matrix of half ``e`` that ``ldmatrix`` puts in ``lane``."""
    if trans:
        return (lane % 4) * 2 + e, lane // 4
    return lane // 4, (lane % 4) * 2 + e


def lane_row_address(lane: Any, operand: str, k_major: bool) -> tuple[Any, Any]:
    """(storage row, storage column) of the 8 halves that ``lane`` points ``ldmatrix.x4`` at,
    relative to the fragment's corner: for ``a`` a 16(m)×16(k) A fragment (registers a0..a3),
    for ``b`` two 16(k)×8(n) B fragments side by side (registers b0, b1 of the first, then
    b0, b1 of the second). ``k_major`` storage is ``[rows][k]``, else ``[k][rows]``."""
    j = lane // 8     # the matrix this lane addresses (its register j)
    r = lane % 8      # the row of that matrix
    if operand == "a":  # matrix j: rows 8*(j % 2), k 8*(j // 2)
        return (8 * (j % 2) + r, 8 * (j // 2)) if k_major else (8 * (j // 2) + r, 8 * (j % 2))
    # operand b: matrix j: n-tile j // 2, k-half j % 2
    return (8 * (j // 2) + r, 8 * (j % 2)) if k_major else (8 * (j % 2) + r, 8 * (j // 2))


def swizzle(row: Any, chunks_per_row: int) -> Any:
    """The XOR applied to the 16-byte chunk index of storage row ``row``: eight consecutive rows
    read at one chunk land in eight different 16-byte slots of a 128-byte line."""
    if chunks_per_row >= 8:
        return row % 8
    group = 8 // chunks_per_row  # rows sharing one 128-byte line
    return (row // group) % chunks_per_row


def swizzled_offset(row: int, col: int, row_len: int) -> int:
    """Element offset of (row, col) in a swizzled tile of ``row_len`` halves per row."""
    chunks = row_len // CHUNK
    return row * row_len + ((col // CHUNK) ^ swizzle(row, chunks)) * CHUNK + col % CHUNK


def _store(tile: np.ndarray, k_major_rows: bool, row_len: int) -> np.ndarray:
    rows = tile.shape[0]
    flat = np.zeros(rows * row_len, tile.dtype)
    for r in range(rows):
        for c in range(tile.shape[1]):
            flat[swizzled_offset(r, c, row_len)] = tile[r, c]
    return flat


def _ldmatrix(flat: np.ndarray, row_len: int, addresses: list[tuple[int, int]], trans: bool
              ) -> np.ndarray:
    """regs[lane, j, e] loaded by ``ldmatrix.x4`` when lane l points at ``addresses[l]``."""
    regs = np.zeros((32, 4, 2), flat.dtype)
    for j in range(4):
        rows = [addresses[8 * j + r] for r in range(8)]
        mat = np.array([[flat[swizzled_offset(sr, sc + c, row_len)] for c in range(8)]
                        for sr, sc in rows])
        for lane in range(32):
            for e in range(2):
                regs[lane, j, e] = mat[ldmatrix_element(lane, e, trans)]
    return regs


def simulate_warp_tile(a: np.ndarray, b: np.ndarray, a_k_major: bool, b_k_major: bool,
                       swap: tuple[int, int] | None = None) -> np.ndarray:
    """One warp's ``D = A @ B`` for a 16×16 ``a`` and a 16×16 ``b`` (two n-tiles), computed the
    way the generated kernel does: the tiles stored swizzled in the chosen orders, fragments
    loaded by ``ldmatrix`` from the lanes' `lane_row_address`, one ``mma`` per n-tile by the
    fragment layouts. ``swap`` exchanges two A registers (a planted bug for the tests)."""
    a_store = a if a_k_major else a.T            # [m][k] or [k][m]
    b_store = b.T if b_k_major else b            # [n][k] or [k][n]
    a_len, b_len = a_store.shape[1], b_store.shape[1]
    a_flat, b_flat = _store(a_store, a_k_major, a_len), _store(b_store, b_k_major, b_len)
    a_regs = _ldmatrix(a_flat, a_len, [lane_row_address(lane, "a", a_k_major) for lane in range(32)],
                       trans=not a_k_major)
    b_regs = _ldmatrix(b_flat, b_len, [lane_row_address(lane, "b", b_k_major) for lane in range(32)],
                       trans=not b_k_major)
    if swap is not None:
        a_regs[:, [swap[0], swap[1]]] = a_regs[:, [swap[1], swap[0]]]
    d = np.zeros((16, 16), np.float64)
    for nt in range(2):
        full_a = np.zeros((16, 16))
        full_b = np.zeros((16, 8))
        for lane in range(32):
            for e in range(2):
                for i in range(4):
                    full_a[a_element(lane, i, e)] = a_regs[lane, i, e]
                for i in range(2):
                    full_b[b_element(lane, i, e)] = b_regs[lane, 2 * nt + i, e]
        acc = full_a @ full_b
        for lane in range(32):
            for i in range(4):
                r, c = c_element(lane, i)
                d[r, 8 * nt + c] = acc[r, c]
    return d


def simulate_warp_tile_tf32(a: np.ndarray, b: np.ndarray, a_k_major: bool, b_k_major: bool,
                            swap: tuple[int, int] | None = None) -> np.ndarray:
    """One warp's ``D = A @ B`` for a 16×8 float32 ``a`` and an 8×16 ``b`` (two n-tiles) the
    way the TF32 kernel computes it: the tiles stored swizzled as 16-bit units, k-major
    fragments loaded by ``ldmatrix`` from the 16-bit types' lane addresses and put together
    from their unit pairs, row-major ones read element by element, one ``m16n8k8`` per n-tile
    by the TF32 fragment layouts (products exact here: no TF32 rounding is modelled). ``swap``
    exchanges two A registers (a planted bug for the tests)."""
    def units(store: np.ndarray) -> np.ndarray:  # [rows][cols] float32 -> [rows][2 cols] u16
        return np.ascontiguousarray(store.astype(np.float32)).view(np.uint16)

    def element(flat: np.ndarray, row_len: int, row: int, col: int) -> np.float32:
        lo = flat[swizzled_offset(row, 2 * col, row_len)]
        hi = flat[swizzled_offset(row, 2 * col + 1, row_len)]
        return np.array([lo, hi], np.uint16).view(np.float32)[0]

    def regs_of(pairs: np.ndarray) -> np.ndarray:  # [lane, j, 2] u16 -> [lane, j] float32
        return np.ascontiguousarray(pairs.astype(np.uint16)).view(np.float32)[..., 0]

    a_store = units(a if a_k_major else a.T)      # [m][2k] or [k][2m]
    b_store = units(b.T if b_k_major else b)      # [n][2k] or [k][2n]
    a_len, b_len = a_store.shape[1], b_store.shape[1]
    a_flat, b_flat = _store(a_store, True, a_len), _store(b_store, True, b_len)
    if a_k_major:
        a_regs = regs_of(_ldmatrix(a_flat, a_len, [lane_row_address(lane, "a", True)
                                                   for lane in range(32)], trans=False))
    else:
        a_regs = np.array([[element(a_flat, a_len, *reversed(a_element_tf32(lane, i)))
                            for i in range(4)] for lane in range(32)])
    if b_k_major:
        b_regs = regs_of(_ldmatrix(b_flat, b_len, [lane_row_address(lane, "b", True)
                                                   for lane in range(32)], trans=False))
    else:
        b_regs = np.array([[element(b_flat, b_len, b_element_tf32(lane, i % 2)[0],
                                    8 * (i // 2) + b_element_tf32(lane, i % 2)[1])
                            for i in range(4)] for lane in range(32)])
    if swap is not None:
        a_regs[:, [swap[0], swap[1]]] = a_regs[:, [swap[1], swap[0]]]
    d = np.zeros((16, 16), np.float64)
    for nt in range(2):
        full_a, full_b = np.zeros((16, 8)), np.zeros((8, 8))
        for lane in range(32):
            for i in range(4):
                full_a[a_element_tf32(lane, i)] = a_regs[lane, i]
            for i in range(2):
                full_b[b_element_tf32(lane, i)] = b_regs[lane, 2 * nt + i]
        acc = full_a @ full_b
        for lane in range(32):
            for i in range(4):
                r, c = c_element(lane, i)
                d[r, 8 * nt + c] = acc[r, c]
    return d
