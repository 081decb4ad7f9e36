"""Multi-GPU execution (issue 15): one call split across devices by the polyhedral model.

`plan.make_plan` computes the split with isl (no GPU needed); `execute` runs it: per-device
input slabs (peer copies, host staging, or in place), one stream per part, outputs gathered on
the output device; `tune` tunes the chunk's signature so the single-device kernel is reused.
"""

from .plan import Part, SplitPlan, make_plan

__all__ = ["Part", "SplitPlan", "make_plan"]
