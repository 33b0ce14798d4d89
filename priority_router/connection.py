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
from urllib.parse import unquote, urlsplit

import redis
from redis.sentinel import Sentinel

from .errors import ConfigurationError
from .redact import redact_url

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
            from redis.connection import parse_url

            parse_url(url)  # type: ignore[no-untyped-call]
    except (ValueError, TypeError) as exc:
        raise ConfigurationError(
            "redis_url", f"{redact_url(url)} cannot be parsed ({exc})", "use redis://host:port/db"
        ) from None
    return url


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
    db = int(segments[1]) if len(segments) > 1 else 0
    username = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password else None
    return hosts, unquote(segments[0]), db, username, password, parts.scheme.lower().startswith("rediss")
