"""A tier change's writes: a client's tier (its key shares the client's hash slot) and its
limits (one hash every worker reads) go to the store in one transaction, so no process
ever sees the new tier with the old limits, or a change half made by a publisher that died
between two writes.

On a Redis Cluster the two live in different hash slots, which no transaction spans: the
writes go in one pipeline, and a reader may see one a round trip before the other (workers
read limits at most every second anyway)."""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise
from typing import Any

import redis
from redis.client import Pipeline
from redis.cluster import ClusterPipeline

from .connection import is_cluster

#: What the stores queue their writes on: a redis-py pipeline.
Writes = Pipeline | ClusterPipeline


def in_one_write(client: redis.Redis, *steps: Callable[[Writes], None]) -> list[list[Any]]:
    """Run ``steps`` (each queues writes) as one transaction; each step's replies, in order."""
    with client.pipeline(transaction=not is_cluster(client)) as writes:
        ends = []
        for step in steps:
            step(writes)
            ends.append(len(writes))
        replies: list[Any] = writes.execute()
    return [replies[start:end] for start, end in pairwise([0, *ends])]
