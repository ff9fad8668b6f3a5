"""The systemd unit template: its hardening, limits and stop timing, read from the file."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from atlantis.supervisor.settings import Settings
from atlantis.units import parse_duration, parse_size

UNIT = Path(__file__).resolve().parent.parent / "deploy" / "systemd" / "atlantis-supervise@.service"


def _directives() -> dict[str, dict[str, list[str]]]:
    """section -> key -> every value (systemd allows a key more than once)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in UNIT.read_text("utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        assert not line.endswith("\\"), f"continued lines are not expected: {line}"
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        assert current is not None, f"directive outside a section: {line}"
        key, eq, value = line.partition("=")
        assert eq, f"not a directive: {line}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def _one(service: dict[str, list[str]], key: str) -> str:
    values = service.get(key)
    assert values, f"{key}= missing from the unit"
    return values[-1]


def test_unit_keeps_the_supervisor_contract() -> None:
    service = _directives()["Service"]
    assert _one(service, "Type") == "notify"
    assert _one(service, "KillMode") == "mixed"
    assert _one(service, "KillSignal") == "SIGTERM"
    assert _one(service, "User") == "atlantis"
    assert _one(service, "ExecStart").split()[0].endswith("/atlantis-supervise")


@pytest.mark.parametrize(("key", "expected"), [
    ("NoNewPrivileges", "yes"),
    ("ProtectSystem", "strict"),
    ("ProtectHome", "yes"),
    ("PrivateTmp", "yes"),
    ("PrivateDevices", "yes"),
    ("ProtectKernelTunables", "yes"),
    ("ProtectKernelModules", "yes"),
    ("ProtectControlGroups", "yes"),
    ("RestrictSUIDSGID", "yes"),
    ("LockPersonality", "yes"),
    ("RestrictRealtime", "yes"),
    ("RestrictNamespaces", "yes"),
    ("SystemCallArchitectures", "native"),
    ("CapabilityBoundingSet", ""),
    ("UMask", "0077"),
])
def test_hardening_directives(key: str, expected: str) -> None:
    assert _one(_directives()["Service"], key) == expected


def test_atlantis_home_is_the_only_writable_path() -> None:
    service = _directives()["Service"]
    writable = " ".join(service["ReadWritePaths"]).split()
    home = [v.split("=", 1)[1] for v in service.get("Environment", [])
            if v.startswith("ATLANTIS_HOME=")]
    assert home == ["/var/lib/atlantis"]
    assert writable == home


def test_limits_have_documented_defaults() -> None:
    service = _directives()["Service"]
    tasks = int(_one(service, "TasksMax"))
    memory = parse_size(_one(service, "MemoryMax"))
    files = int(_one(service, "LimitNOFILE"))
    assert 512 <= tasks <= 65536, "TasksMax bounds a fork bomb; it must be a number"
    assert memory >= 512 * 1024**2
    assert files >= 4096
    for key in ("TasksMax", "MemoryMax", "LimitNOFILE"):
        assert "Default" in _comment_above(key), f"{key} has no comment giving its default"


def _comment_above(key: str) -> str:
    """The comment lines right above ``key=`` in the unit."""
    lines = UNIT.read_text("utf-8").splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(f"{key}="))
    comment: list[str] = []
    for line in reversed(lines[:at]):
        if not line.startswith("#"):
            break
        comment.insert(0, line)
    return "\n".join(comment)


def test_stop_timeout_exceeds_the_drain() -> None:
    service = _directives()["Service"]
    stop = parse_duration(_one(service, "TimeoutStopSec"))
    d = Settings()
    # The defaults: drain, then SIGKILL after the kill grace, then the last results written
    # and idle children gone.
    assert stop > d.drain_timeout + d.kill_grace + d.flush_timeout + d.exit_timeout
    # And what ExecStart asks for, if it overrides them.
    argv = shlex.split(_one(service, "ExecStart"))
    given = {a: parse_duration(b) for a, b in zip(argv, argv[1:], strict=False)
             if a in ("--drain-timeout", "--kill-grace")}
    drain = given.get("--drain-timeout", d.drain_timeout)
    grace = given.get("--kill-grace", d.kill_grace)
    assert stop > drain + grace + d.flush_timeout + d.exit_timeout
    watchdog = parse_duration(_one(service, "WatchdogSec"))
    assert watchdog >= 10


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze(tmp_path: Path) -> None:
    unit = tmp_path / "atlantis-supervise@queue.service"
    shutil.copy(UNIT, unit)
    verify = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True,
                            text=True, timeout=60)
    problems = [line for line in (verify.stdout + verify.stderr).splitlines()
                if line.strip() and "is not executable" not in line]  # not installed here
    assert problems == []
    security = subprocess.run(["systemd-analyze", "security", "--offline=true", str(unit)],
                              capture_output=True, text=True, timeout=60)
    if "--offline" in security.stderr and security.returncode != 0:
        pytest.skip("this systemd-analyze has no --offline")
    last = security.stdout.strip().splitlines()[-1]
    assert "Overall exposure level" in last
    exposure = float(last.split(":")[-1].split()[0])
    assert exposure <= 2.5, last
