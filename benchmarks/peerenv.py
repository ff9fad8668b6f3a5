"""The peers' environments: their pinned virtualenvs and, for RQ and Celery, a redis-server.

The peers run in their own virtualenvs under ``~/.cache/atlantis-bench`` (or
``$ATLANTIS_BENCH_CACHE``), created on first use with ``python3 -m venv`` + ``pip install``
of :data:`PINS`; they are never installed into the project's environment.

RQ and Celery need Redis: :class:`RedisServer` starts Debian's ``redis-server`` (installing
the package with apt-get when it is missing and apt-get may run) on 127.0.0.1, a free port,
no persistence, in a temporary folder, and stops it by its pid.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PINS: dict[str, list[str]] = {
    "pgqueuer": ["pgqueuer==1.6.0", "asyncpg==0.32.0", "psycopg[binary]==3.3.9"],
    "procrastinate": ["procrastinate==3.10.0", "psycopg[binary]==3.3.9",
                      "psycopg-pool==3.3.3"],
    "chancy": ["chancy==0.26.0", "psycopg[binary]==3.3.9", "psycopg-pool==3.3.3"],
    "rq": ["rq==3.0.0", "redis==8.1.0"],
    "celery": ["celery[redis]==5.7.0", "redis==8.1.0"],
}
"""What each peer's venv gets; the first line is the peer itself."""


def cache_dir() -> Path:
    raw = os.environ.get("ATLANTIS_BENCH_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "atlantis-bench")
    return Path(raw)


def installed_version(python: Path, dist: str) -> str | None:
    try:
        out = subprocess.run(
            [str(python), "-c",
             f"import importlib.metadata as m; print(m.version({dist!r}))"],
            capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def peer_python(peer: str) -> tuple[Path | None, str]:
    """The peer venv's python (creating/updating the venv if needed), or None and why."""
    venv = cache_dir() / f"{peer}-venv"
    python = venv / "bin" / "python"
    pins = PINS[peer]
    want = pins[0].split("==")[1]
    if installed_version(python, peer) == want:
        return python, want
    print(f"compare: preparing {venv} ({' '.join(pins)})", file=sys.stderr)
    try:
        if not python.exists():
            venv.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(["python3", "-m", "venv", str(venv)], check=True, timeout=300)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *pins], check=True,
                       timeout=900)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"pip install failed: {exc}"
    got = installed_version(python, peer)
    if got != want:
        return None, f"pip install gave {peer} {got}, not {want}"
    return python, want


# -- redis-server ----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def redis_binary() -> tuple[str | None, str]:
    """Debian's redis-server (installed with apt-get if missing and possible), or None, why."""
    found = shutil.which("redis-server")
    if found:
        return found, ""
    print("compare: installing Debian's redis-server (apt-get)", file=sys.stderr)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        subprocess.run(["apt-get", "install", "-y", "-qq", "redis-server"], check=True,
                       timeout=600, env=env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"redis-server is not installed and apt-get could not install it ({exc})"
    found = shutil.which("redis-server")
    return (found, "") if found else (None, "redis-server not found after apt-get install")


class RedisServer:
    """One redis-server on 127.0.0.1 for the Redis peers; ``stop()`` ends it by its pid."""

    def __init__(self, binary: str) -> None:
        self.folder = tempfile.mkdtemp(prefix="atl-bench-redis-")
        self.port = free_port()
        self.proc = subprocess.Popen(
            [binary, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
             "--appendonly", "no", "--dir", self.folder, "--daemonize", "no",
             "--loglevel", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
            start_new_session=True)
        deadline = time.monotonic() + 10
        while True:
            try:
                if self.command("PING") == "PONG":
                    break
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise OSError("redis-server did not start")
            time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def command(self, *args: str) -> int | str | list[str] | None:
        """One Redis command over RESP (a new connection each time: only for polling)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
            payload = f"*{len(args)}\r\n" + "".join(
                f"${len(a.encode())}\r\n{a}\r\n" for a in args)
            sock.sendall(payload.encode())
            reader = sock.makefile("rb")
            return _read_reply(reader)

    def flush(self) -> None:
        self.command("FLUSHALL")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        with contextlib.suppress(OSError):
            shutil.rmtree(self.folder)


def _read_reply(reader: io.BufferedReader) -> int | str | list[str] | None:
    line = reader.readline()
    kind, rest = line[:1], line[1:-2].decode()
    if kind == b"+":
        return rest
    if kind == b"-":
        raise OSError(f"redis: {rest}")
    if kind == b":":
        return int(rest)
    if kind == b"$":
        size = int(rest)
        if size < 0:
            return None
        data = reader.read(size + 2)
        return data[:-2].decode()
    if kind == b"*":
        count = int(rest)
        return [str(_read_reply(reader)) for _ in range(max(count, 0))]
    raise OSError(f"redis: unexpected reply {line!r}")
