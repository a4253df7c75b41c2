"""Entry point of the Spark job (``spark-submit ... jobs/main.py <subcommand> ...``; see ./spark-submit.sh).

Subcommands::

    audit --store DIR [--store DIR2 ...] --out DIR [--as-of ISO-8601] [--mode indexed|full] [--conf-file FILE]
          [--include-bodies] [--broker NAME ...] [--profile NAME|auto] [--run-id ID] [--incremental]
    demo  [--out DIR] [--as-of ISO-8601] [--mode indexed|full] [--conf-file FILE] [--include-bodies]
          [--run-id ID]
    check [--checks FILE] [--json FILE] [--junit-xml FILE] --out DIR [--run-id ID] [--store DIR ... and every
          audit option]      (jobs/check/cli.py: exit 0 pass, 1 warn, 2 fail, 3 error -- also for misuse)
    report --out DIR [--run-id ID]      (HTML report of a finished run, from its Delta tables; no Spark)

audit and demo write ``OUT/report/<run_id>.html`` at the end of the run unless ``--no-report`` is given.
    repair --store DIR --out AUDIT_OUT [--run-id ID] --into NEWDIR [--actions LIST] [--dry-run]
          (jobs.repair.run; driver only, no SparkSession)
    recover --out AUDIT_OUT [--run-id ID] --namesrv HOST:PORT [--decisions FILE] [--send] [--rate N]
          [--timeout-s S] [--broker NAME ...] [--live-broker NAME] [--acl-file FILE]
          (jobs.recover.run; driver only, no SparkSession; dry run unless --send)

Arguments are parsed and validated on the driver into frozen dataclasses (:class:`AuditOptions`,
:class:`DemoOptions`) before any JVM starts; ``--validate-only`` (used by spark-submit.sh as a pre-check)
stops there, printing the driver JVM's options the run wants (``jobs.session.QUICK_JIT`` for a short run,
:func:`quick_run`; nothing otherwise).  Then ``jobs.audit.run.run_audit(spark, options)`` / ``jobs.demo.run_demo(spark, options)`` run.

Exit codes: 0 ok; 2 usage error (one line on stderr: ``txaudit: error: ...``); 1 audit failure.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import sys
from typing import List, Optional, Sequence

_HERE = os.path.dirname(os.path.abspath(__file__))
if __name__ == "__main__" and sys.path and os.path.abspath(sys.path[0]) == _HERE:
    # run as a file (spark-submit jobs/main.py): import the package, not its modules as top-level names
    sys.path[0] = os.path.dirname(_HERE)

from jobs.audit import guard  # noqa: E402
from jobs.check.cli import EXIT_ERROR as EXIT_CHECK_ERROR  # noqa: E402
from jobs.check.cli import add_arguments as add_check_arguments
from jobs.cli_options import AuditOptions, DemoOptions, ReportOptions  # noqa: E402,F401  (re-exported)
from jobs.config import MODES, AuditConfig, load_audit_config  # noqa: E402
from jobs.sources.options import default_broker_name  # noqa: E402,F401  (the data sources' naming rule)
from txlog_io.errors import UsageError  # noqa: E402

PROG = "txaudit"
EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2
DEFAULT_DEMO_OUT = "demo-out"


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting (one-line errors, exit code 2 by us)."""

    def error(self, message):  # noqa: D401
        raise UsageError(message)


