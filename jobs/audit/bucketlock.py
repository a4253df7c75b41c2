"""The run lock of an ``--out`` in an S3 bucket: one lock object, ``<out>/.txaudit.lock``, created with a
conditional PUT.

A bucket has no ``flock`` and no atomic create-or-fail ``open``; what S3 (since 2024) and the S3-compatible
servers with conditional writes do offer is a PUT that succeeds only if the key is absent
(``If-None-Match: *``) or still holds a given version (``If-Match: <ETag>``); anything else is refused with
``412 Precondition Failed``, atomically on the server.  So:

* **acquire**: PUT the lock object with ``If-None-Match: *``.  Exactly one of two runs racing for the same
  ``--out`` gets 200; the other gets 412, reads the object (who holds it: host, pid, run id) and fails with one
  line -- unless the lock is **stale**.
* **heartbeat**: while the run lasts, a daemon thread rewrites the object every ``ttl / 3`` seconds with
  ``If-Match: <our ETag>`` (each rewrite gives a new ETag, kept for the next).  A 412 here means another run
  took the lock over (we were silent for longer than the TTL): the thread stops and says so on stderr.
* **stale**: a lock whose object was last written more than ``ttl`` seconds ago, measured on the server's clock
  (its ``Last-Modified`` against the ``Date`` of the GET response: no client clock is trusted), belongs to a
  run that died without releasing it (``kill -9``, a lost node).  It is taken over with ``If-Match: <its
  ETag>``: if two runs try at once, one PUT wins and the other gets 412.
* **release**: DELETE with ``If-Match: <our ETag>`` (a lock that was taken over is not deleted).

What this does not give: a run that stays alive but cannot reach the server for longer than the TTL may be
taken over while it still writes.  Each table's Delta log stays consistent even then (delta-rs commits a
version with ``If-None-Match: *``: two commits of the same version cannot both land, the second retries on top
of the first); only the two runs' rows may interleave in time.  ``TXAUDIT_LOCK_TTL_S`` sets the TTL (default
120 s).

The client is boto3 (pyarrow's S3 filesystem sends no conditional headers), configured from the same S3
settings as every other client (``jobs.config.object_store_settings``); nothing secret is printed.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import uuid
from email.utils import parsedate_to_datetime
from typing import Optional, Tuple

from txlog_io import storefs
from txlog_io.errors import UsageError

DEFAULT_TTL_S = 120.0


class BucketLockedError(UsageError):
    """Another run holds the lock object of this ``--out``."""


def ttl_seconds() -> float:
    try:
        return max(1.0, float(os.environ.get("TXAUDIT_LOCK_TTL_S", DEFAULT_TTL_S)))
    except ValueError:
        return DEFAULT_TTL_S


def _client():
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise UsageError("--out: the run lock in a bucket needs boto3 (pip install 'boto3>=1.35')") from None

    from jobs.config import object_store_settings

    s = object_store_settings()
    kwargs = {"endpoint_url": s.endpoint_url, "region_name": s.region or ("us-east-1" if s.endpoint_url else None)}
    if s.access_key_id and s.secret_access_key:
        kwargs.update(aws_access_key_id=s.access_key_id, aws_secret_access_key=s.secret_access_key,
                      aws_session_token=s.session_token)
    cfg = Config(connect_timeout=5, read_timeout=20, retries={"max_attempts": 2, "mode": "standard"},
                 s3={"addressing_style": "path"} if s.endpoint_url else None)
    return boto3.client("s3", config=cfg, **{k: v for k, v in kwargs.items() if v})


def _bucket_key(uri: str) -> Tuple[str, str]:
    parts = storefs.split_uri(uri)
    if parts is None or parts[0].lower() not in storefs.S3_SCHEMES:
        raise UsageError(f"--out {uri}: a run lock in a bucket needs an S3 URI (s3://, s3a://)")
    bucket, _, key = parts[1].partition("/")
    return bucket, key


def _code(exc) -> str:
    err = getattr(exc, "response", {}).get("Error", {}) if hasattr(exc, "response") else {}
    return str(err.get("Code", "")) or type(exc).__name__


def _status(exc) -> int:
    return int((getattr(exc, "response", None) or {}).get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def _one_line(uri: str, exc: BaseException) -> str:
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return f"--out {uri}: cannot use the run lock object: {text}"


class BucketLock:
    """The lock object ``<out>/<name>`` (see the module docstring)."""

    def __init__(self, out: str, run_id: str, name: str, ttl_s: Optional[float] = None):
        self.out, self.run_id = out, run_id
        self.bucket, prefix = _bucket_key(out)
        self.key = f"{prefix}/{name}" if prefix else name
        self.uri = f"{out.rstrip('/')}/{name}"
        self.ttl = float(ttl_s if ttl_s is not None else ttl_seconds())
        self.owner = uuid.uuid4().hex
        self.etag: Optional[str] = None
        self.lost = False
        self._client = _client()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._beats = 0

    def _body(self) -> bytes:
        return json.dumps({"owner": self.owner, "host": socket.gethostname(), "pid": os.getpid(),
                           "run_id": self.run_id, "ttl_s": self.ttl, "heartbeat": self._beats},
                          sort_keys=True).encode("utf-8")

    def _put(self, **condition) -> str:
        r = self._client.put_object(Bucket=self.bucket, Key=self.key, Body=self._body(),
                                    ContentType="application/json", **condition)
        return r["ETag"]

    def holder(self) -> Optional[Tuple[dict, str, float]]:
        """``(content, ETag, age in seconds on the server's clock)`` of the lock object; None when absent."""
        from botocore.exceptions import ClientError

        try:
            r = self._client.get_object(Bucket=self.bucket, Key=self.key)
        except ClientError as e:
            if _code(e) in ("NoSuchKey", "404") or _status(e) == 404:
                return None
            raise
        body = r["Body"].read(4096)
        try:
            content = json.loads(body.decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            content = {}
        date = r.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
        now = parsedate_to_datetime(date).timestamp() if date else time.time()
        return content, r["ETag"], max(0.0, now - r["LastModified"].timestamp())

    def message(self, content: dict, age: float) -> str:
        who = (f"host {content.get('host', '?')}, pid {content.get('pid', '?')}, run id "
               f"{content.get('run_id', '?')}") if content else "holder unknown"
        return (f"--out {self.out} is in use by another txaudit run ({who}; lock object {self.uri}, last "
                f"heartbeat {age:.0f} s ago, stale after {self.ttl:.0f} s); wait for it to finish or use "
                f"another --out")

    def acquire(self) -> None:
        """Take the lock, or raise BucketLockedError naming the holder (UsageError: the server refused)."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            try:
                self.etag = self._put(IfNoneMatch="*")
            except ClientError as e:
                if _status(e) not in (409, 412):
                    raise
                held = self.holder()
                if held is None:                      # released between the two requests: one more try
                    self.etag = self._put(IfNoneMatch="*")
                else:
                    content, etag, age = held
                    if age <= self.ttl:
                        raise BucketLockedError(self.message(content, age)) from None
                    try:                              # stale: take it over, unless another run just did
                        self.etag = self._put(IfMatch=etag)
                    except ClientError as e2:
                        if _status(e2) in (409, 412):
                            again = self.holder()
                            raise BucketLockedError(self.message(*(again[0], again[2]) if again else ({}, 0.0))) \
                                from None
                        raise
                    print(f"txaudit: took over the stale run lock {self.uri} ({self.message(content, age)})",
                          file=sys.stderr, flush=True)
        except BucketLockedError:
            raise
        except ClientError as e:
            raise UsageError(_one_line(self.out, e)) from None
        except BotoCoreError as e:
            raise UsageError(_one_line(self.out, e)) from None
        self._thread = threading.Thread(target=self._heartbeat, name="txaudit-lock-heartbeat", daemon=True)
        self._thread.start()

    def _heartbeat(self) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        while not self._stop.wait(self.ttl / 3):
            self._beats += 1
            try:
                self.etag = self._put(IfMatch=self.etag)
            except ClientError as e:
                if _status(e) in (404, 412):
                    self.lost = True
                    print(f"txaudit: warning: the run lock {self.uri} was taken over by another run "
                          f"(this run's heartbeat was late by more than {self.ttl:.0f} s)",
                          file=sys.stderr, flush=True)
                    return
            except BotoCoreError:
                continue                              # the server did not answer: next beat

    def release(self) -> None:
        """Stop the heartbeat; delete the lock object if it is still ours."""
        from botocore.exceptions import BotoCoreError, ClientError

        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        if self.lost or self.etag is None:
            return
        try:
            self._client.delete_object(Bucket=self.bucket, Key=self.key, IfMatch=self.etag)
        except (ClientError, BotoCoreError) as e:
            print(f"txaudit: warning: run lock {self.uri} not released ({_code(e)}); it turns stale after "
                  f"{self.ttl:.0f} s", file=sys.stderr, flush=True)
        self.etag = None


def probe(out: str, name: str) -> Optional[str]:
    """Message naming the holder when the lock object of ``out`` is held now (reads only)."""
    from botocore.exceptions import BotoCoreError, ClientError

    lock = BucketLock(out, "", name)
    try:
        held = lock.holder()
    except (ClientError, BotoCoreError):
        return None
    if held is None or held[2] > lock.ttl:
        return None
    return lock.message(held[0], held[2])


__all__ = ["BucketLock", "BucketLockedError", "probe", "ttl_seconds", "DEFAULT_TTL_S"]
