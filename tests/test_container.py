"""The container image and the Kubernetes manifests (Dockerfile, deploy/kubernetes/,
docs/howto/containers.md): the supervisor refuses to start without a database URL and never
starts an embedded server there; every flag and environment variable they use exists; the
Deployment's grace period outlasts the drain; the scaler's query runs; and, where docker or
podman works, the image is built and started. The supervisor as PID 1 and its readiness
port are tested in tests/test_pid_one.py and tests/test_readiness.py."""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import psycopg
import pytest

from atlantis import environ
from atlantis.supervisor.cli import main as supervise_command
from atlantis.supervisor.settings import Settings, from_options
from atlantis.units import parse_duration, parse_size
from tests.conftest import BIN, ROOT
from tests.docs import bad_input_text

DOCKERFILE = ROOT / "Dockerfile"
KUBERNETES = ROOT / "deploy" / "kubernetes"
REFUSAL = ("atlantis-supervise: ATLANTIS_DATABASE_URL is not set and ATLANTIS_EMBEDDED=never: "
           "set it (or --database-url) to the database's URL; no embedded PostgreSQL is started")
BAD_MODE = "atlantis-supervise: ATLANTIS_EMBEDDED='sometimes' is not one of auto, never"
#: Variables the image or the manifests may set that are not atlantis's (pip's, the shell's).
NOT_ATLANTIS = frozenset({"PATH", "PIP_DISABLE_PIP_VERSION_CHECK", "PIP_NO_CACHE_DIR",
                          "PIP_ROOT_USER_ACTION"})
#: Every variable atlantis reads or sets (atlantis/environ.py).
ATLANTIS_VARIABLES = frozenset(v for k, v in vars(environ).items()
                               if k.isupper() and isinstance(v, str))


# ---- no database URL: one line, nothing started -----------------------------------------------

def _without_url(tmp_path: Path, mode: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in (environ.DATABASE_URL, environ.APP, environ.EMBEDDED)}
    return {**env, environ.EMBEDDED: mode, environ.HOME: str(tmp_path / "home")}


@pytest.mark.parametrize(("mode", "argv", "line"), [
    ("never", [], REFUSAL),
    ("never", ["--queue", "pidone", "--app", "tests.apps.pidone:registry"], REFUSAL),
    ("sometimes", ["--queue", "pidone", "--app", "tests.apps.pidone:registry"], BAD_MODE),
], ids=["no-arguments", "app-and-queue", "bad-mode"])
def test_without_a_database_url_the_supervisor_refuses_in_one_line(
        tmp_path: Path, mode: str, argv: list[str], line: str) -> None:
    """What the image's entry point does with no ATLANTIS_DATABASE_URL: exit 2, one line,
    before anything else is looked at; no embedded server, no home made for one."""
    done = subprocess.run([str(BIN / "atlantis-supervise"), *argv], cwd=ROOT,
                          env=_without_url(tmp_path, mode), capture_output=True, text=True,
                          timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (2, "", line + "\n")
    assert not (tmp_path / "home").exists(), "something was made for an embedded server"


def test_without_a_database_url_tide_refuses_too(tmp_path: Path) -> None:
    done = subprocess.run([str(BIN / "tide"), "job", "list"], cwd=ROOT,
                          env=_without_url(tmp_path, "never"), capture_output=True, text=True,
                          timeout=60)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == ("tide: cannot start the embedded PostgreSQL: "
                           + REFUSAL.removeprefix("atlantis-supervise: ") + "\n")
    assert not (tmp_path / "home").exists()


# ---- the Dockerfile and the manifests ---------------------------------------------------------

def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, its arguments) in order; continued lines joined, comments dropped."""
    found: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text("utf-8").splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, rest = (pending + line).partition(" ")
        found.append((keyword.upper(), rest.strip()))
        pending = ""
    return found


def image_env() -> dict[str, str]:
    """The final stage's ENV."""
    env: dict[str, str] = {}
    for keyword, rest in dockerfile():
        if keyword == "FROM":
            env = {}
        elif keyword == "ENV":
            for pair in shlex.split(rest):
                name, eq, value = pair.partition("=")
                assert eq, f"ENV {rest}: write NAME=value"
                env[name] = value
    return env


def instruction(keyword: str) -> str:
    """The final value of ``keyword`` (the last one written)."""
    values = [rest for k, rest in dockerfile() if k == keyword]
    assert values, f"no {keyword} in the Dockerfile"
    return values[-1]


def manifests() -> dict[str, dict[str, Any]]:
    """Every document of deploy/kubernetes/, by kind."""
    yaml = pytest.importorskip("yaml")
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(KUBERNETES.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text("utf-8")):
            assert doc["kind"] not in found, f"two {doc['kind']} in deploy/kubernetes"
            found[doc["kind"]] = doc
    return found


