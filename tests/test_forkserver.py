"""The suite's supervisor fork server decides rightly which supervisors it may fork
(tests/forkserver.py): a fork must start like the program would."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tests.forkserver import _as_started, forkable

SERVER = {"HOME": "/root", "PATH": "/usr/bin"}


def test_an_app_folder_on_pythonpath_is_forked_and_applied_as_at_start(tmp_path: Path) -> None:
    env = {**SERVER, "PYTHONPATH": f"{tmp_path}{os.pathsep}relative",
           "PYTHONDONTWRITEBYTECODE": "1"}
    assert forkable(env, SERVER)
    path, bytecode = list(sys.path), sys.dont_write_bytecode
    try:
        _as_started(env)
        assert sys.path[1:3] == [str(tmp_path), os.path.abspath("relative")]
        assert sys.path[0] == path[0] and sys.dont_write_bytecode
    finally:
        sys.path[:], sys.dont_write_bytecode = path, bytecode


def test_what_runs_at_an_interpreters_start_is_never_forked(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("")
    assert not forkable({**SERVER, "PYTHONPATH": str(tmp_path)}, SERVER)
    assert not forkable({**SERVER, "PYTHONHASHSEED": "1"}, SERVER)
    assert not forkable({**SERVER, "LD_PRELOAD": "x.so"}, SERVER)
    # A server started with the variable: the fork could not take it away.
    assert not forkable(SERVER, {**SERVER, "PYTHONPATH": str(tmp_path)})
    assert forkable(SERVER, SERVER)
