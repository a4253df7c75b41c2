"""Real-broker harness: released Apache RocketMQ NameServer + broker + a transactional producer, on 127.0.0.1.

* ``ensure_lib(version)`` runs ``fetch.sh`` (Maven Central -> ``$TXAUDIT_CACHE/rocketmq-<ver>/lib``, outside
  the repository, once); ``FetchUnavailable`` when Maven Central could not be reached.
* ``compile_workload(version)`` compiles ``TxWorkload.java`` with javac against that lib (cached by the
  source's hash next to the lib).
* ``Cluster`` starts a NameServer and a broker (each its own JVM, own process group, loopback, free ports),
  store under a temporary directory, short ``transactionTimeOut`` / ``transactionCheckInterval`` /
  ``transactionCheckMax``; ``stop_broker(clean=True)`` sends SIGTERM (BrokerStartup's shutdown hook runs
  ``BrokerController.shutdown()``), ``clean=False`` sends SIGKILL; ``start_broker()`` again restarts on the
  same store.  ``close()`` kills every process it started (process groups), also on test failure.
* ``Cluster.workload(mode, ...)`` runs TxWorkload (modes ``die``, ``run``, ``answer``) and ``truth(logs)``
  turns their JSON lines into the expected state per transaction.

Nothing here imports the project's ``jobs`` package: the tests drive the audit through ``./spark-submit.sh``.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

HERE = Path(__file__).resolve().parent
FETCH = HERE / "fetch.sh"
WORKLOAD_SRC = HERE / "TxWorkload.java"
VERSIONS = ("4.9.8", "5.3.3")

# transaction settings of every harness broker (the audit gets the same values through --conf-file)
TX_TIMEOUT_MS = 1000
TX_CHECK_INTERVAL_MS = 1000
TX_CHECK_MAX = 3
OP_BATCH_INTERVAL_MS = 500       # 5.x transactionOpBatchInterval (default 3000): op records batched in memory

# JDK 17: RocketMQ 4.9.8 unmaps files through sun.misc/DirectBuffer internals and netty reflects on NIO.
JDK17_OPENS = [
    "--add-opens=java.base/java.nio=ALL-UNNAMED",
    "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens=java.base/java.lang=ALL-UNNAMED",
    "--add-opens=java.base/java.lang.reflect=ALL-UNNAMED",
    "--add-opens=java.base/java.util=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.misc=ALL-UNNAMED",
    "--add-exports=java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-exports=java.base/jdk.internal.ref=ALL-UNNAMED",
    "-Dio.netty.tryReflectionSetAccessible=true",
]


class FetchUnavailable(Exception):
    """Maven Central could not be reached (or did not serve an artifact): the tests skip loudly."""


class HarnessError(Exception):
    pass


def cache_dir() -> Path:
    return Path(os.environ.get("TXAUDIT_CACHE") or Path.home() / ".cache" / "txaudit")


def java_bin(tool: str = "java") -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / tool).exists():
        return str(Path(home) / "bin" / tool)
    return tool


def ensure_lib(version: str) -> Path:
    """The jars of one RocketMQ version (fetched once; later calls only check the stamp)."""
    lib = cache_dir() / f"rocketmq-{version}" / "lib"
    if (lib / ".complete").exists():
        return lib
    p = subprocess.run(["bash", str(FETCH), version], capture_output=True, text=True, timeout=1800,
                       stdin=subprocess.DEVNULL)
    if p.returncode == 3:
        raise FetchUnavailable(f"RocketMQ {version} could not be fetched from Maven Central: "
                               f"{(p.stderr or p.stdout).strip()[-1500:]}")
    if p.returncode != 0:
        raise HarnessError(f"fetch.sh {version} failed (exit {p.returncode}): {p.stderr[-2000:]}")
    return lib


def classpath(lib: Path, *extra: Path) -> str:
    return os.pathsep.join([*(str(e) for e in extra), str(lib / "*")])


def compile_workload(version: str) -> Path:
    """TxWorkload.class compiled against ``version``'s client jars, cached by the source's hash."""
    lib = ensure_lib(version)
    digest = hashlib.sha256(WORKLOAD_SRC.read_bytes()).hexdigest()[:12]
    out = lib.parent / f"workload-{digest}"
    if (out / "TxWorkload.class").exists():
        return out
    tmp = lib.parent / f"workload-{digest}.tmp{os.getpid()}"
    tmp.mkdir(parents=True, exist_ok=True)
    p = subprocess.run([java_bin("javac"), "-nowarn", "-encoding", "UTF-8", "-cp", classpath(lib), "-d",
                        str(tmp), str(WORKLOAD_SRC)], capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise HarnessError(f"javac TxWorkload.java against RocketMQ {version}: {p.stderr[-3000:]}")
    try:
        tmp.rename(out)
    except OSError:          # another process won the race: use its classes
        subprocess.run(["rm", "-rf", str(tmp)], check=False)
    return out


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    # 4.9.8 binds its server sockets on every interface: the port must be free there too
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def _ephemeral_range() -> Tuple[int, int]:
    """The kernel's ephemeral port range (outgoing connections and bind(0) listeners take ports from it)."""
    try:
        lo, hi = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999                         # Linux's default


