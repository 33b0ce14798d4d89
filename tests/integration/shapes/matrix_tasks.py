"""The shapes matrix's document: each run appends itself to a Redis list, so the test
sees the order documents started in and any document that ran twice."""

from __future__ import annotations

import json
import os
import time

import redis
from celery import shared_task

_runs = redis.Redis.from_url(os.environ["SHAPE_RUNS_URL"])


@shared_task(name="matrix.process")
def process(client_id: str, document_id: str, seconds: float = 0.05) -> None:
    started = time.time()
    time.sleep(seconds)
    _runs.rpush(os.environ["SHAPE_RUNS_KEY"], json.dumps([document_id, client_id, started]))
