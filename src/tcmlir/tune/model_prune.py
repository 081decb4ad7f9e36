"""Candidates the cost model calls hopeless are not compiled (issue 28: every tuner candidate
pays a compile of 1-10 s).

The register-tiled contraction kernel has a model (`contraction_model.tiling_time`: waves,
occupancy, the issue and shared-memory rates, DRAM and L2 traffic, split-K's fold) calibrated
on the H100; a candidate of that kernel family — a contraction program (`is_contraction`),
private-memory register tiles of 16 x 16 threads, one set of options for every kernel — is
priced beside the default options, and one predicted more than `PRUNE_RATIO` times slower is
answered without compiling (`Evaluation.error` says so; the search treats it as failed).
The ratio is wide on purpose: the model ranks tilings, it is not a timer (its calibration
points were within 10-20%), and the knobs it does not price (unrolling, copies, the thread
block's shape beyond its size) can still move a candidate by tens of percent. Other programs
and kernel families get no prediction and are all compiled.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..options import MappingOptions
from .evaluate import Evaluation

__all__ = ["PRUNE_RATIO", "ModelPruner", "predict"]

PRUNE_RATIO = 3.0
PRUNED = "pruned by the cost model"


def predict(fn: Any, sizes: Mapping[str, int] | None, opts: MappingOptions) -> float | None:
    """The contraction model's seconds for ``opts`` on ``fn`` at ``sizes`` (the sum over
    its contractions), or None where it has no model of the kernel ``opts`` make."""
    from ..contraction_model import THREADS, tiling_time
    from ..cuda_defaults import MODEL_GPU, contraction_problems, is_contraction

    if sizes is None or not is_contraction(fn.statements):
        return None
    tile, reg = tuple(opts.tile_sizes), tuple(opts.register_tile)
    if (len(tile) != 3 or len(reg) != 2 or not opts.use_private_memory or opts.kernels
            or opts.devices or min(tile) <= 0 or min(reg) <= 0
            or tile[0] % reg[0] or tile[1] % reg[1]
            or (tile[0] // reg[0]) * (tile[1] // reg[1]) != THREADS
            or tuple(opts.block[:2]) != (tile[1] // reg[1], tile[0] // reg[0])):
        return None
    problems = contraction_problems(fn.statements, sizes)
    if problems is None:
        return None
    ways = max(1, opts.split_k)
    total = 0.0
    for p in problems:
        t = tiling_time(tile, reg, p.extents, p.reduction, ways=ways if len(problems) == 1 else 1,
                        aligned=p.aligned, b_k_major=p.b_k_major, streamed=p.streamed,
                        gpu=MODEL_GPU)
        total += t.predicted_s
    return total


class ModelPruner:
    """Splits a generation into candidates to compile and those answered as pruned; counts
    them (``pruned``). ``baseline``: the default options (never pruned: the ratio is to its
    own prediction); no baseline prediction, no pruning."""

    def __init__(self, fn: Any, sizes: Mapping[str, int] | None, baseline: MappingOptions,
                 ratio: float = PRUNE_RATIO):
        self.fn, self.sizes, self.ratio = fn, sizes, ratio
        self.base = predict(fn, sizes, baseline)
        self.pruned = 0

    def split(self, candidates: list[MappingOptions]
              ) -> tuple[list[MappingOptions], dict[int, Evaluation]]:
        """(the candidates to evaluate, their positions' answers for the pruned ones)."""
        if self.base is None or self.base <= 0:
            return candidates, {}
        keep: list[MappingOptions] = []
        answers: dict[int, Evaluation] = {}
        for i, opts in enumerate(candidates):
            t = predict(self.fn, self.sizes, opts)
            if t is not None and t > self.ratio * self.base:
                answers[i] = Evaluation(opts, float("inf"), 0, error=(
                    f"{PRUNED}: {t * 1e3:.3f} ms predicted, {t / self.base:.1f}x the "
                    f"default's {self.base * 1e3:.3f} ms"))
                self.pruned += 1
            else:
                keep.append(opts)
        return keep, answers
