"""Redis Cluster as the counter store, on a real local cluster of 3 masters and 3 replicas.

Users reach it by URL (``redis+cluster://host:port[,host:port...]``) in the constructor, in
``PRIORITY_ROUTER_REDIS_URL`` and in the CLI.  Celery's broker stays the tests' plain Redis;
only the counts live on the cluster.  The failover test kills a master of a cluster of its
own while documents keep being published.
"""

from __future__ import annotations

import json
import logging
import re
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from celery.signals import after_task_publish
from click.testing import CliRunner
from redis.cluster import RedisCluster, key_slot
from support.broker import drain
from support.cluster import LocalCluster, require_cluster_programs, running_cluster
from support.redis_wire import record_writes
from support.services import broker_db_url, close_app

from priority_router import (
    DEFAULT_THRESHOLDS,
    ConfigurationError,
    CounterUnavailable,
    PriorityRouter,
    Reason,
    RouterConfig,
    Transport,
    from_wire,
)
from priority_router import headers as H
from priority_router.ops.cli import main
from priority_router.router import engine_of
from priority_router.store.counter import Counter
from priority_router.store.packed import EXEC, MULTI, command
from workers.app import create_app

BURST = [1, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 8, 8, 8, 8, 9]


@pytest.fixture
def broker_url(redis_server_url: str) -> str:
    """Celery's broker is the tests' plain Redis (the counter is what runs on the cluster)."""
    return broker_db_url(redis_server_url)


@pytest.fixture
def router(redis_cluster: LocalCluster, key_prefix: str) -> PriorityRouter:
    return PriorityRouter(redis_url=redis_cluster.url, key_prefix=key_prefix)


def masters_of(cluster: LocalCluster, router: PriorityRouter, clients: list[str]) -> set[int]:
    """The ports of the masters holding these clients' counts."""
    return {cluster.master_of_key(engine_of(router).counter.key(c)).port for c in clients}


