"""One error hierarchy for txlog_io, and the Anomaly record for data problems.

Two kinds of trouble, kept apart on purpose:

* Usage problems (a missing path, an unreadable file, a bad option, an encoder asked to write an impossible
  record) raise a :class:`TxlogError` subclass.  The message always names the file, and where it applies the byte
  position and what was expected versus what was found.
* Data problems inside a store (truncated record, bad magic, CRC mismatch, wrong file size, gap between files,
  unparsable JSON, ...) never raise out of a decoder.  They become :class:`Anomaly` values that travel next to the
  decoded records, and decoding resynchronises at the next valid record.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Optional


class TxlogError(Exception):
    """Base of every error txlog_io raises on purpose."""


class UsageError(TxlogError):
    """The caller asked for something that cannot be done (bad argument, bad option value)."""


class StoreNotFoundError(UsageError):
    """A path given as a store, mapped-file directory or file does not exist."""

    def __init__(self, path: str, what: str = "path"):
        super().__init__(f"{what} not found: {path}")
        self.path = path


class ScratchSpaceError(UsageError):
    """A directory the job must write its scratch files to (Spark's local directories) cannot take writes."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"Spark local directory {path} is not usable: {reason}; free space there or point "
                         f"SPARK_LOCAL_DIRS (or spark.local.dir) at a directory with room")
        self.path = path


