"""Digest of the PTX tcmlir generates for the whole test corpus (no GPU needed).

    python tools/ptx_digest.py

Prints one sha256 over the PTX of every corpus program (first size set) under the naive options,
a 1-D block of 256 threads, the default options of a call (`MappingOptions.default_for`) and the
contraction options (register tiles, shared/private promotion, cp.async). A change that prints
the same digest generates the same GPU code, so GPU results measured before it still hold; a
different digest means the GPU tests must run again. Last GPU-verified digest (the code the H200
runs of 2026-12-01's second session tested — grid clamping, size-aware contraction tiles,
transposes through shared memory, row kernels with launch bounds and unrolled strides — after
every code-generating change of that session but the last):
986a7093f3e46c0414cc6baf2c5a60119327b4b74ac9d724e2c49cfffc2e187f
The last change (several contractions in one program, e.g. a two-layer MLP or a matmul's
gradient, get the contraction tiles) gives b2b0d99695e272e6d735ed5992ae41ccd2228ef8b33381fae4c1fb8e514bd0d9:
checked by the simulator and ptxas, and the matmul gradient on the H200 (tools/bench_grad.py),
but the GPU corpus has not run on it.
"""

from __future__ import annotations

import hashlib
import os
import sys

os.environ["TCMLIR_ALWAYS_COMPILE"] = "1"  # generate, do not read the artifact cache
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))


def main() -> int:
    import numpy as np
    from corpus.programs import CASES

    import tcmlir as tc

    digest = hashlib.sha256()
    for case in CASES:
        inputs = case.make_inputs(np.random.default_rng(0), **case.sizes[0])
        fn = tc.define(case.source, case.entry, target="cuda")
        for opts in (tc.MappingOptions.naive(), tc.MappingOptions.naive().map_to_threads(256),
                     None, tc.MappingOptions.cuda_contraction()):
            digest.update(fn.compile(*inputs, options=opts, target="cuda", arch="sm_90").ptx.encode())
    print(digest.hexdigest())
    return 0


if __name__ == "__main__":
    sys.exit(main())