def port_range() -> Tuple[int, int]:
    """Where the harness picks its ports: below the ephemeral range (10000 .. its start), so that no other
    process on the machine (Spark's bind(0) listeners, any outgoing connection) is handed one of them by the
    kernel between the pick and the JVM's bind."""
    lo_eph, _ = _ephemeral_range()
    if lo_eph - 10000 >= 2000:
        return 10000, lo_eph
    return 20000, 60000                             # an unusual ephemeral range: fall back to a wide span


def free_port_block(width: int, lo: Optional[int] = None, hi: Optional[int] = None) -> int:
    """A port p such that p .. p+width-1 are all free now (the broker uses listenPort-2, listenPort, +1).
    Free *now* only: a start that then finds a port taken is retried by :class:`Cluster` with fresh ports."""
    import random
    dlo, dhi = port_range()
    lo, hi = (dlo if lo is None else lo), (dhi if hi is None else hi)
    rnd = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(500):
        p = rnd.randrange(lo, hi - width)
        if all(_bindable(p + i) for i in range(width)):
            return p
    raise HarnessError("no free block of loopback ports")


#: starts of one JVM when its ports keep being taken between the pick and the bind
PORT_ATTEMPTS = 3


#: A broker refuses every put once its disk partition is fuller than a ratio, whatever the store's own size:
#: 4.9.8 answers SERVICE_NOT_AVAILABLE ("disk is full", DefaultMessageStore's diskSpaceWarningLevelRatio,
#: system property, default 0.90), DLedger answers OS_PAGE_CACHE_BUSY ("[PC_SYNCHRONIZED] broker busy":
#: DLedgerConfig's disk-full ratio is dledger.disk.ratio.clean + 0.05, default 0.90), and past
#: diskSpaceCleanForciblyRatio (0.85) the cleaner deletes files early.  The test stores are a few MiB; a
#: machine whose disk is 90 % full (a CI host, a developer's laptop) must not turn into refused sends.
DISK_FULL_PROPS = ("-Drocketmq.broker.diskSpaceWarningLevelRatio=0.99",
                   "-Drocketmq.broker.diskSpaceCleanForciblyRatio=0.99",
                   "-Ddledger.disk.ratio.check=0.94", "-Ddledger.disk.ratio.clean=0.94")


@dataclass
class Proc:
    """One JVM in its own process group."""
    name: str
    popen: subprocess.Popen
    log: Path
    timeout_s: float = 90

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            try:
                os.killpg(self.popen.pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, clean: bool = True, timeout: float = 60) -> int:
        self.signal(signal.SIGTERM if clean else signal.SIGKILL)
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            return self.popen.wait(timeout=30)

    def tail(self, n: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""


def _spawn(name: str, cmd: List[str], log: Path, env: Dict[str, str], cwd: Path) -> Proc:
    fh = open(log, "ab")
    try:
        popen = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                 cwd=str(cwd), start_new_session=True)
    finally:
        fh.close()
    return Proc(name, popen, log)


