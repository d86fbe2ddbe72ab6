"""A local single-node Kafka (KRaft, broker + controller) from Maven Central jars, without Docker.

``start``: fetch the jars once (``mvn dependency:copy-dependencies`` with ``infra/kafka/pom.xml``) into
``~/.cache/flywheel/kafka/<version>/libs``, write ``server.properties`` into the data dir, format the
KRaft storage the first time, start ``java ... kafka.Kafka`` detached (pid file and log in the data
dir) and wait until a client can fetch metadata. ``stop``: SIGTERM by pid, wait, SIGKILL if it hangs.
``cluster`` + ``start_cluster``: N such nodes (broker + controller each) in one KRaft cluster, the
controller quorum made of all of them, topics replicated ``min(N, 3)`` times with ``min.insync.replicas``
one less (RF=3, min ISR 2 on three nodes), as the fault tests of a cluster need.

Exceptions:
    KafkaLauncherError       one line that tells the user what went wrong (CLI prints it as is)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

POM = Path(__file__).with_name("pom.xml")
CACHE = Path.home() / ".cache" / "flywheel"
HOST = "127.0.0.1"


class KafkaLauncherError(RuntimeError):
    pass


# Brokers started by this process, kept so they are reaped on stop (and not garbage-collected while
# running, which Python reports as a ResourceWarning).
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def kafka_version() -> str:
    match = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", POM.read_text())
    if match is None:
        raise KafkaLauncherError(f"no <kafka.version> in {POM}")
    return match.group(1)


@dataclass(frozen=True)
class BrokerConfig:
    port: int = 9092
    controller_port: int | None = None  # default: port + 1
    data_dir: Path | None = None  # default: ~/.cache/flywheel/kafka-data/<port>
    heap: str = "512m"
    extra: dict[str, str] = field(default_factory=dict)  # more server.properties
    node_id: int = 1
    voters: str | None = None  # controller.quorum.voters of a cluster; default: this node alone
    replicas: int = 1  # default.replication.factor (internal topics too); min ISR is one less, at least 1

    @property
    def cport(self) -> int:
        return self.controller_port if self.controller_port is not None else self.port + 1

    @property
    def dir(self) -> Path:
        return (self.data_dir or CACHE / "kafka-data" / str(self.port)).expanduser().resolve()

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def pid_file(self) -> Path:
        return self.dir / "kafka.pid"

    @property
    def log_file(self) -> Path:
        return self.dir / "kafka.log"

    @property
    def properties(self) -> Path:
        return self.dir / "server.properties"


def ensure_jars(version: str | None = None) -> Path:
    """The directory holding the broker's jars, downloading them with Maven the first time."""
    version = version or kafka_version()
    libs = CACHE / "kafka" / version / "libs"
    if libs.is_dir() and any(libs.glob("kafka_2.13-*.jar")):
        return libs
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaLauncherError("Maven (mvn) is not installed; it is needed once to fetch the Kafka jars")
    staging = libs.with_name(f"libs.tmp-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    cmd = [
        mvn,
        "-q",
        "-B",
        "-f",
        str(POM),
        "dependency:copy-dependencies",
        f"-DoutputDirectory={staging}",
        "-DincludeScope=runtime",
        f"-Dkafka.version={version}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or ["no output"]
        raise KafkaLauncherError(f"mvn could not fetch Kafka {version} jars: {tail[0]}")
    with contextlib.suppress(FileExistsError, OSError):
        staging.rename(libs)  # another process may have won the race; either copy is complete
    shutil.rmtree(staging, ignore_errors=True)
    return libs


def _properties(cfg: BrokerConfig) -> str:
    min_isr = str(max(1, cfg.replicas - 1))
    props = {
        "process.roles": "broker,controller",
        "node.id": str(cfg.node_id),
        "controller.quorum.voters": cfg.voters or f"{cfg.node_id}@{HOST}:{cfg.cport}",
        "listeners": f"PLAINTEXT://{HOST}:{cfg.port},CONTROLLER://{HOST}:{cfg.cport}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{cfg.port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(cfg.dir / "logs"),
        "num.partitions": "1",
        "default.replication.factor": str(cfg.replicas),
        "offsets.topic.replication.factor": str(cfg.replicas),
        "offsets.topic.num.partitions": "8",
        "transaction.state.log.replication.factor": str(cfg.replicas),
        "transaction.state.log.min.isr": min_isr,
        "share.coordinator.state.topic.replication.factor": str(cfg.replicas),
        "share.coordinator.state.topic.min.isr": min_isr,
        "min.insync.replicas": min_isr,
        "group.initial.rebalance.delay.ms": "0",
        "auto.create.topics.enable": "true",
        "log.retention.hours": "168",
        **cfg.extra,
    }
    return "".join(f"{k}={v}\n" for k, v in props.items())


def _java(cfg: BrokerConfig, libs: Path, *args: str) -> list[str]:
    java = shutil.which("java")
    if java is None:
        raise KafkaLauncherError("Java 17+ is not installed (`java` not on PATH)")
    return [java, f"-Xmx{cfg.heap}", "-cp", f"{libs}/*", *args]


def read_pid(cfg: BrokerConfig) -> int | None:
    """The broker's pid when its pid file names a live Kafka process, else None."""
    try:
        pid = int(cfg.pid_file.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    if b"kafka.Kafka" not in cmdline or str(cfg.properties).encode() not in cmdline:
        return None
    if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
        return None  # a zombie left by this very process: it has exited
    return pid


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((HOST, port)) == 0


def _ready(bootstrap: str, timeout_s: float) -> bool:
    """True when a Kafka client can fetch cluster metadata (the broker is serving)."""
    from aiokafka.admin import AIOKafkaAdminClient

    async def probe() -> bool:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * 1000))
        try:
            await admin.start()
            await admin.list_topics()
            return True
        except Exception:
            return False
        finally:
            with contextlib.suppress(Exception):
                await admin.close()

    quiet = logging.getLogger("aiokafka")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        return asyncio.run(probe())
    finally:
        quiet.setLevel(level)


