#!/usr/bin/env bash
# Creates the environment and runs the whole test suite (real local Ray, SQLite files, HTTP).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/env.sh"
cd "$root"

# tests/deploy/test_deploy.py checks deploy/compose.yaml with `docker-compose config`, which Debian's
# docker-compose 1.29 runs with no Docker engine. Installed here, not in env.sh: only the tests
# need it. Without root or apt the test skips (fails under CI=true) and says what is missing.
if ! command -v docker-compose >/dev/null && ! docker compose version >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "== installing Debian's docker-compose package system-wide (apt-get install), for" \
         "tests/deploy/test_deploy.py"
    install_compose() {
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-compose
    }
    # apt-get update only when the install fails without it (no or stale package lists): it is
    # the slow part. apt's chatter is shown only when the install fails.
    if ! apt_log="$(install_compose 2>&1)" \
       && ! apt_log="$( { apt-get update -qq && install_compose; } 2>&1)"; then
      echo "$apt_log" >&2
      echo "== could not install docker-compose; tests/deploy/test_deploy.py will say so" >&2
    fi
  else
    echo "== docker-compose is missing; tests/deploy/test_deploy.py skips its compose check. Install" \
         "it with: sudo apt-get install -y --no-install-recommends docker-compose" >&2
  fi
fi

.venv/bin/ruff check .
exec .venv/bin/python -m pytest -q "$@"
