"""Apache Kafka (KRaft) processes started straight from the jars that ``deploy/kafka.sh fetch``
caches: one node with any listeners (the security tests), or an N-node cluster of combined
broker+controller nodes on 127.0.0.1 (``gpuwarden bench chaos``).

Every node is a ``java kafka.Kafka server.properties`` child of this process (own session,
PR_SET_PDEATHSIG), so a node can be killed (SIGKILL), stopped (SIGTERM) and started again on
its data directory, and nothing outlives the caller.
"""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from gpuwarden.sim.brokers import BrokerError, die_with_parent, free_port, wait_port

__all__ = ["KRaftCluster", "KafkaNode", "kafka_libs", "new_cluster_id"]

KAFKA_VERSION = os.environ.get("KAFKA_VERSION", "3.9.1")


def kafka_libs(script: Path | None = None, timeout_s: float = 600) -> Path:
    """The folder of the Kafka server jars, fetched first by ``deploy/kafka.sh fetch`` when missing.

    Raises:
        BrokerError: no java, no ``deploy/kafka.sh``, or the jars cannot be fetched.
    """
    cache = Path(os.environ.get("KAFKA_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
                 / "gpuwarden" / "kafka")  # fmt: skip
    libs = cache / KAFKA_VERSION / "libs"
    if (libs / f"kafka_2.13-{KAFKA_VERSION}.jar").is_file():
        return libs
    script = script or Path(__file__).resolve().parents[3] / "deploy" / "kafka.sh"
    if not script.is_file():
        raise BrokerError(f"no Kafka jars in {libs} and no {script} to fetch them")
    try:
        subprocess.run(["bash", str(script), "fetch"], check=True, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.CalledProcessError as exc:
        raise BrokerError(f"deploy/kafka.sh fetch failed: {exc.stderr[-2000:]}") from exc
    return libs


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding (as
    ``kafka-storage random-uuid`` prints, never starting with ``-``)."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):
            return cid


def _props_text(props: Mapping[str, str]) -> str:
    return "".join(f"{k}={v}\n" for k, v in props.items())


class KafkaNode:
    """One Kafka server process.

    Args:
        node_id: ``node.id``.
        props: the whole ``server.properties`` (``log.dirs`` is set to ``workdir/data``).
        workdir: its folder: properties, data, ``server.log``, ``stdout.log``.
        libs: the jar folder (:func:`kafka_libs`).
        heap: JVM ``-Xmx`` (e.g. ``256m``).
        port: the port to wait on after start (a client listener).
    """

    def __init__(
        self, node_id: int, props: Mapping[str, str], workdir: Path, libs: Path, heap: str = "256m", port: int = 0
    ) -> None:
        self.node_id = node_id
        self.workdir = workdir
        self.libs = libs
        self.heap = heap
        self.port = port
        self.props = {**props, "node.id": str(node_id), "log.dirs": str(workdir / "data")}
        self.proc: subprocess.Popen[bytes] | None = None
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "server.properties").write_text(_props_text(self.props))
        (workdir / "log4j.properties").write_text(
            "log4j.rootLogger=WARN, file\n"
            "log4j.appender.file=org.apache.log4j.FileAppender\n"
            f"log4j.appender.file.File={workdir / 'server.log'}\n"
            "log4j.appender.file.layout=org.apache.log4j.PatternLayout\n"
            "log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n\n"
        )

    def _java(self, main: str, *args: str) -> list[str]:
        return [
            "java",
            f"-Xmx{self.heap}",
            "-Xms64m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-Xshare:auto",
            f"-Dlog4j.configuration=file:{self.workdir / 'log4j.properties'}",
            "-cp",
            f"{self.libs}/*",
            main,
            *args,
        ]

    def format(self, cluster_id: str, scram: list[str] | None = None, timeout_s: float = 120) -> None:
        """Format the storage (once; ``--ignore-formatted``). ``scram``: ``--add-scram`` values,
        e.g. ``SCRAM-SHA-512=[name=alice,password=secret]``.

        Raises:
            BrokerError: the storage tool failed.
        """
        extra: list[str] = []
        for s in scram or []:
            extra += ["--add-scram", s]
        cmd = self._java(
            "kafka.tools.StorageTool",
            "format",
            "-t",
            cluster_id,
            "-c",
            str(self.workdir / "server.properties"),
            "--ignore-formatted",
            *extra,
        )
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        if out.returncode != 0:
            raise BrokerError(
                f"kafka storage format of node {self.node_id} failed: {(out.stdout + out.stderr)[-2000:]}"
            )

    def start(self) -> None:
        """Start the process (no wait; see :meth:`wait`). No-op while it runs."""
        if self.alive:
            return
        with open(self.workdir / "stdout.log", "ab") as out:
            self.proc = subprocess.Popen(
                self._java("kafka.Kafka", str(self.workdir / "server.properties")),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )

    def wait(self, timeout_s: float = 120) -> None:
        """Wait until the node listens on ``port``.

        Raises:
            BrokerError: it exited (log tail in the message) or did not listen in time.
        """
        try:
            wait_port("127.0.0.1", self.port, timeout_s, self.proc)
        except BrokerError as exc:
            raise BrokerError(f"kafka node {self.node_id}: {exc}\n{self.log_tail()}") from exc

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL (a crash: no controlled shutdown) and reap."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def stop(self, timeout_s: float = 30) -> None:
        """SIGTERM (controlled shutdown), SIGKILL after ``timeout_s``. Safe twice."""
        p = self.proc
        if p is None or p.poll() is not None:
            return
        p.terminate()
        try:
            p.wait(timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(30)

    def log_tail(self, n: int = 20) -> str:
        lines: list[str] = []
        for name in ("stdout.log", "server.log"):
            try:
                lines += (self.workdir / name).read_text(errors="replace").splitlines()[-n:]
            except OSError:
                pass
        return "\n".join(lines)


class KRaftCluster:
    """``size`` combined broker+controller nodes on 127.0.0.1 (PLAINTEXT), distinct node ids
    (1..size), ports and log dirs; the controller quorum is all of them.

    Args:
        size: number of nodes (3 for a cluster that survives one node down with RF 3,
            ``min.insync.replicas=2``).
        workdir: where each node's folder goes (default: a temp dir).
        heap: JVM heap of each node.
        libs: the jar folder (default :func:`kafka_libs`).
    """

    def __init__(
        self, size: int = 3, workdir: Path | None = None, heap: str = "256m", libs: Path | None = None
    ) -> None:
        if size < 1:
            raise ValueError("a cluster needs at least one node")
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="gpuwarden-kraft-"))
        self.libs = libs or kafka_libs()
        ports = [(free_port(), free_port()) for _ in range(size)]
        voters = ",".join(f"{i + 1}@127.0.0.1:{c}" for i, (_, c) in enumerate(ports))
        rf = min(3, size)
        self.nodes: list[KafkaNode] = []
        for i, (port, cport) in enumerate(ports):
            props = {
                "process.roles": "broker,controller",
                "controller.quorum.voters": voters,
                "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{cport}",
                "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
                "controller.listener.names": "CONTROLLER",
                "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                "inter.broker.listener.name": "PLAINTEXT",
                "num.partitions": "1",
                "offsets.topic.replication.factor": str(rf),
                "offsets.topic.num.partitions": "4",
                "transaction.state.log.replication.factor": str(rf),
                "transaction.state.log.min.isr": str(min(2, rf)),
                "default.replication.factor": str(rf),
                "min.insync.replicas": str(min(2, rf)),
                "group.initial.rebalance.delay.ms": "0",
                "auto.create.topics.enable": "false",
                "unclean.leader.election.enable": "false",
                "log.retention.hours": "2",
                "num.network.threads": "2",
                "num.io.threads": "2",
                "background.threads": "2",
                "log.cleaner.threads": "1",
                "replica.lag.time.max.ms": "10000",
            }
            self.nodes.append(KafkaNode(i + 1, props, self.workdir / f"node{i + 1}", self.libs, heap, port))

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def start(self, timeout_s: float = 180) -> str:
        """Format (first time) and start every node, wait until each listens; returns the
        bootstrap servers.

        Raises:
            BrokerError: a node could not be formatted or started.
        """
        cid = new_cluster_id()
        for n in self.nodes:
            if not (n.workdir / "data" / "meta.properties").exists():
                n.format(cid)
        self.start_all(timeout_s)
        return self.bootstrap_servers

    def start_all(self, timeout_s: float = 180) -> None:
        """Start every stopped node (on its existing data), wait until each listens, then until
        every node is a registered broker (:meth:`wait_registered`).

        Raises:
            BrokerError: a node exited, or the cluster was not whole within ``timeout_s``.
        """
        for n in self.nodes:
            n.start()
        end = time.monotonic() + timeout_s
        for n in self.nodes:
            n.wait(max(1.0, end - time.monotonic()))
        self.wait_registered(max(1.0, end - time.monotonic()))

    def wait_registered(self, timeout_s: float = 120) -> None:
        """Wait until the cluster's metadata lists every node as a broker. Listening is not
        enough: until the controller quorum has a leader and has registered a broker, the
        brokers answer with fewer brokers or none (aiokafka: "No broker metadata found"), and a
        controller election at start-up on a busy machine can take seconds. Topics created
        before then get fewer replicas than the cluster has (the replication factor follows the
        brokers registered). Call it from a thread without a running event loop.

        Raises:
            BrokerError: not every node registered within ``timeout_s`` (what was seen last).
        """
        end = time.monotonic() + timeout_s
        last = "no answer yet"
        while True:
            try:
                seen = asyncio.run(self._registered())
                if seen >= len(self.nodes):
                    return
                last = f"{seen} of {len(self.nodes)} brokers registered"
            except Exception as exc:  # any client error: not ready yet, try again
                last = f"{type(exc).__name__}: {exc}"
            if time.monotonic() > end:
                raise BrokerError(
                    f"the KRaft cluster at {self.bootstrap_servers} did not register its {len(self.nodes)} "
                    f"brokers in {timeout_s:.0f} s ({last})\n{self.nodes[0].log_tail()}"
                )
            time.sleep(0.5)

    async def _registered(self) -> int:
        """Brokers in the cluster's metadata now (one admin client, 5 s per request)."""
        from gpuwarden.shared.bus.clients import kafka_admin

        admin = kafka_admin(self.bootstrap_servers, request_timeout_ms=5000)
        await admin.start()
        try:
            cluster = await admin.describe_cluster()
            return len(cluster.get("brokers") or [])
        finally:
            await admin.close()

    def stop_all(self, timeout_s: float = 15) -> None:
        """SIGTERM every node at once, SIGKILL what still runs after ``timeout_s`` (the last
        nodes cannot finish a controlled shutdown without a quorum). Data kept:
        :meth:`start_all` brings the cluster back."""
        for n in self.nodes:
            if n.proc is not None and n.proc.poll() is None:
                n.proc.terminate()
        end = time.monotonic() + timeout_s
        for n in self.nodes:
            n.stop(max(0.1, end - time.monotonic()))

    def kill_all(self) -> None:
        """SIGKILL every node (data kept)."""
        for n in self.nodes:
            n.kill()

    def close(self) -> None:
        """Stop every node; the work folder stays (logs)."""
        self.stop_all()
