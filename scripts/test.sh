#!/usr/bin/env bash
# Set up and run every check of the project: lint, types, tests.
# Usage: bash scripts/test.sh [extra pytest args]
# Needs Python >= 3.11 and pip; installs the package (editable) with the
# `dev` and `worker` extras (torch, grpc) into the current Python environment.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
echo "== install (editable, extras dev+worker)"
"$PY" -m pip install --quiet --disable-pip-version-check --progress-bar off -e ".[dev,worker]"

echo "== ruff"
"$PY" -m ruff check .

echo "== mypy (policy core and simulator)"
"$PY" -m mypy

echo "== pytest"
"$PY" -m pytest "$@"