class UnreadableFileError(TxlogError):
    """A file exists but cannot be opened or read."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"cannot read {path}: {reason}")
        self.path = path


class EncodeError(TxlogError):
    """An encoder was given a value that RocketMQ could not have written (or cannot represent)."""

    def __init__(self, field: str, expected: str, actual: Any):
        super().__init__(f"cannot encode {field}: expected {expected}, got {actual!r}")
        self.field = field
        self.expected = expected
        self.actual = actual


class FormatError(TxlogError):
    """A data problem at a known place.  Raised only inside codecs and turned into an Anomaly at their edge."""

    def __init__(self, kind: str, file: str, position: int, detail: str,
                 expected: Any = None, actual: Any = None):
        where = f"{file}@{position}"
        exp = f" (expected {expected}, actual {actual})" if expected is not None or actual is not None else ""
        super().__init__(f"{kind} at {where}: {detail}{exp}")
        self.anomaly = Anomaly(kind=kind, file=file, position=position, detail=detail,
                               expected=None if expected is None else str(expected),
                               actual=None if actual is None else str(actual))


class AnomalyKind:
    """Stable anomaly codes (a public contract: they appear in dumps, Delta tables and tests)."""

    TRUNCATED_RECORD = "TRUNCATED_RECORD"          # record header/length runs past the end of valid data
    TRUNCATED_FILE = "TRUNCATED_FILE"              # file ends right after a record, no BLANK/zero tail: cut
    BAD_MAGIC = "BAD_MAGIC"                        # neither V1, V2 nor BLANK where a record must start
    BAD_TOTAL_SIZE = "BAD_TOTAL_SIZE"              # impossible TOTALSIZE, or fields do not add up to it
    BODY_CRC_MISMATCH = "BODY_CRC_MISMATCH"        # masked CRC32 of the stored body differs from BODYCRC
    PROPERTY_CRC_MISMATCH = "PROPERTY_CRC_MISMATCH"  # 5.2+ __CRC32# property does not match the record
    PHYSICAL_OFFSET_MISMATCH = "PHYSICAL_OFFSET_MISMATCH"  # PHYSICALOFFSET field != file start + position
    BAD_PROPERTIES = "BAD_PROPERTIES"              # properties bytes not valid UTF-8 / malformed
    BAD_BODY_COMPRESSION = "BAD_BODY_COMPRESSION"  # compressed body does not decompress
    GARBAGE_AFTER_END = "GARBAGE_AFTER_END"        # non-zero bytes after the end of valid data
    RESYNC = "RESYNC"                              # bytes skipped to reach the next valid record
    FILE_SIZE_MISMATCH = "FILE_SIZE_MISMATCH"      # mapped file length differs from the queue's file size
    FILE_GAP = "FILE_GAP"                          # adjacent mapped files are not contiguous
    FILE_OVERLAP = "FILE_OVERLAP"                  # adjacent mapped files overlap
    BAD_FILE_NAME = "BAD_FILE_NAME"                # not a 20-digit offset name
    MISALIGNED_FILE_NAME = "MISALIGNED_FILE_NAME"  # name not a multiple of the unit size
    BAD_CQ_ENTRY = "BAD_CQ_ENTRY"                  # consume-queue unit with impossible values
    CQ_ENTRY_MISMATCH = "CQ_ENTRY_MISMATCH"        # CQ unit disagrees with the CommitLog record it points to
    BAD_STATETABLE_UNIT = "BAD_STATETABLE_UNIT"
    UNIT_FILE_OUT_OF_ORDER = "UNIT_FILE_OUT_OF_ORDER"  # unit file whose CommitLog offsets go back: misplaced
    UNIT_OUT_OF_ORDER = "UNIT_OUT_OF_ORDER"        # a file's last unit points before the one preceding it
    IMPOSSIBLE_UNIT = "IMPOSSIBLE_UNIT"            # unit pointing at a record no CommitLog of the store can hold
    BAD_REDOLOG_UNIT = "BAD_REDOLOG_UNIT"
    BAD_JSON = "BAD_JSON"                          # config JSON that cannot be parsed even leniently
    BAD_CHECKPOINT = "BAD_CHECKPOINT"
    MISSING_FILE = "MISSING_FILE"
    BAD_CQ_EXT_UNIT = "BAD_CQ_EXT_UNIT"            # consume-queue-ext unit whose size fields do not add up
    BAD_CONFIG_ENTRY = "BAD_CONFIG_ENTRY"          # parsable config JSON with an entry RocketMQ could not have written
    BAD_FILE_HEADER = "BAD_FILE_HEADER"            # a file header that cannot be what the broker wrote
    BAD_INDEX_ENTRY = "BAD_INDEX_ENTRY"            # IndexFile entry or hash slot with an impossible value
    INDEX_INCOMPLETE = "INDEX_INCOMPLETE"          # an index may miss retained records: indexed mode scanned
    DLEDGER_ENTRY_MISMATCH = "DLEDGER_ENTRY_MISMATCH"  # DLedger entry header vs itself / its record
    DLEDGER_INDEX_MISMATCH = "DLEDGER_INDEX_MISMATCH"  # index unit vs entry; entry indexes not contiguous
    DLEDGER_UNCOMMITTED = "DLEDGER_UNCOMMITTED"    # entries past the DLedger checkpoint's committedIndex
    DLEDGER_REPLICA_DIFFERS = "DLEDGER_REPLICA_DIFFERS"  # a replica of the audited group differs from it
    INCREMENTAL_FALLBACK = "INCREMENTAL_FALLBACK"  # --incremental could not continue: a full audit ran
    COMMITLOG_HEAD_MISSING = "COMMITLOG_HEAD_MISSING"  # CommitLog files before the first lost, not retained


@dataclass(frozen=True)
class Anomaly:
    """A data problem found while decoding: what, where (file + byte position in that file), and the evidence."""

    kind: str
    file: str
    position: int
    detail: str
    expected: Optional[str] = None
    actual: Optional[str] = None
    source: str = ""            # which decoder found it: commitlog, consumequeue, statetable, ...
    physical_offset: Optional[int] = None  # global offset (CommitLog / logical queue offset bytes) if known
    length: Optional[int] = None           # bytes of the damaged range starting at position; None: not a range
    data_end: Optional[int] = None         # a torn end: global offset where the file's readable data ends

    def to_dict(self) -> dict:
        return asdict(self)
