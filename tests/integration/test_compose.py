import os
import shutil
import subprocess

import pytest
from support.services import IN_CI, ROOT


@pytest.mark.parametrize("profile", [[], ["--profile", "rabbitmq"]])
def test_compose_file_is_valid(profile: list[str]) -> None:
    if shutil.which("docker-compose") is None:
        reason = "docker-compose is not installed (Debian: apt-get install docker-compose)"
        if IN_CI:
            pytest.fail(reason + "; .ci/run installs it")
        pytest.skip(reason)
    proc = subprocess.run(
        ["docker-compose", "--env-file", ".env.example", *profile, "config"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith(("BROKER", "FLOWER", "RABBITMQ"))},
    )
    assert proc.returncode == 0, proc.stderr
    for service in ("redis", "rabbitmq", "worker", "flower", "producer"):
        assert f"  {service}:" in proc.stdout
    assert "FLOWER_BASIC_AUTH: admin:change-me" in proc.stdout
    assert "healthcheck" in proc.stdout
    assert "PRIORITY_ROUTER_METRICS_PORT: '9808'" in proc.stdout
    # Flower runs with the workers' app, so its broker page counts every priority sub-queue.
    assert "- -A\n    - workers.app\n    - flower" in proc.stdout
    # Secrets come from the environment only, never the compose file itself.
    assert "change-me" not in (ROOT / "docker-compose.yml").read_text()
