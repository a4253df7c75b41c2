#!/usr/bin/env bash
# Idempotent project bootstrap: virtualenv + editable install + Java check.
#
#   scripts/bootstrap.sh            # creates/updates ROOT/.venv, quiet when nothing to do
#
# Environment: TXAUDIT_VENV (venv path, default ROOT/.venv), PYTHON (interpreter to create it with, default: the
# first of python3, python3.13 .. python3.10 that is >= 3.10), JAVA_HOME (java to check, default `java` on PATH).
# The editable install is redone only when setup.cfg / pyproject.toml (or the repo path) change: their hash is kept
# in VENV/.txaudit-setup.sha256.  Must work on a machine that has only python3 and a JDK 17.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TXAUDIT_VENV:-$ROOT/.venv}"
STAMP="$VENV/.txaudit-setup.sha256"

die() { echo "bootstrap: error: $*" >&2; exit 1; }

# --- Java (Spark 4 needs 17+) ------------------------------------------------------------------------------------
java_bin="java"
if [ -n "${JAVA_HOME:-}" ] && [ -x "$JAVA_HOME/bin/java" ]; then java_bin="$JAVA_HOME/bin/java"; fi
if ! java_out="$("$java_bin" -version 2>&1)"; then
    die "'$java_bin -version' failed: install a Java 17+ runtime (e.g. apt-get install openjdk-17-jre-headless) or set JAVA_HOME"
fi
java_major="$(printf '%s\n' "$java_out" | sed -n 's/.*version "\([0-9][0-9]*\)[."].*/\1/p' | head -n1)"
if [ "${java_major:-0}" = "1" ]; then java_major=8; fi
if [ -n "$java_major" ] && [ "$java_major" -lt 17 ]; then
    die "Java $java_major found ($java_bin); Spark 4 needs Java 17+: install a JDK 17 or point JAVA_HOME at one"
fi

# --- interpreter -------------------------------------------------------------------------------------------------
py_ok() { "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' >/dev/null 2>&1; }

hash_inputs() {
    # what decides whether the editable install is current: packaging metadata + where the repo lives
    { cat "$ROOT/setup.cfg" "$ROOT/pyproject.toml" 2>/dev/null; echo "root=$ROOT"; } | "$1" -c \
        'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())'
}

# serialise concurrent bootstraps of the same venv (run-tests.sh and spark-submit.sh may race)
if command -v flock >/dev/null 2>&1; then
    lock="${TMPDIR:-/tmp}/txaudit-bootstrap-$(printf '%s' "$VENV" | cksum | cut -d' ' -f1).lock"
    exec 9>"$lock"
    flock 9
fi

if [ ! -x "$VENV/bin/python" ] || ! py_ok "$VENV/bin/python"; then
    base_py=""
    for cand in ${PYTHON:-} python3 python3.13 python3.12 python3.11 python3.10; do
        if command -v "$cand" >/dev/null 2>&1 && py_ok "$cand"; then base_py="$cand"; break; fi
    done
    [ -n "$base_py" ] || die "no Python >= 3.10 found (tried ${PYTHON:-} python3 python3.13..python3.10)"
    echo "bootstrap: creating virtualenv $VENV with $(command -v "$base_py")" >&2
    rm -rf "$VENV"
    "$base_py" -m venv "$VENV" \
        || die "'$base_py -m venv' failed (Debian/Ubuntu: apt-get install python3-venv)"
fi

want="$(hash_inputs "$VENV/bin/python")"
have="$(cat "$STAMP" 2>/dev/null || true)"
if [ "$want" != "$have" ]; then
    echo "bootstrap: installing rocketmq-txaudit[test] into $VENV (setup.cfg changed or first run)" >&2
    rm -f "$STAMP"
    log="$VENV/.txaudit-install.log"
    # pip's and the build backend's chatter goes to the log; shown only when something fails
    if ! "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >"$log" 2>&1; then
        tail -n 20 "$log" >&2; die "pip upgrade failed in $VENV (full log: $log)"
    fi
    if ! "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e "$ROOT[test]" >>"$log" 2>&1; then
        tail -n 20 "$log" >&2; die "pip install -e '$ROOT[test]' failed (full log: $log)"
    fi
    printf '%s\n' "$want" > "$STAMP"
fi
