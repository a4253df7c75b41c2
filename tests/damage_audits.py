"""Audits of damaged store copies beside their intact originals, shared by the damage tests.

``audit_both_modes`` reconstructs several stores (each its own broker) in full and in indexed mode on the
driver path and returns the chosen output tables as lists of rows; ``states`` picks one broker's
transaction states out of such an audit."""
from __future__ import annotations

from typing import Dict, Iterable, List, Mapping

MODES = ("full", "indexed")


def audit_both_modes(spark, roots: Mapping[str, str],
                     tables: Iterable[str] = ("transactions", "anomalies")) -> Dict[str, Dict[str, List[dict]]]:
    """``{mode: {table: rows}}`` for the stores ``roots`` (broker name -> store root), audited together."""
    from jobs.read.frames import load_store_frames
    from jobs.reconstruct.spark import reconstruct

    tables = tuple(tables)
    out: Dict[str, Dict[str, List[dict]]] = {}
    for mode in MODES:
        frames = load_store_frames(spark, list(roots.values()), mode=mode, brokers=list(roots))
        result = reconstruct(frames, None, local=True)
        out[mode] = {t: result.arrow[t].to_pylist() for t in tables}
    return out


def states(audit: Mapping[str, List[dict]], broker: str) -> Dict[str, str]:
    """transaction key -> state of ``broker``'s transactions in one mode's audit."""
    return {t["transaction_key"]: t["state"] for t in audit["transactions"] if t["broker"] == broker}
