"""The ``tcmlir cache`` command (registered by `tcmlir.tune.cli`): look at and manage the cache.

    tcmlir cache ls [--arch A]                 tuned options and compiled artifacts, apart
    tcmlir cache show KEY [--json]             one entry (KEY: a prefix of what ls prints)
    tcmlir cache stats [--json]                entries, sizes, this process's hits/misses
    tcmlir cache export FILE [--arch A]        tuned options as JSON (never compiled code)
    tcmlir cache import FILE                   merge an export (tuned options only)
    tcmlir cache prune [--max-size SIZE] [--older-than DAYS]   evict compiled artifacts
    tcmlir cache clear [--arch A]              delete everything (of one arch); a damaged
                                               cache file is moved aside

Every action takes ``--path P`` (a database file or a directory; default: TCMLIR_CACHE_DIR or
the user cache directory). Reading actions on a cache that does not exist create nothing.
Mistakes raise `TCError`, which `tcmlir.cli.main` prints and turns into exit status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections.abc import Sequence
from typing import Any

from .errors import CacheError
from .kernel_cache import ArtifactRecord
from .manage import (
    TunedKey,
    find_entry,
    open_existing,
    prune,
    set_aside_unusable,
    stats,
    tuned_keys,
)
from .paths import resolve_cache_path

__all__ = ["add_cache_command", "human_date", "human_size"]

KEY_DIGITS = 12


def human_size(n: int) -> str:
    """``532 B``, ``12.3 KiB``, ``1.0 GiB``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def human_date(ts: float) -> str:
    """Local time to the minute, ``2026-12-01 14:05``; ``-`` for none."""
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts)) if ts > 0 else "-"


