"""The floor of a publish hook: one ``PING`` to the server a document's check would go to.

A synchronous hook that asks the counter store once per publish cannot cost less than one
round trip to that store.  ``pinged_servers`` gives, for each client id, a plain
``redis.Redis`` on the server its check reaches: the store itself on one Redis, and on
Redis Cluster the master that serves the client's counter slot (every key of a client
shares its hash tag).  ``ping_receiver`` is a ``before_task_publish`` receiver that sends
one ``PING`` there and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import redis
from redis.crc import key_slot

from priority_router.redis_urls import CLUSTER_SCHEMES, cluster_parts
from priority_router.store.client_ids import client_key


def pinged_servers(store: str, clients: Iterable[str]) -> dict[str, redis.Redis]:
    """For each client id, a client of the server its check goes to (``store``'s URL)."""
    clients = list(clients)
    if store.split("://", 1)[0].lower() not in CLUSTER_SCHEMES:
        server = redis.Redis.from_url(store)
        return dict.fromkeys(clients, server)
    host, port = cluster_parts(store)[0][0]
    with redis.Redis(host=host, port=port) as seed:
        ranges = seed.execute_command("CLUSTER", "SLOTS")
    nodes: dict[tuple[str, int], redis.Redis] = {}
    found: dict[str, redis.Redis] = {}
    for client in clients:
        slot = key_slot(client_key("", client).encode())
        for start, end, primary, *_ in ranges:
            if start <= slot <= end:
                address = (primary[0].decode(), int(primary[1]))
                if address not in nodes:
                    nodes[address] = redis.Redis(host=address[0], port=address[1])
                found[client] = nodes[address]
                break
        else:
            raise LookupError(f"no master serves slot {slot}")
    return found


def ping_receiver(servers: dict[str, redis.Redis], header: str = "client_id") -> Callable[..., None]:
    """A ``before_task_publish`` receiver that sends one ``PING`` to the document's server."""

    def one_ping(headers: dict[str, Any] | None = None, **_: Any) -> None:
        servers[(headers or {})[header]].ping()

    return one_ping


def close_all(servers: dict[str, redis.Redis]) -> None:
    for server in {id(s): s for s in servers.values()}.values():
        server.close()
