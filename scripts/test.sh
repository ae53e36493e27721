#!/usr/bin/env bash
# Creates the environment and runs the whole test suite (real local Ray, SQLite files, HTTP).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/env.sh"
cd "$root"

# install_for_tests PACKAGE TEST: Debian's PACKAGE, system-wide, for the test file TEST. Only the
# tests need these, so they are installed here and not in env.sh. apt-get update runs only when
# the install fails without it (no or stale package lists): it is the slow part. apt's chatter is
# shown only when the install fails; without root or apt, the command to run is printed.
install_for_tests() {
  local package="$1" test="$2" apt_log
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "== $package is missing, for $test. Install it with:" \
         "sudo apt-get install -y --no-install-recommends $package" >&2
    return 0
  fi
  echo "== installing Debian's $package package system-wide (apt-get install), for $test"
  local install=(env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq
                 --no-install-recommends "$package")
  if ! apt_log="$("${install[@]}" 2>&1)" \
     && ! apt_log="$( { apt-get update -qq && "${install[@]}"; } 2>&1)"; then
    echo "$apt_log" >&2
    echo "== could not install $package; $test will say so" >&2
  fi
}

# tests/deploy/test_deploy.py checks deploy/compose.yaml with `docker-compose config`, which Debian's
# docker-compose 1.29 runs with no Docker engine. Without it the test skips (fails under CI=true).
if ! command -v docker-compose >/dev/null && ! docker compose version >/dev/null 2>&1; then
  install_for_tests docker-compose tests/deploy/test_deploy.py
fi
# tests/e2e/test_browser.py drives Debian's chromium with Playwright (which downloads no browser
# of its own then). Without it that test fails.
if ! command -v chromium >/dev/null; then
  install_for_tests chromium tests/e2e/test_browser.py
fi

# The checks of tools, before the tests: lint, the one format, types (pyproject.toml's
# [tool.mypy]: service, workers, trainers and api_schemas, with the pydantic plugin).
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
# The tests run on SEEDGRID_TEST_WORKERS processes (pytest-xdist; 0: in this one), each with
# its own local Ray, a test file's tests on one of them. Most tests wait (on Ray, on a
# subprocess, on HTTP) more than they compute. Measured on a quiet 2-core machine: one process
# 1,390 s, 2 processes 990 s, 3 processes 1,217 s (and tests that start interpreters waited
# longest there); beside 2 other CPU-bound processes, one took 2,657 s and 3 took 1,656 s; 2
# took 1,814 s on a fresh clone of a436ae8, and 1,723 s of cb3ff4b (an idle dispatcher backs
# off, a faster mean-test interval).
exec .venv/bin/python -m pytest -q -n "${SEEDGRID_TEST_WORKERS:-2}" --dist loadfile "$@"
