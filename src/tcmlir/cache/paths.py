"""Where the persistent cache lives: one SQLite file under the user's cache directory.

Order of precedence: an explicit path given to the cache object, then the directory named by
``TCMLIR_CACHE_DIR``, then ``<user cache dir>/tcmlir``. The file inside a directory is always
``cache.sqlite3``. `cache_dir_from_env` is the one place that reads the environment variable
(it moves to ``tcmlir.config`` with the other named knobs).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "CACHE_DIR_ENV",
    "CACHE_FILE_NAME",
    "cache_dir_from_env",
    "default_cache_path",
    "resolve_cache_path",
    "user_cache_dir",
]

CACHE_DIR_ENV = "TCMLIR_CACHE_DIR"
CACHE_FILE_NAME = "cache.sqlite3"


def cache_dir_from_env(environ: Mapping[str, str] | None = None) -> Path | None:
    """The directory named by ``TCMLIR_CACHE_DIR``, or None when it is unset or empty."""
    if environ is None:
        from ..config import get_config

        value = (get_config().cache_dir or "").strip()
    else:
        value = environ.get(CACHE_DIR_ENV, "").strip()
    return Path(value).expanduser() if value else None


def user_cache_dir(platform: str | None = None, environ: Mapping[str, str] | None = None,
                   home: Path | None = None) -> Path:
    """The platform's per-user cache directory (not tcmlir's own folder inside it).

    Linux and other Unixes: ``$XDG_CACHE_HOME`` or ``~/.cache``; macOS: ``~/Library/Caches``;
    Windows: ``%LOCALAPPDATA%`` (or ``~/AppData/Local``).
    """
    platform = sys.platform if platform is None else platform
    environ = os.environ if environ is None else environ
    home = Path.home() if home is None else home
    if platform.startswith("win"):
        local = environ.get("LOCALAPPDATA", "").strip()
        return Path(local) if local else home / "AppData" / "Local"
    if platform == "darwin":
        return home / "Library" / "Caches"
    xdg = environ.get("XDG_CACHE_HOME", "").strip()
    # The XDG spec says a relative value is invalid and must be ignored.
    return Path(xdg) if xdg and os.path.isabs(xdg) else home / ".cache"


def default_cache_path(environ: Mapping[str, str] | None = None) -> Path:
    """``$TCMLIR_CACHE_DIR/cache.sqlite3`` if set, else ``<user cache dir>/tcmlir/cache.sqlite3``."""
    directory = cache_dir_from_env(environ)
    if directory is None:
        directory = user_cache_dir(environ=environ) / "tcmlir"
    return directory / CACHE_FILE_NAME


def resolve_cache_path(path: str | os.PathLike[str] | None = None) -> Path:
    """The database file for ``path``: the default when None, ``path/cache.sqlite3`` when
    ``path`` is an existing directory, else ``path`` itself."""
    if path is None:
        return default_cache_path().absolute()
    resolved = Path(path).expanduser().absolute()
    return resolved / CACHE_FILE_NAME if resolved.is_dir() else resolved
