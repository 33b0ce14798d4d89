"""The noisy-neighbour workload, written once for the demo, the benchmarks and the compose producer.

One heavy client dumps a burst of documents; then light clients each send a few, spread
over ``light_spread`` seconds starting ``light_start`` seconds after the burst is out.

The light schedule starts when the burst has been published, not when it began: light
documents that fell due while the burst was still being sent would otherwise all go out
at once and queue behind each other, and the run would measure that instead of how the
light clients fare next to the heavy backlog (slower publishing on a cold first run made
that batch, and so the result, vary from run to run).
Document lengths are seeded, so two runs of one workload send the same documents.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from celery import Celery

HOLD = "workers.hold_document"
PROCESS = "workers.process_document"


@dataclass(frozen=True)
class Document:
    group: str  # "heavy" or "light"
    client_id: str
    document_id: str
    #: Seconds the document holds a worker slot (``hold_document``).
    seconds: float
    #: Seconds after the burst is out at which it is published (0 for the burst itself).
    at: float


@dataclass(frozen=True)
class NoisyNeighbour:
    heavy: int = 300
    light_clients: int = 12
    light_docs: int = 3
    #: Mean seconds a document holds a worker slot.
    doc_seconds: float = 0.04
    #: Lengths are uniform in doc_seconds * (1 +/- jitter); 0 makes every document equal.
    jitter: float = 0.0
    light_start: float = 0.05
    light_spread: float = 1.0
    seed: int = 7
    #: Publish ``process_document`` with this many pages (CPU work) instead of ``hold_document``.
    pages: int | None = None

    @property
    def total(self) -> int:
        return self.heavy + self.light_clients * self.light_docs

    def documents(self) -> Iterator[Document]:
        rng = random.Random(self.seed)

        def length() -> float:
            return self.doc_seconds * (1 + self.jitter * (2 * rng.random() - 1))

        for n in range(self.heavy):
            yield Document("heavy", "heavy", f"h{n}", length(), 0.0)
        light = [(c, d) for d in range(self.light_docs) for c in range(self.light_clients)]
        gap = self.light_spread / max(1, len(light))
        for i, (c, d) in enumerate(light):
            yield Document("light", f"light{c:02d}", f"l{c}-{d}", length(), self.light_start + i * gap)


#: Called as ``wait(seconds)`` between light documents; the demo collects results there.
Wait = Callable[[float], None]


def publish(
    app: Celery,
    workload: NoisyNeighbour,
    wait: Wait = time.sleep,
    published: dict[str, tuple[str, float]] | None = None,
) -> dict[str, tuple[str, float]]:
    """Publish ``workload`` through ``app``; returns task id -> (group, publish time).

    ``published`` (returned) is filled in as documents go out, for a ``wait`` that
    watches them."""
    published = {} if published is None else published
    burst_out: float | None = None
    for doc in workload.documents():
        if doc.group == "heavy":
            delay = 0.0
        else:
            burst_out = time.time() if burst_out is None else burst_out
            delay = burst_out + doc.at - time.time()
        if delay > 0:
            wait(delay)
        if workload.pages is None:
            name, args = HOLD, (doc.client_id, doc.document_id, doc.seconds)
        else:
            name, args = PROCESS, (doc.client_id, doc.document_id, workload.pages)
        result = app.send_task(name, args, headers={"client_id": doc.client_id})
        published[result.id] = (doc.group, time.time())
    return published


# --- Fairness between counting modes (bench/fairness_modes.py) ---------------------------------

#: Task id -> (the document, the publisher's clock just after ``send_task`` returned).
Sent = dict[str, tuple[Document, float]]


def _lengths(seed: int, doc_seconds: float, jitter: float) -> Callable[[], float]:
    rng = random.Random(seed)
    return lambda: doc_seconds * (1 + jitter * (2 * rng.random() - 1))


@dataclass(frozen=True)
class SteadyBurst:
    """A steady client next to a bursting one.

    The steady client (group "light") sends ``steady`` documents one at a time: each is
    published when the previous one has finished.  Just before its ``burst_after``-th
    document (0-based), the bursting client (group "heavy") dumps ``burst`` documents at
    once, so that steady document and the ones after it meet the burst's backlog.
    """

    steady: int = 30
    burst: int = 150
    burst_after: int = 5
    doc_seconds: float = 0.05
    jitter: float = 0.5
    seed: int = 7

    @property
    def total(self) -> int:
        return self.steady + self.burst

    def documents(self) -> tuple[list[Document], list[Document]]:
        """(the steady client's documents, the burst), with seeded lengths."""
        length = _lengths(self.seed, self.doc_seconds, self.jitter)
        steady = [Document("light", "steady", f"s{n}", length(), 0.0) for n in range(self.steady)]
        burst = [Document("heavy", "burst", f"b{n}", length(), 0.0) for n in range(self.burst)]
        return steady, burst


@dataclass(frozen=True)
class HeavyMix:
    """Several heavy clients of different sizes, and light clients spread over time.

    Heavy client ``i`` (``heavy0``, ``heavy1``, ...) dumps ``heavy[i]`` documents at once,
    ``i * heavy_gap`` seconds after the start; then ``light_clients`` clients send
    ``light_docs`` each, spread evenly over ``light_spread`` seconds from ``light_start``.
    """

    heavy: tuple[int, ...] = (120, 60, 30)
    heavy_gap: float = 0.5
    light_clients: int = 8
    light_docs: int = 2
    light_start: float = 0.1
    light_spread: float = 2.5
    doc_seconds: float = 0.05
    jitter: float = 0.5
    seed: int = 7

    @property
    def total(self) -> int:
        return sum(self.heavy) + self.light_clients * self.light_docs

    def documents(self) -> list[Document]:
        """Every document, in publishing order (by ``at``, seconds after the start)."""
        length = _lengths(self.seed, self.doc_seconds, self.jitter)
        docs = [
            Document("heavy", f"heavy{i}", f"h{i}-{n}", length(), i * self.heavy_gap)
            for i, size in enumerate(self.heavy)
            for n in range(size)
        ]
        light = [(c, d) for d in range(self.light_docs) for c in range(self.light_clients)]
        gap = self.light_spread / max(1, len(light))
        docs += [
            Document("light", f"light{c:02d}", f"l{c}-{d}", length(), self.light_start + i * gap)
            for i, (c, d) in enumerate(light)
        ]
        return sorted(docs, key=lambda doc: doc.at)  # stable: a dump stays in order


def send(app: Celery, doc: Document) -> tuple[str, float]:
    """Publish one ``hold_document``; returns (task id, publisher's clock after the send)."""
    result = app.send_task(
        HOLD, (doc.client_id, doc.document_id, doc.seconds), headers={"client_id": doc.client_id}
    )
    return result.id, time.time()


def publish_timed(app: Celery, docs: list[Document], wait: Wait = time.sleep) -> Sent:
    """Publish ``docs`` (sorted by ``at``), each ``at`` seconds after the first went out."""
    sent: Sent = {}
    start = time.time()
    for doc in docs:
        delay = start + doc.at - time.time()
        if delay > 0:
            wait(delay)
        tid, at = send(app, doc)
        sent[tid] = (doc, at)
    return sent


def publish_steady_burst(app: Celery, workload: SteadyBurst, timeout: float = 300) -> Sent:
    """Run ``workload``: the steady client waits for each result before its next document."""
    steady, burst = workload.documents()
    sent: Sent = {}
    for n, doc in enumerate(steady):
        if n == workload.burst_after:
            for heavy in burst:
                tid, at = send(app, heavy)
                sent[tid] = (heavy, at)
        tid, at = send(app, doc)
        sent[tid] = (doc, at)
        app.AsyncResult(tid).get(timeout=timeout)
    return sent


def slowdown(waits: list[float], services: list[float]) -> float:
    """A client's slowdown: mean(wait + service) / mean(service) over its documents.

    1.0 means its documents never waited; 3.0, that they took three times their own length
    from publish to finish on average."""
    if not services or len(waits) != len(services):
        raise ValueError("one wait per service time, and at least one document")
    return (sum(waits) + sum(services)) / sum(services)


def jain(values: list[float]) -> float:
    """Jain's fairness index (sum x)^2 / (n * sum x^2): 1.0 when every x is equal, down to
    1/n when one client gets all of it."""
    if not values or any(v < 0 for v in values):
        raise ValueError("Jain's index needs at least one value, none negative")
    squares = sum(v * v for v in values)
    return 1.0 if squares == 0 else sum(values) ** 2 / (len(values) * squares)


def p95(values: list[float]) -> float:
    """The 95th percentile (inclusive), or the one value there is."""
    return statistics.quantiles(values, n=20, method="inclusive")[18] if len(values) > 1 else values[0]


def waits_by_group(
    published: dict[str, tuple[str, float]], results: dict[str, dict[str, Any]]
) -> dict[str, list[float]]:
    """Each group's waits: a document's start (its report) minus the time it was published."""
    waits: dict[str, list[float]] = {"heavy": [], "light": []}
    for tid, (group, at) in published.items():
        waits[group].append(results[tid]["started_at"] - at)
    return waits
