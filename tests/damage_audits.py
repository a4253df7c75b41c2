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


def flipped_copy(store, root, data, flips: Mapping[int, int]) -> str:
    """A copy of the store ``store`` at ``root`` with the bytes of its file ``data`` (a path inside the store)
    at each position of ``flips`` XOR-ed with its value; the copy's root."""
    import shutil
    from pathlib import Path

    shutil.copytree(store, root)
    with open(Path(root) / data, "r+b") as f:
        for pos, bit in flips.items():
            f.seek(pos)
            b = f.read(1)[0]
            f.seek(pos)
            f.write(bytes([b ^ bit]))
    return str(root)


def audit_three_ways(spark, roots: Mapping[str, str]) -> Dict[str, Dict[str, List[dict]]]:
    """``audit_both_modes`` plus ``"distributed"``: the full-mode read reduced on the executor path."""
    from jobs.read.frames import load_store_frames
    from jobs.reconstruct.spark import reconstruct

    got = audit_both_modes(spark, roots)
    frames = load_store_frames(spark, list(roots.values()), mode="full", brokers=list(roots))
    spread = reconstruct(frames, None, local=False)
    assert spread.path != "driver"
    got["distributed"] = {t: [r.asDict(recursive=True) for r in getattr(spread, t).collect()]
                          for t in ("transactions", "anomalies")}
    return got


def by_key(audit: Mapping[str, List[dict]], broker: str) -> Dict[str, dict]:
    """transaction key -> transaction row of ``broker`` in one mode's audit."""
    return {t["transaction_key"]: t for t in audit["transactions"] if t["broker"] == broker}


def silent_changes(intact: Mapping[str, dict], damaged: Mapping[str, dict], damage_flags) -> List[tuple]:
    """The transactions of ``intact`` whose state ``damaged`` changed without one of ``damage_flags``."""
    return [(k, intact[k]["state"], t["state"], t["flags"]) for k, t in damaged.items()
            if k in intact and t["state"] != intact[k]["state"] and not set(damage_flags) & set(t["flags"])]
