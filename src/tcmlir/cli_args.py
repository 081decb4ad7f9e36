"""Argument handling shared by every ``tcmlir`` command (run, tune, profile, dump, cache).

One parser class (`CommandParser`: usage mistakes print ``tcmlir: error: ...`` and exit 2),
one way to name a definition (a file, ``-`` for stdin, or a shipped example name such as
``matmul``), one reading of ``--sizes``, ``--options`` (a preset name, JSON, or a file of it),
``--target`` and ``--devices``, and one message format for every error (`format_error`).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from .errors import TCError

__all__ = ["EXIT_CHECK", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE", "PRESETS", "CommandParser",
           "add_definition_args", "file_error", "format_error", "parse_devices", "parse_options",
           "parse_sizes", "positive_int", "read_source", "read_source_file", "run_command",
           "shipped_examples", "sizes_line"]

EXIT_OK = 0
EXIT_CHECK = 1        # `run --check`: the outputs differ from the reference
EXIT_USAGE = 2        # a user error: a message on stderr, never a traceback
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for Ctrl-C
PRESETS = ("naive", "pointwise", "mlp", "convolution", "group_convolution")
PREFIX = "tcmlir: error: "
_LOCATED = re.compile(r"^(\S[^\n]*?:\d+:\d+): error: ")


def format_error(message: str) -> str:
    """Every error the command prints: ``tcmlir: error: WHAT``; a located message
    (``FILE:LINE:COL: error: what`` and its source lines) keeps its location after the prefix."""
    if message.startswith(PREFIX):
        return message
    return PREFIX + _LOCATED.sub(r"\1: ", message, count=1)


class CommandParser(argparse.ArgumentParser):
    """An argparse parser whose usage errors use `format_error` and name the ``--help``."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, format_error(f"{self.prog}: {message} (see `{self.prog} --help`)")
                  + "\n")


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def parse_sizes(text: str | None) -> dict[str, int]:
    """``M=512,N=64`` → {"M": 512, "N": 64}; TCError on malformed text or a name given twice."""
    sizes: dict[str, int] = {}
    if not text:
        return sizes
    for item in text.split(","):
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name.isidentifier() or not value.lstrip("-").isdigit():
            raise TCError(f"--sizes: expected NAME=INTEGER items separated by commas, got {item!r}")
        if int(value) < 1:
            raise TCError(f"--sizes: {name} must be at least 1, got {value}")
        if name in sizes:
            raise TCError(f"--sizes: {name} is given twice ({name}={sizes[name]} and "
                          f"{name}={value}); give each size once")
        sizes[name] = int(value)
    return sizes


def sizes_line(sizes: dict[str, Any]) -> str:
    """``M=512,N=64``: the text `parse_sizes` reads."""
    return ",".join(f"{k}={v}" for k, v in sizes.items())


def parse_devices(text: str | None) -> tuple[int, ...] | None:
    """``--devices 0,1`` → (0, 1); None when not given; TCError on anything else."""
    if text is None:
        return None
    try:
        devices = tuple(int(d) for d in text.split(","))
    except ValueError:
        devices = ()
    if not devices or min(devices) < 0:
        raise TCError(f"--devices: expected GPU ordinals like 0,1, got {text!r}")
    return devices


def file_error(path: str | Path, exc: OSError | UnicodeDecodeError) -> TCError:
    """The one message every command gives for a file it cannot read."""
    if isinstance(exc, FileNotFoundError):
        why = "no such file"
    elif isinstance(exc, IsADirectoryError):
        why = "is a directory, not a file"
    elif isinstance(exc, PermissionError):
        why = "permission denied"
    elif isinstance(exc, UnicodeDecodeError):
        why = "not a UTF-8 text file"
    else:
        why = exc.strerror or str(exc)
    return TCError(f"{PREFIX}{path}: {why}")


