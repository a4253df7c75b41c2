"""The metric registry of the CI data-quality mode (``check``) and its Spark-free computation.

Every metric is computed per broker (entity ``broker``, instance = broker name) and for all brokers of the run
together (entity ``all``, instance ``*``), from the run's own Delta tables read as Arrow tables
(:class:`RunData`); nothing here reads a store or needs Spark, so tests call :func:`compute_metrics` directly.

Registry (:data:`METRICS` documents each name; :func:`metric_names` lists every concrete one):

=================================  ===========================================================================
``transactions``                   rows of ``transactions``
``state.<STATE>``                  transactions in that state (COMMITTED, ROLLED_BACK, DISCARDED, PREPARED, UNKNOWN_DAMAGED)
``prepared_past_timeout``          PREPARED transactions flagged PREPARED_PAST_TIMEOUT (due for a check-back)
``prepared_past_deadline``         PREPARED transactions whose ``deadline_ms <= as_of_ms`` (the broker should
                                   already have discarded them, or retention deleted them)
``max_prepared_age_s``             largest ``age_ms`` / 1000 among PREPARED transactions (0 when none)
``flag.<CODE>``                    transactions carrying flag CODE (every code of ``jobs.reconstruct.flags.FLAGS``); for
                                   the codes that can only describe unattributable evidence
                                   (``jobs.reconstruct.flags.ANOMALY_ONLY``) the ``audit_anomalies`` rows with that code
``check_back``                     rows of ``check_back_worklist``
``check_back.<PRIORITY>``          of them with that priority (CRITICAL, HIGH, NORMAL)
``recovery``                       rows of ``recovery_worklist``
``recovery.<ACTION>``              of them whose (most important) ``action`` is ACTION
                                   (``jobs.reconstruct.flags.RECOVERY_ACTIONS``)
``findings``                       rows of ``audit_anomalies`` (decoder findings + unattributable evidence)
``findings.<KIND>``                of them with ``code`` KIND (``txlog_io.errors.AnomalyKind`` or a flag code)
``share.<metric>``                 ``<metric>`` / ``transactions`` (0 when there are none); for every count
                                   metric above (not ``max_prepared_age_s``)
=================================  ===========================================================================

An unknown name (or flag code, state, priority, action, finding kind) is a :class:`UnknownMetricError` that
names it; :func:`check_metric_name` is what the checks file validation calls.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from jobs.reconstruct.flags import ANOMALY_ONLY, FLAGS, RECOVERY_ACTIONS
from jobs.reconstruct.params import STATES as TX_STATES
from schemas.quality import ALL_INSTANCE, ENTITY_ALL, ENTITY_BROKER
from txlog_io.errors import AnomalyKind, UsageError

STATES = TX_STATES
#: check_back_worklist.priority values (jobs.reconstruct.spark.check_back_worklist)
PRIORITIES = ("CRITICAL", "HIGH", "NORMAL")
FINDING_KINDS = tuple(sorted({v for k, v in vars(AnomalyKind).items()
                              if k.isupper() and isinstance(v, str)} | set(FLAGS)))
SHARE = "share."
MAX_SAMPLES = 10

#: family -> (members or None, description).  A family with members is ``<family>.<MEMBER>``.
METRICS: Dict[str, Tuple[Optional[Tuple[str, ...]], str]] = {
    "transactions": (None, "rows of transactions"),
    "state": (STATES, "transactions in that state"),
    "prepared_past_timeout": (None, "PREPARED transactions flagged PREPARED_PAST_TIMEOUT"),
    "prepared_past_deadline": (None, "PREPARED transactions with deadline_ms <= as_of_ms"),
    "max_prepared_age_s": (None, "largest age of a PREPARED transaction in seconds (0 when none)"),
    "flag": (tuple(FLAGS), "transactions carrying the flag (ANOMALY_ONLY codes: audit_anomalies rows)"),
    "check_back": (None, "rows of check_back_worklist"),
    "check_back_priority": (PRIORITIES, "check_back_worklist rows with that priority"),
    "recovery": (None, "rows of recovery_worklist"),
    "recovery_action": (tuple(RECOVERY_ACTIONS), "recovery_worklist rows whose action is that action"),
    "findings": (None, "rows of audit_anomalies"),
    "findings_kind": (FINDING_KINDS, "audit_anomalies rows with that code"),
    "share": (None, "<metric> / transactions, for every count metric"),
}
#: prefix of each family with members as written in metric names
_PREFIXES = {"state": "state.", "flag": "flag.", "check_back_priority": "check_back.",
             "recovery_action": "recovery.", "findings_kind": "findings."}
#: metrics that are not counts (no share.<metric>)
NOT_COUNTS = frozenset({"max_prepared_age_s"})


class UnknownMetricError(UsageError):
    """A metric name (or one of its codes) the registry does not know."""


def base_metric_names() -> List[str]:
    """Every concrete metric name except the ``share.*`` ones, in registry order."""
    names = []
    for family, (members, _) in METRICS.items():
        if family == "share":
            continue
        if members is None:
            names.append(family)
        else:
            names.extend(_PREFIXES[family] + m for m in members)
    return names


def metric_names() -> List[str]:
    base = base_metric_names()
    return base + [SHARE + n for n in base if n not in NOT_COUNTS]


def check_metric_name(name: str) -> str:
    """``name`` if the registry knows it; an :class:`UnknownMetricError` naming what is unknown otherwise."""
    if not isinstance(name, str) or not name.strip():
        raise UnknownMetricError(f"metric must be a non-empty string, got {name!r}")
    inner = name[len(SHARE):] if name.startswith(SHARE) else name
    if name.startswith(SHARE) and inner in NOT_COUNTS:
        raise UnknownMetricError(f"unknown metric {name!r}: share.* exists only for count metrics, "
                                 f"{inner!r} is not one")
    if inner in METRICS and METRICS[inner][0] is None and inner != "share":
        return name
    for family, prefix in _PREFIXES.items():
        if inner.startswith(prefix):
            code = inner[len(prefix):]
            members = METRICS[family][0]
            if code in members:
                return name
            what = {"state": "state", "flag": "flag code (jobs.reconstruct.flags.FLAGS)",
                    "check_back_priority": "check-back priority", "recovery_action": "recovery action "
                    "(jobs.reconstruct.flags.RECOVERY_ACTIONS)", "findings_kind": "finding kind (AnomalyKind or flag "
                    "code)"}[family]
            raise UnknownMetricError(f"unknown metric {name!r}: {code!r} is not a known {what}; known: "
                                     f"{', '.join(members)}")
    singles = [f for f, (m, _) in METRICS.items() if m is None and f != "share"]
    raise UnknownMetricError(f"unknown metric {name!r}; known: {', '.join(singles)}, state.<STATE>, "
                             f"flag.<CODE>, check_back.<PRIORITY>, recovery.<ACTION>, findings.<KIND>, "
                             f"share.<metric>")


# ------------------------------------------------------------------------------------------------------------
# the run's data
# ------------------------------------------------------------------------------------------------------------

#: columns read from each table (nothing else is needed)
TX_COLUMNS = ("broker", "transaction_key", "state", "flags", "age_ms", "deadline_ms", "as_of_ms")
CHECK_BACK_COLUMNS = ("broker", "transaction_key", "priority", "urgency_rank")
RECOVERY_COLUMNS = ("broker", "transaction_key", "action")
FINDINGS_COLUMNS = ("broker", "code", "transaction_key", "file", "position", "physical_offset")


@dataclass
class RunData:
    """One run's outputs as Arrow tables (only the columns above) and its brokers, in ``--store`` order."""

    run_id: str
    brokers: Tuple[str, ...]
    transactions: pa.Table
    check_back: pa.Table
    recovery: pa.Table
    findings: pa.Table
    _cache: dict = field(default_factory=dict, repr=False)

    def scoped(self, table: str, broker: Optional[str]) -> pa.Table:
        """``table`` restricted to ``broker`` (None: every broker)."""
        t = getattr(self, table)
        if broker is None:
            return t
        key = (table, broker)
        if key not in self._cache:
            self._cache[key] = t.filter(pc.equal(t.column("broker"), broker))
        return self._cache[key]


