"""The local Redis Sentinel setup, ``workers.sentinel`` (the benchmarks use it too)."""

from workers.sentinel import DOWN_AFTER_MS, SERVICE, LocalSentinel, running_sentinel  # noqa: F401
