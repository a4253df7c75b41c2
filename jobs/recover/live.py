"""What ``recover`` asks the live cluster before it sends anything: the route, and whether a request is stale.

Route (as ``MQClientAPIImpl.getTopicRouteInfoFromNameServer`` does): GET_ROUTEINFO_BY_TOPIC (105) for the
transaction's real topic, ``acceptStandardJsonOnly=true``; the broker is the ``brokerDatas`` entry whose master
(brokerId 0) address is the store host encoded in the offsetMsgId the request names (the broker that wrote
the copy), or the one named with ``--live-broker``.

Staleness (how ``recover`` knows the broker moved past the audit for one transaction): the broker's own
message index.  ``IndexService.buildIndex`` indexes every message that is not a ROLLBACK record under
``topic#UNIQ_KEY`` -- half copies (``RMQ_SYS_TRANS_HALF_TOPIC``, each check re-puts one before it asks the
producer, a RESUME puts one back), discard records (``TRANS_CHECK_MAX_TIME_TOPIC``) and the committed real
message (the real topic; ``EndTransactionProcessor.endMessageTransaction`` keeps the properties).
QUERY_MESSAGE (12) with that key and ``beginTimestamp=0, endTimestamp=Long.MAX_VALUE`` (as mqadmin's
queryMsgByUniqueKey) returns those messages, newest first, at most the broker's ``defaultQueryMaxNum``.
A request is

* REFUSED_STALE when the real topic holds a message with the UNIQ_KEY (committed since), or a half copy /
  discard record lies after the copy the audit based the request on (the newest half copy for
  END_TRANSACTION, the discard record for RESUME): the broker checked, resumed or discarded the transaction
  after the audit's as-of;
* REFUSED_UNVERIFIABLE when the index does not show that very copy (deleted by retention, index disabled, or
  a transaction without UNIQ_KEY): nothing proves the request still fits;
* otherwise sent.

Not visible in the index: a ROLLBACK since the audit that no check preceded (a producer's own late
END_TRANSACTION writes only an op record); re-sending ROLLBACK for a rolled-back half writes one more op
record and changes nothing else.  The index is built asynchronously (``ReputMessageService``), so a copy
written milliseconds before the query may not show yet.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from jobs.recover.plan import END, RESUME, Request
from jobs.recover.wire import Remote, Unreachable
from txlog_io import remoting as R
from txlog_io.commitlog_layout import DISCARD_TOPIC, HALF_TOPIC
from txlog_io.properties import UNIQ_KEY
from txlog_io.stored_messages import StoredMessageError, split_stored_messages

LONG_MAX = (1 << 63) - 1
QUERY_MAX = 64
ACL_WORDS = ("aclexception", "signature", "accesskey", "access key", "authentication", "no permission")


class Refused(Exception):
    """The cluster refused a lookup (NameServer has no route, ACL error, unexpected response)."""


def is_acl_error(resp: R.Command) -> bool:
    text = (resp.remark or "").lower()
    return resp.code == R.NO_PERMISSION or any(w in text for w in ACL_WORDS)


def describe(resp: R.Command) -> str:
    remark = " ".join((resp.remark or "").split())[:300]
    return f"code {resp.code}" + (f" ({remark})" if remark else "")


class Routes:
    def __init__(self, remote: Remote, namesrv: str, live_broker: Optional[str]):
        self.remote, self.namesrv, self.live_broker = remote, namesrv, live_broker
        self._cache: Dict[str, list] = {}

    def brokers(self, topic: str) -> list:
        if topic not in self._cache:
            try:
                resp = self.remote.call(self.namesrv, R.GET_ROUTEINFO_BY_TOPIC,
                                        {"topic": topic, "acceptStandardJsonOnly": "true"})
            except Unreachable as e:
                raise Refused(f"NameServer: {e}") from None
            if resp.code != R.SUCCESS:
                raise Refused(f"NameServer {self.namesrv} has no route for topic {topic}: {describe(resp)}")
            try:
                data = R.loads_fastjson(resp.body.decode("utf-8"))
            except ValueError as e:
                raise Refused(f"NameServer {self.namesrv}: route of {topic} does not parse: {e}") from None
            self._cache[topic] = list(data.get("brokerDatas") or [])
        return self._cache[topic]

    def resolve(self, req: Request) -> Tuple[str, str]:
        """(brokerName, master address) of the broker to send ``req`` to."""
        datas = self.brokers(req.real_topic)
        masters = {d.get("brokerName"): (d.get("brokerAddrs") or {}).get("0") for d in datas}
        if self.live_broker:
            addr = masters.get(self.live_broker)
            if not addr:
                raise Refused(f"--live-broker {self.live_broker}: no master of that name serves topic "
                              f"{req.real_topic} (NameServer {self.namesrv} knows {sorted(masters)})")
            return self.live_broker, addr
        hits = [(n, a) for n, a in masters.items() if a and a == req.store_host]
        if not hits:
            raise Refused(f"no master serving topic {req.real_topic} has the address {req.store_host} the "
                          f"audit's message ids carry (NameServer {self.namesrv}: "
                          f"{ {n: a for n, a in masters.items()} }); name the broker with --live-broker")
        return hits[0]


def query(remote: Remote, addr: str, topic: str, key: str) -> List:
    try:
        resp = remote.call(addr, R.QUERY_MESSAGE, {"topic": topic, "key": key, "maxNum": QUERY_MAX,
                                                   "beginTimestamp": 0, "endTimestamp": LONG_MAX})
    except Unreachable as e:
        raise Refused(f"broker: {e}") from None
    if resp.code == R.QUERY_NOT_FOUND:
        return []
    if resp.code != R.SUCCESS:
        acl = "ACL: the broker rejected the request's credentials: " if is_acl_error(resp) else ""
        raise Refused(f"{acl}broker {addr} refused QUERY_MESSAGE: {describe(resp)}")
    try:
        msgs = split_stored_messages(resp.body)
    except StoredMessageError as e:
        raise Refused(f"broker {addr}: QUERY_MESSAGE body: {e}") from None
    return [m for m in msgs if m.topic == topic and m.properties.get(UNIQ_KEY) == key]


def staleness(remote: Remote, addr: str, req: Request) -> Optional[Tuple[str, str]]:
    """None when ``req`` may be sent, else (REFUSED_STALE | REFUSED_UNVERIFIABLE, why)."""
    key = req.uniq_key
    if not key:
        return "REFUSED_UNVERIFIABLE", "no UNIQ_KEY: the broker's index cannot show this transaction"
    real = query(remote, addr, req.real_topic, key) if req.real_topic else []
    if real:
        return "REFUSED_STALE", (f"the real topic {req.real_topic} holds a message with this UNIQ_KEY at "
                                 f"CommitLog offset {max(m.physical_offset for m in real)}: committed")
    halves = [m.physical_offset for m in query(remote, addr, HALF_TOPIC, key)]
    discards = [m.physical_offset for m in query(remote, addr, DISCARD_TOPIC, key)]
    base, seen, what = ((req.newest_copy_offset, halves, "half copy") if req.kind == END else
                        (req.discard_offset, discards, "discard record"))
    if base is None or base not in seen:
        return "REFUSED_UNVERIFIABLE", (f"the broker's index does not show the {what} at CommitLog offset {base} "
                                        f"the audit saw (deleted, or not indexed)")
    newer_half = [o for o in halves if o > base]
    if newer_half:
        return "REFUSED_STALE", (f"a half copy at CommitLog offset {max(newer_half)} was written after the audit's "
                                 f"{what} at {base}: the broker " +
                                 ("checked it again" if req.kind == END else "resumed it") + " since")
    newer_discard = [o for o in discards if o > base]
    if newer_discard:
        return "REFUSED_STALE", (f"a discard record at CommitLog offset {max(newer_discard)} was written after "
                                 f"the audit's {what} at {base}")
    return None


__all__ = ["Routes", "Refused", "staleness", "query", "is_acl_error", "describe", "RESUME", "END"]
