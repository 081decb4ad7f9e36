"""``python -m tcmlir.dump --grad``: the derived gradient definition in place of the source's."""

from __future__ import annotations

import warnings

from ..errors import PreconditionWarning, Source
from .derive import derive


def gradient_text(text: str, filename: str, entry: str | None) -> tuple[str, str, str]:
    """(derived TC source, its file name, its entry) for definition ``entry`` of ``text``.

    The derived program's extra sizes (gradients of outputs with computed extents) make
    preconditions that hold by construction; the dump checks the text again, so their
    warnings, and only theirs (located in ``<gradient of ...>``), are silenced.
    """
    from ..lang import check, parse

    program = derive(check(parse(text, filename), entry, source=Source(text, filename)))
    name = f"<gradient of {program.forward.name}>"
    warnings.filterwarnings("ignore", message=f"{name}:", category=PreconditionWarning)
    return program.source, name, program.entry
