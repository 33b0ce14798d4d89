"""Counter-store URLs: which schemes there are, and checking one before anything connects.

``store/connection.py`` builds the client from a URL checked here; ``config.py`` checks the
``redis_url`` setting with :func:`check_url`.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from .errors import ConfigurationError
from .redact import redact_url

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
    _check_query(url, scheme)
    try:
        if scheme in CLUSTER_SCHEMES:
            cluster_parts(url)
        elif scheme in SENTINEL_SCHEMES:
            sentinel_parts(url)
        else:
            _check_direct(url, scheme)
    except (ValueError, TypeError) as exc:
        if scheme in CLUSTER_SCHEMES:
            fix = (
                "use redis+cluster://host:port[,host:port...] with numeric ports and no database "
                "(Redis Cluster has only database 0), e.g. redis+cluster://10.0.0.1:6379,10.0.0.2:6379"
            )
        elif scheme in SENTINEL_SCHEMES:
            fix = (
                "use redis+sentinel://host:26379[,host:26379...]/service_name/db with numeric ports and "
                "database, e.g. redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/mymaster/0"
            )
        else:
            fix = "use redis://host:port/db with a numeric port and database number, e.g. redis://localhost:6379/0"
        raise ConfigurationError("redis_url", f"{redact_url(url)} cannot be used ({exc})", fix) from None
    return url


def _check_query(url: str, scheme: str) -> None:
    """Refuse a query parameter redis-py has no connection option for: it passes every name
    on, and an unknown one (``ssl_ca_cert``) raised a TypeError only at the first publish."""
    names = parse_qs(urlsplit(url).query, keep_blank_values=True)
    if names and scheme in SENTINEL_SCHEMES:
        raise ConfigurationError(
            "redis_url",
            f"the query parameter {next(iter(names))!r} would be ignored: the router reads no query "
            "parameters of a Sentinel URL",
            "use no query; the database goes in the path, as in redis+sentinel://host:26379/service_name/db",
        )
    tls = scheme.startswith("rediss")
    known = _query_names("unix" if scheme == "unix" else "rediss" if tls else "redis")
    for name in names:
        if name in known:
            continue
        if not tls and name in _query_names("rediss"):
            problem = f"the query parameter {name!r} is a TLS option, and {scheme}:// is not TLS"
            tls_scheme = "rediss" if scheme == "unix" else scheme.replace("redis", "rediss", 1)
            fix = f"use {tls_scheme}:// for TLS, or drop {name}"
        else:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            problem = f"the query parameter {name!r} is not a Redis connection option"
            example = "redis-py's connection options, e.g. ?ssl_ca_certs=/path/ca.pem&ssl_cert_reqs=required"
            fix = f"use {close[0]} (a query gives {example})" if close else f"use {example}"
        raise ConfigurationError("redis_url", problem, fix)


@functools.cache
def _query_names(kind: str) -> frozenset[str]:
    """The keywords redis-py's connections of ``kind`` (redis, rediss, unix) accept, which
    its ``parse_url`` reads from a URL's query."""
    from redis import connection

    classes = {
        "redis": (connection.Connection,),
        "rediss": (connection.SSLConnection, connection.Connection),
        "unix": (connection.UnixDomainSocketConnection,),
    }[kind] + (connection.AbstractConnection, connection.ConnectionPool)
    names = {name for cls in classes for name in inspect.signature(cls).parameters}
    return frozenset(names - {"kwargs", "connection_kwargs", "connection_class"})


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


def cluster_parts(url: str) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    """The nodes of a cluster URL and the connection options it gives every node."""
    from redis.connection import parse_url

    parts = urlsplit(url)
    userinfo, _, netloc = parts.netloc.rpartition("@")
    hosts = [cluster_node(item.strip()) for item in netloc.split(",")] if netloc.strip() else []
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


def cluster_node(item: str) -> tuple[str, int]:
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


def sentinel_parts(url: str) -> tuple[list[tuple[str, int]], str, int, str | None, str | None, bool]:
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
