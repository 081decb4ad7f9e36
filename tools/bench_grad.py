"""Forward + backward benchmark: tcmlir torch ops with derived gradients beside PyTorch eager.

    python tools/bench_grad.py [--device cuda|cpu] [--quick] [--only NAME,...] [--json OUT]
                               [--mixed-rows fused|kernels]

For matmul, softmax and layernorm (float32), times the forward alone and forward + backward
(the derived gradient program, `tcmlir.grad`) of a `tcmlir.torch.op`, and the same two for
the PyTorch eager equivalent, and prints the ratios (tcmlir / torch: below 1 is faster), after
checking the outputs and the gradients against torch's; ``backward:`` names the gradient
program's default mapping and its kernel count (the layernorm with scale and shift:
``map-mixed, 3 kernels``).
Median of many runs after warm-up; CUDA events on the GPU (inputs larger than L2 with the
default sizes), a wall clock on the CPU (``--device cpu``, small sizes: a smoke run). Needs
torch (``pip install tcmlir[torch]``).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Case:
    name: str
    tc: str
    make: Callable[[Any, str], tuple]        # (torch, device) -> inputs (requiring grad)
    torch_fn: Callable[..., Any]             # torch's equivalent on the same inputs


def cases(torch: Any, device: str, quick: bool) -> list[Case]:
    big = device == "cuda"
    s = 4 if quick else 1
    M = N = K = (4096 if big else 256) // s
    R, D = (16384 if big else 512) // s, (4096 if big else 256)
    F = torch.nn.functional

    def rand(*shape):
        return torch.randn(*shape, device=device, dtype=torch.float32, requires_grad=True)

    return [
        Case(f"matmul {M}x{K}x{N}",
             "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }",
             lambda t, d: (rand(M, K), rand(K, N)), lambda a, b: a @ b),
        Case(f"softmax {R}x{D}", """
def softmax(float(N, D) I) -> (O) {
    mx(n) max=! I(n, d)
    e(n, d) = exp(I(n, d) - mx(n))
    s(n) +=! e(n, d)
    O(n, d) = e(n, d) / s(n)
}""", lambda t, d: (rand(R, D),), lambda x: torch.softmax(x, 1)),
        Case(f"layernorm {R}x{D}", """
