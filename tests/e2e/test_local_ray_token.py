"""The local Ray that `seedgrid serve` starts (no SEEDGRID_RAY_ADDRESS) takes Ray's token
authentication with a token of its own: a driver that reaches its GCS without that token is
refused, one with it joins. Ray 2.60's servers listen on every interface whatever the node
address given (ray.init maps a loopback address to the machine's own), so the token is what
keeps out anyone who reaches the machine: before, Ray's default token came from
~/.ray/auth_token, shared by every local Ray of the user, or none at all where the operator's
environment turned it off by default."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from service.api.server import free_port
from tests.cluster import alive_in_sessions, kill_sessions
from tests.seedgrid_process import SeedgridProcess

ACTIVE = re.compile(r"dispatcher \S+ is active")
JOIN = (
    "import ray; ray.init(address={address!r}, log_to_driver=False); "
    "print('joined', int(ray.cluster_resources()['CPU']))"
)


def environ(pid: int) -> dict[str, str]:
    pairs = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(p.decode(errors="replace").split("=", 1) for p in pairs if b"=" in p)


@pytest.mark.timeout(240)
def test_the_local_ray_of_serve_refuses_a_driver_without_its_own_token(tmp_path: Path) -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SEEDGRID_", "RAY_AUTH_")) and k != "RAY_ADDRESS"
    }
    env.update(
        SEEDGRID_DATABASE_URL=f"sqlite:///{tmp_path / 'seedgrid.db'}",
        SEEDGRID_RAY_NUM_CPUS="1",
        SEEDGRID_PORT=str(free_port()),
        SEEDGRID_LOG_LEVEL="info",
    )
    serve = SeedgridProcess("serve", ["serve"], env, tmp_path)
    session = serve.process.pid
    try:
        serve.wait_for_log(ACTIVE, timeout_s=120)
        ray_processes = {p.comm: p for p in alive_in_sessions([session])}
        gcs, raylet = ray_processes["gcs_server"], ray_processes["raylet"]
        # the token every Ray process of it runs with: its own, not the user's token file
        seen = environ(gcs.pid)
        assert seen.get("RAY_AUTH_MODE") == "token", seen.get("RAY_AUTH_MODE")
        token = seen.get("RAY_AUTH_TOKEN", "")
        assert len(token) >= 32, "no token of its own"
        assert environ(raylet.pid).get("RAY_AUTH_TOKEN") == token
        user_file = Path.home() / ".ray" / "auth_token"
        assert not user_file.is_file() or user_file.read_text().strip() != token
        (address,) = set(re.findall(r"--gcs-address=(\S+)", raylet.title))

        def join(**auth: str) -> subprocess.CompletedProcess[str]:
            # HOME elsewhere: no ~/.ray/auth_token of the user's to fall back on; two tries
            # of the GCS, not Ray's 20 (a refused driver retried for 20 s)
            driver_env = {**env, "HOME": str(tmp_path), "RAY_NUM_REDIS_GET_RETRIES": "2", **auth}
            return subprocess.run(
                [sys.executable, "-c", JOIN.format(address=address)],
                env=driver_env,
                capture_output=True,
                text=True,
                timeout=120,
            )

        for refused in (join(), join(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="x" * 43)):
            assert refused.returncode != 0 and "joined" not in refused.stdout, refused.stdout
            assert "InvalidAuthToken" in refused.stderr, refused.stderr[-2000:]
        right = join(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
        assert right.returncode == 0 and "joined 1" in right.stdout, right.stderr[-2000:]
    finally:
        serve.terminate()
        kill_sessions([session])