def _counts(t: pa.Table, column: str) -> Dict[Tuple[str, str], int]:
    """``{(broker, value): rows}``."""
    if t.num_rows == 0:
        return {}
    g = t.group_by(["broker", column]).aggregate([([], "count_all")])
    return {(b, v): int(n) for b, v, n in zip(g.column("broker").to_pylist(), g.column(column).to_pylist(),
                                               g.column("count_all").to_pylist(), strict=True)}


def _broker_rows(t: pa.Table) -> Dict[str, int]:
    if t.num_rows == 0:
        return {}
    g = t.group_by(["broker"]).aggregate([([], "count_all")])
    return dict(zip(g.column("broker").to_pylist(), (int(n) for n in g.column("count_all").to_pylist()),
                    strict=True))


def _flag_counts(tx: pa.Table) -> Dict[Tuple[str, str], int]:
    """``{(broker, flag): transactions carrying it}`` (a flag listed twice on one transaction counts once).

    Integer codes + numpy instead of a three-key Arrow group-by: 1 M transactions in ~0.2 s, not ~1.6 s."""
    if tx.num_rows == 0:
        return {}
    flags = tx.column("flags").combine_chunks()
    values = pc.list_flatten(flags)
    if len(values) == 0:
        return {}
    parents = pc.list_parent_indices(flags)
    valid = pc.is_valid(values)
    values, parents = pc.filter(values, valid), pc.filter(parents, valid)
    fenc = values.dictionary_encode()
    brokers = tx.column("broker").combine_chunks().dictionary_encode()
    nf, nb = len(fenc.dictionary), len(brokers.dictionary)
    keys = np.sort(parents.to_numpy().astype(np.int64) * nf + fenc.indices.to_numpy().astype(np.int64))
    keys = keys[np.concatenate(([True], keys[1:] != keys[:-1]))]     # np.unique's hashing is far slower
    bidx = brokers.indices.to_numpy().astype(np.int64)[keys // nf]
    counts = np.bincount(bidx * nf + keys % nf, minlength=nb * nf)
    return {(brokers.dictionary[int(c) // nf].as_py(), fenc.dictionary[int(c) % nf].as_py()): int(counts[c])
            for c in np.nonzero(counts)[0]}


def _prepared(tx: pa.Table) -> pa.Table:
    return tx.filter(pc.equal(tx.column("state"), "PREPARED")) if tx.num_rows else tx


def _past_deadline_mask(tx: pa.Table):
    return pc.fill_null(pc.less_equal(tx.column("deadline_ms"), tx.column("as_of_ms")), False)


def compute_metrics(data: RunData) -> Dict[Tuple[str, str, str], float]:
    """Every registry metric: ``{(entity, instance, name): value}`` for each broker of the run and for all.

    Brokers of the run without rows get zeros; a broker that has rows but is not among ``data.brokers``
    (never the case for a finished run) is counted too."""
    tx = data.transactions
    prepared = _prepared(tx)
    per: Dict[str, Counter] = {}

    def add(broker: str, name: str, n: float) -> None:
        per.setdefault(broker, Counter())[name] += n

    for b, n in _broker_rows(tx).items():
        add(b, "transactions", n)
    for (b, s), n in _counts(tx, "state").items():
        if s in STATES:
            add(b, f"state.{s}", n)
    for (b, f), n in _flag_counts(tx).items():
        if f not in ANOMALY_ONLY:
            add(b, f"flag.{f}", n)
    if prepared.num_rows:
        for b, n in _broker_rows(_has_flag(prepared, "PREPARED_PAST_TIMEOUT")).items():
            add(b, "prepared_past_timeout", n)
        for b, n in _broker_rows(prepared.filter(_past_deadline_mask(prepared))).items():
            add(b, "prepared_past_deadline", n)
        ages = prepared.group_by(["broker"]).aggregate([("age_ms", "max")])
        for b, a in zip(ages.column("broker").to_pylist(), ages.column("age_ms_max").to_pylist(),
                        strict=True):
            if a is not None:
                add(b, "max_prepared_age_s", max(0.0, a / 1000.0))
    for b, n in _broker_rows(data.check_back).items():
        add(b, "check_back", n)
    for (b, p), n in _counts(data.check_back, "priority").items():
        if p in PRIORITIES:
            add(b, f"check_back.{p}", n)
    for b, n in _broker_rows(data.recovery).items():
        add(b, "recovery", n)
    for (b, a), n in _counts(data.recovery, "action").items():
        if a in RECOVERY_ACTIONS:
            add(b, f"recovery.{a}", n)
    for b, n in _broker_rows(data.findings).items():
        add(b, "findings", n)
    for (b, k), n in _counts(data.findings, "code").items():
        add(b, f"findings.{k}", n)          # kinds outside the registry are kept in the history too
        if k in ANOMALY_ONLY:
            add(b, f"flag.{k}", n)

    base = base_metric_names()
    brokers = list(data.brokers) + sorted(set(per) - set(data.brokers))
    out: Dict[Tuple[str, str, str], float] = {}
    scopes = [(ENTITY_BROKER, b, [per.get(b, Counter())]) for b in brokers]
    scopes.append((ENTITY_ALL, ALL_INSTANCE, [per.get(b, Counter()) for b in brokers]))
    for entity, instance, counters in scopes:
        values: Dict[str, float] = {}
        extra = sorted({k for c in counters for k in c} - set(base))
        for name in base + extra:
            if name == "max_prepared_age_s":
                values[name] = float(max([c.get(name, 0.0) for c in counters] or [0.0]))
            else:
                values[name] = float(sum(c.get(name, 0) for c in counters))
        total = values["transactions"]
        for name in list(values):
            if name not in NOT_COUNTS:
                values[SHARE + name] = values[name] / total if total else 0.0
        for name, v in values.items():
            out[(entity, instance, name)] = v
    return out


def metrics_table_rows(run_id: str, run_date, metrics: Dict[Tuple[str, str, str], float]) -> pa.Table:
    """The ``metrics`` Delta table rows of a run (schemas.quality.METRICS)."""
    from schemas.quality import METRICS as METRICS_TABLE

    keys = sorted(metrics)
    return pa.table({
        "run_id": pa.array([run_id] * len(keys), pa.string()),
        "run_date": pa.array([run_date] * len(keys), pa.date32()),
        "entity": pa.array([k[0] for k in keys], pa.string()),
        "instance": pa.array([k[1] for k in keys], pa.string()),
        "name": pa.array([k[2] for k in keys], pa.string()),
        "value": pa.array([metrics[k] for k in keys], pa.float64()),
    }, schema=METRICS_TABLE.arrow_schema())


# ------------------------------------------------------------------------------------------------------------
# samples: what stands behind a failing check
# ------------------------------------------------------------------------------------------------------------

def _keys(t: pa.Table, limit: int) -> List[str]:
    t = t.slice(0, limit)       # already in order (_sorted)
    keys = zip(t.column("broker").to_pylist(), t.column("transaction_key").to_pylist(), strict=True)
    return [f"{b}:{k}" for b, k in keys]


def _sorted(t: pa.Table, keys: Sequence[Tuple[str, str]], limit: int = MAX_SAMPLES) -> pa.Table:
    """The first ``limit`` rows of ``t`` in ``keys`` order (top-k, then a stable sort of those)."""
    if t.num_rows == 0:
        return t
    if t.num_rows > limit:
        t = t.take(pc.select_k_unstable(t, k=limit, sort_keys=list(keys)))
    return t.sort_by(list(keys))


def _finding_samples(t: pa.Table, limit: int) -> List[str]:
    t = _sorted(t, [("broker", "ascending"), ("file", "ascending"), ("position", "ascending"),
                    ("physical_offset", "ascending")], limit)
    out = []
    for r in t.to_pylist():
        if r["file"]:
            out.append(f"{r['file']}@{r['position'] if r['position'] is not None else '?'}")
        elif r["physical_offset"] is not None:
            out.append(f"{r['broker']}:commitlog@{r['physical_offset']}")
        elif r["transaction_key"]:
            out.append(f"{r['broker']}:{r['transaction_key']}")
        else:
            out.append(f"{r['broker']}:{r['code']}")
    return out


def _has_flag(t: pa.Table, flag: str) -> pa.Table:
    if t.num_rows == 0:
        return t
    flags = t.column("flags").combine_chunks()
    parents = pc.list_parent_indices(flags)
    hit = pc.fill_null(pc.equal(pc.list_flatten(flags), flag), False)
    mask = np.zeros(t.num_rows, dtype=bool)
    mask[pc.filter(parents, hit).to_numpy()] = True
    return t.filter(pa.array(mask))


def samples(data: RunData, metric: str, broker: Optional[str], limit: int = MAX_SAMPLES) -> List[str]:
    """Up to ``limit`` transaction keys (``broker:key``) or findings behind ``metric`` in that scope, in a
    stable order (most urgent / oldest first where that means something, else by key)."""
    name = metric[len(SHARE):] if metric.startswith(SHARE) else metric
    tx = data.scoped("transactions", broker)
    by_key = [("broker", "ascending"), ("transaction_key", "ascending")]
    if name == "transactions":
        return _keys(_sorted(tx, by_key, limit), limit)
    if name.startswith("state."):
        return _keys(_sorted(tx.filter(pc.equal(tx.column("state"), name[6:])), by_key, limit), limit)
    if name in ("prepared_past_timeout", "prepared_past_deadline", "max_prepared_age_s"):
        p = _prepared(tx)
        if name == "prepared_past_timeout":
            p = _has_flag(p, "PREPARED_PAST_TIMEOUT")
        elif name == "prepared_past_deadline":
            p = p.filter(_past_deadline_mask(p)) if p.num_rows else p
        return _keys(_sorted(p, [("age_ms", "descending")] + by_key, limit), limit)
    if name.startswith("flag."):
        code = name[5:]
        if code in ANOMALY_ONLY:
            f = data.scoped("findings", broker)
            return _finding_samples(f.filter(pc.equal(f.column("code"), code)) if f.num_rows else f, limit)
        return _keys(_sorted(_has_flag(tx, code), by_key, limit), limit)
    if name.startswith("check_back"):
        cb = data.scoped("check_back", broker)
        if name.startswith("check_back.") and cb.num_rows:
            cb = cb.filter(pc.equal(cb.column("priority"), name[len("check_back."):]))
        return _keys(_sorted(cb, [("urgency_rank", "ascending")] + by_key, limit), limit)
    if name.startswith("recovery"):
        rc = data.scoped("recovery", broker)
        if name.startswith("recovery.") and rc.num_rows:
            rc = rc.filter(pc.equal(rc.column("action"), name[len("recovery."):]))
        return _keys(_sorted(rc, by_key, limit), limit)
    if name.startswith("findings"):
        f = data.scoped("findings", broker)
        if name.startswith("findings.") and f.num_rows:
            f = f.filter(pc.equal(f.column("code"), name[len("findings."):]))
        return _finding_samples(f, limit)
    return []


def describe_registry() -> Iterable[str]:
    """One line per metric family (``txaudit check --list-metrics`` style output)."""
    for family, (members, text) in METRICS.items():
        label = (_PREFIXES[family] + "<" + family.split("_")[-1].upper() + ">") if members else family
        if family == "share":
            label = "share.<metric>"
        yield f"{label:<26} {text}" + (f" ({', '.join(members)})" if members else "")


__all__ = ["METRICS", "STATES", "PRIORITIES", "FINDING_KINDS", "RunData", "UnknownMetricError",
           "compute_metrics", "metrics_table_rows", "check_metric_name", "metric_names", "base_metric_names",
           "samples", "describe_registry", "MAX_SAMPLES"]
