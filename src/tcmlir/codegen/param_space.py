"""The CUDA kernel parameter space: what ptxas accepts, checked before any code is generated.

Every parameter of the kernel ABI (`nvptx`) is 8 bytes: a pointer per tensor the kernel reads
or writes, an i64 per size it reads (only a parametric kernel reads any), the error flag's
pointer. `check_parameter_space` refuses a statement whose tensors alone overflow it, before
the passes (`compiler.compile_kernel`); `check_kernel_parameters` refuses a kernel as it is
lowered (statements fused into one kernel share it), before LLVM. Both are located
`CodegenError` errors that name the tensor past the limit.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from .. import ir as tc
from ..errors import CodegenError
from .ast_groups import statement_tensors

__all__ = ["PARAM_SPACE_BYTES", "check_kernel_parameters", "check_parameter_space"]

#: Kernel parameter space ptxas accepts at the PTX ISA we emit (8.0): 0x1100 bytes. (ISA 8.1
#: with a CUDA 12.1+ driver allows 32764 bytes on sm_70+; we keep 8.0 for older drivers.)
PARAM_SPACE_BYTES = 4352


def check_parameter_space(fn: tc.Function, *, temporaries_may_go: bool = False) -> None:
    """A located `CodegenError` when a statement of ``fn`` reads and writes more tensors than
    one kernel's parameter space holds (8 bytes per tensor and for the error flag), before any
    code is generated: every kernel takes the tensors of each statement it runs (sizes fixed
    at compile time are not passed; a parametric kernel's are counted after lowering, by
    `check_kernel_parameters`).

    ``temporaries_may_go``: a pass (``inline-temporaries``) may replace temporaries by their
    definitions, so only the inputs and outputs of statements that write no temporary count.
    `compiler.compile_kernel` checks before the passes, so a statement no kernel can take is
    refused at once rather than after scheduling, mapping and lowering the definition; each
    kernel is checked again when it is lowered."""
    temporaries = {t.name for t in fn.temporaries} if temporaries_may_go else set()
    for k, st in enumerate(fn.statements):
        if st.tensor in temporaries:
            continue
        names = statement_tensors(st) - temporaries
        if 8 * (len(names) + 1) > PARAM_SPACE_BYTES:
            _refuse(fn, f"statement S{k} of {fn.name}",
                    tuple(t for t in fn.tensors if t.name in names), 0)


def check_kernel_parameters(fn: tc.Function, kernel: str, statements: Collection[int],
                            tensors: Sequence[str], sizes: Sequence[str]) -> None:
    """`check_parameter_space` for one lowered kernel: its tensors and sizes (`KernelLaunch`)."""
    if 8 * (len(tensors) + len(sizes) + 1) <= PARAM_SPACE_BYTES:
        return
    ks = sorted(statements)
    listed = ", ".join(f"S{k}" for k in ks) if len(ks) <= 6 else \
        f"{', '.join(f'S{k}' for k in ks[:3])}, ..., S{ks[-1]}: {len(ks)} statements"
    _refuse(fn, f"the CUDA kernel {kernel} ({listed})", tuple(fn.tensor(t) for t in tensors),
            len(sizes), "" if len(ks) < 2 else
            "fuse fewer statements into one kernel (options fusion='min'), ")


def _refuse(fn: tc.Function, what: str, tensors: tuple[tc.Tensor, ...], n_sizes: int,
            other_fix: str = "") -> None:
    fixed = 8 * (n_sizes + 1)
    need = 8 * len(tensors) + fixed
    most = (PARAM_SPACE_BYTES - fixed) // 8
    culprit = tensors[max(0, min(most, len(tensors) - 1))]
    text = (f"{what} would take {len(tensors)} tensor, {n_sizes} size and 1 flag parameters "
            f"of 8 bytes: {need} bytes, more than the {PARAM_SPACE_BYTES} bytes of kernel "
            f"parameter space ptxas accepts (PTX ISA 8.0); {culprit.name} is tensor "
            f"{most + 1} of at most {most}")
    fix = (f"use fewer tensors in one statement (stack inputs of one shape into one tensor with "
           f"an extra dimension), {other_fix}or run it with target='cpu'")
    if fn.source is None:
        raise CodegenError(f"{text}\n  fix: {fix}")
    raise CodegenError.at(fn.source, culprit.span, text, fix)
