"""The ``recover`` command: ``./spark-submit.sh recover --out AUDIT_OUT [--run-id ID] --namesrv HOST:PORT
[--decisions FILE] [--send] [--rate N] ...`` (driver only, no Spark).

1. pick the audit run; build its requests (jobs.recover.plan): RESUME_CHECK_HALF_MESSAGE per RESUME_DISCARDED
   transaction, END_TRANSACTION per decision for a PREPARED half;
2. leave out what ``recovery_log`` already shows answered SUCCESS for this audit run (broker, transaction key,
   request): re-running after a partial failure sends only what is still needed;
3. per request, at most ``--rate`` per second: route through the NameServer, staleness check against the
   broker's index (jobs.recover.live), then -- only with ``--send`` -- send it as a two-way request and wait
   for the broker's answer (the producer sends END_TRANSACTION one-way; sent two-way the broker answers it,
   so its response code and remark are recorded; nothing received within ``--timeout-s`` is NO_RESPONSE);
4. print one line per request and append the rows to ``recovery_log`` (schemas.recover) through the Delta
   sink, as this invocation's run (``<audit run id>.recover-<UTC time>``), flushed every
   ``FLUSH_EVERY`` rows and at the end, also when aborting.

Aborts (exit 2, one line, nothing further sent): NameServer or broker unreachable, no route, a broker that
rejects the credentials (ACL), a broker that stops answering.  Without ``--send`` nothing is written.
Credentials: ``TXAUDIT_ACL_ACCESS_KEY`` / ``TXAUDIT_ACL_SECRET_KEY`` [/ ``TXAUDIT_ACL_SECURITY_TOKEN``], or
``--acl-file`` (``accessKey=`` / ``secretKey=`` [/ ``securityToken=``] lines); never printed or logged.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import List, Optional, Tuple

from jobs.recover import live
from jobs.recover import plan as P
from jobs.recover.wire import Remote, Unreachable
from txlog_io import remoting as R
from txlog_io.errors import UsageError

FLUSH_EVERY = 50
ENV_KEYS = ("TXAUDIT_ACL_ACCESS_KEY", "TXAUDIT_ACL_SECRET_KEY", "TXAUDIT_ACL_SECURITY_TOKEN")


class RecoverAbort(Exception):
    """Stop now (exit 2, one line): the cluster cannot be reached or refuses us."""


@dataclass(frozen=True)
class RecoverOptions:
    out: str
    run_id: Optional[str]
    namesrv: str
    decisions: Optional[str]
    send: bool
    rate: float
    timeout_s: float
    brokers: Tuple[str, ...]
    live_broker: Optional[str]
    acl_file: Optional[str]


def load_credentials(acl_file: Optional[str]) -> Optional[R.Credentials]:
    if acl_file:
        try:
            lines = open(acl_file, encoding="utf-8").read().splitlines()
        except OSError as e:
            raise UsageError(f"--acl-file: cannot read {acl_file}: {e.strerror}") from None
        kv = {}
        for line in lines:
            k, sep, v = line.partition("=")
            if sep and not line.lstrip().startswith("#"):
                kv[k.strip()] = v.strip()
        if not kv.get("accessKey") or not kv.get("secretKey"):
            raise UsageError(f"--acl-file: {acl_file} needs accessKey= and secretKey= lines")
        return R.Credentials(kv["accessKey"], kv["secretKey"], kv.get("securityToken") or None)
    ak, sk, token = (os.environ.get(k) for k in ENV_KEYS)
    if bool(ak) != bool(sk):
        raise UsageError(f"set both {ENV_KEYS[0]} and {ENV_KEYS[1]} (or neither)")
    return R.Credentials(ak, sk, token or None) if ak and sk else None


def _row(run_id: str, req: P.Request, name: Optional[str], addr: Optional[str], outcome: str,
         code: Optional[int] = None, remark: Optional[str] = None, sent_at: Optional[int] = None,
         latency: Optional[int] = None) -> dict:
    return {"audit_run_id": run_id, "broker": req.broker, "transaction_key": req.transaction_key,
            "uniq_key": req.uniq_key, "request": req.kind, "request_code": req.code, "decision": req.decision,
            "live_broker": name, "broker_addr": addr, "header": json.dumps(req.header, sort_keys=True),
            "outcome": outcome, "response_code": code, "remark": remark, "sent_at_ms": sent_at,
            "latency_ms": latency}


def _print(verb: str, req: P.Request, where: str, detail: str) -> None:
    what = f"{req.kind}{' ' + req.decision if req.decision else ''}"
    print(f"{verb:<21} {what:<25} {req.broker}/{req.transaction_key}  -> {where}  {detail}", flush=True)


def write_log(out: str, invocation: str, rows: List[dict]) -> None:
    import pyarrow as pa

    from jobs.delta.sink import write_table
    from schemas.recover import RECOVERY_LOG

    write_table(pa.Table.from_pylist(rows, schema=RECOVERY_LOG.arrow_schema()), out, RECOVERY_LOG,
                run_id=invocation)


def _one(remote: Remote, routes: live.Routes, req: P.Request, run_id: str, send: bool) -> Optional[dict]:
    name, addr = routes.resolve(req)
    where = f"{name}@{addr}"
    verdict = live.staleness(remote, addr, req)
    if verdict:
        _print(verdict[0], req, where, verdict[1])
        return _row(run_id, req, name, addr, verdict[0], remark=verdict[1]) if send else None
    if not send:
        _print("WOULD SEND", req, where, json.dumps(req.header, sort_keys=True))
        return None
    sent_at = int(time.time() * 1000)
    t0 = time.monotonic()
    try:
        resp = remote.call(addr, req.code, req.header)
    except (Unreachable, R.RemotingFormatError) as e:
        row = _row(run_id, req, name, addr, "NO_RESPONSE", remark=str(e), sent_at=sent_at,
                   latency=int((time.monotonic() - t0) * 1000))
        _print("NO_RESPONSE", req, where, str(e))
        raise RecoverAbort(f"broker {where} stopped answering ({e}); {req.kind} for {req.transaction_key} may "
                           f"or may not have been applied (recorded as NO_RESPONSE)") from _Carry(row)
    latency = int((time.monotonic() - t0) * 1000)
    outcome = "OK" if resp.code == R.SUCCESS else "FAILED"
    row = _row(run_id, req, name, addr, outcome, resp.code, resp.remark, sent_at, latency)
    _print(outcome, req, where, f"response {live.describe(resp)} in {latency} ms")
    if live.is_acl_error(resp):
        raise RecoverAbort(f"ACL: broker {where} rejected the credentials: {live.describe(resp)}") \
            from _Carry(row)
    return row


class _Carry(Exception):
    """Carries the row of the request an abort happened on."""

    def __init__(self, row: dict):
        super().__init__("row")
        self.row = row


def run_recover(opts: RecoverOptions) -> int:
    t_start = time.monotonic()
    run = P.pick_run(opts.out, opts.run_id)
    creds = load_credentials(opts.acl_file)
    brokers = set(opts.brokers) or None
    decisions = P.read_decisions(opts.decisions) if opts.decisions else {}
    ends, notes = P.end_requests(run, decisions, brokers)
    requests = P.resume_requests(run, brokers) + ends
    done = P.done_keys(opts.out, run["run_id"])
    todo = [r for r in requests if r.log_key not in done]
    invocation = f"{run['run_id']}.recover-{dt.datetime.now(dt.timezone.utc).strftime('%Y%m%dT%H%M%S%fZ')}"
    print(f"txaudit: recover from audit run {run['run_id']}: {len(requests)} request(s), "
          f"{len(requests) - len(todo)} already answered SUCCESS (recovery_log), {len(todo)} to "
          f"{'send' if opts.send else 'check (dry run: nothing is sent; --send sends)'}; "
          f"{'ACL credentials from ' + ('--acl-file' if opts.acl_file else 'the environment') if creds else 'no ACL'}",
          file=sys.stderr)
    for n in notes:
        print(f"txaudit: note: {n}", file=sys.stderr)
    remote = Remote(opts.timeout_s, creds)
    routes = live.Routes(remote, opts.namesrv, opts.live_broker)
    rows: List[dict] = []
    written = 0
    t0 = time.monotonic()
    try:
        for i, req in enumerate(todo):
            wait = t0 + i / opts.rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            try:
                row = _one(remote, routes, req, run["run_id"], opts.send)
            except RecoverAbort as e:
                if isinstance(e.__cause__, _Carry):
                    rows.append(e.__cause__.row)
                raise
            except Unreachable as e:
                raise RecoverAbort(str(e)) from None
            except live.Refused as e:
                raise RecoverAbort(str(e)) from None
            if row is not None:
                rows.append(row)
            if opts.send and len(rows) - written >= FLUSH_EVERY:
                write_log(opts.out, invocation, rows)
                written = len(rows)
    finally:
        remote.close()
        if opts.send and len(rows) > written:
            write_log(opts.out, invocation, rows)
    counts: dict = {}
    for r in rows:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    print(f"txaudit: recover: {', '.join(f'{k} {v}' for k, v in sorted(counts.items())) or 'nothing sent'}"
          f"{'; recovery_log run ' + invocation if rows else ''} ({time.monotonic() - t_start:.1f} s)",
          file=sys.stderr)
    return 0


__all__ = ["RecoverOptions", "run_recover", "RecoverAbort", "load_credentials"]