def _table(headers: Sequence[str], rows: list[Sequence[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
            for row in [headers, *rows]]


def _sizes(record: Any) -> str:
    return ",".join(f"{k}={v}" for k, v in record.sizes.items()) or "-"


def add_cache_command(sub: Any) -> None:
    """Add ``cache`` and its actions to the ``tcmlir`` subparsers ``sub``."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--path", default=None,
                        help="cache database or directory (default: TCMLIR_CACHE_DIR or the "
                             "user cache dir)")
    cache = sub.add_parser("cache", help="look at and manage the persistent cache",
                           description="Look at and manage the persistent cache of tuned "
                                       "options and compiled artifacts.")
    actions = cache.add_subparsers(dest="cache_action", required=True, metavar="ACTION")

    ls = actions.add_parser("ls", parents=[common], help="list tuned options and artifacts")
    ls.add_argument("--arch", default=None, help="only this arch (e.g. sm_90)")
    ls.set_defaults(func=_cmd_ls)
    show = actions.add_parser("show", parents=[common], help="show one entry")
    show.add_argument("key", metavar="KEY",
                      help="a KEY printed by `tcmlir cache ls` (a unique prefix is enough)")
    show.add_argument("--json", action="store_true", help="as JSON")
    show.set_defaults(func=_cmd_show)
    st = actions.add_parser("stats", parents=[common], help="entries, sizes, hits/misses")
    st.add_argument("--json", action="store_true", help="as JSON")
    st.set_defaults(func=_cmd_stats)
    export = actions.add_parser("export", parents=[common],
                                help="write the tuned options to a JSON file")
    export.add_argument("file", metavar="FILE", help="the JSON file to write")
    export.add_argument("--arch", default=None, help="only this arch (e.g. sm_90)")
    export.set_defaults(func=_cmd_export)
    imp = actions.add_parser("import", parents=[common], help="merge exported tuned options")
    imp.add_argument("file", metavar="FILE",
                     help="a file `tcmlir cache export` wrote (or an older SQLite export)")
    imp.set_defaults(func=_cmd_import)
    pr = actions.add_parser("prune", parents=[common],
                            help="evict compiled artifacts (tuned options are kept)")
    pr.add_argument("--max-size", default=None,
                    help="keep at most this much, least recently used go first (500M, 2G, 0)")
    pr.add_argument("--older-than", type=float, default=None, metavar="DAYS",
                    help="evict those unused for this many days")
    pr.set_defaults(func=_cmd_prune)
    clear = actions.add_parser("clear", parents=[common], help="delete every entry")
    clear.add_argument("--arch", default=None, help="only this arch (e.g. sm_90)")
    clear.set_defaults(func=_cmd_clear)


def _no_cache(args: argparse.Namespace) -> str:
    return f"no tcmlir cache at {resolve_cache_path(args.path)} (nothing tuned or compiled yet)"


def _cmd_ls(args: argparse.Namespace) -> int:
    store = open_existing(args.path)
    if store is None:
        print(_no_cache(args))
        return 0
    with store:
        keys = tuned_keys(store, args.arch)
        from .kernel_cache import KernelCache

        kernels = KernelCache(store=store)
        artifacts = kernels.entries(args.arch)
        summary = stats(store.path)
    print(f"tcmlir cache {store.path} ({human_size(summary.file_bytes)} on disk)")
    print()
    print(f"Tuned options: {len(keys)} signature(s), "
          f"{sum(len(k.candidates) for k in keys)} candidate(s)")
    rows = [[k.key[:KEY_DIGITS], k.best.entry, k.best.arch, _sizes(k.best),
             f"{k.best.time_s * 1e3:.4f} ms", str(len(k.candidates)), human_date(k.tuned)]
            for k in keys]
    for line in _table(["KEY", "ENTRY", "ARCH", "SIZES", "BEST", "CANDIDATES", "TUNED"], rows):
        print(line)
    cap = summary.max_size
    print()
    print(f"Compiled artifacts: {len(artifacts)}, "
          f"{human_size(sum(a.size for a in artifacts))} "
          f"(cap {human_size(cap) if cap else 'none'}, TCMLIR_CACHE_MAX_SIZE)")
    rows = [[a.digest[:KEY_DIGITS], a.entry, a.kind, a.arch, human_size(a.size),
             human_date(a.created), human_date(a.last_used)]
            for a in sorted(artifacts, key=lambda a: (-a.last_used, a.digest))]
    for line in _table(["KEY", "ENTRY", "KIND", "ARCH", "SIZE", "CREATED", "LAST USED"], rows):
        print(line)
    return 0


def _show_tuned(key: TunedKey) -> list[str]:
    best = key.best
    lines = [f"tuned options {key.key}",
             f"  entry      {best.entry}",
             f"  arch       {best.arch}",
             f"  sizes      {_sizes(best)}",
             f"  signature  {best.signature}",
             "  source", *(f"    {line}" for line in best.source.splitlines()),
             "candidates, fastest first:"]
    rows = [[str(i + 1), f"{c.time_s * 1e3:.4f} ms", str(c.runs), human_date(c.created),
             c.options_json] for i, c in enumerate(key.candidates)]
    return lines + ["  " + line for line in _table(["#", "TIME", "RUNS", "TUNED", "OPTIONS"],
                                                    rows)]


def _show_artifact(a: ArtifactRecord) -> list[str]:
    lines = [f"compiled artifact {a.digest}",
             f"  entry      {a.entry}",
             f"  kind       {a.kind}",
             f"  arch       {a.arch}",
             f"  size       {human_size(a.size)} ({a.size} bytes)",
             f"  created    {human_date(a.created)}",
             f"  last used  {human_date(a.last_used)}",
             f"  meta       {json.dumps(dict(a.meta), sort_keys=True)}"]
    for name in ("options", "signature", "tcmlir_version", "llvm_version", "toolchain"):
        lines.append(f"  {name:<10} {a.key.get(name, '') or '-'}")
    lines += ["  source", *(f"    {line}" for line in a.key.get("source", "").splitlines())]
    return lines


def _cmd_show(args: argparse.Namespace) -> int:
    store = open_existing(args.path)
    if store is None:
        raise CacheError(_no_cache(args))
    with store:
        found = find_entry(store, args.key)
    if args.json:
        data = ({"tuned": key_dict(found)} if isinstance(found, TunedKey)
                else {"artifact": found.to_dict()})
        print(json.dumps(data, indent=2, sort_keys=True))
    else:
        lines = _show_tuned(found) if isinstance(found, TunedKey) else _show_artifact(found)
        print("\n".join(lines))
    return 0


def key_dict(key: TunedKey) -> dict[str, Any]:
    return {"key": key.key, "candidates": [c.to_dict() for c in key.candidates]}


def _cmd_stats(args: argparse.Namespace) -> int:
    s = stats(args.path)
    if args.json:
        print(json.dumps(dataclasses.asdict(s), indent=2, sort_keys=True))
        return 0
    kinds = ", ".join(f"{kind} {n} ({human_size(b)})" for kind, (n, b) in sorted(s.by_kind.items()))
    lines = [f"cache           {s.path}{'' if s.exists else ' (does not exist yet)'}",
             f"on disk         {human_size(s.file_bytes)}",
             f"tuned options   {s.tuned_keys} signature(s), {s.tuned_rows} candidate(s)",
             f"artifacts       {s.artifacts} ({human_size(s.artifact_bytes)})"
             + (f": {kinds}" if kinds else ""),
             f"size cap        {human_size(s.max_size) if s.max_size else 'none'} "
             "(TCMLIR_CACHE_MAX_SIZE; compiled artifacts only)",
             f"this process    tuned options {s.options_hits} hit(s) / {s.options_misses} "
             f"miss(es), artifacts {s.artifact_hits} hit(s) / {s.artifact_misses} miss(es) "
             "(a program's own: tcmlir.cache.stats())"]
    print("\n".join(lines))
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from .options_cache import OptionsCache

    target = args.file
    store = open_existing(args.path)
    if store is None:
        raise CacheError(f"{_no_cache(args)}: nothing to export")
    with store:
        counts = OptionsCache(store=store).export(target, arch=args.arch)
    print(f"exported {counts['tuned_rows']} tuned option row(s) to {target} (JSON; compiled "
          "artifacts are never exported: each machine compiles its own)")
    return 0


def _cmd_import(args: argparse.Namespace) -> int:
    from .options_cache import OptionsCache

    source = args.file
    try:  # an unreadable file is reported as by every command (cli.file_error)
        with open(source, "rb"):
            pass
    except OSError as exc:
        from ..cli_args import file_error

        raise file_error(source, exc) from None
    with OptionsCache(args.path) as cache:
        counts = cache.import_(source)
    line = (f"imported {source}: {counts['tuned_rows']} tuned option row(s) merged, "
            f"{counts['skipped']} skipped")
    if counts["ignored_artifacts"]:
        line += (f"; {counts['ignored_artifacts']} compiled artifact(s) in it ignored (native "
                 "code is never imported: it is compiled here when first needed)")
    print(line)
    return 0


def _cmd_prune(args: argparse.Namespace) -> int:
    from ..config import parse_size

    max_size = None if args.max_size is None else parse_size(args.max_size, "--max-size")
    store = open_existing(args.path)
    if store is None:
        print(f"{_no_cache(args)}: nothing to prune")
        return 0
    with store:
        before = stats(store.path).file_bytes
        result = prune(store, max_size=max_size, older_than_days=args.older_than)
        after = stats(store.path)
    print(f"pruned {result.removed} compiled artifact(s) ({human_size(result.removed_bytes)}); "
          f"kept {result.kept} ({human_size(result.kept_bytes)}) and all {after.tuned_rows} "
          f"tuned option row(s); file {human_size(before)} -> {human_size(after.file_bytes)}")
    return 0


def _cmd_clear(args: argparse.Namespace) -> int:
    from .kernel_cache import KernelCache
    from .options_cache import OptionsCache

    try:
        store = open_existing(args.path)
    except CacheError:
        moved = set_aside_unusable(args.path)
        if moved is None:
            raise
        print(f"the cache file {resolve_cache_path(args.path)} could not be read (damaged); "
              f"moved it to {moved} (delete that when you do not need it); the next call "
              "starts a new cache")
        return 0
    if store is None:
        print(f"{_no_cache(args)}: nothing to clear")
        return 0
    with store:
        tuned = OptionsCache(store=store).clear(args.arch)
        arts = KernelCache(store=store).clear(args.arch)
    print(f"cleared {tuned} tuned option row(s) and {arts} artifact(s)")
    return 0
