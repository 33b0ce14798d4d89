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
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

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
