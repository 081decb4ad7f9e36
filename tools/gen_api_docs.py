"""Generate ``docs/api.md``, the API reference, from the docstrings and signatures of tcmlir.

    python tools/gen_api_docs.py            # rewrite docs/api.md
    python tools/gen_api_docs.py --check    # exit 1 if docs/api.md is not what it would write

Everything comes from the installed package at run time (``inspect``): every name in
``tcmlir.__all__``, grouped below, and for each class the public methods, properties and
dataclass fields it defines itself, in source order; a name this script does not know yet lands
under "Other names", so nothing public goes missing. tests/test_docs.py regenerates the
page and compares it with the committed one: after changing a docstring or a signature, run this
script and commit docs/api.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import inspect
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "docs" / "api.md"

# (heading, names in tcmlir.__all__, one line about the group); errors are found by type
GROUPS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("Defining and calling", ("define", "TCFunction"),
     "`tc.define` checks TC source and returns a `TCFunction`; calling it compiles once per "
     "signature and launches."),
    ("Compiled kernels", ("Kernel", "BenchmarkResult"),
     "`fn.compile(...)` returns a `Kernel`: every stage's text, `launch`, `benchmark`."),
    ("Mapping options", ("MappingOptions",),
     "How a definition is scheduled, tiled and mapped; immutable, fluent, JSON round-tripping."),
    ("Tuning and caching", ("TunerConfig", "OptionsCache", "make_naive_options_factory",
                            "make_load_from_cache_options_factory",
                            "make_autotuned_options_factory"),
     "The genetic tuner's settings, the persistent options cache and the options factories "
     "`tc.define(..., options_factory=...)` takes."),
    ("Front end", ("parse", "check"),
     "The parser and the checker on their own (`tc.define` runs both)."),
)
EXTRA_MODULES: tuple[tuple[str, str], ...] = (
    ("tcmlir.pretty", "format_schedule"),
    ("tcmlir.dump", "dump"),
)


def _markdown(doc: str) -> str:
    """Docstring text as Markdown: RST ``code`` → `code`; literal blocks (after ``::``) fenced."""
    doc = re.sub(r"``([^`]+)``", r"`\1`", doc)
    lines, out, i = doc.split("\n"), [], 0
    while i < len(lines):
        line = lines[i]
        if line.rstrip().endswith("::") and i + 1 < len(lines):
            head = line.rstrip()[:-2].rstrip()
            out.append(head + ":" if head else "")
            i += 1
            block = []
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith((" ", "\t"))):
                block.append(lines[i])
                i += 1
            while block and not block[-1].strip():
                block.pop()
            while block and not block[0].strip():
                block.pop(0)
            indent = min((len(b) - len(b.lstrip()) for b in block if b.strip()), default=0)
            out += ["", "```", *[b[indent:] for b in block], "```", ""]
            continue
        out.append(line)
        i += 1
    return "\n".join(out).strip()


def _annotation(value: Any) -> str:
    if value is inspect.Parameter.empty:
        return ""
    if isinstance(value, str):
        return value
    return inspect.formatannotation(value)


def _default(value: Any) -> str:
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    text = repr(value)
    if re.search(r" at 0x[0-9a-f]+>", text):  # an object without a stable repr
        return f"<{type(value).__name__}>"
    return text


def format_signature(func: Callable[..., Any], *, drop_self: bool = False) -> str:
    """``(source: str, name: str | None = None, *, target: str = 'auto') -> TCFunction``."""
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        return "(...)"
    params = list(sig.parameters.values())
    if drop_self and params and params[0].name in ("self", "cls"):
        params = params[1:]
    parts: list[str] = []
    star_done = False
    for i, p in enumerate(params):
        if p.kind is p.KEYWORD_ONLY and not star_done:
            parts.append("*")
            star_done = True
        if p.kind is p.VAR_POSITIONAL:
            star_done = True
        prefix = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "")
        text = prefix + p.name
        note = _annotation(p.annotation)
        if note:
            text += f": {note}"
        if p.default is not inspect.Parameter.empty:
            text += (" = " if note else "=") + _default(p.default)
        parts.append(text)
        if p.kind is p.POSITIONAL_ONLY and (i + 1 == len(params)
                                            or params[i + 1].kind is not p.POSITIONAL_ONLY):
            parts.append("/")
    result = _annotation(sig.return_annotation)
    return f"({', '.join(parts)})" + (f" -> {result}" if result else "")


def _doc(obj: Any) -> str:
    doc = inspect.getdoc(obj)
    return _markdown(doc) if doc else "*No docstring.*"


def _own_members(cls: type) -> Iterator[tuple[str, str, Any]]:
    """(kind, name, member) of what ``cls`` defines itself: fields, properties, methods."""
    fields = [f for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else []
    for f in fields:
        if not f.name.startswith("_") and f.repr:
            yield "field", f.name, f
    for name, member in vars(cls).items():
        if name.startswith("_") and name not in ("__call__",):
            continue
        if isinstance(member, property):
            yield "property", name, member
        elif isinstance(member, (classmethod, staticmethod)):
            yield "classmethod", name, member.__func__
        elif inspect.isfunction(member):
            yield "method", name, member


def _field_line(f: dataclasses.Field) -> str:
    text = f"`{f.name}: {_annotation(f.type)}`"
    if f.default is not dataclasses.MISSING:
        text += f" = `{_default(f.default)}`"
    elif f.default_factory is not dataclasses.MISSING:
        text += " (a fresh default)"
    return f"- {text}"


def _document_class(qual: str, cls: type) -> list[str]:
    bases = [b.__name__ for b in cls.__bases__ if b is not object]
    head = f"### class `{qual}`" + (f" ({', '.join(bases)})" if bases else "")
    out = [head, "", _doc(cls), ""]
    members = list(_own_members(cls))
    fields = [m for kind, _, m in members if kind == "field"]
    if fields:
        out += ["Fields:", "", *[_field_line(f) for f in fields], ""]
    for kind, name, member in members:
        if kind == "field":
            continue
        if kind == "property":
            out += [f"#### `{qual}.{name}` (property)", "", _doc(member), ""]
            continue
        call = "" if name == "__call__" else f".{name}"
        shown = f"{qual}{call}" if kind == "classmethod" else (
            f"fn{call}" if qual == "TCFunction" and not call else f"{qual}{call}")
        out += [f"#### `{shown}{format_signature(member, drop_self=True)}`", "", _doc(member), ""]
    return out


def _document(qual: str, obj: Any) -> list[str]:
    if inspect.isclass(obj):
        return _document_class(qual, obj)
    if callable(obj):
        return [f"### `{qual}{format_signature(obj)}`", "", _doc(obj), ""]
    return [f"### `{qual}`", "", f"`{obj!r}`", ""]


def generate() -> str:
    """The text of docs/api.md for the tcmlir importable here."""
    import importlib

    import tcmlir as tc

    names = [n for n in tc.__all__ if n != "__version__"]
    errors = [n for n in names if inspect.isclass(getattr(tc, n))
              and issubclass(getattr(tc, n), (Exception, Warning))]
    grouped = {n for _, group, _ in GROUPS for n in group}
    lines = [
        "# API reference",
        "",
        "Generated by `python tools/gen_api_docs.py` from the docstrings and signatures of",
        "the package; do not edit by hand (tests/test_docs.py checks that it is current).",
        "`import tcmlir as tc`; every name below is in `tcmlir.__all__` unless its module is",
        "named. The README has the tour, docs/architecture.md the layers.",
        "",
    ]
    sections: list[tuple[str, list[str], str]] = [
        (title, [n for n in group if n in names], blurb) for title, group, blurb in GROUPS]
    other = [n for n in names if n not in grouped and n not in errors]
    if other:
        sections.append(("Other names", other, "Public names not grouped above."))
    lines += ["Contents:", ""]
    lines += [f"- [{title}](#{_anchor(title)})" for title, members, _ in sections if members]
    lines += ["- [Errors and warnings](#errors-and-warnings)", "- [Modules](#modules)", ""]
    for title, members, blurb in sections:
        if not members:
            continue
        lines += [f"## {title}", "", blurb, ""]
        for name in members:
            lines += _document(f"tc.{name}" if not inspect.isclass(getattr(tc, name)) else name,
                               getattr(tc, name))
    lines += ["## Errors and warnings", "",
              "Every error tcmlir raises on purpose is a `tc.TCError`; messages of located "
              "errors start `<file>:LINE:COL: error:`.", ""]
    for name in sorted(errors, key=lambda n: (n != "TCError", n)):
        cls = getattr(tc, name)
        bases = ", ".join(b.__name__ for b in cls.__bases__)
        lines += [f"### `{name}` ({bases})", "", _doc(cls), ""]
    lines += ["## Modules", "", "Functions used from their modules.", ""]
    for module, name in EXTRA_MODULES:
        lines += _document(f"{module}.{name}", getattr(importlib.import_module(module), name))
    return "\n".join(lines).rstrip() + "\n"


def _anchor(title: str) -> str:
    return re.sub(r"[^a-z0-9 -]", "", title.lower()).replace(" ", "-")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="compare with docs/api.md instead of writing it")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    text = generate()
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is out of date: run python tools/gen_api_docs.py",
                  file=sys.stderr)
            return 1
        return 0
    args.output.write_text(text, encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
