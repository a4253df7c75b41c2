"""A local S3-compatible server for the tests and ``txlog-bench audit --store-on s3``: moto's S3 (PyPI
``moto[server]``, a test extra) served on loopback from a thread of this process, behind a WSGI layer that

* logs every request: method, path, query, ``Range`` header, status, response body bytes, the condition of a
  conditional request (``If-None-Match`` / ``If-Match``) -- the server-side
  account of what a run read (bytes transferred, requests made) and the proof that it wrote nothing;
* serves a plain ranged GET of an object from the object's buffer (moto itself reads the whole object for
  each), so the benchmark's large stores are read at the cost of the bytes asked for;
* accepts only the server's own access key id (moto alone accepts any): a request signed with another key
  gets S3's ``403 InvalidAccessKeyId``, so wrong credentials fail as they do against AWS.

Usage::

    with LocalS3() as s3:
        s3.create_bucket("b"); s3.upload("/path/store", "b", "backups/broker-a/store")
        env = s3.env()            # AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ... for a client of this server
        mark = len(s3.log); ...; s3.summary(mark)
"""
from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import dataclass
from typing import Dict, List, Optional

ACCESS_KEY_ID = "txaudittestkey"
SECRET_ACCESS_KEY = "txaudit-test-secret"
REGION = "us-east-1"
_KEY_ID = re.compile(r"Credential=([^/,\s]+)/")
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")
_DENIED = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InvalidAccessKeyId</Code><Message>The AWS '
           b'Access Key Id you provided does not exist in our records.</Message></Error>')


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: str
    range: str
    status: int
    bytes_out: int
    at: float           # time.time() when the response was complete
    condition: str = ""  # the If-None-Match / If-Match header of a conditional request ("If-None-Match: *")


class _Logged:
    """WSGI middleware: key check, then the request log."""

    def __init__(self, app, log: List[Request], lock: threading.Lock):
        self.app, self.log, self.lock = app, log, lock

    def __call__(self, environ, start_response):
        status_box = []
        auth = environ.get("HTTP_AUTHORIZATION", "")
        m = _KEY_ID.search(auth)
        if auth and (not m or m.group(1) != ACCESS_KEY_ID):
            start_response("403 Forbidden", [("Content-Type", "application/xml"),
                                             ("Content-Length", str(len(_DENIED)))])
            self._add(environ, 403, len(_DENIED))
            return [_DENIED]

        ranged = self._ranged_get(environ)
        if ranged is not None:
            status, headers, data = ranged
            start_response(status, headers)
            self._add(environ, int(status.split(" ", 1)[0]), len(data))
            return [data]

        def recording_start(status, headers, exc_info=None):
            status_box.append(int(status.split(" ", 1)[0]))
            return start_response(status, headers, exc_info)

        body = self.app(environ, recording_start)
        out = 0
        chunks = []
        for chunk in body:
            out += len(chunk)
            chunks.append(chunk)
        if hasattr(body, "close"):
            body.close()
        self._add(environ, status_box[0] if status_box else 0, out)
        return chunks

    @staticmethod
    def _ranged_get(environ):
        """A plain ``GET`` of ``bytes=a-b`` of an existing object, served from the object's buffer: moto reads
        the whole object for every ranged GET (a 1 GiB CommitLog file read in 4 MiB requests would cost 256
        whole reads); None for anything else (moto answers it)."""
        m = _RANGE.match(environ.get("HTTP_RANGE", ""))
        if (environ.get("REQUEST_METHOD") != "GET" or not m or environ.get("QUERY_STRING")
                or any(environ.get(h) for h in ("HTTP_IF_MATCH", "HTTP_IF_NONE_MATCH", "HTTP_IF_MODIFIED_SINCE",
                                                "HTTP_IF_UNMODIFIED_SINCE", "HTTP_X_AMZ_SERVER_SIDE_ENCRYPTION_"
                                                "CUSTOMER_ALGORITHM"))):
            return None
        from urllib.parse import unquote

        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.s3.models import s3_backends

        bucket, _, name = unquote(environ.get("PATH_INFO", "")).lstrip("/").partition("/")
        try:
            key = s3_backends[DEFAULT_ACCOUNT_ID]["global"].get_object(bucket, name)
        except Exception:  # noqa: BLE001 - no such bucket / key: moto's own answer
            return None
        if key is None or not hasattr(key, "_value_buffer"):
            return None
        size = int(key.size)
        first = int(m.group(1))
        last = min(int(m.group(2)) if m.group(2) else size - 1, size - 1)
        if first > last:
            return None
        with key.lock:
            key._value_buffer.seek(first)
            data = key._value_buffer.read(last - first + 1)
        headers = [("Content-Type", "binary/octet-stream"), ("Content-Length", str(len(data))),
                   ("Content-Range", f"bytes {first}-{first + len(data) - 1}/{size}"), ("Accept-Ranges", "bytes"),
                   ("ETag", key.etag), ("Last-Modified", key.last_modified_RFC1123)]
        return "206 Partial Content", headers, data

    def _add(self, environ, status: int, out: int) -> None:
        with self.lock:
            self.log.append(Request(environ.get("REQUEST_METHOD", ""), environ.get("PATH_INFO", ""),
                                    environ.get("QUERY_STRING", ""), environ.get("HTTP_RANGE", ""), status, out,
                                    time.time(), _condition(environ)))


