"""The counter store's Redis client, built from one URL.

- ``redis://[[user]:password@]host[:port][/db]`` and ``rediss://...`` (TLS; ``ssl_*`` query
  parameters as redis-py reads them, e.g. ``?ssl_cert_reqs=required&ssl_ca_certs=/ca.pem``)
- ``unix:///path/to/redis.sock?db=0``
- ``redis+sentinel://[[user]:password@]host:26379[,host2:26379...]/service_name[/db]``
  (``rediss+sentinel://`` for TLS to the master): asks the Sentinels for the current master
  on every reconnect, so a failover needs no configuration change.  The password is the
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
from urllib.parse import parse_qs, unquote, urlsplit

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisClusterException
from redis.retry import Retry
from redis.sentinel import Sentinel

from ..errors import ConfigurationError
from ..redact import redact_url

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
SCHEMES = ("redis", "rediss", "unix", *SENTINEL_SCHEMES, *CLUSTER_SCHEMES)
#: The port of a cluster node listed without one.
DEFAULT_CLUSTER_PORT = 6379


def check_url(url: object) -> str:
    """``url`` when it is a counter-store URL, else a ConfigurationError saying why."""
    if not isinstance(url, str) or "://" not in url:
        raise ConfigurationError(
            "redis_url",
            f"{url!r} is not a Redis URL",
            "use redis://host:port/db, rediss://... (TLS), unix:///path.sock, "
            "redis+sentinel://host:26379/service_name/db or redis+cluster://host:port[,host:port]",
        )
    scheme = url.split("://", 1)[0].lower()
    if scheme not in SCHEMES:
        raise ConfigurationError(
            "redis_url",
            f"scheme {scheme!r} in {redact_url(url)} is not a Redis scheme",
            "use redis://, rediss:// (TLS), unix://, redis+sentinel:// or redis+cluster://",
        )
    if scheme in CLUSTER_SCHEMES:
        try:
            _cluster_parts(url)
        except (ValueError, TypeError) as exc:
            raise ConfigurationError(
                "redis_url",
                f"{redact_url(url)} cannot be used ({exc})",
                "use redis+cluster://host:port[,host:port...] with numeric ports and no database "
                "(Redis Cluster has only database 0), e.g. redis+cluster://10.0.0.1:6379,10.0.0.2:6379",
            ) from None
        return url
    try:
        if scheme in SENTINEL_SCHEMES:
            _sentinel_parts(url)
        else:
            _check_direct(url, scheme)
    except (ValueError, TypeError) as exc:
        raise ConfigurationError(
            "redis_url",
            f"{redact_url(url)} cannot be used ({exc})",
            "use redis://host:port/db with a numeric port and database number, e.g. redis://localhost:6379/0",
        ) from None
    return url


def _check_direct(url: str, scheme: str) -> None:
    # redis-py's parse_url ignores a database it cannot read (``/notadb`` becomes 0
    # silently), so every part is checked here.
    from redis.connection import parse_url

    parse_url(url)  # type: ignore[no-untyped-call]
    parts = urlsplit(url)
    _ = parts.port  # raises ValueError for a port that is not a number or out of range
    query_db = parse_qs(parts.query).get("db")
    if query_db is not None:
        _database(query_db[0])
    if scheme == "unix":
        if not parts.path:
            raise ValueError("a unix:// URL needs the socket's path, e.g. unix:///run/redis.sock?db=0")
        return
    if not parts.hostname:
        raise ValueError("the URL names no host")
    path = parts.path.strip("/")
    if path:
        _database(path)


def _database(text: str) -> int:
    if not text.isdigit():
        raise ValueError(f"database {text!r} is not a whole number")
    return int(text)


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
    hosts, service, db, username, password, tls = _sentinel_parts(url)
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        hosts,
        sentinel_kwargs={"socket_connect_timeout": connect_timeout, "socket_timeout": socket_timeout},
        **options,
    )
    master: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call]
        service, db=db, username=username, password=password, ssl=tls, **options
    )
    return master


def is_cluster(client: object) -> bool:
    """True when ``client`` talks to a Redis Cluster (built from a URL or passed in)."""
    return isinstance(client, RedisCluster | LazyCluster)


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
    hosts, url_options = _cluster_parts(url)
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


def _cluster_parts(url: str) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    """The nodes of a cluster URL and the connection options it gives every node."""
    from redis.connection import parse_url

    parts = urlsplit(url)
    userinfo, _, netloc = parts.netloc.rpartition("@")
    hosts = [_cluster_node(item.strip()) for item in netloc.split(",")] if netloc.strip() else []
    if not hosts:
        raise ValueError("the URL names no node, e.g. redis+cluster://10.0.0.1:6379")
    texts = [parts.path.strip("/")] if parts.path.strip("/") else []
    texts += parse_qs(parts.query).get("db", [])
    for text in texts:
        if _database(text) != 0:
            raise ValueError(f"database {text} was asked for, but Redis Cluster has only database 0")
    tls = parts.scheme.lower().startswith("rediss")
    # redis-py reads the credentials and the query's options (ssl_*) as for one node.
    host, port = hosts[0]
    single = f"{'rediss' if tls else 'redis'}://{userinfo + '@' if userinfo else ''}"
    single += f"{'[' + host + ']' if ':' in host else host}:{port}?{parts.query}"
    options: dict[str, Any] = parse_url(single)  # type: ignore[no-untyped-call]
    for name in ("host", "port", "db", "connection_class"):
        options.pop(name, None)
    if tls:
        options["ssl"] = True
    return hosts, options


def _cluster_node(item: str) -> tuple[str, int]:
    if not item:
        raise ValueError("a node is missing between two commas")
    host, colon, port = item.rpartition(":")
    if not colon or host.endswith(":") or (":" in host and not host.startswith("[")):
        host, port = item, str(DEFAULT_CLUSTER_PORT)
    host = host.strip("[]")
    if not host:
        raise ValueError(f"the node {item!r} names no host")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"the port of {item!r} is not a number from 1 to 65535")
    return host, int(port)


def _sentinel_parts(url: str) -> tuple[list[tuple[str, int]], str, int, str | None, str | None, bool]:
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    hosts = []
    for item in netloc.split(","):
        host, _, port = item.strip().rpartition(":")
        if not host:
            host, port = port, "26379"
        hosts.append((host.strip("[]"), int(port)))
    segments = [s for s in parts.path.split("/") if s]
    if not segments:
        raise ValueError("the path must name the Sentinel service, e.g. /mymaster/0")
    db = _database(segments[1]) if len(segments) > 1 else 0
    username = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password else None
    return hosts, unquote(segments[0]), db, username, password, parts.scheme.lower().startswith("rediss")
