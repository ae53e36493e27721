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
# Compile seedgrid's own modules (pip compiled the installed packages): where
# PYTHONDONTWRITEBYTECODE is set, as on some CI machines, each process would compile the ones it
# imports again, ~0.3 s of CPU for every Ray worker (it imports the trainers) and every service.
# Cheap when nothing changed; a module edited later is still read from its source.
.venv/bin/python -m compileall -q -j 0 api_schemas service trainers workers tests >/dev/null
