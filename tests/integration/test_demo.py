"""``priority-router demo`` end to end, as a user runs it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.services import counter_db_url, free_port

from workers.demo import redis_for_demo
from workers.local_redis import redis_answers

PROGRAM = [sys.executable, "-m", "priority_router", "demo"]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purpose; only our own children could be reaped by us.
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "State:\tZ" not in status.read_text()


def worker_pids(output: str) -> list[int]:
    return [int(p) for group in re.findall(r"pids ([\d, ]+)\)", output) for p in group.split(", ")]


@pytest.fixture
def demo_env(redis_server_url: str) -> dict[str, str]:
    return {**os.environ, "REDIS_URL": counter_db_url(redis_server_url), "COLUMNS": "120"}


def test_demo_compares_plain_celery_and_the_router(demo_env: dict[str, str], tmp_path: Path) -> None:
    chart = tmp_path / "demo.png"
    # A user's own project may have a workers/ package of its own: the demo uses the repository's.
    (tmp_path / "workers").mkdir()
    (tmp_path / "workers" / "__init__.py").write_text("raise ImportError('the user workers package')\n")
    args = ["--heavy", "80", "--light-clients", "4", "--light-docs", "2", "--chart", str(chart)]
    done = subprocess.run(
        [*PROGRAM, *args], env=demo_env, capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "(from REDIS_URL)" in out
    assert "plain Celery" in out and "with priority-router" in out
    assert re.search(r"start\s+\d+x\s+sooner\s+at\s+p95", out), out
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pids = worker_pids(out)
    assert len(pids) == 4
    assert not [p for p in pids if alive(p)]


def test_ctrl_c_stops_every_worker(demo_env: dict[str, str], tmp_path: Path) -> None:
    log = tmp_path / "demo.log"
    with log.open("w") as out:
        demo = subprocess.Popen(
            [*PROGRAM, "--heavy", "3000", "--chart", str(tmp_path / "x.png")],
            env=demo_env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
        )
    try:
        deadline = time.monotonic() + 60
        while not worker_pids(log.read_text()):
            assert demo.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        time.sleep(1)
        demo.send_signal(signal.SIGINT)
        assert demo.wait(60) == 130, log.read_text()
    finally:
        if demo.poll() is None:
            demo.kill()
    output = log.read_text()
    assert "interrupted" in output
    pids = worker_pids(output)
    assert pids
    assert not [p for p in pids if alive(p)]
    assert not (tmp_path / "x.png").exists()


def test_without_any_redis_the_demo_starts_and_stops_its_own(monkeypatch: pytest.MonkeyPatch) -> None:

    monkeypatch.delenv("REDIS_URL", raising=False)
    nowhere = f"redis://127.0.0.1:{free_port()}"
    with redis_for_demo(local=nowhere) as url:
        assert url != nowhere
        assert redis_answers(url)
    assert not redis_answers(url)
