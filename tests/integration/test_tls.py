"""The counter store over TLS (``rediss://``) against a real TLS-enabled redis-server."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery
from support.services import IN_CI, free_port

from priority_router import ConfigurationError, PriorityRouter
from priority_router.integration.install import settings_error

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
