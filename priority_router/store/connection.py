"""The counter store's Redis client, built from one URL.

- ``redis://[[user]:password@]host[:port][/db]`` and ``rediss://...`` (TLS; ``ssl_*`` query
  parameters as redis-py reads them, e.g. ``?ssl_cert_reqs=required&ssl_ca_certs=/ca.pem``)
- ``unix:///path/to/redis.sock?db=0``
- ``redis+sentinel://[[user]:password@]host:26379[,host2:26379...]/service_name[/db]``
  (``rediss+sentinel://`` for TLS to the master): asks the Sentinels for the current master
  on every reconnect and, while in use, every second (``sentinel_pool.py``), so a failover
  needs no configuration change.  The password is the
  master's; Sentinels without authentication are assumed.
- ``redis+cluster://[[user]:password@]host:port[,host:port...]`` (``rediss+cluster://`` for
  TLS; ``ssl_*`` query parameters as for ``rediss://``): a Redis Cluster, found from any of
  the listed nodes.  Cluster has only database 0.  The client follows the cluster's own
  slot map: after a failover it asks the nodes again and uses the promoted replica.

Every connection has short connect and read timeouts and no retries: a slow answer must
turn into a fail-open publish, not a blocked one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, cast

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisClusterException
from redis.retry import Retry
from redis.sentinel import MasterNotFoundError, Sentinel

from ..redis_urls import CLUSTER_SCHEMES, SENTINEL_SCHEMES, cluster_parts, sentinel_parts
from .sentinel_pool import FollowingPool


def make_client(url: str, connect_timeout: float, socket_timeout: float) -> redis.Redis:
    options: dict[str, Any] = {
        "socket_connect_timeout": connect_timeout,
        "socket_timeout": socket_timeout,
        "retry_on_timeout": False,
        "retry": None,
    }
    scheme = url.split("://", 1)[0].lower()
    if scheme in CLUSTER_SCHEMES:
        # The counter and the router are typed for redis.Redis; the cluster client has the
        # same command methods and routes each command by its key's slot.
        cluster = LazyCluster(
            lambda: _cluster_client(url, connect_timeout, socket_timeout),
            # Setting up asks a node for the slot map and the command table, then connects.
            wait=4 * (connect_timeout + socket_timeout),
        )
        return cast(redis.Redis, cluster)
    if scheme not in SENTINEL_SCHEMES:
        return redis.Redis.from_url(url, **options)
    hosts, service, db, username, password, tls = sentinel_parts(url)
    sentinel = Sentinel(  # type: ignore[no-untyped-call, unused-ignore]  # typed from redis-py 8.2
        hosts,
        # Without retry=None redis-py retries each Sentinel with backoff: one that accepts
        # and never answers held a publish about 5 s.
        sentinel_kwargs={
            "socket_connect_timeout": connect_timeout,
            "socket_timeout": socket_timeout,
            "retry": None,
        },
        **options,
    )
    master: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call, unused-ignore]
        service,
        connection_pool_class=FollowingPool,
        db=db,
        username=username,
        password=password,
        ssl=tls,
        **options,
    )
    return master


def is_cluster(client: object) -> bool:
    """True when ``client`` talks to a Redis Cluster (built from a URL or passed in)."""
    return isinstance(client, RedisCluster | LazyCluster)


def ping_every_master(client: redis.Redis) -> None:
    """A breaker's probe (``breaker.py``): a ``PING`` to every master of a cluster, else to
    the one server; raises as the first that fails.  A cluster's plain ``PING`` goes to one
    node, which answers while another master is stopped: the breaker then let a publish
    through to that master, which waited its timeout again, once per probe."""
    if is_cluster(client):
        client.ping(target_nodes=RedisCluster.PRIMARIES)
    else:
        client.ping()


def failing_nodes_note(client: object) -> str:
    """``"; the cluster marks host:port (master) as failed, ..."``: the nodes a cluster's
    members mark as failing (``fail`` or ``fail?`` in ``CLUSTER NODES``), asked of the first
    node that answers, for an error such as "The cluster is down", which names none.  Empty
    for one Redis, for a cluster that marks none, or when no node answers (each error then
    names its node)."""
    if not is_cluster(client):
        return ""
    cluster = cast(RedisCluster, client)
    try:
        nodes = cluster.get_nodes()  # type: ignore[no-untyped-call, unused-ignore]
    except (redis.RedisError, RedisClusterException):
        return ""  # no node answers at all: the client's own error names those it tried
    for node in nodes:
        try:
            table = cluster.get_redis_connection(node).execute_command("CLUSTER NODES")  # type: ignore[no-untyped-call, unused-ignore]
        except (redis.RedisError, RedisClusterException):
            continue
        failing = [
            f"{address.split('@')[0]} ({'master' if 'master' in flags else 'replica'}) as "
            + ("failed" if "fail" in flags else "possibly failed")
            for address, flags in _node_flags(table)
            if "fail" in flags or "fail?" in flags
        ]
        return f"; the cluster marks {', '.join(failing)}" if failing else ""
    return ""


def _node_flags(table: object) -> list[tuple[str, list[str]]]:
    # redis-py parses CLUSTER NODES into {address: {"flags": "master,fail", ...}}.
    if isinstance(table, dict):
        return [(str(address), str(node.get("flags", "")).split(",")) for address, node in table.items()]
    text = table.decode() if isinstance(table, bytes) else str(table)
    rows = [line.split() for line in text.splitlines()]
    return [(row[1], row[2].split(",")) for row in rows if len(row) > 2]


class LazyCluster:
    """A :class:`~redis.cluster.RedisCluster` built at its first use, then used as itself.

    RedisCluster asks the nodes for the slot map as soon as it is constructed.  Building it
    at the first command keeps the router's promise that nothing connects before the first
    check, and a cluster that is down when a publisher starts costs a fail-open publish and
    is tried again later, instead of an exception while the Celery app is configured.
    """

    def __init__(self, build: Callable[[], RedisCluster], wait: float) -> None:
        self._build = build
        #: Longest a caller waits for another thread's build before it fails instead.
        self._wait = wait
        self._lock = threading.Lock()
        self._cluster: RedisCluster | None = None
        self._attempts = 0
        self._last_error: str | None = None

    @property
    def cluster(self) -> RedisCluster:
        """The cluster client; redis.ConnectionError when no node could be asked for the slots."""
        cluster = self._cluster
        if cluster is not None:
            return cluster
        attempts = self._attempts
        # Bounded, so a publisher never blocks for long behind another thread's build (nor
        # forever in a child forked while a build held the lock).
        if not self._lock.acquire(timeout=self._wait):
            raise redis.ConnectionError("the Redis Cluster client is still being set up by another thread")
        try:
            if self._cluster is not None:
                return self._cluster
            if self._attempts != attempts and self._last_error is not None:
                # Another thread tried while this one waited: share its answer rather than
                # making every waiting publisher pay the connect timeouts again in turn.
                raise redis.ConnectionError(self._last_error)
            self._attempts += 1
            try:
                self._cluster = self._build()
            except (RedisClusterException, redis.RedisError, OSError) as exc:
                self._last_error = f"cannot reach the Redis Cluster ({type(exc).__name__}: {exc})"
                raise redis.ConnectionError(self._last_error) from exc
            self._last_error = None
            return self._cluster
        finally:
            self._lock.release()

    def close(self) -> None:
        if self._cluster is not None:
            self._cluster.close()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            # Introspection (copy, pickle, hasattr probes) must not connect.
            raise AttributeError(name)
        return getattr(self.cluster, name)

    def __repr__(self) -> str:
        state = "connected" if self._cluster is not None else "not connected yet"
        return f"<LazyCluster {state}>"


def _cluster_client(url: str, connect_timeout: float, socket_timeout: float) -> RedisCluster:
    hosts, url_options = cluster_parts(url)
    options: dict[str, Any] = {
        "socket_connect_timeout": connect_timeout,
        "socket_timeout": socket_timeout,
        **url_options,
    }
    return RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in hosts],  # type: ignore[no-untyped-call]
        # RedisCluster retries a failed command itself, 10 times with backoff by default;
        # a publish must fail open at once instead.
        retry=Retry(NoBackoff(), 0),
        # Ask the nodes for the slot map after every connection error or MOVED reply.  A
        # transaction counts its errors towards this on a fresh pipeline each time, so with
        # the default (5) and no retries a check would never refresh the map and would keep
        # going to a dead master after its replica took over.
        reinitialize_steps=1,
        **options,
    )


#: What to check when no Sentinel names a master for the URL's service.
SENTINEL_FIX = (
    "check that the Sentinels answer and that the URL's service is one they monitor "
    "(redis-cli -p 26379 SENTINEL MASTERS lists their names)"
)


def store_error(exc: BaseException) -> str:
    """``exc`` in one line for a message: redis-py's error for a Sentinel service without a
    master lists each Sentinel client's repr (about 1 KB); this says which case it is."""
    if isinstance(exc, MasterNotFoundError):
        head, _, errors = str(exc).partition(" : ")
        why = "no Sentinel answered" if errors else "the Sentinels that answered name no master for it"
        return f"{type(exc).__name__}: {head} ({why})"
    return f"{type(exc).__name__}: {exc}"
