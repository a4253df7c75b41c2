#!/usr/bin/env bash
# Code-health checks, each timed; exits non-zero on any finding (all three run, the first failure's code wins).
#
#   scripts/check.sh        # ruff check . ; lint-imports (.importlinter) ; mypy ([tool.mypy] in pyproject.toml)
#
# Runs scripts/bootstrap.sh first and the tools of its virtualenv (TXAUDIT_VENV, default ROOT/.venv): they are
# pinned in setup.cfg's `test` extras.  .ci/run calls it before the test suite.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
"$ROOT/scripts/bootstrap.sh"
BIN="${TXAUDIT_VENV:-$ROOT/.venv}/bin"

rc=0
run() {
    local name="$1"; shift
    local t0 ms status=0
    t0=$(date +%s%N)
    "$@" || status=$?
    ms=$(( ($(date +%s%N) - t0) / 1000000 ))
    printf 'check: %-12s %s in %d.%03d s\n' "$name" "$([ "$status" -eq 0 ] && echo ok || echo "FAILED ($status)")" \
        $((ms / 1000)) $((ms % 1000))
    if [ "$status" -ne 0 ] && [ "$rc" -eq 0 ]; then rc=$status; fi
}

run ruff "$BIN/ruff" check .
run lint-imports "$BIN/lint-imports" --no-cache
run mypy "$BIN/mypy"
exit "$rc"
