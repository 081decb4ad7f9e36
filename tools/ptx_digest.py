"""Digest of the PTX tcmlir generates for the whole test corpus (no GPU needed).

    python tools/ptx_digest.py
    python tools/ptx_digest.py --bench [CASE-PREFIX ...]

``--bench``: instead, one digest per case of `tools/bench.py` at its full sizes under the
default options, with its compile time (large promoted kernels, which the corpus's small sizes
do not reach: a change that keeps these digests keeps the benchmarked GPU code).

Prints one sha256 over the PTX of every corpus program (first size set) under the naive options,
a 1-D block of 256 threads, the default options of a call (`MappingOptions.default_for`) and the
contraction options (register tiles, shared/private promotion, cp.async). A change that prints
the same digest generates the same GPU code, so GPU results measured before it still hold; a
different digest means the GPU tests must run again. Last GPU-verified digest (2026-12-02,
seventh session, code at 4192532: the H200's run 25/26 ran every group of
`tools/gpu-session.sh tests`, memcheck on the corpus, racecheck and synccheck on the
reductions; the random-program and 600x4096 mixed-rows failures there were a compile error
and a compile hang, fixed since without changing this digest; first verified in the fifth
session at a169062):
d1915ffe2a9561fc289dc05ed5df8ad74fa22550bf149591ae38af7f456f5aab
"""

from __future__ import annotations

import hashlib
import os
import sys

os.environ["TCMLIR_ALWAYS_COMPILE"] = "1"  # generate, do not read the artifact cache
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))


def bench_digests(prefixes: list[str]) -> int:
    """Per benchmark case: the PTX's sha256 (16 hex digits) and the compile's seconds."""
    import time
    import types

    import numpy as np

    import tcmlir as tc

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench import cases

    def zeros(*shape: object, device: object = None) -> np.ndarray:  # torch.randn's signature
        return np.zeros(shape[0] if len(shape) == 1 and isinstance(shape[0], tuple) else shape,
                        np.float32)

    fake_torch = types.SimpleNamespace(randn=zeros)
    for case in cases(False):
        if prefixes and not any(case.name.startswith(p) for p in prefixes):
            continue
        fn = tc.define(case.tc, target="cuda")
        start = time.perf_counter()
        ptx = fn.compile(*case.make(fake_torch), arch="sm_90").ptx
        print(f"{case.name:34} {hashlib.sha256(ptx.encode()).hexdigest()[:16]} "
              f"{time.perf_counter() - start:6.1f} s", flush=True)
    return 0


def main() -> int:
    if sys.argv[1:2] == ["--bench"]:
        return bench_digests(sys.argv[2:])
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