def _build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, allow_abbrev=False,
                description="Offline audit of RocketMQ transactional messages from broker store files.")
    p.add_argument("--validate-only", action="store_true", help=argparse.SUPPRESS)
    sub = p.add_subparsers(dest="command", metavar="{audit,demo,check,report,repair,recover}", parser_class=_Parser)

    def common(sp, out_required: bool):
        sp.add_argument("--out", required=out_required, default=None if out_required else DEFAULT_DEMO_OUT,
                        help="output directory; one Delta table per output under it"
                             + ("" if out_required else f" (default: ./{DEFAULT_DEMO_OUT})"))
        sp.add_argument("--as-of", dest="as_of", default=None,
                        help="ISO-8601 time the audit judges 'now' (default: current UTC time); "
                             "a time without zone is UTC")
        sp.add_argument("--mode", choices=MODES, default=None,
                        help="indexed: find records through the ConsumeQueues; "
                             "full: scan every CommitLog record "
                             "(default: mode of the config, indexed)")
        sp.add_argument("--conf-file", dest="conf_file", default=None,
                        help="properties or JSON file overriding conf/audit-defaults.properties "
                             "and broker profile values (broker.<key>=...)")
        sp.add_argument("--include-bodies", dest="include_bodies", action="store_true", default=None,
                        help="copy message bodies into the outputs")
        sp.add_argument("--run-id", dest="run_id", default=None,
                        help="run id (default: derived from --as-of); re-running an id replaces its rows")
        sp.add_argument("--no-report", dest="report", action="store_false",
                        help="do not write the HTML report (OUT/report/<run_id>.html)")

    a = sub.add_parser("audit", help="audit one or more broker stores", allow_abbrev=False)
    a.add_argument("--store", action="append", required=True, metavar="DIR",
                   help="broker store root (the directory holding commitlog/); repeat for several brokers")
    a.add_argument("--broker", action="append", default=None, metavar="NAME",
                   help="broker name per --store, in order (default: the store directory's name, or its "
                        "parent's name when it is called 'store')")
    a.add_argument("--profile", default=None, metavar="NAME",
                   help="broker version profile of conf/broker-defaults.json, or auto (default: config)")
    common(a, out_required=True)

    def incremental(sp):
        sp.add_argument("--incremental", action="store_true", default=None,
                        help="continue from the latest completed run under --out: read only the CommitLog "
                             "appended since (full mode; falls back to a full audit, saying why)")
    incremental(a)

    d = sub.add_parser("demo", help="generate a reference store and audit it", allow_abbrev=False)
    common(d, out_required=False)

    k = sub.add_parser("check", allow_abbrev=False,
                       help="data-quality checks on an audit run (with --store: audit first; without: the "
                            "latest or --run-id run under --out); exit 0 pass, 1 warn, 2 fail, 3 error")
    k.add_argument("--store", action="append", default=None, metavar="DIR",
                   help="audit these stores first (as 'audit' does), then check that run")
    k.add_argument("--broker", action="append", default=None, metavar="NAME", help="as for audit")
    k.add_argument("--profile", default=None, metavar="NAME", help="as for audit")
    common(k, out_required=True)
    incremental(k)
    add_check_arguments(k)
    r = sub.add_parser("report", help="(re)build the HTML report of a finished run (no Spark, no store)",
                       allow_abbrev=False)
    r.add_argument("--out", required=True, help="output directory of earlier audit runs")
    r.add_argument("--run-id", dest="run_id", default=None, help="run to report on (default: the latest)")
    _add_repair_parser(sub)
    _add_recover_parser(sub)
    return p


def _add_recover_parser(sub) -> None:
    r = sub.add_parser("recover", help="send an audit run's recovery requests to a live broker (no Spark)",
                       allow_abbrev=False)
    r.add_argument("--out", required=True, metavar="AUDIT_OUT", help="the audit's output directory")
    r.add_argument("--run-id", dest="run_id", default=None, help="audit run (default: the newest)")
    r.add_argument("--namesrv", required=True, metavar="HOST:PORT", help="the cluster's NameServer")
    r.add_argument("--decisions", default=None, metavar="FILE",
                   help="lines '<transaction_key> COMMIT|ROLLBACK' for PREPARED halves (END_TRANSACTION)")
    r.add_argument("--send", action="store_true", help="send (default: dry run, print what would be sent)")
    r.add_argument("--rate", type=float, default=20.0, metavar="N", help="at most N requests per second (20)")
    r.add_argument("--timeout-s", dest="timeout_s", type=float, default=5.0, metavar="S",
                   help="connect / answer timeout per request (5)")
    r.add_argument("--broker", action="append", default=[], metavar="NAME",
                   help="only this audited broker's transactions (repeatable; default: all)")
    r.add_argument("--live-broker", dest="live_broker", default=None, metavar="NAME",
                   help="brokerName to send to (default: the master whose address the message ids carry)")
    r.add_argument("--acl-file", dest="acl_file", default=None, metavar="FILE",
                   help="ACL credentials (accessKey=, secretKey=); default: TXAUDIT_ACL_ACCESS_KEY / "
                        "TXAUDIT_ACL_SECRET_KEY from the environment")


