"""txlog-dump: print the records of RocketMQ store files as JSON lines (modelled on Kafka's kafka-dump-log).

    txlog-dump {commitlog|consumequeue|statetable|redolog|index|store} PATH... [--bodies] [--verify]

PATH is a file, a mapped-file directory, or a store root.  One JSON object per record goes to stdout; a summary
per file goes to stderr.  ``--verify`` prints only integrity findings (one JSON object each) and exits 1 when
there are any.  The JSON field names are a public contract.
"""
from __future__ import annotations

import argparse
import base64
import json
import sys
from pathlib import Path
from typing import Iterator, Optional

from txlog_io.commitlog_decode import ScanSummary
from txlog_io.compression import decompress
from txlog_io.dledger import decode_log_range
from txlog_io.dledger_store import verify_dledger
from txlog_io.errors import Anomaly, TxlogError, UsageError
from txlog_io.mappedfile import MappedFile, discover_store, is_offset_name, list_mapped_files
from txlog_io.progress import Progress

COMMITLOG_FIELDS = ("file", "file_position", "physical_offset", "total_size", "magic_version", "body_crc",
                    "body_crc_ok", "queue_id", "flag", "queue_offset", "sys_flag", "transaction_type",
                    "born_timestamp", "born_host", "store_timestamp", "store_host", "reconsume_times",
                    "prepared_transaction_offset", "body_size", "topic", "properties", "msg_id", "uniq_key",
                    "tags", "keys")
KINDS = ("commitlog", "consumequeue", "statetable", "redolog", "index", "store")


