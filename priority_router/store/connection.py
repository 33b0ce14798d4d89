"""The counter store's Redis client, built from one URL.

- ``redis://[[user]:password@]host[:port][/db]`` and ``rediss://...`` (TLS; ``ssl_*`` query
  parameters as redis-py reads them, e.g. ``?ssl_cert_reqs=required&ssl_ca_certs=/ca.pem``)
- ``unix:///path/to/redis.sock?db=0``
- ``redis+sentinel://[[user]:password@]host:26379[,host2:26379...]/service_name[/db]``
  (``rediss+sentinel://`` for TLS to the master): asks the Sentinels for the current master
  on every reconnect, so a failover needs no configuration change.  The password is the
  master's; Sentinels without authentication are assumed.

Every connection has short connect and read timeouts and no retries: a slow answer must
turn into a fail-open publish, not a blocked one.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis
from redis.sentinel import Sentinel

from ..errors import ConfigurationError
from ..redact import redact_url

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
SCHEMES = ("redis", "rediss", "unix", *SENTINEL_SCHEMES)


def check_url(url: object) -> str:
    """``url`` when it is a counter-store URL, else a ConfigurationError saying why."""
    if not isinstance(url, str) or "://" not in url:
        raise ConfigurationError(
            "redis_url",
            f"{url!r} is not a Redis URL",
            "use redis://host:port/db, rediss://... (TLS), unix:///path.sock or "
            "redis+sentinel://host:26379/service_name/db",
        )
    scheme = url.split("://", 1)[0].lower()
    if scheme not in SCHEMES:
        raise ConfigurationError(
            "redis_url",
            f"scheme {scheme!r} in {redact_url(url)} is not a Redis scheme",
            "use redis://, rediss:// (TLS), unix:// or redis+sentinel://",
        )
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
    if url.split("://", 1)[0].lower() not in SENTINEL_SCHEMES:
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
