"""The built-in workloads: the same definitions the real benchmarks publish and the simulator replays.

``workers/workload.py`` publishes these documents to real Celery workers (the demo,
``bench/fairness.py``, ``bench/fairness.py --workload modes``, ``bench/fairness.py --workload starvation``,
``bench/fairness.py --workload giants``); each workload's :meth:`trace` is the same documents for the
simulator.  Document lengths are seeded, so two runs of one workload (real or simulated)
send the same documents.
:class:`MixedSizes` and :class:`SlowNeighbour` are the simulator's only: no benchmark
publishes them.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from .trace import Trace, TraceBuilder


@dataclass(frozen=True)
class Document:
    group: str  # "heavy" or "light" ("giant", "medium", "light" for Giants)
    client_id: str
    document_id: str
    #: Seconds the document holds a worker slot (``hold_document``).
    seconds: float
    #: Seconds after the start (for NoisyNeighbour: after the burst is out) at which it is published.
    at: float


class _Open:
    """A workload whose documents are each published at their ``at``: by ``at``, ties in
    the order :meth:`documents` gives them."""

    def documents(self) -> Iterable[Document]:
        raise NotImplementedError

    @property
    def total(self) -> int:
        """How many documents it publishes."""
        return sum(1 for _ in self.documents())

    def trace(self) -> Trace:
        builder = TraceBuilder()
        for doc in sorted(self.documents(), key=lambda d: d.at):
            builder.add(doc.client_id, doc.group, doc.at, doc.seconds)
        return builder.build()


@dataclass(frozen=True)
class NoisyNeighbour(_Open):
    """One heavy client dumps a burst of documents; then light clients each send a few,
    spread over ``light_spread`` seconds starting ``light_start`` seconds after the burst
    is out.

    The light schedule starts when the burst has been published, not when it began: light
    documents that fell due while the burst was still being sent would otherwise all go
    out at once and queue behind each other, and the run would measure that instead of
    how the light clients fare next to the heavy backlog.  In the simulator publishing
    takes no time, so the burst is out at 0.
    """

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

    def documents(self) -> Iterator[Document]:
        length = _lengths(self.seed, self.doc_seconds, self.jitter)
        for n in range(self.heavy):
            yield Document("heavy", "heavy", f"h{n}", length(), 0.0)
        yield from _light(self.light_clients, self.light_docs, self.light_start, self.light_spread, length)


def _lengths(seed: int, doc_seconds: float, jitter: float) -> Callable[[], float]:
    rng = random.Random(seed)
    return lambda: doc_seconds * (1 + jitter * (2 * rng.random() - 1))


def _light(
    clients: int, docs: int, start: float, spread: float, length: Callable[[], float]
) -> list[Document]:
    """``docs`` documents from each of ``clients`` light clients (``light00``, ...), evenly
    spread over ``spread`` seconds from ``start``, client after client in turn."""
    light = [(c, d) for d in range(docs) for c in range(clients)]
    gap = spread / max(1, len(light))
    return [
        Document("light", f"light{c:02d}", f"l{c}-{d}", length(), start + i * gap)
        for i, (c, d) in enumerate(light)
    ]


def _dumps(
    group: str, sizes: Sequence[int], start: float, gap: float, length: Callable[[], float]
) -> list[Document]:
    """Client ``i`` of ``group`` (``heavy0``, ...; documents ``h0-0``, ...) dumps ``sizes[i]``
    documents at once, ``start + i * gap`` seconds after the start."""
    return [
        Document(group, f"{group}{i}", f"{group[0]}{i}-{n}", length(), start + i * gap)
        for i, size in enumerate(sizes)
        for n in range(size)
    ]


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

    def trace(self) -> Trace:
        """The steady client as a closed loop: each document follows the previous one's
        finish; the burst follows the finish of document ``burst_after - 1`` and goes out
        before document ``burst_after``, as ``publish_steady_burst`` sends it."""
        steady, burst = self.documents()
        builder = TraceBuilder()
        previous = -1
        for n, doc in enumerate(steady):
            if n == self.burst_after:
                for heavy in burst:
                    builder.add(heavy.client_id, heavy.group, 0.0, heavy.seconds, after=previous)
            previous = builder.add(doc.client_id, doc.group, 0.0, doc.seconds, after=previous)
        return builder.build()


@dataclass(frozen=True)
class HeavyMix(_Open):
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

    def documents(self) -> list[Document]:
        """Every document, in publishing order (by ``at``, seconds after the start)."""
        length = _lengths(self.seed, self.doc_seconds, self.jitter)
        docs = _dumps("heavy", self.heavy, 0.0, self.heavy_gap, length)
        docs += _light(self.light_clients, self.light_docs, self.light_start, self.light_spread, length)
        return sorted(docs, key=lambda doc: doc.at)  # stable: a dump stays in order


@dataclass(frozen=True)
class MixedSizes(_Open):
    """Documents of very different sizes: one client's long scans next to many clients'
    short invoices, the case for counting documents by their cost.

    ``heavy`` scans of ``heavy_seconds`` from one client (``scans``) at 0; then, at
    ``light_at``, ``light_clients`` clients (``invoices00``, ...) send ``light_docs``
    invoices of ``light_seconds`` each, client after client in turn.  Lengths vary by
    ``jitter`` around their means, seeded.
    """

    heavy: int = 20
    heavy_seconds: float = 30.0
    light_clients: int = 10
    light_docs: int = 10
    light_seconds: float = 1.0
    light_at: float = 1.0
    jitter: float = 0.1
    seed: int = 7

    def documents(self) -> list[Document]:
        """Every document, in publishing order."""
        scale = _lengths(self.seed, 1.0, self.jitter)
        docs = [
            Document("heavy", "scans", f"s{n}", self.heavy_seconds * scale(), 0.0) for n in range(self.heavy)
        ]
        docs += [
            Document("light", f"invoices{c:02d}", f"i{c}-{d}", self.light_seconds * scale(), self.light_at)
            for d in range(self.light_docs)
            for c in range(self.light_clients)
        ]
        return docs


@dataclass(frozen=True)
class SlowNeighbour(_Open):
    """One client's long documents filling every slot, next to light clients' short ones:
    the case for capping a client's documents in flight (``max_in_flight``).

    The heavy client (``heavy``) sends ``heavy`` documents of ``heavy_seconds`` +/-
    ``heavy_jitter``, one every ``heavy_every`` seconds from 0; ``light_clients`` clients
    (``light00``, ...) send ``light_docs`` documents each of ``light_seconds`` +/-
    ``light_jitter``, evenly spread over ``light_spread`` seconds from ``light_start``,
    client after client in turn.  Once the heavy client holds every slot, no queue order
    helps a light document: it waits for a long document to finish, unless a cap keeps
    slots out of the heavy client's reach.
    """

    heavy: int = 12
    heavy_every: float = 2.0
    heavy_seconds: float = 60.0
    heavy_jitter: float = 10.0
    light_clients: int = 8
    light_docs: int = 5
    light_seconds: float = 2.0
    light_jitter: float = 1.0
    light_start: float = 1.0
    light_spread: float = 240.0
    seed: int = 7

    def documents(self) -> list[Document]:
        """Every document, in publishing order."""
        rng = random.Random(self.seed)

        def length(mean: float, jitter: float) -> float:
            return mean + jitter * (2 * rng.random() - 1)

        every = self.heavy_every
        docs = [
            Document("heavy", "heavy", f"h{n}", length(self.heavy_seconds, self.heavy_jitter), n * every)
            for n in range(self.heavy)
        ]
        light = functools.partial(length, self.light_seconds, self.light_jitter)
        docs += _light(self.light_clients, self.light_docs, self.light_start, self.light_spread, light)
        return sorted(docs, key=lambda doc: doc.at)


@dataclass(frozen=True)
class Giants(_Open):
    """Heavy clients of very different sizes: giants, medium clients and light ones, the case
    for a threshold table deeper than the scheme's (``thresholds="wide"``).

    Giant ``i`` (``giant0``, ...) dumps ``giants[i]`` documents at ``i * giant_gap``
    seconds; medium client ``i`` (``medium0``, ...) dumps ``medium[i]`` documents at
    ``medium_at + i * medium_gap``; ``light_clients`` clients (``light00``, ...) send
    ``light_docs`` documents each, evenly spread over ``light_spread`` seconds from
    ``light_start``, client after client in turn.  Every document lasts ``doc_min`` to
    ``doc_max`` seconds, uniformly, seeded.
    """

    giants: tuple[int, ...] = (1000,)
    giant_gap: float = 5.0
    medium: tuple[int, ...] = (60,)
    medium_at: float = 1.0
    medium_gap: float = 10.0
    light_clients: int = 12
    light_docs: int = 3
    light_start: float = 2.0
    light_spread: float = 200.0
    doc_min: float = 1.0
    doc_max: float = 3.0
    seed: int = 7

    def documents(self) -> list[Document]:
        """Every document, in publishing order."""
        rng = random.Random(self.seed)

        def length() -> float:
            return rng.uniform(self.doc_min, self.doc_max)

        docs = _dumps("giant", self.giants, 0.0, self.giant_gap, length)
        docs += _dumps("medium", self.medium, self.medium_at, self.medium_gap, length)
        docs += _light(self.light_clients, self.light_docs, self.light_start, self.light_spread, length)
        return sorted(docs, key=lambda doc: doc.at)


class Workload(Protocol):
    def trace(self) -> Trace: ...


#: ``--workload`` name -> the workload with a given seed: the real benchmarks' defaults
#: (``bench/fairness.py`` for the noisy neighbour, ``bench/fairness.py --workload modes`` for steady-burst
#: and heavy-mix); mixed-sizes is the simulator's own, for counting by cost,
#: slow-neighbour, for capping a client's documents in flight, and the giants (documents
#: of 1-3 s, for 8, 16 and 32 slots), for choosing ``thresholds="wide"`` (bench/wide_table.py).
WORKLOADS: dict[str, Callable[[int], Workload]] = {
    "noisy-neighbour": lambda seed: NoisyNeighbour(
        heavy=160, light_clients=12, light_docs=2, doc_seconds=0.05, jitter=0.5, seed=seed
    ),
    "steady-burst": lambda seed: SteadyBurst(seed=seed),
    "heavy-mix": lambda seed: HeavyMix(seed=seed),
    "mixed-sizes": lambda seed: MixedSizes(seed=seed),
    "slow-neighbour": lambda seed: SlowNeighbour(seed=seed),
    "giant-and-medium": lambda seed: Giants(seed=seed),
    "several-giants": lambda seed: Giants(
        giants=(2000, 1200, 800),
        medium=(200, 150, 100, 60, 40, 25),
        medium_at=2.0,
        medium_gap=20.0,
        light_clients=40,
        light_spread=600.0,
        seed=seed,
    ),
    "staggered-giants": lambda seed: Giants(
        giants=(5000, 3000),
        giant_gap=30.0,
        medium=(480, 300, 220, 150, 90, 60, 45, 30, 25, 21),
        medium_at=3.0,
        medium_gap=30.0,
        light_clients=60,
        light_docs=4,
        light_spread=1200.0,
        seed=seed,
    ),
}

#: The seed every built-in workload uses unless told otherwise (the benchmarks' default).
DEFAULT_SEED = 7
