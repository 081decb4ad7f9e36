"""Digest of the PTX tcmlir generates for the whole test corpus (no GPU needed).

    python tools/ptx_digest.py

Prints one sha256 over the PTX of every corpus program (first size set) under the naive options,
a 1-D block of 256 threads, the default options of a call (`MappingOptions.default_for`) and the
contraction options (register tiles, shared/private promotion, cp.async). A change that prints
the same digest generates the same GPU code, so GPU results measured before it still hold; a
different digest means the GPU tests must run again. Last GPU-verified digest (the code the H200
runs of 2026-12-01's third session tested with `tools/gpu-session.sh tests sanitize` — 128-bit
accesses with the alignment specialisation, split-K, map-mixed, the reduction combine without
offsets — at commit 5254a01):
2bb5ccbf4e6e29ae08e56e0e1ca5581bb05d98510297c9c645176bfc4f09000a
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
