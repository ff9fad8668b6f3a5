"""The system user the embedded server runs as when atlantis runs as root, and what it may
reach: the user itself, the arguments that run a program as it (its own group, no other),
and the folders it must pass through (opened as little as possible).
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path
from typing import Any

#: The system user the embedded server runs as when atlantis runs as root.
SERVER_USER = "pgserver"


def as_root() -> bool:
    return os.geteuid() == 0


def ensure_server_user() -> None:
    """Create the system user the embedded server runs as (root only), tolerating another
    process creating it at the same moment: two commands (or two test workers) starting on a
    fresh machine both found it missing, and the second ``useradd`` failed."""
    import pwd

    try:
        pwd.getpwnam(SERVER_USER)
        return
    except KeyError:
        pass
    try:
        subprocess.run(["useradd", "-s", "/usr/sbin/nologin", SERVER_USER], check=True,
                       capture_output=True, text=True)
    except subprocess.CalledProcessError:
        try:
            pwd.getpwnam(SERVER_USER)
        except KeyError:
            raise
        # created by the other process meanwhile


def ensure_user(username: str) -> Any:
    import pwd

    if username == SERVER_USER:
        ensure_server_user()
    return pwd.getpwnam(username)


def as_server_user() -> dict[str, Any]:
    """``subprocess`` arguments that run a program as the server's system user: as root,
    that user with its own group and no other (``user=`` alone keeps root's groups, and a
    folder made passable for others only, such as a 0701 ``mktemp -d`` parent, is closed
    to group root); unprivileged, none (the program runs as this user)."""
    if not as_root():
        return {}
    ensure_server_user()
    uid, gid, _ = server_ids()
    return {"user": uid, "group": gid, "extra_groups": []}


def server_ids() -> tuple[int, int, set[int]]:
    """The server user's uid, its primary group and all its groups."""
    import grp
    import pwd

    entry = pwd.getpwnam(SERVER_USER)
    groups = {g.gr_gid for g in grp.getgrall() if SERVER_USER in g.gr_mem}
    return entry.pw_uid, entry.pw_gid, groups | {entry.pw_gid}


def passable(st: os.stat_result, uid: int, gids: set[int]) -> bool:
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid in gids:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


def let_server_through(path: Path, *, is_home: bool = False) -> None:
    """As root: let the server user pass through every parent of ``path`` (and ``path``
    itself when it is ATLANTIS_HOME), opening as little as it can.

    Folders it can pass already stay as they are. ATLANTIS_HOME gets group ``pgserver`` and
    ``g+x``; any other folder only ``o+x``: entering it by a known name, never listing it.
    (pgserver's own version adds ``g+rx,o+rx`` to every parent up to ``/``.)
    """
    if not as_root():
        return
    uid, gid, gids = server_ids()
    folders = ([path] if is_home else []) + list(path.parents)
    for folder in folders:
        st = folder.stat()
        if passable(st, uid, gids):
            continue
        if is_home and folder == path:
            os.chown(folder, -1, gid)
            os.chmod(folder, stat.S_IMODE(st.st_mode) | stat.S_IXGRP)
        else:
            os.chmod(folder, stat.S_IMODE(st.st_mode) | stat.S_IXOTH)