def _log_tail(cfg: BrokerConfig) -> str:
    try:
        lines = [ln for ln in cfg.log_file.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no log"
    errors = [ln for ln in lines if "ERROR" in ln or "Exception" in ln]
    return (errors or lines or ["empty log"])[-1].strip()[:300]


def start(cfg: BrokerConfig, timeout_s: float = 90.0) -> int:
    """Start the broker (or find it running); returns its pid once clients can connect."""
    pid = _running(cfg)
    if pid is not None:
        return pid
    _check_ports(cfg)  # before fetching jars: a busy port is the likelier mistake
    proc = _launch(cfg, ensure_jars(), _random_cluster_id())
    return _await_ready(cfg, proc, time.monotonic() + timeout_s, timeout_s)


def cluster(nodes: int, base_port: int, data_root: Path, heap: str = "384m") -> list[BrokerConfig]:
    """``nodes`` brokers in one KRaft cluster: node i on ``base_port + 2i`` (its controller on the port
    after), data under ``data_root/node-i``; every node votes in the controller quorum."""
    ports = [base_port + 2 * i for i in range(nodes)]
    voters = ",".join(f"{i + 1}@{HOST}:{port + 1}" for i, port in enumerate(ports))
    return [
        BrokerConfig(
            port=port,
            data_dir=data_root / f"node-{i + 1}",
            heap=heap,
            node_id=i + 1,
            voters=voters,
            replicas=min(nodes, 3),
        )
        for i, port in enumerate(ports)
    ]


def start_cluster(cfgs: list[BrokerConfig], timeout_s: float = 120.0) -> list[int]:
    """Start every node of ``cluster(...)`` (formatted with one cluster id) and wait until each serves
    clients; a node elects no controller alone, so all are launched before any is awaited."""
    libs = ensure_jars()
    cluster_id = _random_cluster_id()
    procs = [(cfg, _launch(cfg, libs, cluster_id)) for cfg in cfgs if _running(cfg) is None]
    deadline = time.monotonic() + timeout_s
    for cfg, proc in procs:
        try:
            _await_ready(cfg, proc, deadline, timeout_s)
        except KafkaLauncherError:
            for other in cfgs:
                stop(other)
            raise
    return [pid for cfg in cfgs if (pid := read_pid(cfg)) is not None]


def _running(cfg: BrokerConfig) -> int | None:
    """The pid of the broker already serving from ``cfg``'s data dir; None when none runs there."""
    pid = read_pid(cfg)
    if pid is None:
        return None
    if _ready(cfg.bootstrap, 5.0):
        return pid
    raise KafkaLauncherError(f"Kafka (pid {pid}) runs from {cfg.dir} but does not answer on {cfg.bootstrap}")


def _launch(cfg: BrokerConfig, libs: Path, cluster_id: str) -> subprocess.Popen[bytes]:
    """Write the properties, format the storage the first time, start the broker detached."""
    _check_ports(cfg)
    cfg.dir.mkdir(parents=True, exist_ok=True)
    cfg.properties.write_text(_properties(cfg))
    if not (cfg.dir / "logs" / "meta.properties").exists():
        fmt = _java(
            cfg, libs, "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(cfg.properties)
        )
        proc = subprocess.run(fmt, capture_output=True, text=True, timeout=120, check=False)
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or ["no output"]
            raise KafkaLauncherError(f"formatting KRaft storage in {cfg.dir / 'logs'} failed: {tail[0]}")
    with cfg.log_file.open("ab") as log:
        proc_ = subprocess.Popen(
            _java(cfg, libs, "-Djava.awt.headless=true", "kafka.Kafka", str(cfg.properties)),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=cfg.dir,
            start_new_session=True,  # outlives the CLI; stopped by pid
        )
    _CHILDREN[proc_.pid] = proc_
    cfg.pid_file.write_text(f"{proc_.pid}\n")
    return proc_


def _check_ports(cfg: BrokerConfig) -> None:
    for port in (cfg.port, cfg.cport):
        if _port_open(port):
            raise KafkaLauncherError(f"port {port} on {HOST} is already in use by another process")


def _await_ready(cfg: BrokerConfig, proc_: subprocess.Popen[bytes], deadline: float, timeout_s: float) -> int:
    while time.monotonic() < deadline:
        if proc_.poll() is not None:
            _CHILDREN.pop(proc_.pid, None)
            cfg.pid_file.unlink(missing_ok=True)
            raise KafkaLauncherError(f"Kafka exited with code {proc_.returncode}: {_log_tail(cfg)}")
        if _port_open(cfg.port) and _ready(cfg.bootstrap, 5.0):
            return proc_.pid
        time.sleep(0.5)
    stop(cfg)
    raise KafkaLauncherError(f"Kafka did not accept clients on {cfg.bootstrap} within {timeout_s:.0f}s")


def _random_cluster_id() -> str:
    """A KRaft cluster id as Kafka's ``Uuid.randomUuid`` makes one: url-safe base64 of 16 random bytes,
    never starting with "-" (one in 64 would; ``kafka-storage format -t`` would read it as an option)."""
    import base64

    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def stop(cfg: BrokerConfig, timeout_s: float = 30.0) -> bool:
    """Stop the broker of ``cfg``; False when none was running."""
    pid = read_pid(cfg)
    if pid is None:
        cfg.pid_file.unlink(missing_ok=True)
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while read_pid(cfg) is not None and time.monotonic() < deadline:
        _reap(pid)
        time.sleep(0.2)
    if read_pid(cfg) is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        while read_pid(cfg) is not None and time.monotonic() < deadline + 10:
            _reap(pid)
            time.sleep(0.1)
    _reap(pid)
    cfg.pid_file.unlink(missing_ok=True)
    return True


def _reap(pid: int) -> None:
    """Collect the exit status when the broker is our own child (started in this process)."""
    child = _CHILDREN.get(pid)
    if child is not None and child.poll() is not None:
        del _CHILDREN[pid]


@dataclass(frozen=True)
class BrokerStatus:
    running: bool
    pid: int | None
    ready: bool
    bootstrap: str
    data_dir: Path


def status(cfg: BrokerConfig) -> BrokerStatus:
    pid = read_pid(cfg)
    ready = pid is not None and _ready(cfg.bootstrap, 3.0)
    return BrokerStatus(pid is not None, pid, ready, cfg.bootstrap, cfg.dir)