def _recover_options(ns):
    from jobs.recover.run import RecoverOptions
    from txlog_io.msgid import parse_host

    out = os.path.abspath(ns.out)
    if not os.path.isdir(out):
        raise UsageError(f"--out: not a directory: {out}")
    try:
        parse_host(ns.namesrv)
    except UsageError as e:
        raise UsageError(f"--namesrv: {e}") from None
    if not ns.rate > 0:
        raise UsageError(f"--rate: must be > 0, got {ns.rate}")
    if not ns.timeout_s > 0:
        raise UsageError(f"--timeout-s: must be > 0, got {ns.timeout_s}")
    for name, path in (("--decisions", ns.decisions), ("--acl-file", ns.acl_file)):
        if path is not None and not os.path.isfile(path):
            raise UsageError(f"{name}: not a file: {path}")
    if ns.run_id is not None and not ns.run_id.strip():
        raise UsageError("--run-id: must not be empty")
    return RecoverOptions(out=out, run_id=ns.run_id, namesrv=ns.namesrv, decisions=ns.decisions,
                          send=bool(ns.send), rate=float(ns.rate), timeout_s=float(ns.timeout_s),
                          brokers=tuple(ns.broker), live_broker=ns.live_broker, acl_file=ns.acl_file)


def _add_repair_parser(sub) -> None:
    r = sub.add_parser("repair", help="repair a copy of an audited store (no Spark)", allow_abbrev=False)
    r.add_argument("--store", required=True, metavar="DIR", help="the audited store root (read-only)")
    r.add_argument("--out", required=True, metavar="AUDIT_OUT", help="the audit's output directory")
    r.add_argument("--run-id", dest="run_id", default=None,
                   help="audit run (default: the newest of the store)")
    r.add_argument("--into", required=True, metavar="NEWDIR", help="absent or empty directory for the copy")
    r.add_argument("--actions", default=None, metavar="LIST",
                   help="comma-separated MARK_DONE, REBUILD_CQ, REBUILD_STATETABLE (default: all)")
    r.add_argument("--dry-run", dest="dry_run", action="store_true", help="print the writes, write nothing")


def _repair_options(ns):
    from jobs.repair.run import RepairOptions, check_into
    from refbroker.repair import ACTIONS

    store = _check_store(ns.store)
    out = _existing_out(ns.out)
    actions = tuple(a.strip().upper() for a in (ns.actions or ",".join(ACTIONS)).split(",") if a.strip())
    bad = [a for a in actions if a not in ACTIONS]
    if bad or not actions:
        raise UsageError(f"--actions: unknown action(s) {', '.join(bad) or '(none given)'} "
                         f"(known: {', '.join(ACTIONS)})")
    if ns.run_id is not None and not ns.run_id.strip():
        raise UsageError("--run-id: must not be empty")
    return RepairOptions(store=store, out=out, into=check_into(store, ns.into), run_id=ns.run_id,
                         actions=actions, dry_run=bool(ns.dry_run))


