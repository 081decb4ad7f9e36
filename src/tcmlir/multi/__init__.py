"""Multi-GPU execution (issue 15): one call split across devices by the polyhedral model.

`plan.make_plan` computes the split with isl (no GPU needed); `execute` runs it: per-device
input slabs (peer copies, host staging, or in place), one stream per part, outputs gathered on
the output device (or left as per-device `shards`); `prepared` is what an executor works out
on its first call so that later calls only queue driver work; `tune` tunes the chunk's
signature so the single-device kernel is reused.
"""

from .execute import SplitKernel, call_sharded
from .plan import Part, SplitPlan, make_plan
from .shards import Shard, Sharded

__all__ = ["Part", "Shard", "Sharded", "SplitKernel", "SplitPlan", "call_sharded", "make_plan"]