#: what a JVM prints when a server socket's port was taken between the pick and its bind
BIND_FAILURE = re.compile(r"java\.net\.BindException: Address already in use")


class PortTaken(HarnessError):
    """A JVM exited before listening because one of its ports was taken (its output shows the bind failure)."""


def _wait_port(port: int, proc: Proc, timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not proc.alive():
            tail = proc.tail()
            kind = PortTaken if BIND_FAILURE.search(tail) else HarnessError
            raise kind(f"{proc.name} exited ({proc.popen.returncode}) before listening on {port}:\n{tail}")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise HarnessError(f"{proc.name} not listening on 127.0.0.1:{port} after {timeout:.0f} s:\n{proc.tail()}")


LOGBACK = """<?xml version="1.0" encoding="UTF-8"?>
<configuration>
  <appender name="FILE" class="ch.qos.logback.core.FileAppender">
    <file>{log}</file>
    <encoder><pattern>%d{{HH:mm:ss.SSS}} %-5p [%t] %c{{0}} - %m%n</pattern></encoder>
  </appender>
  <logger name="RocketmqTransaction" level="INFO"/>
  <logger name="RocketmqBroker" level="INFO"/>
  <root level="WARN"><appender-ref ref="FILE"/></root>
</configuration>
"""


@dataclass
class Cluster:
    """NameServer + one broker of one RocketMQ version on 127.0.0.1, store under ``work/store``."""
    version: str
    work: Path
    dledger: bool = False
    tx_settings: Dict[str, str] = field(default_factory=dict)
    procs: List[Proc] = field(default_factory=list)
    broker: Optional[Proc] = None
    namesrv: Optional[Proc] = None

    def __post_init__(self):
        self.lib = ensure_lib(self.version)
        self.classes = compile_workload(self.version)
        self.work.mkdir(parents=True, exist_ok=True)
        self.home = self.work / "home"
        (self.home / "conf").mkdir(parents=True, exist_ok=True)
        self.logs = self.work / "logs"
        self.logs.mkdir(exist_ok=True)
        for role in ("namesrv", "broker"):
            (self.home / "conf" / f"logback_{role}.xml").write_text(
                LOGBACK.format(log=self.logs / f"{role}-rocketmq.log"))
        self.store = self.work / "store"
        self.ns_port = free_port_block(1)
        self.broker_port = free_port_block(4) + 2          # listenPort-2 (VIP channel), +1 (HA)
        self.dledger_port = free_port_block(1) if self.dledger else None
        self.broker_starts = 0
        self.namesrv_starts = 0
        self.broker_lives = 0                      # starts that got as far as listening
        self.port_retries: List[str] = []          # why a start was repeated on fresh ports

    # ---- JVMs --------------------------------------------------------------------------------------------
    def _env(self) -> Dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
        env["ROCKETMQ_HOME"] = str(self.home)
        env.pop("NAMESRV_ADDR", None)
        return env

    def _java(self, main: str, heap: str, *args: str, cp_extra=()) -> List[str]:
        return [java_bin(), f"-Xms{heap}", f"-Xmx{heap}", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                "-XX:MaxDirectMemorySize=256m",
                "-Xss512k", f"-Duser.home={self.home}", f"-Drocketmq.home.dir={self.home}",
                f"-Drocketmq.client.logRoot={self.logs}", "-Drocketmq.client.logLevel=WARN",
                "-Djava.net.preferIPv4Stack=true", "-Dfile.encoding=UTF-8", *DISK_FULL_PROPS, *JDK17_OPENS,
                "-cp", classpath(self.lib, *cp_extra), main, *args]

    @property
    def namesrv_addr(self) -> str:
        return f"127.0.0.1:{self.ns_port}"

    def _retry_on_taken_port(self, what: str, start: Callable[[], None], repick: Callable[[], None]) -> None:
        """``start()``; when the JVM exited because a port was taken after the pick (BindException in its
        output), log why, pick fresh ports and start again (at most PORT_ATTEMPTS times)."""
        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                return start()
            except PortTaken as e:
                if attempt == PORT_ATTEMPTS:
                    raise
                first = str(e).splitlines()[0]
                why = BIND_FAILURE.search(str(e)).group(0)
                note = f"{what} start {attempt}: {first} ({why}); retrying on fresh ports"
                self.port_retries.append(note)
                print(f"realbroker: {note}", file=sys.stderr)
                repick()

    def start_namesrv(self) -> None:
        def repick():
            self.ns_port = free_port_block(1)
        self._retry_on_taken_port("namesrv", self._start_namesrv_once, repick)

    def _start_namesrv_once(self) -> None:
        conf = self.work / "namesrv.properties"
        conf.write_text(f"listenPort={self.ns_port}\nbindAddress=127.0.0.1\nrocketmqHome={self.home}\n")
        self.namesrv_starts += 1
        name = "namesrv.out" if self.namesrv_starts == 1 else f"namesrv-{self.namesrv_starts}.out"
        self.namesrv = _spawn("namesrv", self._java("org.apache.rocketmq.namesrv.NamesrvStartup", "128m",
                                                    "-c", str(conf)),
                              self.logs / name, self._env(), self.work)
        self.procs.append(self.namesrv)
        _wait_port(self.ns_port, self.namesrv, 90)

    def broker_properties(self) -> str:
        lines = {
            "brokerClusterName": "DefaultCluster",
            "brokerName": "broker-a",
            "brokerId": "0",
            "brokerIP1": "127.0.0.1",
            "bindAddress": "127.0.0.1",
            "namesrvAddr": self.namesrv_addr,
            "listenPort": str(self.broker_port),
            "storePathRootDir": str(self.store),
            "storePathCommitLog": str(self.store / "commitlog"),
            "mappedFileSizeCommitLog": str(1024 * 1024),
            "mappedFileSizeConsumeQueue": "6000",
            "maxHashSlotNum": "64",
            "maxIndexNum": "512",
            "flushDiskType": "ASYNC_FLUSH",
            "brokerRole": "ASYNC_MASTER",
            "autoCreateTopicEnable": "true",
            "registerNameServerPeriod": "10000",
            "transactionTimeOut": str(TX_TIMEOUT_MS),
            "transactionCheckInterval": str(TX_CHECK_INTERVAL_MS),
            "transactionCheckMax": str(TX_CHECK_MAX),
            # BrokerFastFailure answers a send that waited longer than this in the send queue with
            # [TIMEOUT_CLEAN_QUEUE] "broker busy" (default 200 ms): a loaded test machine is not a busy broker
            "waitTimeMillsInSendQueue": "10000",
            # a test machine's disk is shared with everything else on it: see DISK_FULL_PROPS
            "diskMaxUsedSpaceRatio": "95",
        }
        if self.version.startswith("5."):
            # 5.x writes op records in batches every transactionOpBatchInterval (default 3000 ms); with a 1 s
            # transactionTimeOut the check service would re-check (and re-commit) resolved halves meanwhile
            lines["transactionOpBatchInterval"] = str(OP_BATCH_INTERVAL_MS)
            lines["diskSpaceWarningLevelRatio"] = "99"         # 5.x: MessageStoreConfig keys (percent)
            lines["diskSpaceCleanForciblyRatio"] = "99"
        lines.update(self.tx_settings)
        if self.dledger:
            lines.pop("storePathCommitLog")
            lines.update({"enableDLegerCommitLog": "true", "dLegerGroup": "broker-a", "dLegerSelfId": "n0",
                          "dLegerPeers": f"n0-127.0.0.1:{self.dledger_port}"})
        return "".join(f"{k}={v}\n" for k, v in lines.items())

    def start_broker(self) -> None:
        first = self.broker_starts == 0

        def repick():
            self.broker_port = free_port_block(4) + 2
            if self.dledger and first:          # a restarted DLedger store keeps its peer address
                self.dledger_port = free_port_block(1)
        self._retry_on_taken_port("broker", self._start_broker_once, repick)
        self._wait_registered(60)
        if self.dledger:
            self._wait_leader(120)

    def _start_broker_once(self) -> None:
        conf = self.work / "broker.properties"
        conf.write_text(self.broker_properties())
        self.broker_starts += 1
        self.broker = _spawn("broker", self._java("org.apache.rocketmq.broker.BrokerStartup", "384m", "-c",
                                                  str(conf)),
                             self.logs / f"broker-{self.broker_starts}.out", self._env(), self.work)
        self.procs.append(self.broker)
        _wait_port(self.broker_port, self.broker, 120)
        self.broker_lives += 1

    def _wait_leader(self, timeout: float) -> None:
        """A DLedger broker serves writes once its one-node group elected it (DLedgerRoleChangeHandler)."""
        end = time.monotonic() + timeout
        pattern = re.compile(r"Finish handling broker role change succ=true term=\d+ role=LEADER")
        while time.monotonic() < end:
            # 4.9.8 logs through the harness's logback file; 5.3.3 through its own, under ROCKETMQ_HOME/logs
            seen = max((len(pattern.findall(f.read_text(errors="replace"))) for f in self.broker_log_files()),
                       default=0)
            if seen >= self.broker_lives:
                return
            if not self.broker.alive():
                break
            time.sleep(0.2)
        raise HarnessError(f"DLedger broker not LEADER after {timeout:.0f} s:\n{self.broker.tail()}")

    def _wait_registered(self, timeout: float) -> None:
        """The broker logs "boot success" once it registered with the NameServer (both versions)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if "boot success" in self.broker.tail(20000):
                return
            if not self.broker.alive():
                break
            time.sleep(0.2)
        raise HarnessError(f"broker did not report 'boot success':\n{self.broker.tail()}")

    def stop_broker(self, clean: bool = True) -> int:
        rc = self.broker.stop(clean=clean, timeout=90)
        if clean and (self.store / "abort").exists():
            raise HarnessError(f"clean stop left an abort file (exit {rc}):\n{self.broker.tail()}")
        return rc

    def start(self) -> "Cluster":
        self.start_namesrv()
        self.start_broker()
        return self

    def close(self) -> None:
        for p in reversed(self.procs):
            if p.alive():
                p.signal(signal.SIGKILL)
                try:
                    p.popen.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    pass

    def __enter__(self) -> "Cluster":
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- the producer ------------------------------------------------------------------------------------
    def start_workload(self, mode: str, log: Path, timeout_s: int = 90, **opts) -> Proc:
        """Start TxWorkload ``mode`` (its JSON lines go to ``log``)."""
        args = ["--namesrv", self.namesrv_addr, "--broker", f"127.0.0.1:{self.broker_port}", "--log",
                str(log), "--timeout-s", str(timeout_s)]
        for k, v in opts.items():
            args += [f"--{k.replace('_', '-')}", str(v)]
        p = _spawn(f"workload-{mode}",
                   self._java("TxWorkload", "128m", mode, *args, cp_extra=(self.classes,)),
                   self.logs / f"workload-{mode}.out", self._env(), self.work)
        p.timeout_s = timeout_s
        self.procs.append(p)
        return p

    def wait_workload(self, p: Proc) -> None:
        try:
            rc = p.popen.wait(timeout=p.timeout_s + 120)
        except subprocess.TimeoutExpired:
            p.signal(signal.SIGKILL)
            raise HarnessError(f"{p.name} hung:\n{p.tail()}") from None
        if rc != 0:
            raise HarnessError(f"{p.name} exit {rc}:\n{p.tail()}\nbroker:\n"
                               f"{self.broker.tail() if self.broker else ''}")

    def workload(self, mode: str, log: Path, timeout_s: int = 90, **opts) -> None:
        """Run TxWorkload ``mode`` to completion (``die`` halts the JVM on purpose); raise on failure."""
        self.wait_workload(self.start_workload(mode, log, timeout_s, **opts))

    def wait_phase(self, p: Proc, log: Path, phase: str, timeout: float = 90) -> None:
        """Until the workload logged ``phase`` ("online": its producer started; "done": its work is over and
        the store may be stopped).  Polled every 50 ms so that the broker can be stopped right away."""
        end = time.monotonic() + timeout
        needle = f'"phase": "{phase}"'
        while time.monotonic() < end:
            if log.exists() and needle in log.read_text():
                return
            if not p.alive():
                self.wait_workload(p)
                raise HarnessError(f"{p.name} ended before logging phase {phase}")
            time.sleep(0.05)
        raise HarnessError(f"{p.name}: no phase {phase} after {timeout:.0f} s:\n{p.tail()}")

    # ---- what the broker itself logged -------------------------------------------------------------------
    def broker_log_files(self) -> List[Path]:
        return sorted([*self.logs.glob("*.log"), *(self.home / "logs").rglob("*.log")])

    def broker_discards(self) -> Dict[str, int]:
        """KEYS -> times the broker logged moving that half to TRANS_CHECK_MAX_TIME_TOPIC (both versions'
        DefaultTransactionalMessageCheckListener.resolveDiscardMsg log the whole MessageExt at ERROR)."""
        out: Dict[str, int] = {}
        for f in self.broker_log_files():
            for line in f.read_text(errors="replace").splitlines():
                if "has been checked too many times" in line:
                    m = re.search(r"KEYS=(RB-[A-Za-z0-9_]+-\d+)", line)
                    if m:
                        out[m.group(1)] = out.get(m.group(1), 0) + 1
        return out


# ---- truth -----------------------------------------------------------------------------------------------
@dataclass
class TxTruth:
    key: str
    cls: str
    uniq: Optional[str] = None
    answers: List[str] = field(default_factory=list)     # every answer, in order (send + checks)
    checks: int = 0
    state: str = "PREPARED"


def read_log(path: Path) -> List[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def truth(paths: List[Path], broker_discards: Optional[Dict[str, int]] = None) -> Dict[str, TxTruth]:
    """Expected state per KEYS from the producers' logs and what the broker did: the last COMMIT / ROLLBACK
    answer wins; otherwise DISCARDED when the broker moved the half to TRANS_CHECK_MAX_TIME_TOPIC (its own
    log line, or a pull of that topic during the run), else PREPARED.  The broker's view of committed
    messages (a pull of the real topic) must equal the COMMIT answers (the tests check that too)."""
    txs: Dict[str, TxTruth] = {}
    discarded = set(broker_discards or ())
    events = [e for p in paths if p.exists() for e in read_log(p)]
    for e in sorted(events, key=lambda e: e.get("t") or 0):
        ev = e.get("event")
        if ev in ("send", "died", "check"):
            t = txs.setdefault(e["key"], TxTruth(e["key"], e["class"]))
            t.uniq = t.uniq or e.get("uniq")
            if ev == "check":
                t.checks += 1
            if ev in ("send", "check"):
                t.answers.append(e["answer"])
        elif ev == "view":
            discarded |= set(e["discarded"])
    for t in txs.values():
        final = [a for a in t.answers if a != "UNKNOW"]
        if final:
            t.state = {"COMMIT": "COMMITTED", "ROLLBACK": "ROLLED_BACK"}[final[-1]]
        elif t.key in discarded:
            t.state = "DISCARDED"
    return txs


def last_view(*paths: Path) -> dict:
    views = sorted((e for p in paths if p.exists() for e in read_log(p) if e.get("event") == "view"),
                   key=lambda e: e["t"])
    if not views:
        raise HarnessError(f"{paths}: no broker view logged")
    return views[-1]


# ---- scenarios -------------------------------------------------------------------------------------------
SCENARIOS = ("clean", "kill9", "kill9_restart")
DLEDGER_SCENARIOS = ("dledger_clean", "dledger_kill9")     # enableDLegerCommitLog=true (4.9.8 and 5.3.3)
#: 5.3.3 with its RocksDB consume-queue store (MessageStoreConfig storeType=defaultRocksDB: RocksDBMessageStore,
#: consumequeue/ holds a RocksDB database of RocksDBConsumeQueueStore)
ROCKSDB_SCENARIOS = ("rocksdb_clean", "rocksdb_kill9")
ROCKSDB_SETTINGS = {"storeType": "defaultRocksDB"}
WORKLOAD = {"counts": "commit=3,rollback=2,check_commit=2,check_rollback=2,check2_commit=1,discard=2",
            "died": "died_commit=2,died_discard=2", "inflight": 2}
RESTART_CHECK_INTERVAL_MS = 5000
# CHECK_IMMUNITY_TIME_IN_SECONDS of the in-flight halves when the broker is not restarted: no check-back while
# a graceful stop takes seconds (4.9.8's check service kept checking for 3-6 s after SIGTERM on a loaded
# machine; a long stop still checks and may discard them, docs/realbroker.md).  Not after a restart: 5.3.3
# consumed the immunity copies before the kill and never checked those halves again.
INFLIGHT_IMMUNITY_S = 10


@dataclass
class ScenarioRun:
    version: str
    scenario: str
    store: Path
    logs: List[Path]
    truth: Dict[str, TxTruth]
    broker_discards: Dict[str, int]
    view: dict
    seconds: float
    steps: List[str]


def run_scenario(version: str, scenario: str, work: Path, seed: int = 7) -> ScenarioRun:
    """One broker life: producers (one dies mid-transaction) -> stop (SIGTERM ``clean`` / SIGKILL ``kill9``)
    -> for ``*_restart``: start the broker again on the store, a new producer answers the in-flight halves
    on check-back, SIGTERM.  Every process is gone when this returns or raises."""
    t0 = time.monotonic()
    steps: List[str] = []
    run_log, die_log, answer_log = work / "workload-run.jsonl", work / "workload-die.jsonl", \
        work / "workload-answer.jsonl"
    cluster = Cluster(version, work, dledger=scenario.startswith("dledger"),
                      tx_settings=dict(ROCKSDB_SETTINGS) if scenario.startswith("rocksdb") else {})
    try:
        cluster.start()
        steps.append(f"started {time.monotonic() - t0:.1f}s")
        run = cluster.start_workload("run", run_log, seed=seed, counts=WORKLOAD["counts"],
                                     died=WORKLOAD["died"], inflight=WORKLOAD["inflight"], op_flush_ms=1500,
                                     immunity_s=0 if scenario.endswith("_restart") else INFLIGHT_IMMUNITY_S)
        cluster.wait_phase(run, run_log, "online")
        cluster.workload("die", die_log, seed=seed, counts=WORKLOAD["died"])
        cluster.wait_phase(run, run_log, "done", timeout=run.timeout_s + 60)
        clean = not scenario.endswith(("kill9", "kill9_restart"))
        cluster.stop_broker(clean=clean)                  # right away: the in-flight halves stay unchecked
        steps.append(f"{'stopped' if clean else 'killed -9'} {time.monotonic() - t0:.1f}s")
        run.stop(clean=False)                             # its log is complete ("done" was written)
        if scenario.endswith("_restart"):
            # the answering producer is up before the broker: the restarted broker's first checks find it
            ans = cluster.start_workload("answer", answer_log, seed=seed, inflight=WORKLOAD["inflight"],
                                         op_flush_ms=1500)
            cluster.wait_phase(ans, answer_log, "online")
            # A restarted broker starts its check service before it registers with the NameServer, so its
            # first passes (every second) would find no producer channel and discard the halves (seen on
            # both versions).  The restart waits 5 s before its first pass; the producer (route polled and
            # heartbeat sent every second) is registered by then.
            cluster.tx_settings["transactionCheckInterval"] = str(RESTART_CHECK_INTERVAL_MS)
            cluster.start_broker()
            steps.append(f"restarted {time.monotonic() - t0:.1f}s")
            cluster.wait_phase(ans, answer_log, "done", timeout=ans.timeout_s + 60)
            cluster.stop_broker(clean=True)
            steps.append(f"stopped {time.monotonic() - t0:.1f}s")
            ans.stop(clean=False)
    finally:
        cluster.close()
        steps += cluster.port_retries
    logs = [die_log, run_log, answer_log]
    discards = cluster.broker_discards()
    return ScenarioRun(version, scenario, cluster.store, [p for p in logs if p.exists()],
                       truth(logs, discards), discards, last_view(*logs), time.monotonic() - t0, steps)
