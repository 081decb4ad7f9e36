"""The GPU the defaults are chosen for, without a device: its number of SMs.

A foundation below `passes` (the row, column and full-reduction mappings size their grids with
it) and `gpu_defaults` (which re-exports it), so that neither imports the other's layer.
"""

__all__ = ["SM_COUNT"]

SM_COUNT = 132          # NVIDIA H200 (sm_90)