def parse_as_of(value: Optional[str], now: Optional[dt.datetime] = None) -> dt.datetime:
    """ISO-8601 date or date-time -> aware UTC datetime (naive = UTC; default: now)."""
    if value is None:
        return (now or dt.datetime.now(dt.timezone.utc)).astimezone(dt.timezone.utc)
    v = value.strip()
    if v.endswith(("Z", "z")):
        v = v[:-1] + "+00:00"
    try:
        t = dt.datetime.fromisoformat(v)
    except ValueError:
        raise UsageError(f"--as-of: not an ISO-8601 date or date-time: {value!r}") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.timezone.utc)
    return t.astimezone(dt.timezone.utc)


def default_run_id(as_of: dt.datetime) -> str:
    return as_of.strftime("%Y%m%dT%H%M%SZ")


def _check_store(root: str) -> str:
    path = guard.check_store(root)
    from txlog_io.mappedfile import message_log_kind

    try:
        kind = message_log_kind(path)
    except UsageError as e:
        raise UsageError(f"--store: {e}") from None
    if kind is None:      # no log: auditing it would report a silent "0 transactions"
        raise UsageError(f"--store: no message log in {path} (neither commitlog/ nor dledger-<id>/data/): "
                         f"its transactions cannot be read")
    return path


def _check_out(out: str) -> str:
    return guard.check_out(out)


def _existing_out(out: str) -> str:
    """``--out`` of ``report`` / ``repair``: an audit's output directory (or prefix) that exists."""
    path = guard.check_out(out)
    from jobs.delta import outfs

    if not outfs.isdir(path):
        raise UsageError(f"--out: not a directory: {path}")
    return path


def _config(ns) -> AuditConfig:
    conf_file = None
    if ns.conf_file:
        conf_file = os.path.abspath(ns.conf_file)
        if not os.path.isfile(conf_file):
            raise UsageError(f"--conf-file: not found: {conf_file}")
    overrides = {}
    if ns.mode:
        overrides["mode"] = ns.mode
    if ns.include_bodies:
        overrides["include.bodies"] = "true"
    if getattr(ns, "profile", None):
        overrides["broker.profile"] = ns.profile
    return load_audit_config(conf_file, overrides or None)


def parse_args(argv: Sequence[str]):
    """``argv`` (without the program name) -> ``(validate_only, options)``; raises UsageError."""
    ns = _build_parser().parse_args(list(argv))
    if ns.command is None:
        raise UsageError("missing subcommand: audit, demo, check, report, repair or recover")
    if ns.command == "report":
        out = _existing_out(ns.out)
        if ns.run_id is not None and not ns.run_id.strip():
            raise UsageError("--run-id: must not be empty")
        return ns.validate_only, ReportOptions(out=out, run_id=ns.run_id)
    if ns.command == "repair":
        return ns.validate_only, _repair_options(ns)
    if ns.command == "recover":
        return ns.validate_only, _recover_options(ns)
    cfg = _config(ns)
    as_of = parse_as_of(ns.as_of)
    run_id = ns.run_id if ns.run_id is not None else default_run_id(as_of)
    if not run_id.strip():
        raise UsageError("--run-id: must not be empty")
    conf_file = os.path.abspath(ns.conf_file) if ns.conf_file else None
    out = _check_out(ns.out)
    if ns.command == "audit" or (ns.command == "check" and ns.store):
        stores: List[str] = []
        for s in ns.store:
            root = _check_store(s)
            if root in stores:
                raise UsageError(f"--store: given twice: {root}")
            stores.append(root)
        if ns.broker:
            brokers = list(ns.broker)
            if len(brokers) != len(stores):
                raise UsageError(f"--broker: {len(brokers)} name(s) for {len(stores)} store(s); "
                                 f"give one --broker per --store, in order")
            brokers = [guard.check_broker_name(b) for b in ns.broker]
        else:
            brokers = [guard.check_broker_name(default_broker_name(s), "--store (the broker name taken from "
                                               "its directory; name it with --broker)") for s in stores]
        if len(set(brokers)) != len(brokers):
            from txlog_io.mappedfile import message_log_kind

            # one name for several stores = replicas of one DLedger group (one broker): DLedger stores only
            shared = {b for b in brokers if brokers.count(b) > 1}
            if any(message_log_kind(s) != "dledger" for s, b in zip(stores, brokers, strict=True)
                   if b in shared):
                raise UsageError(f"broker names must be unique, got {brokers} (name each store with "
                                 f"--broker; only the replicas of one DLedger group may share a name)")
        guard.check_out_vs_stores(out, stores, [*cfg.table_names.values(), "audit_runs", "message_bodies"])
        opts = AuditOptions(stores=tuple(stores), brokers=tuple(brokers), out=out, as_of=as_of, mode=cfg.mode,
                            conf_file=conf_file, include_bodies=cfg.include_bodies, run_id=run_id,
                            profile=cfg.broker_profile, config=cfg, report=ns.report,
                            incremental=bool(getattr(ns, "incremental", None)))
    elif ns.command == "demo":
        if guard.storefs.is_remote(out):
            raise UsageError(f"--out: {out}: the demo writes its generated store under --out: give a directory")
        opts = DemoOptions(out=out, as_of=as_of, mode=cfg.mode, conf_file=conf_file,
                           include_bodies=cfg.include_bodies, run_id=run_id, config=cfg, report=ns.report)
    if ns.command == "check":
        from jobs.check.cli import check_options

        opts = check_options(ns, cfg, out, opts if ns.store else None)
    return ns.validate_only, opts


