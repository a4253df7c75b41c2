"""The ``check`` subcommand's options and run (called by jobs/main.py; see jobs/check/evaluate.py for what it does).

Exit codes (Soda's ``soda scan``): 0 every check passed, 1 at least one warning, 2 at least one failure, 3 the
checks could not be evaluated -- a bad checks file, an unknown metric or broker, a bad option, an unreadable
store or output table, a Spark failure -- with one line ``txaudit: error: ...`` on stderr.  For ``check`` a
misused option is therefore exit 3, not the 2 of ``audit`` (2 means "a check failed" here).
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Optional

from txlog_io.errors import TxlogError, UsageError

# jobs.main imports this module for every subcommand: the checks machinery (pyarrow, yaml) is imported only
# when check runs, so audit's and demo's pre-check stay light

PROG = "txaudit"
EXIT_ERROR = 3
DEFAULT_CHECKS = "checks-default.yaml"
#: audit options that mean nothing without --store (the run under --out was audited with its own)
_AUDIT_ONLY = (("as_of", "--as-of"), ("mode", "--mode"), ("include_bodies", "--include-bodies"),
               ("profile", "--profile"), ("broker", "--broker"), ("incremental", "--incremental"))


@dataclass(frozen=True)
class CheckOptions:
    """``check``, validated on the driver: with ``audit`` set the audit runs first and its run is checked."""

    checks: object                 # jobs.check.checks.ChecksFile
    out: str
    run_id: Optional[str]          # run to check (None: the latest finished run under out)
    json_path: Optional[str]
    junit_path: Optional[str]
    config: object                 # jobs.config.AuditConfig
    audit: Optional[object] = None  # jobs.main.AuditOptions
    report: bool = True            # rebuild OUT/report/<run_id>.html with the check results (--no-report: no)


def add_arguments(parser) -> None:
    parser.add_argument("--checks", default=None, metavar="FILE",
                        help=f"YAML checks file (default: conf/{DEFAULT_CHECKS})")
    parser.add_argument("--json", dest="json_path", default=None, metavar="FILE",
                        help="also write the results as JSON (success, statistics, results)")
    parser.add_argument("--junit-xml", dest="junit_path", default=None, metavar="FILE",
                        help="also write the results as JUnit XML (one testcase per check result)")


def _output_file(option: str, path: Optional[str]) -> Optional[str]:
    if path is None:
        return None
    p = os.path.abspath(path)
    if os.path.isdir(p):
        raise UsageError(f"{option}: is a directory: {p}")
    parent = os.path.dirname(p)
    if not os.path.isdir(parent):
        raise UsageError(f"{option}: directory does not exist: {parent}")
    if not os.access(parent, os.W_OK):
        raise UsageError(f"{option}: directory not writable: {parent}")
    return p


def check_options(ns, config, out: str, audit=None) -> CheckOptions:
    """Build :class:`CheckOptions` from the parsed namespace (``audit``: the AuditOptions when --store was
    given).  Raises UsageError / ChecksFileError (both exit 3 for check)."""
    from jobs.check.checks import ChecksFileError, load_checks
    from jobs.config import conf_dir

    if audit is None:
        given = [opt for attr, opt in _AUDIT_ONLY if getattr(ns, attr, None) not in (None, False, [])]
        if given:
            raise UsageError(f"{given[0]}: only with --store (without it, check evaluates a run already "
                             f"under --out, audited with its own settings)")
    path = ns.checks if ns.checks is not None else os.path.join(str(conf_dir()), DEFAULT_CHECKS)
    checks = load_checks(path)
    if audit is not None:
        for c in checks.checks:
            for b in c.brokers:
                if b not in ("*", "each") and b not in audit.brokers:
                    raise ChecksFileError(f"checks file {checks.path}: check #{c.index} {c.name!r}: key "
                                          f"'broker': broker {b!r} is not audited (brokers: "
                                          f"{', '.join(audit.brokers)})")
    run_id = audit.run_id if audit is not None else ns.run_id
    if run_id is not None and not run_id.strip():
        raise UsageError("--run-id: must not be empty")
    return CheckOptions(checks=checks, out=out, run_id=run_id, json_path=_output_file("--json", ns.json_path),
                        junit_path=_output_file("--junit-xml", ns.junit_path), config=config, audit=audit,
                        report=getattr(ns, "report", True))


def _error(msg: str) -> int:
    print(f"{PROG}: error: {' '.join(str(msg).split())}", file=sys.stderr, flush=True)
    return EXIT_ERROR


def run_check_command(opts: CheckOptions, validate_only: bool = False) -> int:
    """Audit (when asked), evaluate, print, write the files; returns the exit code."""
    if validate_only:
        return 0
    from jobs.check.evaluate import CheckError, log, run_check
    from jobs.check.output import format_results, summary_line, write_json, write_junit

    names = dict(opts.config.table_names)
    spark = None
    try:
        if opts.audit is not None:
            from jobs.audit.plan import quick_start
            from jobs.audit.run import run_audit
            from jobs.config import object_store_conf
            from jobs.session import build_session, disk_full

            try:
                spark = build_session(app_name="txaudit-check", extra_conf=object_store_conf(),
                                      quick_jit=quick_start(opts.audit))
            except UsageError as e:     # a full or unwritable Spark local directory
                return _error(str(e))
            try:
                run_audit(spark, opts.audit)
            except UsageError as e:
                return _error(str(e))
            except Exception as e:  # noqa: BLE001 - traceback for the operator, one line, exit 3
                full = disk_full(e, opts.out, spark)
                if full:                 # the disk filled during the audit: the trace adds nothing
                    return _error(f"check failed: the audit failed: {full}")
                import traceback

                traceback.print_exc(file=sys.stderr)
                first = (str(e).strip().splitlines() or [""])[0]
                return _error(f"check failed: the audit failed: {type(e).__name__}: {first}")
        t0 = time.monotonic()
        try:
            report = run_check(opts.checks, opts.out, opts.run_id, names, spark, opts.config.delta_writer)
        except (CheckError, TxlogError) as e:
            return _error(str(e))
        except Exception as e:  # noqa: BLE001
            import traceback

            traceback.print_exc(file=sys.stderr)
            first = (str(e).strip().splitlines() or [""])[0]
            return _error(f"check failed: {type(e).__name__}: {first}")
        try:
            if opts.json_path:
                write_json(report, opts.json_path)
            if opts.junit_path:
                write_junit(report, opts.junit_path)
        except OSError as e:
            return _error(f"cannot write {e.filename}: {e.strerror}")
        if opts.report:       # the run's page now shows its check results (a failed report only warns)
            from jobs.audit.run import write_run_report

            write_run_report(opts.out, report.run.run_id)
        s = report.seconds
        log(f"check: {len(opts.checks.checks)} check(s) -> {len(report.results)} result(s) on run "
            f"{report.run.run_id} in {time.monotonic() - t0:.2f} s (read {s['read']:.2f}, evaluate "
            f"{s['evaluate']:.2f}, write {s['write']:.2f})")
        print(format_results(report), flush=True)
        print(summary_line(report), flush=True)
        errors = [r for r in report.results if r.status == "ERROR"]
        if errors:      # one line, like every other exit 3; every ERROR row is in check_results / stdout
            more = f" (and {len(errors) - 1} more ERROR result(s))" if len(errors) > 1 else ""
            _error(errors[0].message + more)
        return report.exit_code
    finally:
        if spark is not None:
            try:
                spark.stop()
            except Exception:  # noqa: BLE001
                pass


__all__ = ["CheckOptions", "add_arguments", "check_options", "run_check_command", "EXIT_ERROR"]