# -- the URL ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "redis+cluster://10.0.0.1:6379",
        "redis+cluster://10.0.0.1:6379,10.0.0.2:6380,redis-3",
        "redis+cluster://app:secret@10.0.0.1:6379,10.0.0.2:6379/0",
        "rediss+cluster://:secret@redis.example:6380?ssl_cert_reqs=required",
        "redis+cluster://[::1]:7000,[::1]:7001",
    ],
)
def test_cluster_urls_are_accepted(url: str) -> None:
    assert RouterConfig(redis_url=url).redis_url == url


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("redis+cluster://", "names no node"),
        ("redis+cluster://:hunter2@", "names no node"),
        ("redis+cluster://10.0.0.1:notaport", "is not a number from 1 to 65535"),
        ("redis+cluster://10.0.0.1:6379,10.0.0.2:99999", "is not a number from 1 to 65535"),
        ("redis+cluster://10.0.0.1:6379,,10.0.0.2:6379", "missing between two commas"),
        ("redis+cluster://:6379", "names no host"),
        ("redis+cluster://:hunter2@10.0.0.1:6379/2", "Redis Cluster has only database 0"),
        ("redis+cluster://10.0.0.1:6379?db=1", "Redis Cluster has only database 0"),
        ("redis+cluster://10.0.0.1:6379/zero", "is not a whole number"),
    ],
)
def test_bad_cluster_urls_say_what_is_wrong(url: str, reason: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        PriorityRouter(redis_url=url)
    assert info.value.setting == "redis_url"
    assert reason in str(info.value)
    assert "Fix:" in str(info.value)
    assert "hunter2" not in str(info.value)


def test_passwords_in_multi_node_urls_are_redacted() -> None:
    cluster = PriorityRouter(redis_url="redis+cluster://app:hunter2@10.0.0.1:6379,10.0.0.2:6379")
    assert repr(cluster) == (
        "<PriorityRouter redis+cluster://app:***@10.0.0.1:6379,10.0.0.2:6379 prefix='priority-router:'>"
    )
    sentinel = PriorityRouter(redis_url="redis+sentinel://:hunter2@10.0.0.1:26379,10.0.0.2:26379/docs")
    assert "hunter2" not in repr(sentinel)


def test_a_cluster_that_does_not_answer_fails_open(key_prefix: str) -> None:
    # Building the router connects to nothing, so an app configured while the cluster is
    # down still starts; its publishes are priced by its own counts.
    router = PriorityRouter(redis_url="redis+cluster://127.0.0.1:1,127.0.0.1:2", key_prefix=key_prefix)
    decision = router.decide("acme")
    assert (decision.pending, decision.priority, decision.reason.value) == (0, 1, "local")
    with pytest.raises(CounterUnavailable, match="cannot reach the Redis Cluster"):
        router.record("acme")
    result = CliRunner().invoke(main, ["--redis-url", "redis+cluster://:hunter2@127.0.0.1:1", "status"])
    assert result.exit_code == 1
    assert "cannot reach the Redis Cluster" in result.output
    assert "hunter2" not in result.output


# -- the counter on a cluster -------------------------------------------------------------


def test_counts_follow_the_scheme(router: PriorityRouter) -> None:
    assert [router.record("acme").priority for _ in range(22)] == BURST
    assert router.peek("acme").pending == -21
    assert router.peek("acme").pending == -21
    assert router.record("light").pending == 0
    assert router.reset("acme") is True
    assert router.reset("acme") is False
    assert router.record("acme").pending == 0


def test_tiers_are_read_in_the_check_on_every_master(
    redis_cluster: LocalCluster, router: PriorityRouter
) -> None:
    clients = [f"tiered-{i}" for i in range(30)]
    for client in clients:
        router.set_tier(client, fixed=7)
    router.set_default_tier(shift=1)
    assert masters_of(redis_cluster, router, clients) == {m.port for m in redis_cluster.masters()}
    for client in clients:
        # The tier key shares the client's slot, so the check's transaction reads it.
        assert router.record(client).priority == 7
        with redis_cluster.master_of_key(engine_of(router).counter.key(client)).client() as master:
            assert master.exists(engine_of(router).tier_store.key(client)) == 1
    assert router.record("untiered").tier == "default: shift=1"
    prefix = router.config.key_prefix
    inflight = PriorityRouter(redis_url=redis_cluster.url, key_prefix=prefix, mode="inflight")
    assert inflight.record(clients[0], "t1").priority == 7
    assert set(router.tiers()) == set(clients)


def test_each_count_lives_on_its_master_and_expires_with_the_reset(
    redis_cluster: LocalCluster, router: PriorityRouter
) -> None:
    clients = [f"client-{i}" for i in range(60)]
    for client in clients:
        router.record(client)
    router.record("client-0")
    for client in clients:
        key = engine_of(router).counter.key(client)
        # The master serving the key's slot holds it: one slot per client, no redirects.
        with redis_cluster.master_of_key(key).client() as master:
            assert master.get(key) == (b"2" if client == "client-0" else b"1")
            assert 1_400_000 < master.pttl(key) <= 1_500_000
    assert masters_of(redis_cluster, router, clients) == {m.port for m in redis_cluster.masters()}


def test_the_reset_is_the_keys_expiry(redis_cluster: LocalCluster, key_prefix: str) -> None:
    router = PriorityRouter(redis_url=redis_cluster.url, key_prefix=key_prefix)
    counter = Counter(engine_of(router).redis, key_prefix, reset_interval=0.3)
    counter.record("acme")
    assert counter.record("acme") == -1
    time.sleep(0.45)
    assert counter.record("acme") == 0


def test_concurrent_publishers_lose_no_update(router: PriorityRouter) -> None:
    results: list[int] = []
    lock = threading.Lock()

    def publish() -> None:
        for _ in range(100):
            priority = router.record("shared").priority
            with lock:
                results.append(priority)

    threads = [threading.Thread(target=publish) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert router.peek("shared").pending == -399
    assert sorted(results) == sorted(DEFAULT_THRESHOLDS.priority_for(1 - n) for n in range(1, 401))


def test_scan_and_clear_all_cover_every_master(
    redis_cluster: LocalCluster, router: PriorityRouter, key_prefix: str
) -> None:
    ids = [f"c{i}" for i in range(600)] + ["odd:{id}*", "x" * 500]
    for client in ids:
        router.record(client)
    router.record("c7")
    states = {s.client_id: s for s in engine_of(router).counter.scan(count=100)}
    assert len(states) == len(ids)
    assert states["c7"].pending == -1
    assert states["odd:{id}*"].pending == 0
    assert masters_of(redis_cluster, router, ids[:60]) == {m.port for m in redis_cluster.masters()}

    assert engine_of(router).counter.clear_all(count=100) == len(ids)
    assert list(engine_of(router).counter.scan()) == []
    for master in redis_cluster.masters():
        with master.client() as direct:
            assert list(direct.scan_iter(match=key_prefix + "{*")) == []  # the schema marker stays


def test_any_listed_node_that_answers_is_enough(redis_cluster: LocalCluster, key_prefix: str) -> None:
    live = redis_cluster.url.split("://", 1)[1].split(",")[1]
    router = PriorityRouter(redis_url=f"redis+cluster://127.0.0.1:1,{live}", key_prefix=key_prefix)
    assert [router.record("acme").pending for _ in range(3)] == [0, -1, -2]


def test_the_environment_variable_reaches_the_cluster(redis_cluster: LocalCluster, key_prefix: str) -> None:
    env = {"PRIORITY_ROUTER_REDIS_URL": redis_cluster.url, "PRIORITY_ROUTER_KEY_PREFIX": key_prefix}
    router = PriorityRouter.from_env(env)
    assert router.config.redis_url == redis_cluster.url
    router.record("acme")
    assert PriorityRouter(redis_url=redis_cluster.url, key_prefix=key_prefix).peek("acme").pending == 0


# -- one packed write to one master ---------------------------------------------------------


def refuse_the_pipeline(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(*_: object, **__: object) -> None:
        raise AssertionError("a check went through redis-py's cluster pipeline")

    monkeypatch.setattr(RedisCluster, "pipeline", refused)


def test_a_check_is_one_packed_write_to_its_master(
    redis_cluster: LocalCluster, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = PriorityRouter(redis_url=redis_cluster.url, key_prefix=key_prefix)
    clients = [f"wire-{i}" for i in range(12)]
    tiered, costed = "wire-tiered", "wire-costed"
    PriorityRouter(redis_url=redis_cluster.url, key_prefix=key_prefix + "t:").set_tier(tiered, fixed=7)
    extended = PriorityRouter(redis_url=redis_cluster.url, key_prefix=key_prefix + "t:")
    for client in clients:  # markers read, slot map and connections set up
        plain.record(client)
    extended.record(costed, cost=2.5)
    counter = engine_of(plain).counter
    ports = {c: redis_cluster.master_of_key(counter.key(c)).port for c in [*clients, tiered, costed]}
    assert set(ports.values()) == {m.port for m in redis_cluster.masters()}
    refuse_the_pipeline(monkeypatch)
    writes = record_writes(monkeypatch)
    for client in clients:
        writes.clear()
        plain.record(client)
        key = counter.key(client).encode()
        check = MULTI + command(b"INCR", key) + command(b"PEXPIRE", key, b"1500000") + EXEC
        assert about(writes, key) == [(ports[client], check)]
    # With tiers and costs in use, the check also reads the tier and the extras, in the
    # same transaction on the same master.
    decisions = []
    for client, cost in ((tiered, 1.0), (costed, 2.5)):
        writes.clear()
        decisions.append(extended.record(client, cost=cost))
        mine = about(writes, engine_of(extended).counter.key(client).encode())
        assert [port for port, _ in mine] == [ports[client]], writes
        assert mine[0][1].startswith(MULTI) and mine[0][1].endswith(EXEC)
        assert b"GET" in mine[0][1]
    assert [(d.priority, d.pending) for d in decisions] == [(7, 0), (1, -2.5)]
    monkeypatch.undo()  # an operator's read goes through the pipeline
    assert extended.state(costed).counted == 5


def about(writes: list[tuple[int, bytes]], key: bytes) -> list[tuple[int, bytes]]:
    """The writes that name ``key``: the checks, not the reads of the tier and costs markers
    a router makes every few seconds (a slow run crosses one)."""
    return [(port, payload) for port, payload in writes if key in payload]


def test_an_inflight_publish_and_end_are_one_packed_write_each(
    redis_cluster: LocalCluster, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    router = PriorityRouter(redis_url=redis_cluster.url, key_prefix=key_prefix, mode="inflight")
    router.record("warm", "t0")
    keys = engine_of(router).counter
    clients = [f"flight-{i}" for i in range(9)]
    ports = {c: redis_cluster.master_of_key(keys.key(c)).port for c in clients}
    assert set(ports.values()) == {m.port for m in redis_cluster.masters()}
    refuse_the_pipeline(monkeypatch)
    writes = record_writes(monkeypatch)
    for client in clients:
        port = ports[client]
        writes.clear()
        assert router.record(client, "t1").pending == 0
        assert router.record(client, "t2").pending == -1
        assert router.end(client, "t1") is True
        mine = about(writes, keys.key(client).encode())
        assert [p for p, _ in mine] == [port, port, port]
        assert [w[:14] for _, w in mine] == [b"*15\r\n$7\r\nEVALSHA"[:14]] * 2 + [MULTI[:14]]


def test_counts_are_exact_in_both_modes_on_every_master(redis_cluster: LocalCluster, key_prefix: str) -> None:
    seed = PriorityRouter(redis_url=redis_cluster.url, key_prefix=key_prefix + "s:")
    inflight = PriorityRouter(redis_url=redis_cluster.url, key_prefix=key_prefix + "i:", mode="inflight")
    clients = [f"exact-{i}" for i in range(24)]
    assert masters_of(redis_cluster, seed, clients) == {m.port for m in redis_cluster.masters()}

    def publish(worker: int) -> None:
        for round_ in range(10):
            for client in clients:
                seed.record(client)
                inflight.record(client, f"{worker}-{round_}")
                if round_ % 2:
                    assert inflight.end(client, f"{worker}-{round_ - 1}") is True

    threads = [threading.Thread(target=publish, args=(w,)) for w in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for client in clients:
        assert seed.state(client).counted == 30
        assert inflight.state(client).counted == 15


# -- resharding ----------------------------------------------------------------------------


def test_a_failed_master_is_named_where_the_cluster_says_only_that_it_is_down(key_prefix: str) -> None:
    """Found in a field trial: with a master stopped, `inspect` said "The cluster is down"
    and `doctor` the same, naming no node.  They now name the nodes the cluster marks."""
    require_cluster_programs()
    with running_cluster(replicas=0) as cluster:
        router = PriorityRouter(redis_url=cluster.url, key_prefix=key_prefix)
        for n in range(10):
            router.record(f"c{n}")
        victim = cluster.nodes[1]
        victim.process.send_signal(signal.SIGSTOP)
        try:
            named = f"127.0.0.1:{victim.port} (master) as "
            deadline = time.monotonic() + 30
            result = None
            while time.monotonic() < deadline:
                result = CliRunner().invoke(
                    main, ["--redis-url", cluster.url, "--key-prefix", key_prefix, "inspect", "c1"]
                )
                if named + "failed" in result.output:
                    break
                time.sleep(0.5)
            assert result is not None and result.exit_code == 1
            assert f"the cluster marks {named}failed" in result.output, result.output
        finally:
            victim.process.send_signal(signal.SIGCONT)


def test_a_resharded_slot_is_followed_without_losing_a_count(key_prefix: str) -> None:
    """Every step of moving a client's slot to another master, as ``redis-cli --cluster
    reshard`` takes them, with publishes between them: the seed mode keeps counting through
    ASK and MOVED; the inflight mode's script, whose keys are not all there while the slot
    moves, fails open until it has moved (Redis answers TRYAGAIN), and loses nothing."""
    require_cluster_programs()
    with running_cluster(replicas=0) as cluster:
        seed = PriorityRouter(redis_url=cluster.url, key_prefix=key_prefix)
        inflight = PriorityRouter(
            redis_url=cluster.url, key_prefix=key_prefix + "i:", mode="inflight", cooldown=0.2
        )
        client = "moving"
        key = engine_of(seed).counter.key(client)
        slot = key_slot(key.encode())
        source = cluster.master_of_slot(slot)
        target = next(m for m in cluster.masters() if m is not source)
        seen: list[tuple[str, str, int | None]] = []
        flown: list[str] = []

        def publish(step: str) -> None:
            for n in range(3):
                seen.append((step, *_reason_and_pending(seed.decide(client))))
                task = f"{step}-{n}"
                if inflight.decide(client, task).reason.value == "counted":
                    flown.append(task)

        publish("before")
        cluster.move_slot(slot, target, between=publish)
        time.sleep(0.3)  # the inflight breaker's cooldown
        publish("after")

        assert all(reason == "counted" for _, reason, _ in seen), seen
        assert [pending for *_, pending in seen] == [-n for n in range(len(seen))]
        assert cluster.master_of_key(key) is target
        with target.client() as master:
            assert int(master.get(key)) == len(seen)
            # The key had left the source while the slot was still the source's: ASK.
            assert master.info("commandstats")["cmdstat_asking"]["calls"] >= 1
        assert engine_of(seed).redis.get_node_from_key(key).port == target.port  # MOVED followed
        assert "after-0" in flown
        assert inflight.state(client).counted == len(flown)


def _reason_and_pending(decision: Any) -> tuple[str, int | None]:
    return decision.reason.value, decision.pending


# -- the CLI -------------------------------------------------------------------------------


def test_the_cli_reads_and_resets_clients_on_every_master(
    redis_cluster: LocalCluster, router: PriorityRouter, key_prefix: str
) -> None:
    for _ in range(22):
        router.record("bulk")
    for _ in range(5):
        router.record("medium")
    light = [f"light-{i}" for i in range(30)]
    for client in light:
        router.record(client)
    assert masters_of(redis_cluster, router, light) == {m.port for m in redis_cluster.masters()}
    runner = CliRunner()
    env = {"PRIORITY_ROUTER_REDIS_URL": redis_cluster.url, "PRIORITY_ROUTER_KEY_PREFIX": key_prefix}
    options = ["--redis-url", redis_cluster.url, "--key-prefix", key_prefix]

    status = runner.invoke(main, ["status", "--json"], env=env)
    assert status.exit_code == 0, status.output
    rows = json.loads(status.output)
    assert len(rows) == 32
    assert [(r["client_id"], r["pending"], r["priority"]) for r in rows[-2:]] == [
        ("medium", -4, 2),
        ("bulk", -21, 9),
    ]
    table = runner.invoke(main, ["status", *options])
    assert "32 client(s) tracked" in table.output

    inspect = runner.invoke(main, [*options, "inspect", "medium", "--json"])
    assert inspect.exit_code == 0, inspect.output
    row = json.loads(inspect.output)
    assert (row["pending"], row["priority"], row["tracked"]) == (-4, 2, True)

    one = runner.invoke(main, ["reset", "bulk", "--yes", *options])
    assert one.exit_code == 0, one.output
    assert router.peek("bulk").pending == 0

    everyone = runner.invoke(main, ["reset", "--all", "--yes"], env=env)
    assert everyone.exit_code == 0, everyone.output
    assert "reset every client's count: 31 key(s) of the seed mode" in everyone.output
    for master in redis_cluster.masters():
        with master.client() as direct:
            assert list(direct.scan_iter(match=key_prefix + "{*")) == []  # the schema marker stays
    assert json.loads(runner.invoke(main, ["status", "--json"], env=env).output) == []


def test_doctor_checks_every_master(
    redis_cluster: LocalCluster,
    worker_env: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = {**worker_env, "PRIORITY_ROUTER_REDIS_URL": redis_cluster.url}
    module = f"cluster_app_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(
        f"from workers.app import create_app\napp = create_app({env!r})\n", encoding="utf-8"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    result = CliRunner().invoke(main, ["doctor", "-A", module, "--json"])
    findings = {f["check"]: f for f in json.loads(result.output)}
    counter = findings["counter store"]
    assert counter["ok"], counter
    assert re.match(r"Redis Cluster \d+\.\d+", counter["detail"]), counter
    assert redis_cluster.url in counter["detail"]


# -- Celery --------------------------------------------------------------------------------


def test_celery_publishes_are_counted_on_the_cluster(
    redis_cluster: LocalCluster, worker_env: dict[str, str]
) -> None:
    env = {**worker_env, "PRIORITY_ROUTER_REDIS_URL": redis_cluster.url}
    app = create_app(env)
    try:
        for n in range(4):
            app.send_task("workers.process_document", ("acme", f"a{n}", 1), headers={"client_id": "acme"})
        app.send_task("workers.process_document", ("beta", "b0", 1), headers={"client_id": "beta"})
        messages = drain(app, env["DOCUMENT_QUEUE"], expected=5)
    finally:
        close_app(app)
    seen = sorted(
        (
            m.headers["client_id"],
            m.headers[H.PENDING],
            m.headers[H.PRIORITY],
            m.headers[H.REASON],
            from_wire(m.properties["priority"], Transport.REDIS),
        )
        for m in messages
    )
    assert seen == sorted(
        [
            ("acme", 0, 1, "counted", 1),
            ("acme", -1, 1, "counted", 1),
            ("acme", -2, 1, "counted", 1),
            ("acme", -3, 2, "counted", 2),
            ("beta", 0, 1, "counted", 1),
        ]
    )
    assert PriorityRouter.from_env(env).peek("acme").pending == -3


# -- failover ------------------------------------------------------------------------------


@pytest.fixture
def doomed_cluster() -> Iterator[LocalCluster]:
    """A cluster of this test's own: it kills one of the masters."""
    require_cluster_programs()
    with running_cluster() as cluster:
        yield cluster


@dataclass(frozen=True)
class Published:
    at: float
    client: str
    reason: str
    pending: int | None
    priority: int


def test_publishes_keep_going_through_a_failover(
    doomed_cluster: LocalCluster, worker_env: dict[str, str]
) -> None:
    cluster = doomed_cluster
    env = {
        **worker_env,
        "PRIORITY_ROUTER_REDIS_URL": cluster.url,
        "PRIORITY_ROUTER_COOLDOWN": "0.2",
        # Room for a busy test machine; a killed master refuses connections at once anyway.
        "PRIORITY_ROUTER_CONNECT_TIMEOUT": "0.25",
        "PRIORITY_ROUTER_SOCKET_TIMEOUT": "0.25",
    }
    keys = engine_of(PriorityRouter.from_env(env)).counter
    victim = cluster.master_of_key(keys.key("client-0"))
    replica = cluster.replica_of(victim)
    candidates = [f"client-{i}" for i in range(40)]
    on_victim = [c for c in candidates if cluster.master_of_key(keys.key(c)) is victim][:2]
    elsewhere = [c for c in candidates if cluster.master_of_key(keys.key(c)) is not victim][:2]
    clients = on_victim + elsewhere

    published: list[Published] = []

    def stamped(headers: dict[str, Any] | None = None, **_: Any) -> None:
        assert headers is not None
        published.append(
            Published(
                time.monotonic(),
                headers["client_id"],
                headers[H.REASON],
                headers[H.PENDING],
                headers[H.PRIORITY],
            )
        )

    durations: list[float] = []
    app = create_app(env)
    after_task_publish.connect(stamped, weak=False)

    def publish_round() -> list[Published]:
        start = len(published)
        for client in clients:
            started = time.monotonic()
            app.send_task("workers.process_document", (client, "d", 1), headers={"client_id": client})
            durations.append(time.monotonic() - started)
        return published[start:]

    try:
        for _ in range(5):
            publish_round()
        # Replication is asynchronous: let the replica hold every count before the crash.
        with victim.client() as direct:
            assert direct.execute_command("WAIT", 1, 5000) == 1
        before_kill = {p.client: p.pending for p in published if p.pending is not None}
        killed_at = time.monotonic()
        cluster.kill(victim)
        promoted = False
        while time.monotonic() < killed_at + 30:
            last_round = publish_round()
            promoted = promoted or replica.info("replication")["role"] == "master"
            if promoted and all(p.reason == "counted" for p in last_round):
                break
            time.sleep(0.02)
        else:
            pytest.fail(f"counting did not resume within 30 s of the kill: {published[-8:]}")
        messages = drain(app, env["DOCUMENT_QUEUE"], expected=len(published))
    finally:
        after_task_publish.disconnect(stamped)
        close_app(app)

    # Every publish went out, promptly, whatever the counter store was doing.
    assert len(messages) == len(published) == len(durations)
    assert max(durations) < 1.0, f"a publish took {max(durations):.2f} s"
    assert all(p.reason == "counted" for p in published if p.at < killed_at)

    # While the victim's slots had no master, its clients' documents were priced by the
    # publisher's own counts.
    after_kill = [p for p in published if p.at > killed_at]
    failed_open = [p for p in after_kill if p.reason == "local"]
    assert {p.client for p in failed_open} >= set(on_victim)
    assert all(p.pending is not None for p in failed_open)
    assert sum(m.headers[H.REASON] == "local" for m in messages) == len(failed_open)

    # The replica took over those slots, and counting resumed by itself, from the counts
    # it had replicated: nothing lost, nothing counted twice.
    for client in on_victim:
        assert cluster.master_of_key(keys.key(client)) is replica
        resumed = next(p for p in after_kill if p.client == client and p.reason == "counted")
        assert resumed.pending == before_kill[client] - 1


def test_a_stopped_master_stalls_one_publish_not_one_per_probe(
    doomed_cluster: LocalCluster, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The breaker's probe asks every master: a probe that asked one healthy node said the
    store answered while a master was stopped, and each time one publish to that master
    waited its timeout again (a newcomer's cluster trial counted 6 in one outage)."""
    cluster = doomed_cluster
    router = PriorityRouter(
        redis_url=cluster.url, key_prefix=key_prefix, cooldown=0.2, socket_timeout=0.25, connect_timeout=0.25
    )
    keys = engine_of(router).counter
    victim = cluster.master_of_key(keys.key("client-0"))
    candidates = [f"client-{i}" for i in range(40)]
    on_victim = next(c for c in candidates if cluster.master_of_key(keys.key(c)) is victim)
    elsewhere = next(c for c in candidates if cluster.master_of_key(keys.key(c)) is not victim)
    for client in (on_victim, elsewhere):
        assert router.decide(client).reason is Reason.COUNTED
    stalls = []
    victim.process.send_signal(signal.SIGSTOP)
    try:
        with caplog.at_level(logging.INFO, "priority_router"):
            stopped_at = time.monotonic()
            # Below the cluster's node timeout (1 s): no failover, the master is only stopped.
            while time.monotonic() < stopped_at + 0.8:
                for client in (on_victim, elsewhere):
                    started = time.monotonic()
                    router.decide(client)
                    if time.monotonic() - started > 0.2:
                        stalls.append(round(time.monotonic() - started, 2))
                time.sleep(0.01)
    finally:
        victim.process.send_signal(signal.SIGCONT)
    assert len(stalls) <= 1, stalls
    assert "answering again" not in caplog.text, caplog.text


def test_caps_hold_on_the_cluster_with_real_workers(
    redis_cluster: LocalCluster, worker_env: dict[str, str], redis_server_url: str
) -> None:
    """Each client's gate is one script on its own master; the index of held clients and the
    limits live on theirs."""
    import uuid

    import redis as redis_py
    from support.services import running_worker

    from priority_router.store.client_ids import gate_keys

    runs_key = f"runs-{uuid.uuid4().hex[:8]}"
    env = {
        **worker_env,
        "PRIORITY_ROUTER_REDIS_URL": redis_cluster.url,
        "RUNS_REDIS_URL": broker_db_url(redis_server_url),
        "RUNS_KEY": runs_key,
    }
    router = PriorityRouter.from_env(env)
    clients = [f"bulk-{n}" for n in range(6)]
    for client in clients:
        router.set_tier(client, max_in_flight=1)
    gates = {redis_cluster.master_of_key(gate_keys(router.config.key_prefix, c)[0]).port for c in clients}
    assert len(gates) > 1, "the clients' gates should spread over masters"
    app = create_app(env)
    seen = redis_py.Redis.from_url(env["RUNS_REDIS_URL"])
    try:
        docs = [
            app.send_task("tests.track_running", kwargs={"seconds": 0.3, "client_id": c})
            for c in clients
            for _ in range(3)
        ]
        with running_worker(env, "--pool", "threads", "--concurrency", "6"):
            for doc in docs:
                doc.get(timeout=90)
        assert {c: int(seen.hget(runs_key, f"max:{c}") or 0) for c in clients} == dict.fromkeys(clients, 1)
        assert all(int(seen.hget(runs_key, f"run:{d.id}") or 0) == 1 for d in docs)
        assert all(router.gate_state(c).held == 0 for c in clients)
    finally:
        seen.delete(runs_key)
        seen.close()
        close_app(app)
