from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import fakeredis
import pytest
import redis
from support.cluster import LocalCluster, require_cluster_programs, running_cluster
from support.services import IN_CI, ensure_rabbitmq, redis_answers, start_embedded_redis

REDIS_URL = os.environ.get("PRIORITY_ROUTER_TEST_REDIS_URL", "redis://127.0.0.1:6379")
AMQP_URL = os.environ.get("PRIORITY_ROUTER_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")


@pytest.fixture(scope="session")
def redis_server_url() -> Iterator[str]:
    """A real Redis: the configured one when it answers, else a throwaway one."""
    if redis_answers(REDIS_URL):
        yield REDIS_URL.rstrip("/")
        return
    server = start_embedded_redis()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def amqp_url() -> str:
    reason = ensure_rabbitmq(AMQP_URL)
    if reason is not None:
        if IN_CI:
            pytest.fail(f"RabbitMQ is required in CI: {reason}")
        pytest.skip(reason)
    return AMQP_URL


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[LocalCluster]:
    """A throwaway local Redis Cluster: 3 masters, each with a replica.  Tests that kill a
    node start their own with ``running_cluster()``."""
    require_cluster_programs()
    with running_cluster() as cluster:
        yield cluster


@pytest.fixture
def real_redis(redis_server_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_server_url + "/13")


@pytest.fixture
def fake_redis() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis()


@pytest.fixture
def key_prefix() -> str:
    """A prefix no other test shares, so tests never see each other's clients."""
    return f"pr-test-{uuid.uuid4().hex[:10]}:"