def _usage_error(msg: str, code: int = EXIT_USAGE) -> int:
    msg = " ".join(str(msg).split())        # always one line
    print(f"{PROG}: error: {msg}", file=sys.stderr)
    return code


def _run_repair(opts) -> int:
    """The repair job runs on the driver only (jobs.repair.run): no SparkSession."""
    from jobs.repair.run import run_repair

    try:
        return run_repair(opts)
    except UsageError as e:
        return _usage_error(str(e))
    except Exception as e:  # noqa: BLE001 - report, traceback for the operator, exit 1
        import traceback

        traceback.print_exc(file=sys.stderr)
        first = (str(e).strip().splitlines() or [""])[0]
        print(f"{PROG}: error: repair failed: {type(e).__name__}: {first}", file=sys.stderr)
        return EXIT_FAILURE


def _run_recover(opts) -> int:
    """The recover job runs on the driver only (jobs.recover.run): no SparkSession."""
    from jobs.recover.run import RecoverAbort, run_recover

    try:
        return run_recover(opts)
    except (UsageError, RecoverAbort) as e:
        return _usage_error(str(e))
    except Exception as e:  # noqa: BLE001 - report, traceback for the operator, exit 1
        import traceback

        traceback.print_exc(file=sys.stderr)
        first = (str(e).strip().splitlines() or [""])[0]
        print(f"{PROG}: error: recover failed: {type(e).__name__}: {first}", file=sys.stderr)
        return EXIT_FAILURE


def _validate(opts, is_check: bool) -> int:
    """``--validate-only``: the exit code of the checks made before a JVM starts (the arguments were parsed)."""
    if is_check:
        from jobs.check.cli import run_check_command

        return run_check_command(opts, validate_only=True)
    if isinstance(opts, (AuditOptions, DemoOptions)):
        held = guard.probe_lock(opts.out)
        return _usage_error(held) if held else EXIT_OK
    return EXIT_OK


