#!/usr/bin/env bash
# Creates the environment and runs the whole test suite (real local Ray, SQLite files, HTTP).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/env.sh"
cd "$root"
.venv/bin/ruff check .
exec .venv/bin/python -m pytest -q "$@"
