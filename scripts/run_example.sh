#!/usr/bin/env bash
# The main job: seedgrid on embedded SQLite with a local Ray runs the bundled example experiment
# to completion, with a progress bar, then prints the per-condition table and the variance
# comparisons. Extra arguments go to `seedgrid run` (e.g. --metric label_spread). The results go
# to seedgrid's default database (one per user; `seedgrid db current` prints where), or to
# SEEDGRID_DATABASE_URL when it is set.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/env.sh"
cd "$root"
exec .venv/bin/seedgrid run "${SEEDGRID_EXAMPLE:-examples/collapse_stopgrad.yaml}" "$@"
