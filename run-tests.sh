#!/usr/bin/env bash
# Run the test suite in the project's virtualenv (created/updated first).  Arguments go to pytest:
#   ./run-tests.sh                      # whole suite
#   ./run-tests.sh tests/test_delta_sink.py -q -k rerun
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$ROOT"
"$ROOT/scripts/bootstrap.sh"

VENV_PY="${TXAUDIT_VENV:-$ROOT/.venv}/bin/python"
export SPARK_LOCAL_IP=127.0.0.1
export PYSPARK_PYTHON="$VENV_PY"
export PYSPARK_DRIVER_PYTHON="$VENV_PY"

set +e
"$VENV_PY" -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
    echo "run-tests: error: pytest collected no tests" >&2
fi
exit "$rc"
