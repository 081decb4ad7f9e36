"""The DRAM bytes of each cuda kernel of a call's default mapping, against the program's minimal.

    python tools/kernel_bytes.py FILE --sizes N=16384,D=4096 [--grad] [--name ENTRY]

Compiles for cuda (no GPU needed) with the default options at ``--sizes`` (``--grad``: the
derived gradient program instead, as ``python -m tcmlir.dump --grad``) and prints, per kernel,
the bytes it must move (isl counts, `tcmlir.profile.counts.count_work`: the distinct elements it
reads that no write of the same kernel feeds, and those it writes that are outputs or that a
later kernel reads; temporaries kept on chip move nothing), then their sum and the minimal of
the whole program (its inputs read once, its outputs written once). Re-reads that caches
serve (a row's elements within a row kernel) are not counted: the figure is what DRAM must
move when each kernel reads its footprint once.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import tcmlir as tc
from tcmlir.profile.counts import count_work
from tcmlir.profile.structure import kernel_structures


def kernel_bytes(kernel: tc.Kernel) -> tuple[list[tuple[str, int]], int]:
    """([(kernel name, bytes)], the whole program's minimal bytes) of a compiled cuda
    ``kernel`` (`TCFunction.compile` with ``target="cuda"``) at its sizes."""
    sizes = {k: int(v) for k, v in kernel.sizes.items()}
    structures, state = kernel_structures(kernel)
    on_chip = set(kernel.runner.image.on_chip)
    in_memory = [t.name for t in state.fn.tensors if t.name not in on_chip]
    rows = []
    for i, ks in enumerate(structures):
        others = {s for j, o in enumerate(structures) if j != i for s in o.statements}
        reads: set[str] = set()
        for name in others:
            if not name.endswith("_init"):
                st = state.fn.statements[int(name[1:])]
                reads |= {e.tensor for e in tc.ir.walk(st.rhs) if isinstance(e, tc.ir.Read)}
        work = count_work(state.fn, sizes, ks.statements, global_tensors=in_memory,
                          outside_reads=reads)
        rows.append((ks.name, work.bytes))
    return rows, count_work(kernel.function.ir, sizes).bytes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("file")
    p.add_argument("--sizes", required=True, help="e.g. N=16384,D=4096")
    p.add_argument("--name", default=None)
    p.add_argument("--grad", action="store_true", help="the derived gradient program")
    p.add_argument("--options", default=None, help="MappingOptions JSON (default: the default)")
    args = p.parse_args(argv)
    with open(args.file) as f:
        text = f.read()
    sizes = {k: int(v) for k, v in (x.split("=") for x in args.sizes.split(","))}
    fn = tc.define(text, name=args.name)
    if args.grad:
        from tcmlir.grad import derive

        fn = tc.define(derive(fn.ir).source)
    options = tc.MappingOptions.from_json(args.options) if args.options else None
    inputs = [np.zeros(tuple(e.evaluate(sizes) for e in t.shape), t.dtype.numpy) for t in fn.ir.inputs]
    rows, minimal = kernel_bytes(fn.compile(*inputs, target="cuda", arch="sm_90", options=options))
    for name, b in rows:
        print(f"{name:<32} {b:>16,} B")
    total = sum(b for _, b in rows)
    print(f"{'kernels':<32} {total:>16,} B")
    print(f"{'minimal (the program)':<32} {minimal:>16,} B   kernels / minimal = {total / minimal:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
