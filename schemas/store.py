"""Tables decoded straight from store files (one row per record / unit / finding)."""
from __future__ import annotations

import pyarrow as pa

from schemas.core import Column as C
from schemas.core import Table

_str, _i8, _i16, _i32, _i64, _bool, _bin = pa.string(), pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.bool_(), \
    pa.binary()

COMMITLOG = Table.of("commitlog", [
    C("file", _str, False, "CommitLog file path"),
    C("file_position", _i64, False, "byte position of the record in its file"),
    C("physical_offset", _i64, False, "global CommitLog offset (file start offset + file_position)"),
    C("total_size", _i32, False, "TOTALSIZE: whole record size in bytes"),
    C("magic_version", _i8, False, "1 = MESSAGE_MAGIC_CODE 0xDAA320A7, 2 = MESSAGE_MAGIC_CODE_V2 0xDAA320AB"),
    C("body_crc", _i32, False, "BODYCRC as stored (masked CRC32 of the stored body)"),
    C("body_crc_ok", _bool, False, "BODYCRC equals the CRC of the stored body (true for an empty body)"),
    C("queue_id", _i32, False, "QUEUEID"),
    C("flag", _i32, False, "FLAG (user flag)"),
    C("queue_offset", _i64, False, "QUEUEOFFSET (meaning depends on transaction type and version)"),
    C("stored_physical_offset", _i64, False, "PHYSICALOFFSET field as stored in the record"),
    C("sys_flag", _i32, False, "SYSFLAG bits"),
    C("transaction_type", _str, False, "sys_flag & 0xC: NOT, PREPARED, COMMIT or ROLLBACK"),
    C("born_timestamp", _i64, False, "BORNTIMESTAMP, epoch ms (producer clock)"),
    C("born_host", _str, False, "born host ip:port ([ip]:port for IPv6)"),
    C("store_timestamp", _i64, False, "STORETIMESTAMP, epoch ms (broker clock)"),
    C("store_host", _str, False, "store host ip:port ([ip]:port for IPv6)"),
    C("reconsume_times", _i32, False, "RECONSUMETIMES"),
    C("prepared_transaction_offset", _i64, False, "PREPARED_TRANSACTION_OFFSET"),
    C("body_size", _i32, False, "BODYLENGTH (stored, possibly compressed)"),
    C("topic", _str, False, "TOPIC"),
    C("properties", pa.map_(_str, _str), False, "decoded properties map"),
    C("msg_id", _str, False, "offsetMsgId: hex of store host ip + port + physical offset"),
    C("uniq_key", _str, True, "UNIQ_KEY property (client message id / transaction id)"),
    C("tags", _str, True, "TAGS property"),
    C("keys", _str, True, "KEYS property"),
    C("pgroup", _str, True, "PGROUP property (producer group)"),
    C("real_topic", _str, True, "REAL_TOPIC property"),
    C("real_qid", _i32, True, "REAL_QID property"),
    C("tran_msg", _bool, True, "TRAN_MSG property is 'true'"),
    C("transaction_check_times", _i32, True, "TRANSACTION_CHECK_TIMES property"),
    C("tran_prepared_queue_offset", _i64, True, "TRAN_PREPARED_QUEUE_OFFSET property"),
    C("check_immunity_time_s", _i64, True, "CHECK_IMMUNITY_TIME_IN_SECONDS property"),
    C("transaction_id", _str, True, "__transactionId__ property (5.1+ broker)"),
    C("tags_code", _i64, False, "consume-queue tagsCode: Java String.hashCode of TAGS, 0 without tags"),
    C("compression", _str, True, "NONE, ZLIB, LZ4 or ZSTD (from sys_flag)"),
    C("body", _bin, True, "body bytes as stored (only when bodies are requested)"),
], "Every CommitLog record, decoded")

CONSUMEQUEUE = Table.of("consumequeue", [
    C("file", _str, False, "ConsumeQueue file path"),
    C("file_position", _i64, False, "byte position of the unit in its file"),
    C("topic", _str, False, "topic (directory name)"),
    C("queue_id", _i32, False, "queue id (directory name)"),
    C("queue_offset", _i64, False, "logical queue offset of the unit"),
    C("commitlog_offset", _i64, False, "CommitLog offset of the record"),
    C("size", _i32, False, "record TOTALSIZE"),
    C("tags_code", _i64, False, "tagsCode (tag hash, delivery time, or CQ-ext address)"),
], "ConsumeQueue units (pre-blank units skipped)")

STATETABLE = Table.of("statetable", [
    C("file", _str, False, "statetable file path"),
    C("index", _i64, False, "unit index = global byte offset / 24 (tranStateTableOffset)"),
    C("commitlog_offset", _i64, False, "CommitLog offset of the prepared record"),
    C("size", _i32, False, "prepared record size"),
    C("store_timestamp_s", _i32, False, "prepared record store time, epoch seconds"),
    C("producer_group_hash", _i32, False, "Java String.hashCode of PGROUP"),
    C("state", _str, False, "PREPARED (4), COMMIT (8), ROLLBACK (12) or UNKNOWN(n)"),
], "RocketMQ 3.x transaction state table units")

REDOLOG = Table.of("redolog", [
    C("file", _str, False, "redolog file path"),
    C("index", _i64, False, "unit index"),
    C("commitlog_offset", _i64, False, "CommitLog offset of the PREPARED / COMMIT / ROLLBACK record"),
    C("size", _i32, False, "record size"),
    C("tags_code", _i64, False, "-1 for PREPARED; otherwise the prepared record's CommitLog offset"),
    C("kind", _str, False, "PREPARED or END"),
], "RocketMQ 3.x transaction redo log units")

CONSUMER_OFFSETS = Table.of("consumer_offsets", [
    C("file", _str, False, "consumerOffset.json path"),
    C("topic", _str, False, "topic"),
    C("group", _str, False, "consumer group"),
    C("queue_id", _i32, False, "queue id"),
    C("offset", _i64, False, "next queue offset to consume"),
], "config/consumerOffset.json offsetTable")

ANOMALIES = Table.of("anomalies", [
    C("kind", _str, False, "anomaly code (txlog_io.errors.AnomalyKind)"),
    C("file", _str, False, "file in which it was found"),
    C("position", _i64, False, "byte position in that file"),
    C("detail", _str, False, "human-readable reason"),
    C("expected", _str, True, "what a valid file has there"),
    C("actual", _str, True, "what was found"),
    C("source", _str, False, "decoder that found it (commitlog, consumequeue, statetable, redolog, config, store)"),
    C("physical_offset", _i64, True, "global offset when known"),
    C("length", _i64, True, "bytes of the damaged range that starts at position (null: not about a byte range)"),
    C("data_end", _i64, True, "a torn end (GARBAGE_AFTER_END, TRUNCATED_RECORD, TRUNCATED_FILE of a CommitLog or "
                              "DLedger data file): the global offset where the file's readable data ends "
                              "(null otherwise)"),
], "Integrity findings met while decoding")

STORE_TABLES = {t.name: t for t in (COMMITLOG, CONSUMEQUEUE, STATETABLE, REDOLOG, CONSUMER_OFFSETS, ANOMALIES)}
