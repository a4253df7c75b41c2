"""The human summary an audit run prints at its end (and returns as :class:`AuditSummary`).

Spark-free: everything here is built from small aggregates the job already collected (counts per state, per
flag, rows per table, phase timings), never from the result rows themselves.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Dict, Mapping, Optional, Sequence, Tuple

from jobs.reconstruct.params import STATES

STATE_ORDER = STATES
WORKLISTS = ("check_back_worklist", "recovery_worklist")
TOP_FLAGS = 8


@dataclass(frozen=True)
class TableOutput:
    """One Delta table written by the run."""

    logical: str          # configuration name (table.<logical>)
    path: str             # table directory
    rows: int             # rows this run wrote
    files: int
    version: int          # Delta table version of this run's commit
    seconds: float


@dataclass(frozen=True)
class AuditSummary:
    """What :func:`jobs.audit.run.run_audit` returns (and prints through :func:`format_summary`)."""

    run_id: str
    as_of: dt.datetime
    out: str
    mode: str
    brokers: Tuple[str, ...]
    stores: Tuple[str, ...]
    profiles: Dict[str, str]                     # broker -> profile used
    detected_profiles: Dict[str, str]            # broker -> profile detected from the files
    transactions: int
    states: Dict[str, int]                       # state -> count, all brokers
    states_by_broker: Dict[str, Dict[str, int]]  # broker -> state -> count
    flags: Dict[str, int]                        # flag -> transactions carrying it
    tables: Dict[str, TableOutput]               # logical name -> output
    phases: Dict[str, float]                     # phase -> seconds
    elapsed_s: float
    writer: str
    store_fingerprint: str
    include_bodies: bool
    started_at: dt.datetime
    finished_at: dt.datetime
    store_bytes: int = 0
    commitlog_bytes: int = 0
    extra: Dict[str, object] = field(default_factory=dict)

    @property
    def top_flags(self) -> Tuple[Tuple[str, int], ...]:
        return tuple(sorted(self.flags.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_FLAGS])

    def rows(self, logical: str) -> Optional[int]:
        t = self.tables.get(logical)
        return None if t is None else t.rows


def _states_in_order(states: Mapping[str, int]) -> Sequence[Tuple[str, int]]:
    known = [(s, states.get(s, 0)) for s in STATE_ORDER]
    other = sorted((s, n) for s, n in states.items() if s not in STATE_ORDER)
    return known + other


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def _iso(t: dt.datetime) -> str:
    return t.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_summary(s: AuditSummary) -> str:
    """A short, fixed-layout text for the operator's terminal."""
    lines = []
    lines.append(f"TxAudit run {s.run_id}: as of {_iso(s.as_of)}, mode {s.mode}, "
                 f"{len(s.brokers)} store(s), {_mib(s.commitlog_bytes)} of CommitLog")
    for broker, store in zip(s.brokers, s.stores, strict=True):
        prof = s.profiles.get(broker, "?")
        det = s.detected_profiles.get(broker)
        note = f" (detected {det})" if det and det != prof else ""
        lines.append(f"  {broker}: profile {prof}{note}  {store}")
    lines.append(f"Transactions: {s.transactions}")
    width = max([len(st) for st, _ in _states_in_order(s.states)] + [5])
    multi = len(s.brokers) > 1
    if multi:
        lines.append("  " + " " * width + "  " + "  ".join(f"{b:>12}" for b in s.brokers) + f"  {'total':>8}")
    for state, n in _states_in_order(s.states):
        share = f"{100.0 * n / s.transactions:5.1f}%" if s.transactions else "     -"
        if multi:
            per = "  ".join(f"{s.states_by_broker.get(b, {}).get(state, 0):>12}" for b in s.brokers)
            lines.append(f"  {state:<{width}}  {per}  {n:>8}  {share}")
        else:
            lines.append(f"  {state:<{width}}  {n:>8}  {share}")
    if s.top_flags:
        lines.append("Top flags: " + ", ".join(f"{f} {n}" for f, n in s.top_flags))
    else:
        lines.append("Top flags: none")
    wl = [f"{name} {s.tables[name].rows}" for name in WORKLISTS if name in s.tables]
    if wl:
        lines.append("Work lists: " + ", ".join(wl))
    if "audit_anomalies" in s.tables:
        lines.append(f"Findings (audit_anomalies): {s.tables['audit_anomalies'].rows}")
    lines.append(f"Delta tables under {s.out} (run_id={s.run_id}, writer {s.writer}):")
    for t in s.tables.values():
        rel = t.path[len(s.out.rstrip('/')) + 1:] if t.path.startswith(s.out.rstrip('/') + '/') else t.path
        lines.append(f"  {rel:<22} {t.rows:>9} rows  v{t.version}")
    main_phases = [(k, v) for k, v in s.phases.items() if "." not in k]
    lines.append(f"Elapsed {s.elapsed_s:.1f} s (" + ", ".join(f"{k} {v:.1f}" for k, v in main_phases) + ")")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------------
# demo: comparison with the reference broker's ledger
# ------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LedgerComparison:
    """Reconstructed state vs the ledger, per true outcome."""

    matched: Dict[str, int]            # outcome -> transactions whose state equals it
    total: Dict[str, int]              # outcome -> ledger transactions with that outcome
    visible_matched: Dict[str, int]    # visible_outcome -> matched
    visible_total: Dict[str, int]
    missing: int                       # ledger transactions without a reconstructed row
    extra: int                         # reconstructed transactions the ledger does not know
    mismatches: Tuple[Tuple[str, str, str, str], ...] = ()   # (key, outcome, visible_outcome, state), a few

    @property
    def all_matched(self) -> bool:
        return sum(self.matched.values()) == sum(self.total.values()) and self.extra == 0


def format_ledger_comparison(c: LedgerComparison) -> str:
    lines = ["Compared with the reference broker's ledger (reconstructed state == true outcome):"]
    for outcome in STATE_ORDER:
        if c.total.get(outcome):
            vis = ""
            if c.visible_total.get(outcome) is not None:
                vis = (f"   (visible outcome: {c.visible_matched.get(outcome, 0)}/"
                       f"{c.visible_total.get(outcome, 0)})")
            lines.append(f"  {outcome:<12} {c.matched.get(outcome, 0):>6}/{c.total[outcome]:<6}{vis}")
    m, t = sum(c.matched.values()), sum(c.total.values())
    lines.append(f"  {'all':<12} {m:>6}/{t:<6} missing {c.missing}, not in ledger {c.extra}")
    for key, outcome, visible, state in c.mismatches:
        lines.append(f"    mismatch {key}: ledger {outcome} (visible {visible}), reconstructed {state}")
    return "\n".join(lines)


__all__ = ["AuditSummary", "TableOutput", "LedgerComparison", "format_summary", "format_ledger_comparison",
           "STATE_ORDER"]
