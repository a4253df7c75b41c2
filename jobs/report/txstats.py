"""The report's per-transaction figures, folded over a run's ``transactions`` rows one record batch at a time.

A run's transactions table has a row per transaction of the broker: the report never holds it whole.  Each
batch (``jobs.delta.tables.read_batches``) adds to counters whose size is that of the broker's vocabulary,
not of its history -- (broker, state) counts, per flag counts, per (producer group, topic) counts -- and to
the ``URGENT_ROWS`` most urgent PREPARED rows (a bounded merge: the urgency order is total, so the global top
is the top of the batches' tops).  The age-against-deadline chart and the check-times histogram take four
numbers per PREPARED transaction (``PREPARED_COLUMNS``: 24 bytes each), in urgency order (ties, which
differ in broker or key only, draw the same); the other columns of PREPARED rows are dropped batch by batch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Tuple

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from jobs.reconstruct.params import STATES

#: the transactions columns the report reads
TX_COLUMNS = ["broker", "transaction_key", "uniq_key", "keys", "producer_group", "real_topic", "state", "age_ms",
              "deadline_ms", "check_times", "newest_copy_commitlog_offset", "flags"]
#: what the report keeps of every PREPARED transaction (the charts' inputs)
PREPARED_COLUMNS = ["age_ms", "deadline_ms", "check_times"]
PREPARED = "PREPARED"
NONE = "(none)"


@dataclass
class TxStats:
    states: pd.DataFrame            # broker x state counts (rows: brokers, columns: STATES then any other)
    flag_counts: pd.Series          # flag code -> transactions carrying it
    group_topic: pd.DataFrame       # producer_group, real_topic, transactions, flagged, topics_of_group
    prepared: pd.DataFrame          # PREPARED_COLUMNS + to_deadline_ms of every PREPARED transaction, urgency order
    urgent: pd.DataFrame            # the ``urgent`` most urgent PREPARED rows, TX_COLUMNS + to_deadline_ms
    rows: int                       # transactions folded


def urgency(prepared: pd.DataFrame, as_of_ms: int) -> pd.DataFrame:
    """PREPARED rows, most urgent first: soonest deadline (past deadlines first), then oldest, then key."""
    p = prepared.copy()
    p["to_deadline_ms"] = p["deadline_ms"] - as_of_ms
    p["_no_deadline"] = p["deadline_ms"].isna()
    keys = [k for k in ("_no_deadline", "to_deadline_ms", "age_ms", "broker", "transaction_key") if k in p]
    p = p.sort_values(keys, ascending=[k != "age_ms" for k in keys], kind="stable", na_position="last")
    return p.drop(columns="_no_deadline").reset_index(drop=True)


def _urgent_arrow(t: pa.Table, as_of_ms: int, n: int) -> pa.Table:
    """The ``n`` most urgent rows of ``t`` (PREPARED rows, TX_COLUMNS), in the order of :func:`urgency`
    (``sort_indices`` places nulls last, as ``urgency``'s ``na_position``)."""
    left = pc.subtract(t.column("deadline_ms"), pa.scalar(as_of_ms, pa.int64()))
    keyed = t.append_column("_left", left)
    order = pc.sort_indices(keyed, sort_keys=[("_left", "ascending"), ("age_ms", "descending"),
                                              ("broker", "ascending"), ("transaction_key", "ascending")])
    return t.take(order[:n])


class _Fold:
    def __init__(self, as_of_ms: int, urgent: int):
        self.as_of_ms, self.n_urgent = as_of_ms, urgent
        self.states: Dict[Tuple[str, str], int] = {}
        self.flags: Dict[str, int] = {}
        self.groups: Dict[Tuple[str, str], List[int]] = {}
        self.prepared: List[pa.Table] = []
        self.top: Optional[pa.Table] = None
        self.rows = 0

    def add(self, batch: pa.RecordBatch) -> None:
        t = pa.Table.from_batches([batch])
        self.rows += t.num_rows
        known = t.filter(pc.and_(pc.is_valid(t.column("broker")), pc.is_valid(t.column("state"))))
        for r in known.group_by(["broker", "state"], use_threads=False).aggregate(
                [([], "count_all")]).to_pylist():
            k = (r["broker"], r["state"])
            self.states[k] = self.states.get(k, 0) + int(r["count_all"])
        flat = pc.drop_null(pc.list_flatten(t.column("flags")))
        if len(flat):
            counted = pc.value_counts(flat)
            for code, n in zip(counted.field("values").to_pylist(), counted.field("counts").to_pylist(),
                               strict=True):
                self.flags[code] = self.flags.get(code, 0) + int(n)
        flagged = pc.cast(pc.fill_null(pc.greater(pc.list_value_length(t.column("flags")), 0), False), pa.int64())
        g = pa.table({"producer_group": pc.fill_null(t.column("producer_group"), NONE),
                      "real_topic": pc.fill_null(t.column("real_topic"), NONE), "flagged": flagged})
        for r in g.group_by(["producer_group", "real_topic"], use_threads=False).aggregate(
                [([], "count_all"), ("flagged", "sum")]).to_pylist():
            acc = self.groups.setdefault((r["producer_group"], r["real_topic"]), [0, 0])
            acc[0] += int(r["count_all"])
            acc[1] += int(r["flagged_sum"])
        prep = t.filter(pc.fill_null(pc.equal(t.column("state"), PREPARED), False))
        if prep.num_rows:
            self.prepared.append(prep.select(PREPARED_COLUMNS).combine_chunks())
            both = prep if self.top is None else pa.concat_tables([self.top, prep])
            self.top = _urgent_arrow(both, self.as_of_ms, self.n_urgent).combine_chunks()

    def result(self, brokers: List[str], schema: Optional[pa.Schema]) -> TxStats:
        counts = pd.Series(self.states, dtype="int64")
        if len(counts):
            counts.index = pd.MultiIndex.from_tuples(list(self.states), names=["broker", "state"])
            table = counts.unstack(fill_value=0)
        else:
            table = pd.DataFrame()
        states = list(STATES) + sorted(set(table.columns) - set(STATES))
        order = list(brokers) + sorted(set(table.index) - set(brokers))
        state_counts = table.reindex(index=order, columns=states, fill_value=0).astype("int64")
        return TxStats(states=state_counts, flag_counts=pd.Series(self.flags, dtype="int64"),
                       group_topic=self._group_topic(), prepared=self._prepared(), urgent=self._urgent(schema),
                       rows=self.rows)

    def _group_topic(self) -> pd.DataFrame:
        cols = ["producer_group", "real_topic", "transactions", "flagged", "topics_of_group"]
        if not self.groups:
            return pd.DataFrame({c: pd.Series(dtype=object) for c in cols})
        g = pd.DataFrame([(pg, t, n, f) for (pg, t), (n, f) in self.groups.items()],
                         columns=["producer_group", "real_topic", "transactions", "flagged"])
        g["topics_of_group"] = g.groupby("producer_group")["real_topic"].transform("nunique")
        g = g.sort_values(["flagged", "transactions", "producer_group", "real_topic"],
                          ascending=[False, False, True, True], kind="stable")
        return g[cols].astype({"transactions": "int64", "flagged": "int64", "topics_of_group": "int64"}) \
            .reset_index(drop=True)

    def _prepared(self) -> pd.DataFrame:
        if not self.prepared:
            return pd.DataFrame({c: pd.Series(dtype="float64") for c in PREPARED_COLUMNS + ["to_deadline_ms"]})
        t = pa.concat_tables(self.prepared)
        self.prepared = []
        order = pc.sort_indices(t.append_column(
            "_left", pc.subtract(t.column("deadline_ms"), pa.scalar(self.as_of_ms, pa.int64()))),
            sort_keys=[("_left", "ascending"), ("age_ms", "descending")])
        p = t.select(PREPARED_COLUMNS).take(order).to_pandas()
        p["to_deadline_ms"] = p["deadline_ms"] - self.as_of_ms
        return p

    def _urgent(self, schema: Optional[pa.Schema]) -> pd.DataFrame:
        if self.top is None:
            empty = (schema or pa.schema([])).empty_table()
            top = pd.DataFrame({c: pd.Series(dtype=object) for c in TX_COLUMNS}) if not empty.num_columns \
                else empty.to_pandas()
            return urgency(top, self.as_of_ms)
        return urgency(self.top.to_pandas(), self.as_of_ms)


def fold(batches: Optional[Iterable[pa.RecordBatch]], brokers: List[str], as_of_ms: int, urgent: int) -> TxStats:
    """The report's transaction figures over ``batches`` (TX_COLUMNS of one run; None: no table)."""
    f = _Fold(as_of_ms, urgent)
    schema = None
    for b in batches or ():
        schema = schema or b.schema
        f.add(b)
    return f.result(brokers, schema)


__all__ = ["fold", "urgency", "TxStats", "TX_COLUMNS", "PREPARED_COLUMNS"]
