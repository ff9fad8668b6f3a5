"""Installed as users install it: the project's wheel in a fresh virtualenv outside the
repository, its dependencies from the local wheel cache that ``./scripts/test`` fills
(``.cache/wheels``), never from the network. From that virtualenv: ``tide db migrate`` on an
empty database, ``tide job enqueue``, and an ``atlantis-supervise`` that runs the job to
``complete`` in a child that imports the wheel's atlantis, not the repository's."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from tests.conftest import ROOT, job_row, url_for, wait_for

WHEELS = ROOT / ".cache" / "wheels"
FILLED = WHEELS / ".filled"  # written by ./scripts/test once every wheel is in

APP_ATL = """\
job Hello in wheel {
  args { name text not null }
  retries 0
  timeout 60s
  queue   "wheel"
}
"""

APP_PY = """\
import sys

import atlantis

registry = atlantis.Registry.from_atl("wheelapp.atl")


@registry.handler("wheel.Hello")
def hello(ctx: atlantis.JobContext, args) -> dict:
    return {"hello": args.name, "atlantis": atlantis.__file__, "python": sys.executable}
"""


def _clean_env(venv: Path) -> dict[str, str]:
    """This process's environment without pip's settings or the repository's virtualenv:
    pip reads no configuration (no index, no extra find-links), and nothing points at the
    repository, so that only the new virtualenv's packages can be imported."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PIP_") and k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{argv[:3]} exited {done.returncode}:\n{done.stderr}"
    return done.stdout


def _build_wheel(tmp: Path, env: dict[str, str]) -> Path:
    """The wheel, built offline by pyproject.toml's build backend (setuptools, in the dev
    extra) from a copy of the sources: no build/ or egg-info written into the repository."""
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "atlantis", src / "atlantis",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = tmp / "dist"
    # The PEP 517 hook that pip and `python -m build --no-isolation` call, called directly:
    # the same wheel without pip's start-up and its second hook call (the metadata).
    backend = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["build-system"]
    _run([sys.executable, "-c", "import importlib, sys; "
          "importlib.import_module(sys.argv[1]).build_wheel(sys.argv[2])",
          backend["build-backend"], str(dist)], src, env)
    built = sorted(dist.glob("atlantis_jobs-*.whl"))
    assert len(built) == 1, built
    # Every file of the package ships, data included (SQL, grammar, console templates).
    package = src / "atlantis"
    wanted = {f"atlantis/{f.relative_to(package).as_posix()}" for f in package.rglob("*")
              if f.is_file()}
    with zipfile.ZipFile(built[0]) as wheel:
        missing = wanted - set(wheel.namelist())
    assert not missing, f"the wheel lacks {sorted(missing)}"
    return built[0]


@pytest.fixture
def empty_db_url(admin_url: str) -> Iterator[str]:
    """A database with nothing in it (not the suite's migrated template)."""
    name = f"wheel_{os.getpid()}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")
    yield url_for(admin_url, name)
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_the_wheel_installs_offline_and_runs_a_job(tmp_path: Path, empty_db_url: str) -> None:
    if not FILLED.exists():
        pytest.skip(f"no local wheel cache at {WHEELS}: run ./scripts/test once to fill it")
    if FILLED.stat().st_mtime < (ROOT / "pyproject.toml").stat().st_mtime:
        pytest.skip(f"the wheel cache at {WHEELS} is older than pyproject.toml: "
                    "run ./scripts/test once to fill it again")
    venv = tmp_path / "venv"
    env = _clean_env(venv)
    wheel = _build_wheel(tmp_path, env)

    # A virtualenv of its own, filled by the repository's pip (no second pip to install),
    # offline: --no-index, every dependency from the cache. --no-compile: the modules a
    # command imports are compiled when it imports them, not the whole tree up front.
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path, env)
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-compile",
          "--no-index", "--find-links", str(WHEELS), str(wheel)], tmp_path, env)

    app = tmp_path / "app"
    app.mkdir()
    (app / "wheelapp.atl").write_text(APP_ATL, "utf-8")
    (app / "wheelapp.py").write_text(APP_PY, "utf-8")
    where = _run([str(python), "-c", "import atlantis, importlib.metadata as m; "
                  "print(atlantis.__file__); print(m.version('atlantis-jobs'))"], app, env)
    path, version = where.split()
    assert Path(path).is_relative_to(venv), path
    assert wheel.name.startswith(f"atlantis_jobs-{version}-")

    url = empty_db_url
    tide = [str(venv / "bin" / "tide"), "--database-url", url]
    _run([*tide, "db", "migrate", "--app", "wheelapp:registry"], app, env)
    job_id = int(_run([*tide, "job", "enqueue", "wheel.Hello", "--args", '{"name": "wheel"}'],
                      app, env))

    log = tmp_path / "supervisor.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(venv / "bin" / "atlantis-supervise"), "--database-url", url,
             "--app", "wheelapp:registry", "--queue", "wheel", "--concurrency", "1",
             "--poll-interval", "0.2s"],
            cwd=app, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            def ended() -> dict[str, Any] | None:
                row = job_row(conn, job_id)
                return row if row["state"] in ("complete", "dead", "cancelled") else None

            row = wait_for(ended, timeout=60, message=f"job {job_id} to end")
            assert row["state"] == "complete", log.read_text("utf-8", errors="replace")
        result = row["result"] if isinstance(row["result"], dict) else orjson.loads(row["result"])
        assert result["hello"] == "wheel"
        # The attempt ran in a child of the new virtualenv, on the wheel's atlantis.
        assert Path(result["atlantis"]).is_relative_to(venv), result
        assert Path(result["python"]).is_relative_to(venv), result
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0, log.read_text("utf-8", errors="replace")