def _condition(environ) -> str:
    for header, name in (("HTTP_IF_NONE_MATCH", "If-None-Match"), ("HTTP_IF_MATCH", "If-Match")):
        if environ.get(header):
            return f"{name}: {environ[header]}"
    return ""


class LocalS3:
    """moto's S3 on ``127.0.0.1`` (a free port unless given), started by :meth:`start` / ``with``."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        self.host, self.port = host, port
        self.log: List[Request] = []
        self._lock = threading.Lock()
        self._server = None
        self._thread: Optional[threading.Thread] = None

    def start(self) -> "LocalS3":
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )
        from werkzeug.serving import make_server

        class Quiet(MotoRequestHandler):
            def log_request(self, *args, **kwargs):      # the log above is the account; no stderr line each
                pass

        app = _Logged(DomainDispatcherApplication(create_backend_app), self.log, self._lock)
        self._server = make_server(self.host, self.port, app, threaded=True, request_handler=Quiet)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="local-s3", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(10)
            self._server = None

    def __enter__(self) -> "LocalS3":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def env(self, **overrides: str) -> Dict[str, str]:
        """The environment of a client of this server (no profile file is consulted)."""
        env = {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID,
               "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY, "AWS_REGION": REGION,
               "AWS_SHARED_CREDENTIALS_FILE": os.devnull, "AWS_CONFIG_FILE": os.devnull,
               "AWS_EC2_METADATA_DISABLED": "true"}
        env.update(overrides)
        return env

    def filesystem(self):
        from pyarrow import fs as pafs

        return pafs.S3FileSystem(endpoint_override=f"{self.host}:{self.port}", scheme="http", region=REGION,
                                 access_key=ACCESS_KEY_ID, secret_key=SECRET_ACCESS_KEY,
                                 allow_bucket_creation=True,
                                 request_timeout=900)   # moto completes a 1 GiB multipart upload slowly

    def create_bucket(self, bucket: str) -> None:
        self.filesystem().create_dir(bucket)

    def upload(self, local_dir: str, bucket: str, prefix: str) -> str:
        """Copy every file below ``local_dir`` to ``s3://bucket/prefix/...``; returns that URI."""
        fs = self.filesystem()
        for dirpath, _, files in os.walk(local_dir):
            for name in files:
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, local_dir).replace(os.sep, "/")
                with open(path, "rb") as src, fs.open_output_stream(f"{bucket}/{prefix}/{rel}") as dst:
                    while True:
                        block = src.read(8 << 20)
                        if not block:
                            break
                        dst.write(block)
        return f"s3://{bucket}/{prefix}"

    def summary(self, since: int = 0, bucket: Optional[str] = None) -> Dict[str, int]:
        """Requests and response bytes since log entry ``since`` (of one bucket if given), by method, plus
        ``writes``: requests that would change something (PUT, POST, DELETE)."""
        with self._lock:
            rows = self.log[since:]
        if bucket:
            rows = [r for r in rows if r.path.strip("/").split("/", 1)[0] == bucket]
        out = {"requests": len(rows), "bytes_out": sum(r.bytes_out for r in rows),
               "gets": sum(r.method == "GET" for r in rows),
               "ranged_gets": sum(r.method == "GET" and bool(r.range) for r in rows),
               "heads": sum(r.method == "HEAD" for r in rows),
               "writes": sum(r.method in ("PUT", "POST", "DELETE") for r in rows)}
        return out


__all__ = ["LocalS3", "Request", "ACCESS_KEY_ID", "SECRET_ACCESS_KEY", "REGION"]
