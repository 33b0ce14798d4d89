"""A throwaway local Redis for the tests and benchmarks: ``priority_router.demo.local_redis``
(the demo's), and ``redis_or_embedded``."""

from __future__ import annotations

from collections.abc import Callable

from priority_router.demo.local_redis import (
    DEFAULT_FIRST_DB,
    EmbeddedRedis,
    RedisDatabases,
    free_port,
    redis_answers,
    redis_server_program,
    start_embedded_redis,
    stop_process,
)

__all__ = [
    "DEFAULT_FIRST_DB",
    "EmbeddedRedis",
    "RedisDatabases",
    "free_port",
    "redis_answers",
    "redis_or_embedded",
    "redis_server_program",
    "start_embedded_redis",
    "stop_process",
]


def redis_or_embedded(url: str) -> tuple[str, Callable[[], None]]:
    """``url`` when a Redis answers there, else a throwaway one's; and what stops it."""
    if redis_answers(url):
        return url, lambda: None
    server = start_embedded_redis()
    return server.url, server.stop
