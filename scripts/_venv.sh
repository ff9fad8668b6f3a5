# Sourced by scripts/demo and scripts/test: make .venv with Python >= 3.11 and install the
# project into it. EXTRAS selects optional dependencies (e.g. "[dev]").
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

find_python() {
    for candidate in "${PYTHON:-}" python3 python3.13 python3.12 python3.11 python; do
        [ -n "$candidate" ] || continue
        command -v "$candidate" >/dev/null 2>&1 || continue
        if "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
            echo "$candidate"
            return 0
        fi
    done
    return 1
}

if [ ! -x .venv/bin/python ]; then
    py=$(find_python) || { echo "atlantis needs Python 3.11 or newer (set PYTHON=...)" >&2; exit 2; }
    "$py" -m venv .venv
fi
stamp=".venv/.installed${EXTRAS:-}"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
    .venv/bin/python -m pip install -q --disable-pip-version-check -e ".${EXTRAS:-}"
    touch "$stamp"
fi
