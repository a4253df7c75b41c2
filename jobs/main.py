"""Entry point of the Spark job (``spark-submit ... jobs/main.py <subcommand> ...``; see ./spark-submit.sh).

Subcommands::

    audit --store DIR [--store DIR2 ...] --out DIR [--as-of ISO-8601] [--mode indexed|full] [--conf-file FILE]
          [--include-bodies] [--broker NAME ...] [--profile NAME|auto] [--run-id ID]
    demo  [--out DIR] [--as-of ISO-8601] [--mode indexed|full] [--conf-file FILE] [--include-bodies]
          [--run-id ID]

Arguments are parsed and validated on the driver into frozen dataclasses (:class:`AuditOptions`,
:class:`DemoOptions`) before any JVM starts; ``--validate-only`` (used by spark-submit.sh as a pre-check)
stops there.  Then ``jobs.audit.run_audit(spark, options)`` / ``jobs.demo.run_demo(spark, options)`` run.

Exit codes: 0 ok; 2 usage error (one line on stderr: ``txaudit: error: ...``); 1 audit failure.
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

_HERE = os.path.dirname(os.path.abspath(__file__))
if __name__ == "__main__" and sys.path and os.path.abspath(sys.path[0]) == _HERE:
    # run as a file (spark-submit jobs/main.py): import the package, not its modules as top-level names
    sys.path[0] = os.path.dirname(_HERE)

from txlog_io.errors import UsageError  # noqa: E402

from jobs.config import MODES, AuditConfig, load_audit_config  # noqa: E402
from jobs.options import default_broker_name  # noqa: E402,F401  (the data sources' naming rule)

PROG = "txaudit"
EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2
DEFAULT_DEMO_OUT = "demo-out"
_STORE_MARKERS = ("commitlog", "consumequeue", "checkpoint", "config", "transaction")


@dataclass(frozen=True)
class AuditOptions:
    """One audit run, validated on the driver."""

    stores: Tuple[str, ...]          # absolute store roots, in the order given
    brokers: Tuple[str, ...]         # one broker name per store
    out: str                         # absolute output directory (Delta tables under it)
    as_of: dt.datetime               # timezone-aware UTC; the audit's "now"
    mode: str                        # indexed | full
    conf_file: Optional[str]         # user config file (absolute) or None
    include_bodies: bool
    run_id: str                      # re-running the same run id replaces that run's rows
    profile: str                     # broker profile name or "auto"
    config: AuditConfig              # defaults + conf file, validated

    @property
    def run_date(self) -> dt.date:
        return self.as_of.date()

    @property
    def store_pairs(self) -> Tuple[Tuple[str, str], ...]:
        """``((broker, store root), ...)``."""
        return tuple(zip(self.brokers, self.stores))


@dataclass(frozen=True)
class DemoOptions:
    """``demo``: generate a reference store under ``out`` and audit it."""

    out: str
    as_of: dt.datetime
    mode: str
    conf_file: Optional[str]
    include_bodies: bool
    run_id: str
    config: AuditConfig


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting (one-line errors, exit code 2 by us)."""

    def error(self, message):  # noqa: D401
        raise UsageError(message)


