"""The fairness benchmark's pure parts: slowdown, Jain's index and the workload builders."""

from __future__ import annotations

import pytest

from workers.workload import HeavyMix, SteadyBurst, jain, slowdown


def test_slowdown_is_mean_time_in_system_over_mean_service() -> None:
    assert slowdown([0.0, 0.0], [0.05, 0.05]) == 1.0
    assert slowdown([0.1, 0.3], [0.1, 0.1]) == pytest.approx(3.0)  # (0.2 + 0.1) / 0.1


def test_slowdown_needs_one_wait_per_service() -> None:
    with pytest.raises(ValueError):
        slowdown([1.0], [])
    with pytest.raises(ValueError):
        slowdown([], [])


def test_jain_is_one_when_equal_and_one_over_n_when_one_takes_all() -> None:
    assert jain([2.0, 2.0, 2.0]) == pytest.approx(1.0)
    assert jain([5.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)
    assert jain([1.0, 3.0]) == pytest.approx(16 / (2 * 10))
    assert jain([0.0, 0.0]) == 1.0
    with pytest.raises(ValueError):
        jain([])
    with pytest.raises(ValueError):
        jain([1.0, -1.0])


def test_steady_burst_documents_are_seeded_and_grouped() -> None:
    workload = SteadyBurst(steady=3, burst=4, doc_seconds=0.05, jitter=0.5, seed=1)
    steady, burst = workload.documents()
    assert [d.client_id for d in steady] == ["steady"] * 3
    assert {d.group for d in steady} == {"light"} and {d.group for d in burst} == {"heavy"}
    assert len(burst) == 4 and workload.total == 7
    assert all(0.025 <= d.seconds <= 0.075 for d in steady + burst)
    assert workload.documents() == (steady, burst)


def test_heavy_mix_dumps_each_heavy_client_at_its_time_and_spreads_the_light_ones() -> None:
    workload = HeavyMix(
        heavy=(3, 2), heavy_gap=0.5, light_clients=2, light_docs=2, light_start=0.1, light_spread=1.0
    )
    docs = workload.documents()
    assert len(docs) == workload.total == 9
    assert [d.at for d in docs] == sorted(d.at for d in docs)
    assert [d.at for d in docs if d.client_id == "heavy0"] == [0.0] * 3
    assert [d.at for d in docs if d.client_id == "heavy1"] == [0.5] * 2
    assert [d.at for d in docs if d.group == "light"] == pytest.approx([0.1, 0.35, 0.6, 0.85])
    assert [d.document_id for d in docs if d.client_id == "heavy0"] == ["h0-0", "h0-1", "h0-2"]
