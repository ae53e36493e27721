#!/usr/bin/env bash
# The main job: seedgrid on embedded SQLite with a local Ray runs the bundled example experiment
# to completion, with a progress bar, then prints the per-condition table and the variance
# comparisons. Extra arguments go to `seedgrid run` (e.g. --metric min_l2_ratio).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/env.sh"
cd "$root"
export SEEDGRID_DATABASE_URL="${SEEDGRID_DATABASE_URL:-sqlite:///./seedgrid.db}"
exec .venv/bin/seedgrid run "${SEEDGRID_EXAMPLE:-examples/collapse_stopgrad.yaml}" "$@"
