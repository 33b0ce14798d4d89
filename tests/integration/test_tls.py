"""The counter store over TLS (``rediss://``) against a real TLS-enabled redis-server."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis
from celery import Celery
from click.testing import CliRunner
from support.services import IN_CI, counter_db_url, free_port, running_worker

from priority_router import ConfigurationError, PriorityRouter
from priority_router.integration.install import settings_error
from priority_router.ops.cli import main
from workers.app import create_app

REDIS_SERVER = "/usr/bin/redis-server"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    if not (Path(REDIS_SERVER).exists() and shutil.which("openssl")):
        reason = "a TLS-capable redis-server (Debian's) and openssl are needed"
        if IN_CI:
            pytest.fail(reason)
        pytest.skip(reason)
    d = tmp_path_factory.mktemp("tls")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test-ca",
             "-keyout", "ca.key", "-out", "ca.pem", cwd=d)  # fmt: skip
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
             "-keyout", "server.key", "-out", "server.csr", cwd=d)  # fmt: skip
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", "1", "-extfile", "san.ext", "-out", "server.pem", cwd=d)  # fmt: skip
    port = free_port()
    server = subprocess.Popen(
        [REDIS_SERVER, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", "server.pem", "--tls-key-file", "server.key", "--tls-ca-cert-file", "ca.pem",
         "--tls-auth-clients", "no", "--requirepass", "s3cret-pw", "--save", "", "--appendonly", "no",
         "--dir", str(d)],
        cwd=d, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    time.sleep(0.5)
    if server.poll() is not None:
        pytest.fail(f"{REDIS_SERVER} did not start with TLS")
    yield port, d / "ca.pem"
    server.terminate()
    server.wait(10)


def test_rediss_url_counts_over_tls(tls_redis: tuple[int, Path], key_prefix: str) -> None:
    port, ca = tls_redis
    url = f"rediss://:s3cret-pw@127.0.0.1:{port}/0?ssl_ca_certs={ca}&ssl_cert_reqs=required"
    router = PriorityRouter(redis_url=url, key_prefix=key_prefix, connect_timeout=2, socket_timeout=2)
    assert [router.record("acme").pending for _ in range(3)] == [0, -1, -2]
    assert "s3cret-pw" not in repr(router)


def test_a_tls_failure_fails_open_without_leaking_the_password(
    tls_redis: tuple[int, Path], key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    port, _ = tls_redis
    # No CA given: the server's certificate cannot be verified, so every check fails.
    url = f"rediss://:s3cret-pw@127.0.0.1:{port}/0?ssl_cert_reqs=required"
    router = PriorityRouter(redis_url=url, key_prefix=key_prefix, connect_timeout=2, socket_timeout=2)
    decision = router.decide("acme")
    assert (decision.priority, decision.reason.value) == (1, "local")
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "priority counter" in logged
    assert "s3cret-pw" not in logged


def test_a_misspelt_tls_parameter_is_refused_when_the_settings_are_read(
    tls_redis: tuple[int, Path], key_prefix: str
) -> None:
    """redis-py passes every query parameter on: ``ssl_ca_cert`` (no s) was accepted and
    raised a TypeError at the first publish. It is refused with its spelling, and the right
    one counts over TLS."""
    port, ca = tls_redis
    url = f"rediss://:s3cret-pw@127.0.0.1:{port}/0?ssl_ca_cert={ca}&ssl_cert_reqs=required"
    with pytest.raises(ConfigurationError) as info:
        PriorityRouter(redis_url=url, key_prefix=key_prefix)
    assert "'ssl_ca_cert'" in str(info.value)
    assert "Fix: use ssl_ca_certs" in str(info.value)
    assert "s3cret-pw" not in str(info.value)
    app = Celery("tls-typo", broker="memory://", set_as_current=False)
    app.conf.priority_router_redis_url = url
    PriorityRouter(key_prefix=key_prefix).install(app)
    error = settings_error(app)
    assert error is not None and "ssl_ca_certs" in str(error)
    fixed = PriorityRouter(redis_url=url.replace("ssl_ca_cert=", "ssl_ca_certs="), key_prefix=key_prefix)
    assert fixed.record("acme").pending == 0


def test_doctor_names_ssl_ca_certs_when_the_certificate_cannot_be_verified(
    tls_redis: tuple[int, Path], redis_server_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from support.services import broker_db_url
    from test_redis_acl import doctor_on_store

    port, _ = tls_redis
    url = f"rediss://:s3cret-pw@127.0.0.1:{port}/0?ssl_cert_reqs=required"
    finding = doctor_on_store(tmp_path, monkeypatch, url, broker_db_url(redis_server_url))
    assert "TLS handshake" in finding["detail"] and "s3cret-pw" not in finding["detail"], finding
    assert "ssl_ca_certs=" in finding["fix"] and "start Redis" not in finding["fix"], finding


@pytest.mark.parametrize("mode", ["seed", "inflight"])
def test_the_documented_acl_users_run_a_publisher_a_capped_worker_and_the_cli_over_tls(
    mode: str, tls_redis: tuple[int, Path], worker_env: dict[str, str], redis_server_url: str, key_prefix: str
) -> None:
    """The field trial's shape: the counter store behind TLS, each role a least-privilege ACL
    user made from docs/deployment.md's lines, the CA given with ``ssl_ca_certs``."""
    from test_redis_acl import TRACK, _cli, _documented_lines

    port, ca = tls_redis
    tls = f"127.0.0.1:{port}/0?ssl_ca_certs={ca}&ssl_cert_reqs=required"
    admin = redis.Redis.from_url(f"rediss://:s3cret-pw@{tls}")
    admin.acl_log_reset()
    urls = {}
    for role, line in _documented_lines().items():
        user = f"pr-tls-{role}-{uuid.uuid4().hex[:6]}"
        words = [w.replace("priority-router:", key_prefix) for w in shlex.split(line)]
        words = [w.replace(">CHANGE-ME", f">pw-{user}") for w in words]
        words[2] = user
        admin.execute_command(*words)
        urls[role] = f"rediss://{user}:pw-{user}@{tls}"
    try:
        _cli(urls["cli"], key_prefix, "--mode", mode, "tier", "set", "bulk", "--max-in-flight", "1")
        runs = f"runs-{uuid.uuid4().hex[:8]}"
        env = {**worker_env, "PRIORITY_ROUTER_MODE": mode, "RUNS_REDIS_URL": counter_db_url(redis_server_url)}
        env["RUNS_KEY"] = runs
        app = create_app({**env, "PRIORITY_ROUTER_REDIS_URL": urls["publisher"]})
        sent = [app.send_task(TRACK, kwargs={"seconds": 0.2, "client_id": "bulk"}) for _ in range(4)]
        sent += [app.send_task("tests.record_request", kwargs={"client_id": "light"})]
        with running_worker(
            {**env, "PRIORITY_ROUTER_REDIS_URL": urls["worker"]}, "-P", "threads", "-c", "3"
        ) as w:
            done = [r.get(timeout=60) for r in sent]
            log = w.output()
        app.close()
        seen = redis.Redis.from_url(counter_db_url(redis_server_url))
        assert int(seen.hget(runs, "max:bulk") or 0) == 1, log  # the cap held, over TLS
        seen.delete(runs)
        assert done[-1]["reason"] == "counted", done[-1]  # the publisher's user counted it
        assert "refuses" not in log and "not answering" not in log, log
        assert "light" in _cli(urls["cli"], key_prefix, "--mode", mode, "inspect", "light")
        _cli(urls["cli"], key_prefix, "--mode", mode, "tier", "unset", "bulk")
        users = {urlsplit(url).username for url in urls.values()}
        assert [e for e in admin.acl_log() if e.get("username") in users] == []
        # A wrong password is said as one, not as a store that does not answer.
        wrong = CliRunner().invoke(
            main,
            ["--redis-url", urls["cli"].replace(":pw-", ":not-", 1), "--key-prefix", key_prefix, "status"],
        )
        assert wrong.exit_code == 1 and "refuses the URL's user or password" in wrong.output, wrong.output
        assert "does not answer" not in wrong.output, wrong.output
    finally:
        for url in urls.values():
            admin.acl_deluser(urlsplit(url).username)
        admin.close()
