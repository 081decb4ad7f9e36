"""``python -m tcmlir.dump --grad``: the derived gradient definition in place of the source's."""

from __future__ import annotations

import warnings

from ..errors import PreconditionWarning
from .derive import derive


def gradient_text(text: str, filename: str, entry: str | None) -> tuple[str, str, str]:
    """(derived TC source, its file name, its entry) for definition ``entry`` of ``text``.

    The derived program's extra sizes (gradients of outputs with computed extents) make
    preconditions that hold by construction: their warnings are silenced here and at
    `GradProgram.define`, and nowhere else.
    """
    from ..lang import check, parse

    program = derive(check(parse(text, filename), entry, source=_source(text, filename)))
    warnings.filterwarnings("ignore", category=PreconditionWarning)
    return program.source, f"<gradient of {program.forward.name}>", program.entry


def _source(text: str, filename: str):
    from ..errors import Source

    return Source(text, filename)
