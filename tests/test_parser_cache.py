"""The `.atl` parser kept between processes (atlantis/declarations/parser_cache.py): loaded
only when it is this very parser and the user's own, never at the cost of a wrong parse."""

from __future__ import annotations

import importlib.resources
import os
import stat
from pathlib import Path
from typing import Any

import lark
import pytest

from atlantis.declarations import parser_cache

GRAMMAR = importlib.resources.files("atlantis.declarations").joinpath("atl.lark").read_text()
OPTIONS: dict[str, Any] = {"parser": "lalr", "lexer": "contextual", "propagate_positions": True}
ROOT = Path(__file__).resolve().parent.parent
SAMPLES = sorted(p for p in ROOT.glob("**/*.atl") if ".venv" not in p.parts)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(parser_cache.ENV_SWITCH, raising=False)
    return tmp_path / "atlantis"


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every parser read from a cache file."""
    seen: list[Any] = []
    real = lark.Lark.load

    def load(f: Any, **kwargs: Any) -> lark.Lark:
        seen.append(f)
        return real(f, **kwargs)

    monkeypatch.setattr(lark.Lark, "load", load)
    return seen


def _parses(parser: lark.Lark) -> list[Any]:
    out: list[Any] = []
    for path in SAMPLES:
        try:
            out.append(parser.parse(path.read_text("utf-8")))
        except lark.exceptions.UnexpectedInput as exc:
            out.append(repr(exc))
    return out


def test_the_second_process_loads_the_parser_the_first_built(cache: Path,
                                                             loads: list[Any]) -> None:
    first = parser_cache.build(GRAMMAR, **OPTIONS)
    assert loads == []
    files = list(cache.iterdir())
    assert len(files) == 1 and files[0].name.startswith("atl-parser-")
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert stat.S_IMODE(files[0].stat().st_mode) & 0o077 == 0
    second = parser_cache.build(GRAMMAR, **OPTIONS)
    assert len(loads) == 1
    assert len(SAMPLES) > 10 and _parses(second) == _parses(first)
    assert _parses(first) == _parses(lark.Lark(GRAMMAR, **OPTIONS))
    assert second.get_terminal("DURATION").pattern.value == \
        first.get_terminal("DURATION").pattern.value
    # Another grammar (or options, lark, Python) is another file: never the wrong parser.
    parser_cache.build(GRAMMAR + "\n// changed\n", **OPTIONS)
    assert len(list(cache.iterdir())) == 2 and len(loads) == 1


def test_a_file_others_may_write_is_never_loaded(cache: Path, loads: list[Any]) -> None:
    parser_cache.build(GRAMMAR, **OPTIONS)
    [path] = cache.iterdir()
    path.chmod(0o666)
    parser = parser_cache.build(GRAMMAR, **OPTIONS)
    assert loads == []  # built, and the file replaced by one of this user's only
    assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0
    assert _parses(parser) == _parses(lark.Lark(GRAMMAR, **OPTIONS))
    cache.chmod(0o777)
    parser_cache.build(GRAMMAR, **OPTIONS)
    assert loads == []


def test_a_damaged_file_is_built_anew(cache: Path, loads: list[Any]) -> None:
    parser_cache.build(GRAMMAR, **OPTIONS)
    [path] = cache.iterdir()
    path.write_bytes(path.read_bytes()[:1000])
    parser = parser_cache.build(GRAMMAR, **OPTIONS)
    assert _parses(parser) == _parses(lark.Lark(GRAMMAR, **OPTIONS))
    parser_cache.build(GRAMMAR, **OPTIONS)
    assert len(loads) == 2  # the damaged one (refused), then the one written anew
    assert [p.name for p in cache.iterdir()] == [path.name]  # no temporary file left


def test_no_cache_when_switched_off_or_without_a_place(cache: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(parser_cache.ENV_SWITCH, "0")
    parser_cache.build(GRAMMAR, **OPTIONS)
    assert not cache.exists()
    monkeypatch.delenv(parser_cache.ENV_SWITCH)
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # ignored, as the spec asks
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert parser_cache.folder() == tmp_path / "home" / ".cache" / "atlantis"
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))  # not a folder: nowhere to write
    parser = parser_cache.build(GRAMMAR, **OPTIONS)
    assert _parses(parser) == _parses(lark.Lark(GRAMMAR, **OPTIONS))
    assert os.path.isfile(blocked)
