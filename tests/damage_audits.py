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


#: the decoder-finding columns damage.damaged_ranges reads (schemas.store.ANOMALIES), for hand-made findings
FINDING_COLUMNS = {"kind": "string", "source": "string", "physical_offset": "int64", "position": "int64",
                   "length": "int64", "detail": "string", "expected": "string", "actual": "string",
                   "data_end": "int64"}


def findings(rows: Iterable[Mapping]):
    """An Arrow table of decoder findings from dicts (missing columns are null)."""
    import pyarrow as pa

    rows = list(rows)
    schema = pa.schema([(c, pa.type_for_alias(t)) for c, t in FINDING_COLUMNS.items()])
    return pa.table({c: [r.get(c) for r in rows] for c in FINDING_COLUMNS}, schema=schema)


def audit_tables(spark, store, out, mode: str, as_of: str,
                 tables: Iterable[str] = ("transactions", "anomalies")) -> Dict[str, List[dict]]:
    """One ``audit`` of ``store`` into ``out`` through jobs.audit.run (the command's own path, Delta tables
    written) as of ``as_of``: ``{table: rows}`` of the result frames."""
    from jobs.audit.run import run_audit
    from jobs.main import parse_args

    tables = tuple(tables)
    _, opts = parse_args(["audit", "--store", str(store), "--out", str(out), "--as-of", as_of, "--mode", mode])
    got: Dict[str, List[dict]] = {}

    def on_result(result, summary):
        for name in tables:
            got[name] = getattr(result, name).toPandas().to_dict("records")

    run_audit(spark, opts, on_result=on_result, print_summary=False)
    return got
