"""Digest of the PTX tcmlir generates for the whole test corpus (no GPU needed).

    python tools/ptx_digest.py

Prints one sha256 over the PTX of every corpus program (first size set) under the naive options,
a 1-D block of 256 threads, the default options of a call (`MappingOptions.default_for`) and the
contraction options (register tiles, shared/private promotion, cp.async). A change that prints
the same digest generates the same GPU code, so GPU results measured before it still hold; a
different digest means the GPU tests must run again. Last GPU-verified digest (2026-12-01, fifth
session, code at a169062: the H200's run 19 ran memcheck on the corpus, racecheck and
synccheck on the reductions and the launch-plan, split-K and tuner GPU tests on it; run 18 ran
every group of `tools/gpu-session.sh tests` on e20d19d, which differs from it only in the copy
of scattered tile rows, reverted since; `test_mixed_rows.py` ran past its time limit there):
d1915ffe2a9561fc289dc05ed5df8ad74fa22550bf149591ae38af7f456f5aab
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
