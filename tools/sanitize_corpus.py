"""Run the test corpus once on target="cuda", for compute-sanitizer.

    compute-sanitizer --tool memcheck --error-exitcode 1 python tools/sanitize_corpus.py
    compute-sanitizer --tool racecheck --error-exitcode 1 python tools/sanitize_corpus.py --tag reduction

Each program runs at its first corpus size under the naive options, a block that does not
divide the problem and the default options (and, for the row programs `map-rows` maps, 64
threads per row over 3 blocks); results are compared with the numpy reference so a sanitizer-clean run is
also a correct one. Prints one line per program and a summary; exits 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tag", default=None, help="only cases with this tag (e.g. reduction)")
    ap.add_argument("--only", default=None, help="comma list of case names")
    args = ap.parse_args(argv)
    from corpus import assert_outputs_close, run_program
    from corpus.programs import CASES

    import tcmlir as tc
    from tcmlir.gpu_defaults import reduction_defaults

    option_sets = {"naive": tc.MappingOptions.naive(),
                   "odd-block": tc.MappingOptions.naive().map_to_threads(7, 5).map_to_blocks(3, 2),
                   "default": None,  # MappingOptions.default_for: map-rows for row programs
                   # shared/register promotion with small tiles, so tiles and blocks repeat
                   "promo-small": tc.MappingOptions.cuda_contraction().tile(16, 16, 8)
                   .register_tiling(2, 2).map_to_blocks(3, 3)}
    rows_small = tc.MappingOptions().map_rows(64).map_to_blocks(3)  # rows wrap the grid
    failures = 0
    for case in CASES:
        if args.tag and args.tag not in case.tags:
            continue
        if args.only and case.name not in args.only.split(","):
            continue
        sizes = case.sizes[0]
        rng = np.random.default_rng(0)
        inputs = case.make_inputs(rng, **sizes)
        expected = run_program(tc.define(case.source, case.entry, target="numpy"), inputs)
        fn = tc.define(case.source, case.entry, target="cuda")
        sets = dict(option_sets)
        if reduction_defaults(tc.MappingOptions, fn.ir) is not None:
            sets["rows-64x3"] = rows_small
        for label, opts in sets.items():
            try:
                got = run_program(fn, inputs, options=opts)
                assert_outputs_close(got, expected, rtol=case.rtol, context=f"{case.name} {label}")
                status = "ok"
            except (AssertionError, tc.TCError) as exc:
                failures += 1
                status = f"FAILED {str(exc).splitlines()[0]}"
            print(f"{case.name:<28} {label:<9} {status}", flush=True)
    print(f"sanitize_corpus: {failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
