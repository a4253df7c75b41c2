"""``txlog-bench``: the benchmark command line, above both layers it measures.

    txlog-bench decode ...   CommitLog decoder alone (txlog_io/bench.py, Spark-free)
    txlog-bench audit ...    the Spark audit at scale (jobs/bench/audit.py)
    txlog-bench scale ...    transaction-heavy brokers on the distributed reduce path (jobs/bench/scale.py)
    txlog-bench fuzz ...     decoder robustness (jobs/bench/fuzz.py)
    txlog-bench repair ...   offline repair of a store copy vs a plain cp (refbroker/repair_bench.py)

Lives in ``jobs`` because ``audit`` needs Spark; ``txlog_io.bench`` stays Spark-free and never imports
``jobs`` (the lower layer does not reach up).
"""
from __future__ import annotations

import importlib
import sys
from typing import Optional, Sequence

from txlog_io.errors import UsageError

USAGE = "usage: txlog-bench {decode,audit,scale,fuzz,repair} ..."
_COMMANDS = {"decode": "txlog_io.bench", "audit": "jobs.bench.audit", "scale": "jobs.bench.scale", "fuzz": "jobs.bench.fuzz",
             "repair": "refbroker.repair_bench"}


def _fail(msg: str) -> int:
    print(USAGE, file=sys.stderr)
    print(f"txlog-bench: error: {msg}", file=sys.stderr)
    return 2


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE + "\n\n" + (__doc__ or "").split("\n\n")[1])
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command not in _COMMANDS:
        return _fail(f"unknown command {command!r} (choose from {', '.join(_COMMANDS)})")
    try:
        module = importlib.import_module(_COMMANDS[command])
    except ModuleNotFoundError as e:
        if e.name != _COMMANDS[command]:
            raise
        return _fail(f"'{command}' is not available in this installation ({_COMMANDS[command]} is missing)")
    if command == "decode":
        rest = ["decode", *rest]
    try:
        return int(module.main(rest) or 0)
    except UsageError as e:
        return _fail(" ".join(str(e).split()))
    except Exception as e:  # noqa: BLE001 - the trace for the developer, then one line that says what failed
        import traceback

        traceback.print_exc(file=sys.stderr)
        print(f"txlog-bench: error: {command} failed: {failure_line(e)}", file=sys.stderr)
        return 1


def failure_line(exc: BaseException) -> str:
    """One line for a failed run: the exception's first line and, for a Spark job's Java error, its root
    cause (the last ``Caused by:`` line, e.g. ``java.lang.OutOfMemoryError: Java heap space``)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    first = lines[0] if lines else ""
    causes = [ln for ln in lines if ln.startswith("Caused by:")]
    tail = f" ({causes[-1]})" if causes and causes[-1] != first else ""
    return " ".join(f"{type(exc).__name__}: {first}{tail}".split())[:500]


def console_main() -> None:
    """The console script: :func:`main`, its status the process's exit status (txlog_io.process_exit)."""
    from txlog_io import process_exit

    process_exit.run(main)


if __name__ == "__main__":
    console_main()