def layernorm(float(T, D) I, float(D) G, float(D) Bt) -> (O) {
    mean(t) +=! I(t, d) / D
    c(t, d) = I(t, d) - mean(t)
    var(t) +=! c(t, d) * c(t, d) / D
    O(t, d) = c(t, d) * rsqrt(var(t) + 1e-5) * G(d) + Bt(d)
}""", lambda t, d: (rand(R, D), rand(D), rand(D)),
             lambda x, g, b: F.layer_norm(x, (x.shape[1],), g, b, eps=1e-5)),
    ]


def timer(torch: Any, device: str, fn: Callable[[], Any], runs: int, warmup: int = 5) -> float:
    """Median seconds per call of ``fn``."""
    for _ in range(warmup):
        fn()
    times = []
    if device == "cuda":
        for _ in range(runs):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
    else:
        for _ in range(runs):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def mixed_factory(mixed: str, target: str) -> Callable[[Any, Any], Any]:
    """An options factory: the call's default options, with ``mixed_rows=mixed`` where the
    default maps a mix of rows and column reductions (the layernorm gradient)."""
    import dataclasses

    import tcmlir as tc
    from tcmlir.binding import bind_sizes

    def factory(fn: Any, inputs: Any) -> Any:
        sizes = bind_sizes(fn.ir, [tuple(getattr(x, "shape", ())) for x in inputs])
        opts = tc.MappingOptions.default_for(fn, target, sizes)
        return dataclasses.replace(opts, mixed_rows=mixed) if opts.mixed_rows else opts

    return factory


def measure(torch: Any, case: Case, device: str, runs: int, mixed: str = "") -> dict[str, float]:
    import tcmlir as tc
    import tcmlir.torch as tt

    target = "cuda" if device == "cuda" else "cpu"
    factory = mixed_factory(mixed, target) if mixed else None
    op = tt.op(tc.define(case.tc, target=target, options_factory=factory),
               name=f"bench_{case.name.split()[0]}_{mixed or 'default'}")
    inputs = case.make(torch, device)
    seed = torch.randn_like(case.torch_fn(*inputs))
    # the first call compiles the forward (and backward) programs: warm-up, not timed
    with torch.no_grad():
        ours = op(*inputs)
        ref = case.torch_fn(*inputs)
        err = float((ours - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
    if err > 1e-3:
        raise SystemExit(f"{case.name}: tcmlir differs from torch (max rel err {err:.2e})")
    # the gradients too: the derived program under its default mapping (map-mixed for the
    # layernorm with scale and shift) must agree with torch's autograd
    ours_g = torch.autograd.grad(op(*inputs), inputs, seed)
    ref_g = torch.autograd.grad(case.torch_fn(*inputs), inputs, seed)
    gerr = max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
               for a, b in zip(ours_g, ref_g, strict=True))
    if gerr > 1e-3:
        raise SystemExit(f"{case.name}: tcmlir's gradient differs from torch's (max rel err {gerr:.2e})")

    def fwd(f):
        def run():
            with torch.no_grad():
                f(*inputs)
        return run

    def fwd_bwd(f):
        def run():
            torch.autograd.grad(f(*inputs), inputs, seed)
        return run

    return {
        "tcmlir_fwd": timer(torch, device, fwd(op), runs),
        "torch_fwd": timer(torch, device, fwd(case.torch_fn), runs),
        "tcmlir_fwd_bwd": timer(torch, device, fwd_bwd(op), runs),
        "torch_fwd_bwd": timer(torch, device, fwd_bwd(case.torch_fn), runs),
        "max_rel_err": err,
        "grad_max_rel_err": gerr,
        "backward": backward_mapping(case, [tuple(x.shape) for x in inputs], target, mixed),
    }


def backward_mapping(case: Case, shapes: list[tuple[int, ...]], target: str, mixed: str = "") -> str:
    """How the derived gradient program runs by default: its mapping pass and kernel count."""
    import numpy as np

    import tcmlir as tc
    from tcmlir.binding import bind_sizes
    from tcmlir.grad import derive

    fwd = tc.define(case.tc)
    grad = tc.define(derive(fwd.ir).source)
    sizes = bind_sizes(fwd.ir, shapes)
    args = [np.zeros(tuple(e.evaluate(sizes) for e in t.shape), t.dtype.numpy) for t in grad.ir.inputs]
    options = mixed_factory(mixed, target)(grad, args) if mixed else None
    kernel = grad.compile(*args, target=target, options=options)
    passes = re.findall(r"(?:^|,)([a-z-]+)(?=\{|,|$)", kernel.options.to_pipeline(target))
    last = next((p for p in passes if p in ("map-mixed", "map-rows")), passes[-1])
    if target != "cuda":
        return last
    return f"{last}, {kernel.schedule.count('kernel grid=')} kernels"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None,
                    help="default: cuda when torch sees a GPU, else cpu")
    ap.add_argument("--quick", action="store_true", help="smaller sizes")
    ap.add_argument("--only", default="", help="comma list of case-name prefixes")
    ap.add_argument("--runs", type=int, default=None, help="timed runs per measurement")
    ap.add_argument("--json", default=None, help="write the results to this file")
    ap.add_argument("--mixed-rows", choices=("fused", "kernels"), default="",
                    help="the mapping of gradients that mix rows and column reductions "
                         "(default: the default options')")
    args = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("tools/bench_grad.py needs torch: pip install 'tcmlir[torch]'", file=sys.stderr)
        return 2
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    runs = args.runs or (50 if device == "cuda" else 5)
    only = [p for p in args.only.split(",") if p]
    results = {}
    print(f"device {device}; median of {runs} runs; ratio = tcmlir / torch eager")
    print(f"{'case':<26} {'fwd ms':>9} {'torch':>9} {'ratio':>6}   "
          f"{'fwd+bwd ms':>10} {'torch':>9} {'ratio':>6}")
    for case in cases(torch, device, args.quick):
        if only and not any(case.name.startswith(p) for p in only):
            continue
        r = measure(torch, case, device, runs, args.mixed_rows)
        results[case.name] = r
        print(f"{case.name:<26} {r['tcmlir_fwd'] * 1e3:>9.3f} {r['torch_fwd'] * 1e3:>9.3f} "
              f"{r['tcmlir_fwd'] / r['torch_fwd']:>6.2f}   {r['tcmlir_fwd_bwd'] * 1e3:>10.3f} "
              f"{r['torch_fwd_bwd'] * 1e3:>9.3f} {r['tcmlir_fwd_bwd'] / r['torch_fwd_bwd']:>6.2f}"
              f"   backward: {r['backward']}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"device": device, "runs": runs, "results": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
