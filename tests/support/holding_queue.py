"""A client's holding queue as ``GateStore.release`` takes from it, for the gate's store
tests: the store only counts, and a held document's message waits in the broker."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable


class Document:
    def __init__(self, queue: Queue, task_id: str, units: int) -> None:
        self.queue, self.task_id, self.units = queue, task_id, units

    def send(self) -> None:
        if self.queue.fail_release:
            raise ConnectionError("the broker went away")
        self.queue.released.append(self.task_id)
        if self.queue.on_send is not None:
            self.queue.on_send(self.task_id)

    def drop(self) -> None:
        self.queue.dropped.append(self.task_id)

    def put_back(self) -> None:
        self.queue.waiting.appendleft((self.task_id, self.units))


class Queue:
    """A client's holding queue: (task id, units) oldest first, and what was released."""

    def __init__(self) -> None:
        self.waiting: deque[tuple[str, int]] = deque()
        self.released: list[str] = []
        self.dropped: list[str] = []
        self.fail_release = False
        #: Called with each task id sent: a worker receiving the released document at once.
        self.on_send: Callable[[str], object] | None = None

    def take(self) -> Document | None:
        return Document(self, *self.waiting.popleft()) if self.waiting else None
