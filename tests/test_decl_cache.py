"""What `.atl` files declare, kept between processes (atlantis/declarations/decl_cache.py):
loaded only for these very bytes at this path, read by this code, from the user's own
files; a process that finds them never imports lark."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from atlantis.declarations import decl_cache, parser, parser_cache
from atlantis.errors import DeclarationError

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = sorted(p for p in ROOT.glob("**/*.atl") if ".venv" not in p.parts)
JOB = """job Pack in shop {
  args { order_id bigint not null }
  retries 2
}
"""


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv(parser_cache.ENV_SWITCH, raising=False)
    return tmp_path / "xdg" / "atlantis"


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every file the parser read (a miss of the cache)."""
    seen: list[str] = []
    real = parser.read_atl_bytes

    def read(raw: bytes, filename: str) -> Any:
        seen.append(filename)
        return real(raw, filename)

    monkeypatch.setattr(parser, "read_atl_bytes", read)
    return seen


def kept(cache: Path) -> list[Path]:
    return sorted(cache.glob(f"{decl_cache.PREFIX}*"))


def test_a_second_read_loads_what_the_first_parsed(cache: Path, parses: list[str]) -> None:
    read = 0
    for path in SAMPLES:
        try:
            first = decl_cache.read_atl_file(path)
        except DeclarationError:
            continue
        read += 1
        assert decl_cache.read_atl_file(path) == first == parser.read_atl(
            path.read_text("utf-8"), str(path))
    assert read > 10 and len(parses) == read  # each parsed once, then loaded
    files = kept(cache)
    assert len(files) == read
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(f.stat().st_mode) & 0o077 == 0 for f in files)


def test_a_process_that_finds_the_app_kept_never_imports_lark(cache: Path) -> None:
    code = ("import sys; from atlantis.app import load_app; "
            "r = load_app('tests.apps.basic:registry'); "
            "print(len(r.decls), len(r.workflows), 'lark' in sys.modules)")
    env = {**os.environ, "XDG_CACHE_HOME": str(cache.parent)}
    runs = [subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, text=True,
                           capture_output=True, check=True).stdout.split() for _ in range(2)]
    assert runs[0][:2] == runs[1][:2] and int(runs[0][0]) > 0
    assert runs[0][2] == "True"  # the first parsed the file
    assert runs[1][2] == "False"  # the second loaded it


def test_a_changed_or_moved_file_is_read_afresh(cache: Path, tmp_path: Path,
                                                 parses: list[str]) -> None:
    path = tmp_path / "jobs.atl"
    path.write_text(JOB)
    assert decl_cache.read_atl_file(path).jobs[0].retries == 2
    path.write_text(JOB.replace("retries 2", "retries 5"))
    assert decl_cache.read_atl_file(path).jobs[0].retries == 5
    moved = tmp_path / "moved.atl"
    path.rename(moved)
    assert decl_cache.read_atl_file(moved).jobs[0].source.startswith(str(moved))
    assert len(parses) == 3 and len(kept(cache)) == 3


def test_the_reading_code_is_part_of_the_key(cache: Path, tmp_path: Path,
                                             parses: list[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "jobs.atl"
    path.write_text(JOB)
    decl_cache.read_atl_file(path)
    monkeypatch.setattr(decl_cache, "fingerprint", lambda: b"another release")
    decl_cache.read_atl_file(path)
    assert len(parses) == 2  # a new release of the parser reads the file again


def test_a_refused_file_is_never_kept(cache: Path, tmp_path: Path) -> None:
    path = tmp_path / "bad.atl"
    path.write_text("job Pack in shop {\n  retries many\n}\n")
    for _ in range(2):
        with pytest.raises(DeclarationError, match=r"bad\.atl:2:"):
            decl_cache.read_atl_file(path)
    assert kept(cache) == []
    path.write_bytes(b"job P\xff in shop {}\n")
    with pytest.raises(DeclarationError, match="not valid UTF-8"):
        decl_cache.read_atl_file(path)
    with pytest.raises(OSError):
        decl_cache.read_atl_file(tmp_path / "missing.atl")


def test_a_file_others_may_write_or_a_damaged_one_is_never_loaded(
        cache: Path, tmp_path: Path, parses: list[str]) -> None:
    path = tmp_path / "jobs.atl"
    path.write_text(JOB)
    first = decl_cache.read_atl_file(path)
    [kept_file] = kept(cache)
    kept_file.chmod(0o666)
    assert decl_cache.read_atl_file(path) == first
    assert len(parses) == 2  # parsed again, and the file replaced by a private one
    assert stat.S_IMODE(kept_file.stat().st_mode) & 0o077 == 0
    kept_file.write_bytes(b"not a pickle")
    kept_file.chmod(0o600)
    assert decl_cache.read_atl_file(path) == first
    assert len(parses) == 3
    cache.chmod(0o777)
    assert decl_cache.read_atl_file(path) == first
    assert len(parses) == 4


def test_switched_off_nothing_is_kept_and_old_files_are_trimmed(
        cache: Path, tmp_path: Path, parses: list[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "jobs.atl"
    path.write_text(JOB)
    monkeypatch.setenv(parser_cache.ENV_SWITCH, "0")
    decl_cache.read_atl_file(path)
    decl_cache.read_atl_file(path)
    assert len(parses) == 2 and not cache.exists()
    monkeypatch.delenv(parser_cache.ENV_SWITCH)
    monkeypatch.setattr(decl_cache, "KEEP", 2)
    for n in range(4):
        path.write_text(JOB.replace("retries 2", f"retries {n}"))
        decl_cache.read_atl_file(path)
        newest = max(kept(cache), key=lambda f: f.stat().st_mtime_ns)
        os.utime(newest, ns=(n * 10**9, (n + 1) * 10**9))
    assert len(kept(cache)) == 2
    assert decl_cache.read_atl_file(path).jobs[0].retries == 3
    assert len(parses) == 6  # the last one was kept
