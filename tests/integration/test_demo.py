"""``priority-router demo`` end to end, as a user runs it."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest
from support.services import counter_db_url, free_port

from priority_router.demo.local_redis import redis_answers
from priority_router.demo.run import redis_for_demo

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
    # An ops shell's own broker, which Celery would prefer to the demo's: nothing answers there.
    env = {**demo_env, "CELERY_BROKER_URL": f"redis://127.0.0.1:{free_port()}/0"}
    done = subprocess.run(
        [*PROGRAM, *args], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "(from REDIS_URL)" in out
    assert re.search(r"Ignoring [A-Z_, ]*CELERY_BROKER_URL[A-Z_, ]* from the environment", out), out
    assert "plain Celery" in out and "with priority-router" in out
    assert re.search(r"start\s+\d+x\s+sooner\s+at\s+p95", out), out
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pids = worker_pids(out)
    assert len(pids) == 4
    assert not [p for p in pids if alive(p)]


def test_the_demo_refuses_a_redis_url_it_cannot_split_into_databases() -> None:
    url = "redis+sentinel://127.0.0.1:26379/documents/5"
    refusal = r"not a plain Redis URL.*--redis-url redis://HOST:PORT"
    with pytest.raises(SystemExit, match=refusal), redis_for_demo(url):
        pass


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


ROOT = Path(__file__).resolve().parents[2]


def installed_python(tmp: Path) -> Path:
    """An interpreter that sees priority_router as a wheel installs it: a copy of the package
    beside this environment's dependencies, without matplotlib (no ``plot`` extra) and
    without the checkout on sys.path.  (``-P`` or a PYTHONPATH cannot do that here: the
    editable install's .pth file puts the repository root, and so ``workers``, on the path
    of every process of .venv's interpreter, the demo's workers included.)"""
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python"
    site_packages = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    installed = tmp / "installed"
    shutil.copytree(
        ROOT / "priority_router", installed / "priority_router", ignore=shutil.ignore_patterns("__pycache__")
    )
    no_plot = tmp / "no-plot-extra"
    (no_plot / "matplotlib").mkdir(parents=True)
    (no_plot / "matplotlib" / "__init__.py").write_text(
        "raise ImportError('the plot extra is not installed')\n"
    )
    # Lines of a .pth file are appended to sys.path; the .pth files in those folders (the
    # editable install's) are not read.
    dependencies = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    paths = [str(installed), str(no_plot), *sorted(dependencies)]
    (Path(site_packages) / "dependencies.pth").write_text("\n".join(paths) + "\n")
    return python


def table_row(output: str, run: str) -> list[float]:
    """The numbers of one run's row of the demo's table: light p50, light p95, heavy p50,
    heavy p95 (ms) and all done (s)."""
    (cells,) = [line.split(run, 1)[1] for line in output.splitlines() if line.startswith(f"│ {run} ")]
    return [float(n) for n in re.findall(r"\d+(?:\.\d+)?", cells)]


def test_the_demo_runs_as_installed_from_a_wheel(redis_server_url: str, tmp_path: Path) -> None:
    python = installed_python(tmp_path / "env")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "REDIS_URL")}

    def printed(code: str) -> str:
        run = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True, cwd=elsewhere)
        assert run.returncode == 0, run.stderr
        return run.stdout.strip()

    # The repository's workers/ is out of reach; the package is the copy, not the checkout.
    assert printed("import importlib.util; print(importlib.util.find_spec('workers'))") == "None"
    where = printed("import priority_router; print(priority_router.__file__)")
    assert where.startswith(str(tmp_path / "env" / "installed")), where
    # The directory it runs from has a workers/ package of its own, which must not be used.
    (tmp_path / "workers").mkdir()
    (tmp_path / "workers" / "__init__.py").write_text("raise ImportError('the user workers package')\n")
    chart = tmp_path / "demo.png"
    args = ["--heavy", "60", "--light-clients", "4", "--light-docs", "2", "--workers", "1", "--threads", "2"]
    args += ["--redis-url", counter_db_url(redis_server_url), "--chart", str(chart)]
    done = subprocess.run(
        [python, "-m", "priority_router", "demo", *args],
        env={**env, "COLUMNS": "120"},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "(from --redis-url)" in output
    plain, routed = table_row(done.stdout, "plain Celery"), table_row(done.stdout, "with priority-router")
    assert len(plain) == len(routed) == 5, done.stdout
    # Light clients' p95 wait: behind the heavy backlog on plain Celery, ahead of it with the router.
    assert routed[1] < plain[1], done.stdout
    assert re.search(r"start\s+\d+x\s+sooner\s+at\s+p95", done.stdout), done.stdout
    # No matplotlib: the table, and the chart's fix said once.
    assert (
        " ".join(output.split()).count("the chart needs matplotlib (pip install 'priority-router[plot]')")
        == 1
    )
    assert "Chart:" not in output
    assert not chart.exists()
    pids = worker_pids(done.stdout)
    assert len(pids) == 2
    assert not [p for p in pids if alive(p)]