def read_source_file(path: str) -> str:
    """The text of any file named on the command line (a `file_error` if unreadable)."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise file_error(path, exc) from None


def shipped_examples() -> dict[str, Path]:
    """The example TC files installed with tcmlir (``tcmlir.examples``), by name."""
    from importlib.resources import files

    try:
        folder = files("tcmlir.examples")
    except ModuleNotFoundError:  # an install from before examples/ became a package
        return {}
    return {Path(f.name).stem: Path(str(f)) for f in sorted(folder.iterdir(), key=lambda f: f.name)
            if f.name.endswith(".tc")}


def read_source(path: str) -> tuple[str, str]:
    """The text of a TC file and the name to report it under. ``-`` reads stdin; a bare name
    that is no file here but names a shipped example (``matmul`` or ``matmul.tc``) reads that
    example (and says so on stderr); anything unreadable is a `file_error`."""
    if path == "-":
        return sys.stdin.read(), "<stdin>"
    p = Path(path)
    if not p.exists() and p.parent == Path("."):
        example = shipped_examples().get(p.name.removesuffix(".tc"))
        if example is not None:
            print(f"note: {path} is not a file here; using the shipped example {example}",
                  file=sys.stderr)
            p = example
    return read_source_file(str(p)), str(p)


def parse_options(text: str | None) -> Any:
    """``--options``: None, a preset name (`PRESETS`), MappingOptions JSON, or a file of it."""
    from .options import MappingOptions

    if not text:
        return None
    if text in PRESETS:
        return getattr(MappingOptions, text)()
    inline = text.lstrip().startswith("{")
    if not inline and not Path(text).exists() and re.fullmatch(r"[A-Za-z_]+", text):
        raise TCError(f"--options: {text!r} is not a preset ({', '.join(PRESETS)}), JSON or "
                      "a file")
    body = text if inline else read_source_file(text)
    try:
        return MappingOptions.from_json(body)
    except (TCError, ValueError, TypeError) as exc:
        where = "" if inline else f" {text}"
        raise TCError(f"--options{where}: {exc}") from None


def add_definition_args(p: argparse.ArgumentParser, *, targets: tuple[str, ...],
                        default_target: str | None = "auto", sizes_required: bool = False,
                        sizes_help: str | None = None, what: str = "run") -> None:
    """``FILE``, ``--name``, ``--sizes`` and ``--target``, the same on every command."""
    p.add_argument("file", metavar="FILE",
                   help="a .tc file, '-' for stdin, or the name of a shipped example "
                        "(`tcmlir examples` lists them; a file of that name here comes first)")
    p.add_argument("--name", default=None, metavar="E",
                   help=f"the def to {what} (needed only when FILE has several)")
    p.add_argument("--sizes", default=None, required=sizes_required, metavar="M=512,N=64",
                   help=sizes_help or "the value of every size, e.g. M=512,K=512,N=512")
    meaning = {"cuda": "cuda (a GPU)", "cpu": "cpu (LLVM JIT on the host)",
               "numpy": "numpy (the reference interpreter)",
               "auto": "auto (cuda when a GPU is visible, else cpu; TCMLIR_TARGET overrides)"}
    p.add_argument("--target", default=default_target, choices=targets,
                   help="where it runs: " + ", ".join(meaning[t] for t in targets)
                        + "; default: " + (default_target or "auto, or what --stage implies"))


def run_command(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    """Parse ``argv`` with ``parser`` and run the chosen command's ``func``: the exit status
    of ``tcmlir`` (`cli.main`) and ``python -m tcmlir.dump`` (`dump.main`): 0 done, 1 a
    ``--check`` mismatch, 2 a user error, 130 interrupted."""
    from .log import setup_logging

    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help/--version (0) or a usage error (2): already printed
        return int(exc.code or 0)
    try:
        setup_logging()
        return args.func(args)
    except TCError as exc:
        print(format_error(str(exc)), file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(str(file_error(exc.filename or "?", exc)) if exc.filename
              else format_error(str(exc)), file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("tcmlir: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
