"""``python -m tcmlir.dump``: print each level of the compilation of one TC definition.

    python -m tcmlir.dump FILE --name ENTRY [--sizes N=64,M=3]
        [--stage ast|ir|scop|deps|schedule|loops|all]
        [--pipeline 'schedule{fusion=max},tile{sizes=32,32}' | --options JSON]
        [--print-after-all] [--time-passes]
    python -m tcmlir.dump FILE --sizes M=8192,K=8192,N=8192 --devices 0,1   # the split plan

Stages: ``ast`` the parsed definition in canonical TC, ``ir`` the checked IR, ``scop`` the
polyhedral model (parameters, context, per statement domain and accesses), ``deps`` the
dependences by kind, ``schedule`` the final schedule tree in isl syntax (it re-parses with
``isl.Schedule.read_from_str``), ``loops`` C-like loops from isl's AST; ``all`` prints every
stage under a ``== stage ==`` header. A thin CLI on the pass manager: the pipeline (default
``schedule{fusion=max}``) runs with verification after each pass; ``--print-after-all`` and
``--time-passes`` write to stderr. Without ``--sizes`` everything stays parametric.

Every user mistake (file, entry, sizes, pipeline, options) is a located message on stderr and
exit status 2, without a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .errors import OptionsError, PipelineError, Source, TCError

__all__ = ["DEFAULT_PIPELINE", "STAGES", "dump", "main"]

STAGES = ("ast", "ir", "scop", "deps", "schedule", "buffers", "loops")
DEFAULT_PIPELINE = "schedule{fusion=max}"


def _parse_sizes(text: str) -> dict[str, int]:
    source = Source(text, "<sizes>")
    sizes: dict[str, int] = {}
    offset = 0
    for item in text.split(","):
        span = source.span(offset, offset + len(item))
        offset += len(item) + 1
        name, eq, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not eq or not name.isidentifier():
            raise OptionsError.at(source, span, f"bad size '{item.strip()}'",
                                  fix="write sizes as NAME=VALUE,NAME=VALUE (e.g. N=64,M=3)")
        try:
            number = int(value)
        except ValueError:
            number = 0
        if number < 1:
            raise OptionsError.at(source, span, f"size {name} must be an integer >= 1, got '{value}'")
        sizes[name] = number
    return sizes


def _pipeline_text(args: argparse.Namespace) -> str | None:
    """The pipeline to run; None: what a call on ``--target cuda`` would run (its default
    options, chosen per definition in `dump`)."""
    if args.options is None:
        if args.pipeline is None and args.target == "cuda":
            return None
        return args.pipeline or DEFAULT_PIPELINE
    from .options import MappingOptions

    return MappingOptions.from_json(args.options).to_pipeline(args.target)


def dump(text: str, filename: str, entry: str | None, stage: str = "all",
         sizes: dict[str, int] | None = None, pipeline: str | None = DEFAULT_PIPELINE,
         print_after_all: bool = False, time_passes: bool = False, err=None,
         devices: tuple[int, ...] | None = None) -> str:
    """The text of ``stage`` (or of every stage) for definition ``entry`` of ``text``; with
    ``devices``, the multi-GPU split plan of a call at ``sizes`` instead."""
    from .lang.parser import parse_program
    from .lang.sema import check_program

    source = Source(text, filename)
    program = parse_program(text, filename)
    stages = STAGES if stage == "all" else (stage,)
    out: dict[str, str] = {}
    if "ast" in stages:
        import dataclasses

        from .lang.printer import format_program

        chosen = program if entry is None else dataclasses.replace(
            program, defs=tuple(d for d in program.defs if d.name.name == entry))
        if entry is not None and not chosen.defs:
            check_program(program, entry, source=source)  # raises the located "no definition"
        out["ast"] = format_program(chosen).rstrip()
    fn = check_program(program, entry, source=source)
    if devices is not None:  # --devices: the split plan (tcmlir.multi.plan), not the stages
        from .multi.plan import make_plan

        missing = [s for s in fn.sizes if s not in (sizes or {})]
        unknown = sorted(set(sizes or {}) - set(fn.sizes))
        if unknown:
            raise OptionsError(f"--sizes: {', '.join(unknown)} is not a size of {fn.name}")
        if missing:
            raise OptionsError(f"--devices needs every size: give {', '.join(missing)} with "
                               "--sizes")
        return str(make_plan(fn, sizes or {}, devices)) + "\n"
    if "ir" in stages:
        out["ir"] = str(fn).rstrip()
    if not set(stages) & {"scop", "deps", "schedule", "buffers", "loops"}:
        return _join(out, stage)

    from .passes import PassManager, parse_pipeline
    from .poly.deps import format_dependences
    from .poly.loops import build_ast, format_loops
    from .poly.scop import format_scop
    from .poly.state import CompileState

    unknown = sorted(set(sizes or {}) - set(fn.sizes))
    if unknown:
        raise OptionsError(f"--sizes: {', '.join(unknown)} is not a size of {fn.name} "
                           f"(its sizes: {', '.join(fn.sizes) or 'none'})")
    if pipeline is None:  # a cuda call's default options
        from .options import MappingOptions

        pipeline = MappingOptions.default_for(fn, "cuda", sizes).to_pipeline("cuda")
    passes = parse_pipeline(pipeline)
    state = CompileState.initial(fn, sizes)
    if "scop" in stages:
        out["scop"] = format_scop(state.scop)
    if "deps" in stages:
        out["deps"] = format_dependences(state.deps, state.scop.context)
    if {"schedule", "buffers", "loops"} & set(stages):
        manager = PassManager(passes, print_after_all=print_after_all, time_passes=time_passes,
                              out=err)
        state = manager.run(state)
        if state.schedule is None:
            raise PipelineError(f"the pipeline '{pipeline}' computes no schedule: "
                                "start it with `schedule`")
        if "schedule" in stages:
            out["schedule"] = str(state.schedule)
        if "buffers" in stages:  # with "all", only where promotion made buffers
            listed = _format_promotion(state)
            if listed or stage == "buffers":
                out["buffers"] = listed or "(no promoted buffers)"
        if "loops" in stages:
            out["loops"] = format_loops(build_ast(state)).rstrip()
    return _join(out, stage)


def _format_promotion(state) -> str:
    """The buffers of promotion passes, one line each (after the tree), or nothing."""
    promotion = getattr(state, "promotion", None)
    if promotion is None or not promotion.buffers:
        return ""
    lines = []
    for b in promotion.buffers:
        box = " x ".join(f"{e}" + (f"/{s}" if s > 1 else "") for e, s in
                         zip(b.box.extent, b.box.stride, strict=True))
        how = "copied in" if b.copy_in else (f"filled with S{b.fill}'s identity"
                                             if b.fill is not None else "not copied in")
        lines.append(f"{b.name}: {b.space} copy of {b.tensor} in kernel {b.kernel}, box {box}, "
                     f"storage {list(b.storage)} (dims {list(b.order)}), {b.stages} stage(s), "
                     f"{how}{', copied out' if b.copy_out else ''}")
    return "\n".join(lines)


def _join(out: dict[str, str], stage: str) -> str:
    if stage != "all":
        return out[stage] + "\n"
    return "".join(f"== {name} ==\n{text}\n" for name, text in out.items())


def _arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tcmlir.dump",
                                description="Print the compilation stages of a TC definition.")
    p.add_argument("file", help="TC source file ('-' for stdin)")
    p.add_argument("--name", help="the definition to compile (optional if there is one)")
    p.add_argument("--sizes", help="fix sizes, e.g. N=64,M=3 (default: parametric)")
    p.add_argument("--stage", choices=(*STAGES, "all"), default="all")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--pipeline", help=f"pass pipeline (default: {DEFAULT_PIPELINE})")
    group.add_argument("--options", help="MappingOptions as JSON (compiled to a pipeline)")
    p.add_argument("--target", choices=("cpu", "cuda"), default="cpu",
                   help="the target whose pipeline --options compiles to (default: cpu); "
                        "--target cuda alone shows what a cuda call runs (its default options)")
    p.add_argument("--print-after-all", action="store_true",
                   help="print the schedule tree after each pass (stderr)")
    p.add_argument("--time-passes", action="store_true", help="time each pass (stderr)")
    p.add_argument("--devices", help="print how a call at --sizes splits across these GPUs, "
                                     "e.g. 0,1 (tcmlir.multi; no GPU needed)")
    p.add_argument("--grad", action="store_true",
                   help="dump the derived reverse-mode gradient definition instead (tcmlir.grad)")
    return p


def _parse_devices(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(d) for d in text.split(","))
    except ValueError:
        raise OptionsError(f"--devices takes device ordinals like 0,1, got '{text}'") from None


def main(argv: Sequence[str] | None = None) -> int:
    args = _arg_parser().parse_args(argv)
    try:
        if args.file == "-":
            text, filename = sys.stdin.read(), "<stdin>"
        else:
            with open(args.file, encoding="utf-8") as f:
                text, filename = f.read(), args.file
    except (OSError, UnicodeDecodeError) as exc:
        print(f"{args.file}: error: cannot read the file: {exc}", file=sys.stderr)
        return 2
    try:
        sizes = None if args.sizes is None else _parse_sizes(args.sizes)
        if args.grad:  # the gradient program replaces the definition (tcmlir.grad)
            from .grad.dump import gradient_text

            text, filename, args.name = gradient_text(text, filename, args.name)
        result = dump(text, filename, args.name, args.stage, sizes, _pipeline_text(args),
                      args.print_after_all, args.time_passes, err=sys.stderr,
                      devices=_parse_devices(args.devices))
    except TCError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    sys.stdout.write(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
