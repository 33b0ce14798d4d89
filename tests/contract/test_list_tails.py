"""The stranded watch's look at a queue's priority lists (``lua/list_tails.lua``) on a real
Redis, with lists kombu wrote, a message kombu put back and one the gate released."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis
from kombu import Connection, Exchange, Producer, Queue
from support.services import broker_db_url

from priority_router import headers as H
from priority_router.integration.starvation import queue_lists
from priority_router.integration.stranded import SCRIPT, read_lists

pytestmark = pytest.mark.integration

STEPS = list(range(10))


@pytest.fixture
def queue(redis_server_url: str) -> Iterator[str]:
    name = f"tails-{uuid.uuid4().hex[:8]}"
    yield name
    client = redis.Redis.from_url(broker_db_url(redis_server_url))
    for key in client.keys(f"*{name}*"):
        client.delete(key)
    client.close()


def test_each_list_s_length_and_oldest_document_as_kombu_wrote_and_restored_them(
    redis_server_url: str, queue: str
) -> None:
    options = {"priority_steps": STEPS, "queue_order_strategy": "priority", "global_keyprefix": "gp:"}
    with Connection(broker_db_url(redis_server_url), transport_options=options) as conn:
        channel = conn.default_channel
        keys = queue_lists(channel, queue)
        q = Queue(queue, Exchange(queue), routing_key=queue)
        producer = Producer(channel, exchange=q.exchange, routing_key=queue)
        for doc, priority, at in [("a", 1, 100.25), ("b", 1, 101.5), ("c", 3, 102.0)]:
            producer.publish({"doc": doc}, priority=priority, headers={H.PUBLISHED_AT: at}, declare=[q])
        producer.publish({"doc": "plain"}, priority=6, declare=[q])  # no router header
        client = redis.Redis(connection_pool=channel.pool)
        script = client.register_script(SCRIPT)
        look = read_lists(script, keys)
        assert [s.key for s in look] == keys
        assert [s.length for s in look] == [0, 2, 0, 1, 0, 0, 1, 0, 0, 0]
        assert look[1].published_at == 100.25 and not look[1].put_back
        assert look[3].published_at == 102.0
        assert look[6].tail and look[6].published_at is None
        assert look[0].tail == "" and look[0].published_at is None

        # A consumer takes the oldest of list 1 and shuts down without acknowledging it:
        # kombu puts it back where it was taken from, the oldest again.
        with Connection(broker_db_url(redis_server_url), transport_options=options) as other:
            message = q(other.default_channel).get(no_ack=False)
            assert message is not None and message.payload["doc"] == "a"
            assert read_lists(script, keys)[1].length == 1
        tag = look[1].tail
        again = read_lists(script, keys)
        assert again[1].length == 2 and again[1].tail == tag and again[1].put_back

        # The gate releases a held document back to its list with its mark.
        producer.publish({"doc": "r"}, priority=4, headers={H.PUBLISHED_AT: 99.0, H.GATED: True}, declare=[q])
        assert read_lists(script, keys)[4].put_back

        client.lpush(keys[2], b"not json")  # unreadable: counted, never judged
        assert read_lists(script, keys)[2] == type(look[2])(keys[2], 1, "", None, False)
