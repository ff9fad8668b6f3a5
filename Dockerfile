# atlantis-supervise in a container: `docker build -t atlantis .` at the repository's root.
#
# The image holds atlantis alone; your app (its .atl files and handlers) comes in by an image
# built FROM this one, or by a volume mounted on /app (docs/howto/containers.md). It needs
# ATLANTIS_DATABASE_URL: without it the supervisor refuses to start, in one line, and never
# starts an embedded PostgreSQL (ATLANTIS_EMBEDDED=never).
#
# atlantis-supervise is PID 1 (no init in front): it forks at once, PID 1 reaps every orphan
# and passes SIGTERM on, and the supervisor drains as under systemd. Give it a stop timeout
# longer than --drain-timeout + --kill-grace + 15s (the last writes, the children's exit) and
# a margin: 30 + 10 + 15 + 20 = 75s with the defaults (`docker stop -t 75`; Kubernetes'
# terminationGracePeriodSeconds, deploy/kubernetes/deployment.yaml).

ARG PYTHON_IMAGE=python:3.12-slim-bookworm

# ---- build: the wheel, then a virtualenv holding it and its dependencies --------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY atlantis ./atlantis
# Extras, e.g. --build-arg EXTRAS=otel for OpenTelemetry spans; a worker needs none (the
# console's and the development extras stay out).
ARG EXTRAS=""
RUN python -m pip wheel --no-deps --wheel-dir /dist . \
 && python -m venv /opt/atlantis \
 && /opt/atlantis/bin/pip install "$(ls /dist/atlantis_jobs-*.whl)${EXTRAS:+[$EXTRAS]}"

# ---- the image: the virtualenv, a user of its own, the supervisor as the entry point --------
FROM ${PYTHON_IMAGE}
# A numeric user, never root, so that Kubernetes' runAsNonRoot can check it; its home holds
# the .atl parser's cache (~/.cache/atlantis).
RUN groupadd --system --gid 10001 atlantis \
 && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/atlantis \
        --shell /usr/sbin/nologin atlantis
COPY --from=build /opt/atlantis /opt/atlantis
ENV PATH=/opt/atlantis/bin:$PATH \
    ATLANTIS_EMBEDDED=never
# The app goes here (owned by root: the supervisor's user reads it, never writes it).
WORKDIR /app
USER 10001:10001
STOPSIGNAL SIGTERM
ENTRYPOINT ["atlantis-supervise"]
CMD ["--queue", "default"]