def quick_run(opts) -> bool:
    """Whether the command's driver JVM is better off compiling with C1 only (``jobs.session.QUICK_JIT``): an
    audit expected to reduce on the driver (``jobs.audit.plan.quick_start``), a check (of such an audit, or of
    the tables alone), the demo's small store, and report / repair / recover, which run on the driver."""
    from jobs.audit.plan import quick_start

    if isinstance(opts, AuditOptions):
        return quick_start(opts)
    audit = getattr(opts, "audit", None)        # check: with --store it audits first
    return audit is None or quick_start(audit)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    is_check = next((a for a in argv if not a.startswith("-")), None) == "check"
    try:
        validate_only, opts = parse_args(argv)
    except UsageError as e:
        return _usage_error(str(e), EXIT_CHECK_ERROR if is_check else EXIT_USAGE)
    except SystemExit as e:              # --help printed the usage
        return int(e.code or 0)
    if validate_only:
        code = _validate(opts, is_check)
        if code == EXIT_OK and quick_run(opts):      # spark-submit.sh gives it to the driver JVM it starts
            from jobs.session import QUICK_JIT

            print(QUICK_JIT)
        return code
    if is_check:
        from jobs.check.cli import run_check_command

        return run_check_command(opts)
    if isinstance(opts, ReportOptions):
        return run_report(opts)
    if type(opts).__name__ == "RepairOptions":
        return _run_repair(opts)
    if type(opts).__name__ == "RecoverOptions":
        return _run_recover(opts)
    command = "audit" if isinstance(opts, AuditOptions) else "demo"
    # the job modules are imported before Spark starts, so a broken import fails fast
    if command == "audit":
        from jobs.audit.run import run_audit as run
    else:
        from jobs.demo import run_demo as run
    from jobs.session import build_session

    with contextlib.ExitStack() as held:
        try:
            held.enter_context(guard.out_lock(opts.out, opts.run_id))
        except UsageError as e:
            return _usage_error(str(e))
        return _run(run, build_session, command, opts)


def _run(run, build_session, command: str, opts) -> int:
    from jobs.config import object_store_conf
    from jobs.session import disk_full

    try:
        spark = build_session(app_name=f"txaudit-{command}", extra_conf=object_store_conf(),
                              quick_jit=quick_run(opts))
    except UsageError as e:             # a full or unwritable Spark local directory
        return _usage_error(str(e))
    try:
        run(spark, opts)
    except UsageError as e:
        return _usage_error(str(e))
    except NotImplementedError as e:
        print(f"{PROG}: error: {command} failed: {e}", file=sys.stderr)
        return EXIT_FAILURE
    except Exception as e:  # noqa: BLE001 - report, traceback for the operator, exit 1
        full = disk_full(e, opts.out, spark)
        if full:                         # the disk filled during the run: the trace adds nothing
            return _usage_error(f"{command} failed: {full}", EXIT_FAILURE)
        import traceback

        traceback.print_exc(file=sys.stderr)
        first = (str(e).strip().splitlines() or [""])[0]
        print(f"{PROG}: error: {command} failed: {type(e).__name__}: {first}", file=sys.stderr)
        return EXIT_FAILURE
    finally:
        try:
            spark.stop()
        except Exception:  # noqa: BLE001
            pass
    return EXIT_OK


def run_report(opts: ReportOptions) -> int:
    """``report``: no Spark; a missing table or run id is a one-line error (exit 1)."""
    try:
        from jobs.delta.tables import DeltaReadError
        from jobs.report.data import ReportDataError
        from jobs.report.write import write_report

        page = write_report(opts.out, opts.run_id)
    except (ReportDataError, DeltaReadError) as e:
        print(f"{PROG}: error: report: {' '.join(str(e).split())}", file=sys.stderr)
        return EXIT_FAILURE
    except Exception as e:  # noqa: BLE001 - traceback for the operator, one line last
        import traceback

        traceback.print_exc(file=sys.stderr)
        print(f"{PROG}: error: report failed: {type(e).__name__}: {str(e).strip()[:300]}", file=sys.stderr)
        return EXIT_FAILURE
    print(page, flush=True)
    return EXIT_OK


if __name__ == "__main__":
    from txlog_io import process_exit

    process_exit.run(main)
