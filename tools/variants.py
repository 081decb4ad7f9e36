"""GPU: time option variants of one benchmark case beside PyTorch, checking each result.

    python tools/variants.py CASE 'EXPR' ['EXPR' ...] [--runs 20]

CASE is a name prefix of a `tools/bench.py` case (its sizes and torch reference are used);
each EXPR is a Python expression for `MappingOptions`, evaluated with ``MO`` =
`tcmlir.MappingOptions` and ``D`` = the case's default options at its sizes, e.g.
``'D.tile(1, 32, 32).map_to_threads(32, 32)'``. For each variant: the error against torch, the
median time (CUDA events), the ratio to torch and the fraction of the roofline ceiling. A
variant that fails to compile or gives a wrong result is reported and the others go on. Used to
choose defaults from measurements; needs a GPU and torch.
"""

from __future__ import annotations

import argparse
import statistics
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench import COPY_BW, FP32_FLOPS, cases, time_cuda


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("case")
    ap.add_argument("exprs", nargs="+")
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args(argv)
    import torch

    import tcmlir as tc

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    case = next(c for c in cases(False) if c.name.startswith(args.case))
    torch.manual_seed(0)
    inputs = case.make(torch)
    ref = case.torch_fn(torch, *inputs)
    t_torch = time_cuda(torch, lambda: case.torch_fn(torch, *inputs))
    ceiling = max(case.flops / FP32_FLOPS, case.bytes / COPY_BW)
    fn = tc.define(case.tc, target="cuda")
    from tcmlir.binding import bind_sizes

    sizes = bind_sizes(fn.ir, [tuple(x.shape) for x in inputs])
    # D: what a call on these inputs uses (the defaults depend on the sizes)
    env = {"MO": tc.MappingOptions, "D": tc.MappingOptions.default_for(fn, "cuda", sizes),
           "tc": tc}
    print(f"{case.name}: torch {t_torch * 1e3:.3f} ms, ceiling {ceiling * 1e3:.3f} ms", flush=True)
    for expr in args.exprs:
        try:
            opts = eval(expr, env)  # a developer's command line
            kernel = fn.compile(*inputs, options=opts)
            out = kernel.launch(*inputs)
            torch.cuda.synchronize()
            err = float((out - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
            t = statistics.median(kernel.benchmark(*inputs, runs=args.runs))
            grids = [(k.grid, k.block) for k in getattr(kernel.runner, "image", None).kernels] \
                if hasattr(kernel.runner, "image") else []
            flag = "" if err < 1e-3 else "  WRONG"
            print(f"  {expr:<70} {t * 1e3:9.3f} ms = {t_torch / t:6.2f}x torch, "
                  f"{ceiling / t:5.0%} of ceiling, err {err:.1e}{flag} {grids}", flush=True)
        except Exception as exc:  # noqa: BLE001 - report and go on
            print(f"  {expr:<70} FAILED {type(exc).__name__}: {str(exc).splitlines()[0][:120]}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
