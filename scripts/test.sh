#!/usr/bin/env bash
# Set up and run every check of the project: lint, format, types, unit and integration
# tests, and the end-to-end tests with real processes (engines, routers, Redis) and a
# real Kubernetes control plane.
#
# Usage: bash scripts/test.sh [extra pytest args for the unit suite]
#
# Needs Python >= 3.11 with pip, Go >= 1.26 (the control plane is built from Go modules,
# cached outside the repository in ~/.cache/vertumnus-k8s: ~12 min cold, <1 s warm), and
# Debian's redis-server (installed here with apt-get when missing, as root or with sudo).
# Installs the package (editable) with the dev, worker, router and operator extras into
# the current Python environment.
# VERTUMNUS_E2E=0 skips the end-to-end suites (a quick local run).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}

step() { printf '\n== %s\n' "$*"; }

step "system packages (redis-server)"
if ! command -v redis-server >/dev/null 2>&1; then
    SUDO=""
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null 2>&1 || { echo "redis-server is missing and this user cannot install it: apt-get install redis-server" >&2; exit 1; }
        SUDO=sudo
    fi
    $SUDO apt-get install -y -q redis-server >/dev/null 2>&1 \
        || { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q redis-server >/dev/null; }
fi
redis-server --version

step "install (editable, extras dev+worker+router+operator)"
"$PY" -m pip install --quiet --disable-pip-version-check --progress-bar off -e ".[dev,worker,router,operator]"

step "ruff"
"$PY" -m ruff check .
"$PY" -m ruff format --check .

step "mypy (core, simulator, worker, router, operator)"
"$PY" -m mypy

step "pytest: unit and integration (tests/)"
"$PY" -m pytest "$@"

if [ "${VERTUMNUS_E2E:-1}" = 0 ]; then
    echo "VERTUMNUS_E2E=0: end-to-end suites skipped"
    exit 0
fi

step "e2e: the pool with real engines, routers and Redis"
"$PY" -m pytest -q e2e/test_pool.py e2e/test_pool_redis.py

step "e2e: Kubernetes control plane (built from Go modules when missing)"
bash e2e/k8s/build.sh
"$PY" -m pytest -q e2e/test_control_plane.py e2e/test_operator.py e2e/test_operator_real_pool.py \
    e2e/test_operator_sglang.py
