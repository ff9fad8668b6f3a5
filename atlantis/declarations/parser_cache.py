"""The `.atl` parser, kept between processes: building it costs some 200 ms of CPU, loading it
some 20.

Every process that reads a `.atl` file builds the parser once: each child, the supervisor's
check of the app, a zygote, `tide`. Built once, it is saved in the user's cache folder
(``$XDG_CACHE_HOME/atlantis`` when it is absolute, else ``~/.cache/atlantis``) under a name that holds a digest of
the grammar, the options, lark's and Python's versions, so that a change of any of them
builds it anew. The file is a pickle, so it is read only from a folder and a file that this
user owns and no one else may write; otherwise, or if anything fails (no home, a read-only
one, a file cut short), the parser is built as if there were no cache. It is written to a
temporary name and renamed, so that a process never reads another's half-written file.

:func:`read_private` and :func:`write_private` keep any file by those rules: what each `.atl`
file declares is kept beside the parser the same way (:mod:`decl_cache`).
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from atlantis import environ

if TYPE_CHECKING:
    import lark

#: Off with ``0`` (the parser is then built by every process).
ENV_SWITCH = environ.PARSER_CACHE


def folder() -> Path | None:
    """The cache folder, or None when there is no home to put it in."""
    xdg = os.environ.get(environ.XDG_CACHE_HOME, "")
    if os.path.isabs(xdg):
        return Path(xdg) / "atlantis"
    return Path.home() / ".cache" / "atlantis" if os.environ.get("HOME") else None


def _private(path: Path, *, directory: bool) -> bool:
    """Whether ``path`` is this user's and no one else may write it."""
    try:
        st = path.lstat()
    except OSError:
        return False
    kind = stat.S_ISDIR(st.st_mode) if directory else stat.S_ISREG(st.st_mode)
    return kind and st.st_uid == os.getuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def enabled() -> bool:
    """Whether processes may keep what they build here (``ATLANTIS_PARSER_CACHE`` not 0)."""
    return os.environ.get(ENV_SWITCH, "1") != "0"


def read_private(name: str) -> bytes | None:
    """The bytes of cache file ``name``, or None: no cache, no such file, or one in a
    folder or a file that another user owns or may write (never read: it may be a pickle)."""
    where = folder() if enabled() else None
    if where is None:
        return None
    path = where / name
    if not (_private(where, directory=True) and _private(path, directory=False)):
        return None
    try:
        return path.read_bytes()
    except OSError:
        return None


def write_private(name: str, data: bytes) -> Path | None:
    """Save ``data`` as cache file ``name`` (written aside, then renamed: a reader never sees
    half of it); its folder, or None when it could not be written (no cache, then)."""
    where = folder() if enabled() else None
    if where is None:
        return None
    try:
        where.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not _private(where, directory=True):
            return None
        fd, tmp = tempfile.mkstemp(dir=where, prefix=f".{name}.")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, where / name)
        except BaseException:
            os.unlink(tmp)
            raise
    except Exception:  # a cache that cannot be written costs a build, no more
        return None
    return where


def build(grammar: str, **options: Any) -> lark.Lark:
    """The LALR parser of ``grammar``: loaded from the cache when it holds this very one,
    else built (and saved for the next process)."""
    import lark

    key = hashlib.sha256("\0".join([
        grammar, repr(sorted(options.items())), lark.__version__, sys.version,
    ]).encode()).hexdigest()[:32]
    name = f"atl-parser-{key}.lark"
    data = read_private(name)
    if data is not None:
        try:
            return lark.Lark.load(io.BytesIO(data))
        except Exception:  # a damaged cache is no cache: build it below
            pass
    parser = lark.Lark(grammar, **options)
    if enabled():
        saved = io.BytesIO()
        parser.save(saved)
        write_private(name, saved.getvalue())
    return parser