def supervisor_container() -> dict[str, Any]:
    containers = manifests()["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    container: dict[str, Any] = containers[0]
    return container


def checked(argv: list[str], where: str) -> Settings:
    """The settings ``argv`` makes, with every flag an option of atlantis-supervise."""
    options = {opt for p in supervise_command.params for opt in p.opts}
    unknown = [a.split("=")[0] for a in argv
               if a.startswith("--") and a.split("=")[0] not in options]
    assert not unknown, f"{where}: no such option of atlantis-supervise: {unknown}"
    ctx = supervise_command.make_context("atlantis-supervise", list(argv))
    return from_options(ctx.params)


def test_every_flag_and_variable_the_image_uses_exists() -> None:
    entrypoint = json.loads(instruction("ENTRYPOINT"))
    assert entrypoint == ["atlantis-supervise"], "exec form: the supervisor itself is PID 1"
    checked(json.loads(instruction("CMD")), "Dockerfile CMD")
    env = image_env()
    unknown = set(env) - ATLANTIS_VARIABLES - NOT_ATLANTIS
    assert not unknown, f"Dockerfile ENV: atlantis reads no {sorted(unknown)}"
    assert env[environ.EMBEDDED] == "never"
    assert environ.DATABASE_URL not in env, "a secret is never baked into an image"


def test_the_image_is_slim_non_root_and_stops_with_sigterm() -> None:
    stages = [rest for keyword, rest in dockerfile() if keyword == "FROM"]
    assert len(stages) >= 2 and " AS " not in stages[-1].upper(), "a build stage, then the image"
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", DOCKERFILE.read_text("utf-8"), re.MULTILINE)
    assert base is not None and re.fullmatch(r"python:3\.1[1-9]-slim\S*", base.group(1))
    user = instruction("USER")
    assert re.fullmatch(r"[1-9][0-9]*:[1-9][0-9]*", user), "a numeric user, not root"
    assert instruction("STOPSIGNAL") == "SIGTERM"
    assert ".whl" in " ".join(rest for keyword, rest in dockerfile() if keyword == "RUN")
    ignored = (ROOT / ".dockerignore").read_text("utf-8").splitlines()
    assert ignored[ignored.index("*") + 1:][:4] == ["!pyproject.toml", "!README.md",
                                                     "!LICENSE", "!atlantis"]


def test_every_flag_and_variable_the_manifests_use_exists() -> None:
    container = supervisor_container()
    settings = checked(container["args"], "deployment.yaml args")
    names = [e["name"] for e in container["env"]]
    unknown = set(names) - ATLANTIS_VARIABLES - NOT_ATLANTIS
    assert not unknown, f"deployment.yaml env: atlantis reads no {sorted(unknown)}"
    url = next(e for e in container["env"] if e["name"] == environ.DATABASE_URL)
    assert "value" not in url and url["valueFrom"]["secretKeyRef"]["key"]
    # The probes name the supervisor's own port and paths.
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert settings.ready_host == "0.0.0.0" and settings.ready_port
    for probe, path in (("readinessProbe", "/ready"), ("startupProbe", "/live"),
                        ("livenessProbe", "/live")):
        get = container[probe]["httpGet"]
        assert get["path"] == path, probe
        assert ports.get(get["port"], get["port"]) == settings.ready_port, probe
    assert ports["metrics"] == settings.metrics_port
    # The user is the image's.
    pod = manifests()["Deployment"]["spec"]["template"]["spec"]
    uid, gid = (int(x) for x in instruction("USER").split(":"))
    assert (pod["securityContext"]["runAsNonRoot"], pod["securityContext"]["runAsUser"],
            pod["securityContext"]["runAsGroup"]) == (True, uid, gid)
    # Children recycled on memory before the container's limit is reached.
    limit = parse_size(container["resources"]["limits"]["memory"].replace("i", "iB"))
    assert settings.concurrency * settings.max_memory_per_child < limit


def test_the_grace_period_outlasts_the_drain() -> None:
    """terminationGracePeriodSeconds > --drain-timeout + --kill-grace + the last writes and
    the idle children's exit, with a margin; the comment above it says the sum."""
    settings = checked(supervisor_container()["args"], "deployment.yaml args")
    grace = manifests()["Deployment"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    stop = (settings.drain_timeout + settings.kill_grace + settings.flush_timeout
            + settings.exit_timeout)
    assert grace >= stop + 10, f"{grace}s leaves no margin after a {stop:g}s stop"
    text = (KUBERNETES / "deployment.yaml").read_text("utf-8")
    assert f"= {stop:g}s" in text and f"= {grace}s" in text, "the comment's arithmetic"
    assert settings.drain_timeout == parse_duration("30s")  # what docs/howto/containers.md says


def test_the_scaled_object_scales_the_deployment_on_the_queue_signal(
        db: psycopg.Connection[Any]) -> None:
    found = manifests()
    deployment, scaled = found["Deployment"], found["ScaledObject"]
    assert scaled["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "postgresql"
    settings = checked(supervisor_container()["args"], "deployment.yaml args")
    assert settings.queues == ("contacts",)
    query = trigger["metadata"]["query"]
    assert "atlantis.queue_signal('contacts')" in query
    assert float(trigger["metadata"]["targetQueryValue"]) == settings.concurrency
    auth = found["TriggerAuthentication"]
    assert trigger["authenticationRef"]["name"] == auth["metadata"]["name"]
    secret = next(e for e in supervisor_container()["env"]
                  if e["name"] == environ.DATABASE_URL)["valueFrom"]["secretKeyRef"]["name"]
    assert [(r["parameter"], r["name"]) for r in auth["spec"]["secretTargetRef"]] == [
        ("connection", secret)]
    # The query returns one whole number, 0 for a queue with nothing to do.
    assert db.execute(query).fetchall() == [(0,)]


# ---- the image, built and started where docker or podman works ---------------------------------

#: A build that failed for want of a network says so in one of these.
_OFFLINE = ("Temporary failure in name resolution", "Could not find a version",
            "Failed to establish a new connection", "No matching distribution",
            "network is unreachable", "i/o timeout")


def _engine() -> str:
    """docker or podman, whichever works here; the test is skipped (saying why) otherwise."""
    why = []
    for name in ("docker", "podman"):
        path = shutil.which(name)
        if path is None:
            why.append(f"{name} is not installed")
            continue
        done = subprocess.run([path, "info"], capture_output=True, text=True, timeout=60)
        if done.returncode == 0:
            return path
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        why.append(f"{name} does not work: {last}")
    pytest.skip("no container engine: " + "; ".join(why))


@pytest.mark.timeout(1800)
def test_the_image_builds_runs_as_its_user_and_refuses_without_a_url() -> None:
    engine = _engine()
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", DOCKERFILE.read_text("utf-8"), re.MULTILINE)
    assert base is not None
    pulled = subprocess.run([engine, "pull", base.group(1)], capture_output=True, text=True,
                            timeout=600)
    if pulled.returncode != 0:
        last = (pulled.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip(f"{engine} cannot pull the base image {base.group(1)}: {last}")
    tag = f"atlantis-test:{secrets.token_hex(4)}"
    built = subprocess.run([engine, "build", "-t", tag, "-f", str(DOCKERFILE), str(ROOT)],
                           capture_output=True, text=True, timeout=1500)
    try:
        if built.returncode != 0 and any(s in built.stdout + built.stderr for s in _OFFLINE):
            pytest.skip(f"{engine} build has no network for pip: "
                        f"{built.stderr.strip().splitlines()[-1]}")
        assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
        _check_image(engine, tag)
    finally:
        subprocess.run([engine, "rmi", "-f", tag], capture_output=True, timeout=120)


def _check_image(engine: str, tag: str) -> None:
    inspected = subprocess.run([engine, "image", "inspect", "--format", "{{json .Config}}", tag],
                               capture_output=True, text=True, timeout=60, check=True)
    config = json.loads(inspected.stdout)
    assert (config["User"], config["StopSignal"], config["Entrypoint"]) == (
        instruction("USER"), "SIGTERM", ["atlantis-supervise"])
    run = [engine, "run", "--rm", "--network", "none"]
    uid = subprocess.run([*run, "--entrypoint", "id", tag, "-u"], capture_output=True,
                         text=True, timeout=120)
    assert uid.stdout.strip() == instruction("USER").split(":")[0], uid.stderr
    refused = subprocess.run([*run, tag], capture_output=True, text=True, timeout=120)
    assert (refused.returncode, refused.stdout, refused.stderr) == (2, "", REFUSAL + "\n")
    # The app from a mount: loaded (it registers its handlers), then the database is waited
    # for, and is not there.
    mounted = subprocess.run(
        [*run, "-e", f"{environ.DATABASE_URL}=postgresql://nobody@127.0.0.1:1/none",
         "-v", f"{ROOT / 'tests' / 'apps'}:/app/apps:ro", tag, "--queue", "pidone",
         "--app", "apps.pidone:registry", "--startup-timeout", "1s"],
        capture_output=True, text=True, timeout=120)
    assert mounted.returncode == 1, mounted.stderr
    assert "atlantis-supervise: database unreachable for 1s, giving up" in mounted.stderr


def test_the_bad_input_table_quotes_these_messages() -> None:
    text = bad_input_text()
    for message in (REFUSAL, BAD_MODE, "atlantis-supervise: --ready-port must be between 0 and 65535",
                    "atlantis-supervise: --ready-port and --metrics-port must differ",
                    "atlantis-supervise: --ready-host nosuch.invalid: cannot resolve it: ",
                    ": cannot listen on 127.0.0.1:8081: Address already in use"):
        assert message in text, message
