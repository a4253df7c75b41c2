"""The validated options of one ``audit`` / ``demo`` run (what ``jobs.main.parse_args`` returns and
``jobs.audit.run`` / ``jobs.demo`` consume).  Their own module so that neither job imports ``jobs.main``."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Optional, Tuple

from jobs.config import AuditConfig


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
    report: bool = True              # write OUT/report/<run_id>.html at the end (--no-report: False)
    incremental: bool = False        # continue from the previous completed run (jobs/read/incremental/plan.py)

    @property
    def run_date(self) -> dt.date:
        return self.as_of.date()

    @property
    def store_pairs(self) -> Tuple[Tuple[str, str], ...]:
        """``((broker, store root), ...)``."""
        return tuple(zip(self.brokers, self.stores, strict=True))


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
    report: bool = True


@dataclass(frozen=True)
class ReportOptions:
    """``report``: (re)build the HTML report of a finished run from the Delta tables under ``out``."""

    out: str
    run_id: Optional[str]            # None: the latest run


__all__ = ["AuditOptions", "DemoOptions", "ReportOptions"]
