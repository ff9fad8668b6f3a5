"""A fresh embedded home for a test that runs a demo as a user would (tests/test_demo_*.py):
its folder under /tmp (unix socket paths must stay short), an environment that names it and
no other database, and the server the demo starts there stopped by the pid in its
``postmaster.pid`` afterwards."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from atlantis import environ
from chaos.server import scratch_root
from tests.conftest import ROOT


@pytest.fixture
def home() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="atl-d", dir=scratch_root()))
    yield folder
    for pidfile in folder.rglob("postmaster.pid"):
        try:
            server = psutil.Process(int(pidfile.read_text().split()[0]))
            server.send_signal(signal.SIGINT)  # fast shutdown
            server.wait(30)
        except (OSError, ValueError, IndexError, psutil.NoSuchProcess):
            pass
    shutil.rmtree(folder, ignore_errors=True)


def home_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATLANTIS_", "PG"))}
    env[environ.HOME] = str(home)
    return env


def run_in(home: Path, argv: list[str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, env=home_env(home), capture_output=True, text=True,
                          timeout=timeout, check=False)
