"""Option sets that change the schedule itself (skewing, no positive orthant) and TC's presets,
with the corpus programs they are run on against the cases' oracles (CPU: `test_cpu_options`,
GPU: `test_gpu_corpus`). Stencils and convolutions are where skewing and negative schedule
coefficients can apply; matmul, softmax and a two-layer MLP are what the presets are for."""

from __future__ import annotations

import tcmlir as tc

__all__ = ["SCHEDULE_CASES", "SCHEDULE_SETS", "SHAPE_CASES"]

_NAIVE = tc.MappingOptions.naive()
_MAX = _NAIVE.outer_schedule_fusion_strategy("max")

SCHEDULE_SETS: dict[str, tc.MappingOptions] = {
    "skew": _MAX.outer_schedule_allow_skewing(True),
    "no-positive-orthant": _MAX.outer_schedule_positive_orthant(False),
    "skew-no-orthant-tile3": _MAX.outer_schedule_allow_skewing(True)
    .outer_schedule_positive_orthant(False).tile(3, 3, 3),
    "skew-fusion-min": _NAIVE.outer_schedule_allow_skewing(True)
    .outer_schedule_fusion_strategy("min").tile(5, 4),
    "pointwise": tc.MappingOptions.pointwise(),
    "mlp": tc.MappingOptions.mlp(),
    "convolution": tc.MappingOptions.convolution(),
    "group_convolution": tc.MappingOptions.group_convolution(),
}

# the cases whose schedule skewing / negative coefficients change (checked by a test)
SHAPE_CASES = {"skew": "fused_diagonal_stencil", "orthant": "reversed_temporary"}

SCHEDULE_CASES = ("fused_diagonal_stencil", "reversed_temporary", "stencil_offsets", "stencil_negative_offset", "conv1d", "conv2d", "group_conv",
                  "matmul", "softmax_temporaries", "mlp2_temporary", "where_subrange_reduction")
