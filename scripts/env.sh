#!/usr/bin/env bash
# Creates (or reuses) the project's virtual environment in .venv and installs seedgrid into it.
# Sourced by the README's two commands; safe to run again: it reinstalls only when
# pyproject.toml changed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
python="${SEEDGRID_PYTHON:-python3.11}"
if ! command -v "$python" >/dev/null; then
  echo "seedgrid needs Python 3.11 ($python not found; set SEEDGRID_PYTHON)" >&2
  exit 2
fi
stamp=".venv/.seedgrid-installed"
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ ! -x .venv/bin/python ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "== creating the environment in .venv (torch from local disk; a few minutes the first time)"
  "$python" -m venv .venv
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e '.[dev]'
  echo "$want" > "$stamp"
fi
