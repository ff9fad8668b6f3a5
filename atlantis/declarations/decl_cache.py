"""What a `.atl` file declares, kept between processes: reading a file costs some 100 ms of
CPU (importing lark, loading its parser, the parse and its checks), loading what an earlier
process read of it about one.

Every process that loads the app reads its `.atl` files: the supervisor, each child, a
zygote, ``tide``. The first to read a file saves what it declares (a pickle of its
:class:`Declarations`) beside the parser (:mod:`parser_cache`: the same folder, the same
rules: read only from a folder and a file this user owns and no one else may write,
written aside and renamed, ``ATLANTIS_PARSER_CACHE=0`` turns it off). The name holds a
digest of the file's bytes, its path as given, Python's version and a fingerprint of the
code that reads it (the size and modification time of every file of
``atlantis.declarations``, of the modules it uses, and of lark, croniter and tzdata when
installed): a changed file, a moved one or a new release of either is read afresh. A file that is refused is never kept: every
process refuses it again, with the same message.

Nothing here imports lark: a process that finds every file it reads kept never loads it.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import pickle
import sys
from pathlib import Path

from atlantis.declarations import parser_cache
from atlantis.declarations.model import Declarations

PREFIX = "atl-decls-"
#: Files of declarations kept at most; past it, saving one deletes the oldest.
KEEP = 256


@functools.cache
def fingerprint() -> bytes:
    """The code that turns a file's bytes into :class:`Declarations`, as sizes and times."""
    here = Path(__file__).resolve().parent
    files = [Path(e.path) for e in os.scandir(here) if e.name.endswith((".py", ".lark"))]
    files += [here.parent / name for name in ("units.py", "limits.py", "errors.py")]
    for package in ("lark", "croniter", "tzdata"):  # the parser, cron and time zone checks
        spec = importlib.util.find_spec(package)  # finds the package without importing it
        if spec is not None and spec.origin:
            files.append(Path(spec.origin))
    parts = [sys.version, str(here)]
    for path in sorted(files):
        try:
            st = path.stat()
        except OSError:
            parts.append(f"{path}:missing")
            continue
        parts.append(f"{path.name}:{st.st_size}:{st.st_mtime_ns}")
    return "\n".join(parts).encode()


def read_atl_file(path: str | Path) -> Declarations:
    """The jobs and workflows declared in the UTF-8 file at ``path`` (OSError when it cannot
    be read; DeclarationError for what it gets wrong), loaded when an earlier process read
    these very bytes at this path, else parsed (:func:`parser.read_atl_bytes`) and kept."""
    raw = Path(path).read_bytes()
    name = None
    if parser_cache.enabled():
        digest = hashlib.sha256(fingerprint())
        digest.update(b"\0" + os.fsencode(str(path)) + b"\0")
        digest.update(raw)
        name = f"{PREFIX}{digest.hexdigest()[:40]}.pickle"
        data = parser_cache.read_private(name)
        if data is not None:
            try:
                kept = pickle.loads(data)
            except Exception:  # a damaged file is no cache: read the .atl below
                kept = None
            if isinstance(kept, Declarations):
                return kept
    from atlantis.declarations.parser import read_atl_bytes

    found = read_atl_bytes(raw, str(path))
    if name is not None:
        where = parser_cache.write_private(name, pickle.dumps(found, pickle.HIGHEST_PROTOCOL))
        if where is not None:
            _trim(where)
    return found


def _trim(where: Path) -> None:
    """Delete the oldest files of declarations past :data:`KEEP` (edits make new ones)."""
    try:
        kept = [e for e in os.scandir(where) if e.name.startswith(PREFIX)]
        if len(kept) <= KEEP:
            return
        kept.sort(key=lambda e: e.stat().st_mtime_ns)
        for entry in kept[: len(kept) - KEEP]:
            os.unlink(entry.path)
    except OSError:
        return
