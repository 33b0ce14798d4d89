"""Documents lost when a worker is SIGKILLed: one giant client's backlog, a real worker killed
at random moments and restarted, then every document counted.

One question: does a document ever leave the broker without starting?  A giant client
publishes ``--docs`` short documents (``--min-ms`` to ``--max-ms``, seeded), each of which
counts its start by id in a Redis hash (``workers.count_and_sleep``).  A real worker
(``--pool``, ``--concurrency``) is started, SIGKILLed (its whole process group: a prefork
worker's pool processes too) ``--after-min`` to ``--after-max`` seconds after it is ready,
and started again, ``--kills`` times; then one worker drains the queue, with kombu's Redis
sweep set to bring a dead worker's unacknowledged documents back after 3 s.  A document
that never started and is neither in a queue's list nor in kombu's ``unacked`` hash was
taken from the broker by a worker and lost with it.

``--router off`` runs plain Celery with what the router sets for this (late acks, a prefetch
multiplier of 1), so the two differ only by the router:

    python bench/kill_loss.py --router on --pool prefork --kills 100
    python bench/kill_loss.py --router off --pool prefork --kills 100
    python bench/kill_loss.py --router on --pool threads --kills 100
    python bench/kill_loss.py --router on --amqp amqp://guest:guest@127.0.0.1:5672//  # RabbitMQ

Each kill takes the worker's start (2-4 s here) and its life; every loop stops by itself.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

import redis  # noqa: E402
from kombu import Connection  # noqa: E402

from workers.app import create_app  # noqa: E402
from workers.services import fast_redelivery, worker_command, worker_environment  # noqa: E402

TASK = "workers.count_and_sleep"


class KillableWorker:
    """A real worker in a process group of its own, so that a SIGKILL takes its pool too."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        self.log = tempfile.NamedTemporaryFile(prefix="pr-kill-loss-", suffix=".log", delete=False)  # noqa: SIM115
        self.process = subprocess.Popen(
            worker_command(*args, app="bench.short_app"),
            cwd=ROOT,
            env=worker_environment(env),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def wait_ready(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while " ready." not in self.output():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"the worker did not start:\n{self.output()[-3000:]}")
            time.sleep(0.05)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)
        self.log.close()
        os.unlink(self.log.name)

    def stop(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        self.kill()


class Broker:
    """The test queue's broker: what is left in it, and where a document is."""

    def __init__(self, env: dict[str, str], queue: str) -> None:
        self.queue = queue
        self.redis = None if env["BROKER_URL"].startswith("amqp") else redis.Redis.from_url(env["BROKER_URL"])
        self.options = json.loads(env.get("BROKER_TRANSPORT_OPTIONS") or "{}")
        self.url = env["BROKER_URL"]

    def state(self) -> dict[str, int]:
        if self.redis is None:
            with Connection(self.url) as conn:
                try:
                    _, ready, _ = conn.default_channel.queue_declare(self.queue, passive=True)
                except conn.channel_errors:
                    ready = 0
            return {"ready": ready}
        lists = [k for k in self.redis.scan_iter(f"{self.queue}*") if self.redis.type(k) == b"list"]
        return {
            "ready": sum(self.redis.llen(k) for k in lists),
            "unacked": self.redis.hlen(self.options["unacked_key"]),
            "unacked_index": self.redis.zcard(self.options["unacked_index_key"]),
        }

    def where(self, task_id: str) -> str:
        """Every key of the broker's database whose value names ``task_id`` (Redis)."""
        if self.redis is None:
            return "not searched (RabbitMQ)"
        found = []
        for key in self.redis.scan_iter():
            kind = self.redis.type(key)
            if kind == b"list":
                values = self.redis.lrange(key, 0, -1)
            elif kind == b"hash":
                values = self.redis.hvals(key)
            elif kind == b"zset":
                values = self.redis.zrange(key, 0, -1)
            else:
                continue
            if any(task_id.encode() in v for v in values):
                found.append(key.decode(errors="replace"))
        return ", ".join(found) or "nowhere"

    def clear(self) -> None:
        if self.redis is None:
            with Connection(self.url) as conn, contextlib.suppress(*conn.channel_errors):
                conn.default_channel.queue_delete(self.queue)
            return
        for key in self.redis.scan_iter(f"{self.queue}*"):
            self.redis.delete(key)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--redis", default="redis://127.0.0.1:6379", help="a Redis server (databases 1-3 are used)"
    )
    parser.add_argument("--router", choices=("on", "off"), default="on")
    parser.add_argument("--pool", default="prefork")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--docs", type=int, default=8000)
    parser.add_argument("--kills", type=int, default=50)
    parser.add_argument("--min-ms", type=float, default=10)
    parser.add_argument("--max-ms", type=float, default=50)
    parser.add_argument("--after-min", type=float, default=0.2)
    parser.add_argument("--after-max", type=float, default=1.2)
    parser.add_argument("--drain", type=float, default=240, help="most seconds the final drain may take")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--settings", default="", help="extra Celery settings for the worker (JSON)")
    parser.add_argument("--amqp", default="", help="a RabbitMQ URL: the broker, instead of Redis database 1")
    args = parser.parse_args()

    rng = random.Random(args.seed)
    server = args.redis.rstrip("/")
    queue = f"loss-{uuid.uuid4().hex[:8]}"
    env = {
        "BROKER_URL": f"{server}/1",
        "RUNS_REDIS_URL": f"{server}/2",
        "PRIORITY_ROUTER_REDIS_URL": f"{server}/3",
        "PRIORITY_ROUTER_KEY_PREFIX": f"{queue}:",
        "PRIORITY_ROUTER_CONSUMER_CHECK_INTERVAL": "0",
        "RUNS_KEY": f"{queue}:runs",
        "DOCUMENT_QUEUE": queue,
        "WORKER_INCLUDE": "workers.bench_tasks",
        "WORKERS_ROUTER": args.router,
    }
    if args.amqp:
        env["BROKER_URL"] = args.amqp  # RabbitMQ requeues a dead worker's messages at once
    else:
        env["BROKER_TRANSPORT_OPTIONS"] = fast_redelivery(env)
    settings = json.loads(args.settings or "{}")
    if args.router == "off":
        # What the router sets for priorities; plain Celery's early acks lose running documents by design.
        settings = {"task_acks_late": True, "worker_prefetch_multiplier": 1, **settings}
    env["CELERY_SETTINGS"] = json.dumps(settings)
    broker = Broker(env, queue)
    runs = redis.Redis.from_url(env["RUNS_REDIS_URL"])

    app = create_app(env)
    ids = [
        app.send_task(
            TASK, (rng.uniform(args.min_ms, args.max_ms) / 1000,), headers={"client_id": "giant"}
        ).id
        for _ in range(args.docs)
    ]
    print(f"{queue}: {len(ids)} documents published; router {args.router}, {args.pool} -c {args.concurrency}")

    worker_args = ("--pool", args.pool, "--concurrency", str(args.concurrency))
    kills = 0
    for _ in range(args.kills):
        if broker.state()["ready"] == 0:
            print("the backlog ran out: stopping the kills")
            break
        worker = KillableWorker(env, *worker_args)
        worker.wait_ready()
        time.sleep(rng.uniform(args.after_min, args.after_max))
        worker.kill()
        kills += 1
        if kills % 10 == 0:
            started = runs.hlen(env["RUNS_KEY"])
            print(f"  {kills} kills, {started} documents started, broker {broker.state()}")

    worker = KillableWorker(env, *worker_args)
    worker.wait_ready()
    deadline = time.monotonic() + args.drain
    quiet_since = time.monotonic()
    last = -1
    while time.monotonic() < deadline:
        started = runs.hlen(env["RUNS_KEY"])
        if started != last:
            last, quiet_since = started, time.monotonic()
        state = broker.state()
        if started >= len(ids) or (not any(state.values()) and time.monotonic() - quiet_since > 10):
            break
        time.sleep(0.5)
    worker.stop()

    started_ids = {k.decode() for k in runs.hkeys(env["RUNS_KEY"])}
    lost = [i for i in ids if i not in started_ids]
    twice = sum(1 for v in runs.hvals(env["RUNS_KEY"]) if int(v) > 1)
    state = broker.state()
    print(
        f"kills: {kills}; documents: {len(ids)}; started: {len(started_ids)}; started more than once: {twice}"
    )
    per_kill = len(lost) / max(kills, 1)
    print(f"never started: {len(lost)} ({per_kill:.3f} per kill); broker after the drain: {state}")
    for task_id in lost:
        print(f"  {task_id}: in the broker at {broker.where(task_id)}")
    broker.clear()
    runs.delete(env["RUNS_KEY"])
    app.close()


if __name__ == "__main__":
    main()
