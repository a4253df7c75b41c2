#!/usr/bin/env bash
# Run the test suite in the project's virtualenv (created/updated first).  Arguments go to pytest:
#   ./run-tests.sh                      # whole suite, on 2 pytest-xdist workers (a test file at a time)
#   ./run-tests.sh tests/test_delta_sink.py -q -k rerun      # one file: one process, as plain pytest
#   TXAUDIT_TEST_WORKERS=0 ./run-tests.sh                    # whole suite in one process (serial)
#   TXAUDIT_TEST_WORKERS=3 ./run-tests.sh                    # 3 workers
#
# Workers (docs/testing.md): TXAUDIT_TEST_WORKERS if set (0 = one process), else 2 unless the arguments name
# exactly one test file.  Arguments that choose themselves (-n, --numprocesses, --dist, -p no:xdist, --pdb,
# --collect-only) are passed as given, nothing added.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$ROOT"
"$ROOT/scripts/bootstrap.sh"

VENV_PY="${TXAUDIT_VENV:-$ROOT/.venv}/bin/python"
export SPARK_LOCAL_IP=127.0.0.1
export PYSPARK_PYTHON="$VENV_PY"
export PYSPARK_DRIVER_PYTHON="$VENV_PY"

xdist=()
own=0; files=0; dirs=0
for a in "$@"; do
    case "$a" in
        -n|-n[0-9]*|-nauto|-nlogical|--numprocesses*|--dist*|*xdist*|--pdb|--co|--collect-only) own=1 ;;
        -*) ;;
        *) if [ -f "${a%%::*}" ]; then files=$((files + 1)); elif [ -d "$a" ]; then dirs=$((dirs + 1)); fi ;;
    esac
done
if [ "$own" -eq 0 ]; then
    workers="${TXAUDIT_TEST_WORKERS:-}"
    if [ -z "$workers" ]; then
        workers=2
        if [ "$files" -eq 1 ] && [ "$dirs" -eq 0 ]; then workers=0; fi
    fi
    case "$workers" in
        ''|*[!0-9]*) echo "run-tests: error: TXAUDIT_TEST_WORKERS=$workers is not a number" >&2; exit 2 ;;
    esac
    # tests/conftest.py schedules a file at a time, longest first (tests/xdist_files.py)
    if [ "$workers" -gt 0 ]; then xdist=(-n "$workers" --dist loadfile); fi
fi

set +e
"$VENV_PY" -m pytest ${xdist[@]+"${xdist[@]}"} "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
    echo "run-tests: error: pytest collected no tests" >&2
fi
exit "$rc"
