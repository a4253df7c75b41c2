"""The Java baseline of ``txlog-bench decode --java``: RocketMQ's own ``MessageDecoder.decode`` (a port kept
in ``bench/java/MessageDecoderBaseline.java``, Apache-2.0, from apache/rocketmq 5.3.3) compiled with the JDK's
``javac`` (no Maven) and run over the same CommitLog files as our decoder, single-threaded, several passes so
the JIT has warmed up (best pass) while the first pass is reported too.

The class is compiled once per source version into ``~/.cache/txaudit-java/<sha>`` (else a directory under the
temporary directory): never near a store.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Sequence

from txlog_io.errors import UsageError

SOURCE = Path(__file__).resolve().parent.parent / "bench" / "java" / "MessageDecoderBaseline.java"
MAIN_CLASS = "MessageDecoderBaseline"
#: a serial collector keeps garbage collection on the decoding thread's core (see the Java file)
JVM_FLAGS = ("-XX:+UseSerialGC", "-Xms1g", "-Xmx1g")


def _tool(name: str) -> str:
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", name), os.X_OK):
        return os.path.join(home, "bin", name)
    found = shutil.which(name)
    if not found:
        raise UsageError(f"--java needs a JDK 17+ ({name} not found on PATH and JAVA_HOME not set)")
    return found


def compile_baseline() -> Path:
    """The directory holding the compiled baseline class (compiled now if this source was not yet).  javac
    writes into a fresh directory beside the final one, which is then renamed into place: a process that
    finds the final directory finds a whole class, even while another one is compiling (two suites, two
    benchmarks at once)."""
    if not SOURCE.is_file():
        raise UsageError(f"{SOURCE}: Java baseline source missing (run from a source checkout)")
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    fallback = Path(tempfile.gettempdir()) / f"txaudit-java-{os.getuid()}"
    for root in (Path.home() / ".cache" / "txaudit-java", fallback):
        out = root / digest
        if (out / f"{MAIN_CLASS}.class").is_file():
            return out
        try:
            root.mkdir(parents=True, exist_ok=True)
            work = Path(tempfile.mkdtemp(prefix=f".{digest}-", dir=root))
        except OSError:
            continue
        try:
            proc = subprocess.run([_tool("javac"), "-d", str(work), str(SOURCE)], capture_output=True, text=True)
            if proc.returncode != 0:
                raise UsageError(f"{SOURCE}: javac failed: {proc.stderr.strip().splitlines()[-1:]}")
            try:
                work.rename(out)            # atomic; fails when another process got there first
            except OSError:
                if not (out / f"{MAIN_CLASS}.class").is_file():
                    shutil.rmtree(out, ignore_errors=True)      # left half-written by an interrupted compile
                    work.rename(out)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return out
    raise UsageError("no writable directory to compile the Java baseline into")


def run_baseline(files: Sequence[str], passes: int = 5, chunk_bytes: int = 4 << 20) -> dict:
    """Decode ``files`` ``passes`` times in one JVM; the baseline's summary (first_s, best_s, best_cpu_s,
    records, body_bytes, topic_chars, property_entries, msg_id_chars) plus every pass (``runs``)."""
    classes = compile_baseline()
    proc = subprocess.run([_tool("java"), *JVM_FLAGS, "-cp", str(classes), MAIN_CLASS, str(passes),
                           str(chunk_bytes), *map(str, files)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise UsageError(f"Java baseline failed (exit {proc.returncode}): {proc.stderr.strip()[-300:]}")
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    summary = lines[-1]
    summary["runs"] = lines[:-1]
    return summary