def _build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, allow_abbrev=False,
                description="Offline audit of RocketMQ transactional messages from broker store files.")
    p.add_argument("--validate-only", action="store_true", help=argparse.SUPPRESS)
    sub = p.add_subparsers(dest="command", metavar="{audit,demo}", parser_class=_Parser)

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

    a = sub.add_parser("audit", help="audit one or more broker stores", allow_abbrev=False)
    a.add_argument("--store", action="append", required=True, metavar="DIR",
                   help="broker store root (the directory holding commitlog/); repeat for several brokers")
    a.add_argument("--broker", action="append", default=None, metavar="NAME",
                   help="broker name per --store, in order (default: the store directory's name, or its "
                        "parent's name when it is called 'store')")
    a.add_argument("--profile", default=None, metavar="NAME",
                   help="broker version profile of conf/broker-defaults.json, or auto (default: config)")
    common(a, out_required=True)

    d = sub.add_parser("demo", help="generate a reference store and audit it", allow_abbrev=False)
    common(d, out_required=False)
    return p


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
    path = os.path.abspath(root)
    if not os.path.exists(path):
        raise UsageError(f"--store: store not found: {path}")
    if not os.path.isdir(path):
        raise UsageError(f"--store: not a directory: {path}")
    if not any(os.path.exists(os.path.join(path, m)) for m in _STORE_MARKERS):
        inner = os.path.join(path, "store")
        hint = f"; did you mean {inner}?" if os.path.isdir(inner) else ""
        raise UsageError(f"--store: not a RocketMQ store root (none of {', '.join(_STORE_MARKERS)} inside): "
                         f"{path}{hint}")
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
    path = os.path.abspath(out)
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"--out: exists and is not a directory: {path}")
    parent = path
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.access(parent, os.W_OK):
        raise UsageError(f"--out: cannot create or write {path} ({parent} is not writable)")
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
        raise UsageError("missing subcommand: audit or demo")
    cfg = _config(ns)
    as_of = parse_as_of(ns.as_of)
    run_id = ns.run_id if ns.run_id is not None else default_run_id(as_of)
    if not run_id.strip():
        raise UsageError("--run-id: must not be empty")
    conf_file = os.path.abspath(ns.conf_file) if ns.conf_file else None
    out = _check_out(ns.out)
    if ns.command == "audit":
        stores: List[str] = []
        for s in ns.store:
            root = _check_store(s)
            if root in stores:
                raise UsageError(f"--store: given twice: {root}")
            stores.append(root)
        if ns.broker:
            brokers = [b.strip() for b in ns.broker]
            if len(brokers) != len(stores):
                raise UsageError(f"--broker: {len(brokers)} name(s) for {len(stores)} store(s); "
                                 f"give one --broker per --store, in order")
            if any(not b for b in brokers):
                raise UsageError("--broker: empty broker name")
        else:
            brokers = [default_broker_name(s) for s in stores]
        if len(set(brokers)) != len(brokers):
            from txlog_io.mappedfile import message_log_kind

            # one name for several stores = replicas of one DLedger group (one broker): DLedger stores only
            shared = {b for b in brokers if brokers.count(b) > 1}
            if any(message_log_kind(s) != "dledger" for s, b in zip(stores, brokers) if b in shared):
                raise UsageError(f"broker names must be unique, got {brokers} (name each store with "
                                 f"--broker; only the replicas of one DLedger group may share a name)")
        for s in stores:
            if out == s or out.startswith(s.rstrip(os.sep) + os.sep):
                raise UsageError(f"--out must not be inside a store (stores are read-only): {out}")
        opts = AuditOptions(stores=tuple(stores), brokers=tuple(brokers), out=out, as_of=as_of, mode=cfg.mode,
                            conf_file=conf_file, include_bodies=cfg.include_bodies, run_id=run_id,
                            profile=cfg.broker_profile, config=cfg)
    else:
        opts = DemoOptions(out=out, as_of=as_of, mode=cfg.mode, conf_file=conf_file,
                           include_bodies=cfg.include_bodies, run_id=run_id, config=cfg)
    return ns.validate_only, opts


def _usage_error(msg: str) -> int:
    msg = " ".join(str(msg).split())        # always one line
    print(f"{PROG}: error: {msg}", file=sys.stderr)
    return EXIT_USAGE


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        validate_only, opts = parse_args(argv)
    except UsageError as e:
        return _usage_error(str(e))
    except SystemExit as e:              # --help printed the usage
        return int(e.code or 0)
    command = "audit" if isinstance(opts, AuditOptions) else "demo"
    if command == "demo":
        import importlib.util

        if importlib.util.find_spec("jobs.demo") is None:
            print(f"{PROG}: error: demo failed: jobs.demo is not available yet", file=sys.stderr)
            return EXIT_FAILURE
    if validate_only:
        return EXIT_OK

    # the job modules are imported before Spark starts, so a broken import fails fast
    if command == "audit":
        from jobs.audit import run_audit as run
    else:
        from jobs.demo import run_demo as run
    from jobs.session import build_session

    spark = build_session(app_name=f"txaudit-{command}")
    try:
        run(spark, opts)
    except UsageError as e:
        return _usage_error(str(e))
    except NotImplementedError as e:
        print(f"{PROG}: error: {command} failed: {e}", file=sys.stderr)
        return EXIT_FAILURE
    except Exception as e:  # noqa: BLE001 - report, traceback for the operator, exit 1
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


if __name__ == "__main__":
    sys.exit(main())