class _Out:
    """Where records, findings and summaries go; counts findings for the exit code."""

    def __init__(self, verify: bool, stdout=None, stderr=None, tag: Optional[str] = None):
        self.verify = verify
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        self.tag = tag
        self.findings = 0

    def record(self, obj: dict) -> None:
        if not self.verify:
            if self.tag:
                obj = {"source": self.tag, **obj}
            self.stdout.write(json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n")

    def findings_out(self, anomalies) -> None:
        for a in anomalies:
            self.findings += 1
            line = json.dumps(a.to_dict() if isinstance(a, Anomaly) else a, ensure_ascii=False)
            (self.stdout if self.verify else self.stderr).write(line + "\n")

    def summary(self, obj: dict) -> None:
        self.stderr.write(json.dumps({"summary": obj}, ensure_ascii=False) + "\n")


# ---------------------------------------------------------------------------------------------- path resolution
def _require(path: str) -> Path:
    p = Path(path)
    if not p.exists():
        raise UsageError(f"no such file or directory: {path}")
    return p


def _looks_like_store(p: Path) -> bool:
    return p.is_dir() and (any((p / d).is_dir() for d in ("commitlog", "consumequeue", "transaction"))
                           or any(c.name.startswith("dledger-") and (c / "data").is_dir()
                                  for c in p.iterdir()))


def _commitlog_files(p: Path, out: _Out) -> list:
    if p.is_file():
        return [MappedFile(p, int(p.name) if is_offset_name(p.name) else 0, p.stat().st_size)]
    if _looks_like_store(p):
        layout = discover_store(p)
        out.findings_out([a for a in layout.anomalies
                          if a.source in ("commitlog", "dledger", "dledger_index")])
        out.findings_out(verify_dledger(layout))
        return list(layout.commitlog)
    files, anomalies = list_mapped_files(p, source="commitlog")
    out.findings_out(anomalies)
    return files


def _queue_files(p: Path, out: _Out) -> list:
    """[(topic, queue_id, [MappedFile])] for a CQ file, a queue dir, a topic dir, consumequeue/ or a store."""
    if p.is_file():
        return [(p.parent.parent.name, _int_or(p.parent.name), [MappedFile(p, _int_or(p.name), p.stat().st_size)])]
    if _looks_like_store(p):
        layout = discover_store(p)
        out.findings_out([a for a in layout.anomalies if a.source == "consumequeue"])
        return [(t, q, files) for (t, q), files in sorted(layout.consume_queues.items())]
    if any(is_offset_name(c.name) for c in p.iterdir()):
        files, anomalies = list_mapped_files(p, source="consumequeue")
        out.findings_out(anomalies)
        return [(p.parent.name, _int_or(p.name), files)]
    result = []
    dirs = [p] if all(c.name.isdigit() for c in p.iterdir() if c.is_dir()) and any(p.iterdir()) else \
        sorted(c for c in p.iterdir() if c.is_dir())
    for topic_dir in dirs:
        for qdir in sorted((c for c in topic_dir.iterdir() if c.is_dir()), key=lambda c: _int_or(c.name)):
            files, anomalies = list_mapped_files(qdir, source="consumequeue")
            out.findings_out(anomalies)
            result.append((topic_dir.name, _int_or(qdir.name), files))
    return result


def _tx_files(p: Path, which: str, out: _Out) -> list:
    if p.is_file():
        return [MappedFile(p, _int_or(p.name), p.stat().st_size)]
    if _looks_like_store(p):
        layout = discover_store(p)
        out.findings_out([a for a in layout.anomalies if a.source == which])
        return list(getattr(layout, which))
    if which == "redolog" and (p / "TRANSACTION_REDOLOG_TOPIC_XXXX").is_dir():
        p = p / "TRANSACTION_REDOLOG_TOPIC_XXXX" / "0"
    files, anomalies = list_mapped_files(p, source=which)
    out.findings_out(anomalies)
    return files


def _int_or(text: str, default: int = 0) -> int:
    return int(text) if text.lstrip("-").isdigit() else default


# ---------------------------------------------------------------------------------------------- dumpers
def commitlog_records(path: str, *, with_body: bool = False, summary: Optional[ScanSummary] = None,
                      anomalies: Optional[list] = None) -> Iterator[dict]:
    """Every record of one CommitLog file as a dump dict (the public JSON contract)."""
    for batch, found in decode_log_range(path, with_body=with_body, summary=summary):
        if anomalies is not None:
            anomalies.extend(found)
        for row in batch.to_pylist():
            obj = {k: row[k] for k in COMMITLOG_FIELDS}
            obj["properties"] = dict(row["properties"])
            if with_body:
                body = row["body"] or b""
                obj["body"] = base64.b64encode(body).decode("ascii")
                if row["compression"] not in ("NONE", None):
                    try:
                        obj["body_uncompressed"] = base64.b64encode(decompress(body, row["sys_flag"])).decode()
                    except ValueError as exc:
                        obj["body_uncompressed"] = None
                        if anomalies is not None:
                            anomalies.append(Anomaly("BAD_BODY_COMPRESSION", str(path), row["file_position"],
                                                     str(exc), row["compression"], None, "commitlog",
                                                     row["physical_offset"]))
            yield obj


def _isatty(stream) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def dump_commitlog(paths, out: _Out, with_body: bool) -> None:
    files = [mf for p in paths for mf in _commitlog_files(_require(p), out)]
    # progress on a terminal only: a large store takes minutes, and captured stderr must stay JSON lines
    # (not while records scroll on the same terminal)
    progress = Progress("commitlog", sum(mf.size for mf in files), bytes_unit=True, stream=out.stderr,
                        enabled=_isatty(out.stderr) and (out.verify or not _isatty(out.stdout)))
    done = 0
    for i, mf in enumerate(files, 1):
        summary = ScanSummary(str(mf.path), 0, mf.size)
        found: list = []
        n = 0
        progress.update(done, note=f"file {i}/{len(files)}")
        for obj in commitlog_records(str(mf.path), with_body=with_body, summary=summary, anomalies=found):
            out.record(obj)
            n += 1
            progress.update(done + obj["file_position"] + obj["total_size"])
        done += mf.size
        progress.close()              # the per-file lines below start at column 0
        out.findings_out(found)
        out.summary({"file": str(mf.path), "kind": "commitlog", "records": n, "file_size": mf.size,
                     "valid_bytes": summary.valid_end, "trailing_bytes": mf.size - summary.valid_end,
                     "trailing_from": summary.valid_end, "skipped_bytes": summary.skipped_bytes,
                     "stop_reason": summary.stop_reason, "anomalies": len(found)})


def dump_consumequeue(paths, out: _Out) -> None:
    from txlog_io.consumequeue import iter_consumequeue_dicts

    for p in paths:
        for topic, queue_id, files in _queue_files(_require(p), out):
            for mf in files:
                found: list = []
                n = 0
                for obj in iter_consumequeue_dicts(str(mf.path), topic=topic, queue_id=queue_id,
                                                   base_offset=mf.base_offset, anomalies=found):
                    out.record(obj)
                    n += 1
                out.findings_out(found)
                out.summary({"file": str(mf.path), "kind": "consumequeue", "topic": topic, "queue_id": queue_id,
                             "records": n, "file_size": mf.size, "anomalies": len(found)})


def dump_units(paths, out: _Out, which: str) -> None:
    from txlog_io.consumequeue import iter_redolog_dicts, iter_statetable_dicts

    iterate = iter_statetable_dicts if which == "statetable" else iter_redolog_dicts
    for p in paths:
        for mf in _tx_files(_require(p), which, out):
            found: list = []
            n = 0
            for obj in iterate(str(mf.path), base_offset=mf.base_offset, anomalies=found):
                out.record(obj)
                n += 1
            out.findings_out(found)
            out.summary({"file": str(mf.path), "kind": which, "records": n, "file_size": mf.size,
                         "anomalies": len(found)})


def dump_index(paths, out: _Out) -> None:
    """IndexFile entries (a file, the index/ directory or a store root)."""
    from txlog_io.indexfile import list_index_files, read_index_file

    for p in paths:
        path = _require(p)
        if path.is_file():
            files = [path]
        else:
            files = list_index_files(path.parent if path.name == "index" else path)
        if not files:
            raise UsageError(f"no index files under {p} (expected a store root, its index/ or an index file)")
        for f in files:
            idx = read_index_file(f)
            for row in idx.entries.to_pylist():
                out.record(row)
            out.findings_out(idx.anomalies)
            h = idx.header
            out.summary({"file": str(f), "kind": "index", "records": idx.entries.num_rows,
                         "hash_slots": idx.hash_slots, "index_num": idx.index_num,
                         "index_count": h.index_count if h else None,
                         "begin_phy_offset": h.begin_phy_offset if h else None,
                         "end_phy_offset": h.end_phy_offset if h else None, "anomalies": len(idx.anomalies)})


def dump_store(paths, out: _Out, with_body: bool) -> None:
    for p in paths:
        root = _require(p)
        if not _looks_like_store(root):
            raise UsageError(f"not a RocketMQ store root (no commitlog/, consumequeue/ or transaction/): {p}")
        layout = discover_store(root)
        out.findings_out(layout.anomalies)
        out.findings_out(verify_dledger(layout))
        out.tag = "commitlog"
        _dump_files_commitlog(layout, out, with_body)
        out.tag = "consumequeue"
        if (root / "consumequeue").is_dir():
            dump_consumequeue([str(root / "consumequeue")], out)
        out.tag = "statetable"
        _dump_files_units(layout.statetable, out, "statetable")
        out.tag = "redolog"
        _dump_files_units(layout.redolog, out, "redolog")
        out.tag = "config"
        if layout.consumer_offset_path is not None:
            from txlog_io.config import read_consumer_offsets

            rows, found = read_consumer_offsets(layout.consumer_offset_path)
            for r in rows:
                out.record(dict(r))
            out.findings_out(found)
        out.tag = None


def _dump_files_commitlog(layout, out: _Out, with_body: bool) -> None:
    dump_commitlog([str(mf.path) for mf in layout.commitlog], out, with_body)


def _dump_files_units(files, out: _Out, which: str) -> None:
    if files:
        dump_units([str(mf.path) for mf in files], out, which)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="txlog-dump", description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=KINDS)
    parser.add_argument("paths", nargs="+", metavar="PATH")
    parser.add_argument("--bodies", action="store_true", help="add body (base64) and body_uncompressed")
    parser.add_argument("--verify", action="store_true", help="print only integrity findings; exit 1 if any")
    args = parser.parse_args(argv)
    out = _Out(args.verify)
    try:
        if args.kind == "commitlog":
            dump_commitlog(args.paths, out, args.bodies)
        elif args.kind == "consumequeue":
            dump_consumequeue(args.paths, out)
        elif args.kind in ("statetable", "redolog"):
            dump_units(args.paths, out, args.kind)
        elif args.kind == "index":
            dump_index(args.paths, out)
        else:
            dump_store(args.paths, out, args.bodies)
    except TxlogError as exc:
        print(f"txlog-dump: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    return 1 if args.verify and out.findings else 0


def console_main() -> None:
    """The console script: :func:`main`, its status the process's exit status (txlog_io.process_exit)."""
    from txlog_io import process_exit

    process_exit.run(main)


if __name__ == "__main__":
    console_main()
