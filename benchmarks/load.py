"""Bounded load test: concurrent clients submit small experiments and poll them, for a fixed time,
against a real `seedgrid serve` (a subprocess: uvicorn on loopback, a Ray it starts for itself,
never a cluster already running here, a temporary SQLite file, the bearer token on).

After one untimed experiment has run to its end (the first runs wait seconds for Ray's workers
to start), each client loops until the time is up: submit a `collapse` experiment (tiny config, one
condition x `--seeds` seeds), poll its detail every `--poll-s` until every run has ended
(reading its runs list every fifth poll), then read its runs and statistics, and list the
newest experiments. Every request is timed; any exception or non-2xx answer is an error.
Prints p50/p99/max latency per endpoint and overall, the error count and requests/s.

    python benchmarks/load.py --clients 50 --duration-s 60
    python benchmarks/load.py --smoke         # 2 clients for 3 s, after the warm-up (CI)
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import platform
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path

import httpx

ENDED = {"completed", "partial", "failed", "cancelled"}
# --smoke's defaults: a load of a few seconds, through the same code path
SMOKE = {"clients": 2, "duration_s": 3.0, "steps": 5, "seeds": 1, "poll_s": 0.1}


class Recorder:
    def __init__(self) -> None:
        self.latencies_ms: dict[str, list[float]] = defaultdict(list)
        self.errors: Counter[str] = Counter()
        self.examples: list[str] = []

    async def request(
        self, client: httpx.AsyncClient, endpoint: str, method: str, url: str, **kwargs: object
    ) -> httpx.Response | None:
        started = time.perf_counter()
        try:
            response = await client.request(method, url, **kwargs)  # type: ignore[arg-type]
        except httpx.HTTPError as exc:
            self._error(endpoint, f"{endpoint}: {type(exc).__name__}: {exc}")
            return None
        self.latencies_ms[endpoint].append((time.perf_counter() - started) * 1000)
        if not response.is_success:
            self._error(endpoint, f"{endpoint}: {response.status_code} {response.text[:200]}")
            return None
        return response

    def _error(self, endpoint: str, example: str) -> None:
        self.errors[endpoint] += 1
        if len(self.examples) < 10:
            self.examples.append(example)


def experiment_spec(name: str, args: argparse.Namespace) -> dict[str, object]:
    """A small `collapse` experiment: one condition x `--seeds` seeds."""
    return {
        "name": name,
        "trainer": "collapse",
        "config": {"n_samples": 64, "steps": args.steps},
        "grid": {},
        "seeds": args.seeds,
        "metric": "min_l2",
    }


async def warm_up(client: httpx.AsyncClient, args: argparse.Namespace, timeout_s: float) -> float:
    """Run one experiment to its end; returns the seconds it took."""
    started = time.monotonic()
    response = await client.post("/experiments", json=experiment_spec("load-warm-up", args))
    response.raise_for_status()
    detail = f"/experiments/{response.json()['id']}"
    while (await client.get(detail)).json()["status"] not in ENDED:
        if time.monotonic() - started > timeout_s:
            raise SystemExit(f"the warm-up experiment did not end in {timeout_s} s")
        await asyncio.sleep(args.poll_s)
    return time.monotonic() - started


async def client_loop(
    client: httpx.AsyncClient,
    recorder: Recorder,
    index: int,
    deadline: float,
    args: argparse.Namespace,
) -> tuple[int, int]:
    """Returns (experiments submitted, experiments seen ending)."""
    spec = experiment_spec(f"load-{index}", args)
    submitted = ended = 0
    while time.monotonic() < deadline:
        response = await recorder.request(
            client, "POST /experiments", "POST", "/experiments", json=spec
        )
        if response is None:
            await asyncio.sleep(args.poll_s)
            continue
        submitted += 1
        experiment_id = response.json()["id"]
        polls = 0
        while time.monotonic() < deadline:
            await asyncio.sleep(args.poll_s)
            polls += 1
            detail = await recorder.request(
                client, "GET /experiments/{id}", "GET", f"/experiments/{experiment_id}"
            )
            if polls % 5 == 0:
                await recorder.request(
                    client,
                    "GET /experiments/{id}/runs",
                    "GET",
                    f"/experiments/{experiment_id}/runs",
                )
            if detail is not None and detail.json()["status"] in ENDED:
                ended += 1
                runs = await recorder.request(
                    client,
                    "GET /experiments/{id}/runs",
                    "GET",
                    f"/experiments/{experiment_id}/runs",
                )
                if runs is not None:
                    await recorder.request(
                        client,
                        "GET /runs/{id}/metrics",
                        "GET",
                        f"/runs/{runs.json()[0]['id']}/metrics",
                        params={"name": "min_l2"},
                    )
                await recorder.request(
                    client,
                    "GET /experiments/{id}/stats",
                    "GET",
                    f"/experiments/{experiment_id}/stats",
                )
                await recorder.request(
                    client, "GET /experiments", "GET", "/experiments", params={"limit": 20}
                )
                break
    return submitted, ended


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def free_port() -> int:
    """A free loopback port (service.api.server's free_port, whose import costs the whole app)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def start_service(db_path: Path, port: int, token: str, ray_cpus: int) -> subprocess.Popen:
    env = {
        **{k: v for k, v in os.environ.items() if k != "SEEDGRID_RAY_ADDRESS"},
        # a Ray of its own: without an address, ray.init joins the last one started here
        "RAY_ADDRESS": "local",
        "SEEDGRID_DATABASE_URL": f"sqlite:///{db_path}",
        "SEEDGRID_PORT": str(port),
        "SEEDGRID_API_TOKEN": token,
        "SEEDGRID_RAY_NUM_CPUS": str(ray_cpus),
        "SEEDGRID_LOG_LEVEL": "warning",
    }
    return subprocess.Popen([sys.executable, "-m", "service.cli", "serve"], env=env)


def wait_healthy(url: str, process: subprocess.Popen, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"seedgrid serve exited with {process.returncode}")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).json()["status"] == "ok":
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.25)
    raise SystemExit(f"seedgrid serve did not become healthy in {timeout_s} s")


async def run_load(url: str, token: str, args: argparse.Namespace) -> None:
    recorder = Recorder()
    limits = httpx.Limits(max_connections=args.clients, max_keepalive_connections=args.clients)
    async with httpx.AsyncClient(
        base_url=url,
        timeout=args.timeout_s,
        limits=limits,
        headers={"Authorization": f"Bearer {token}"},
    ) as client:
        warm_up_s = await warm_up(client, args, timeout_s=120.0)
        print(f"warm-up: one experiment submitted and ended in {warm_up_s:.1f} s")
        started = time.monotonic()
        deadline = started + args.duration_s
        outcomes = await asyncio.gather(
            *(client_loop(client, recorder, i, deadline, args) for i in range(args.clients))
        )
        elapsed = time.monotonic() - started
        totals = (await client.get("/experiments", params={"limit": 1})).json()
    submitted = sum(s for s, _ in outcomes)
    ended = sum(e for _, e in outcomes)

    print(
        f"\n{args.clients} clients, {elapsed:.1f} s, experiments submitted {submitted}, "
        f"seen ending {ended} (newest id {totals[0]['id'] if totals else '-'})"
    )
    print(
        f"{'endpoint':<30}{'requests':>10}{'errors':>8}{'p50 ms':>10}{'p99 ms':>10}{'max ms':>10}"
    )
    everything: list[float] = []
    for endpoint in sorted(set(recorder.latencies_ms) | set(recorder.errors)):
        values = recorder.latencies_ms[endpoint]
        everything += values
        row = (
            (f"{percentile(values, 50):>10.1f}{percentile(values, 99):>10.1f}{max(values):>10.1f}")
            if values
            else f"{'-':>10}{'-':>10}{'-':>10}"
        )
        print(
            f"{endpoint:<30}{len(values) + recorder.errors[endpoint]:>10}"
            f"{recorder.errors[endpoint]:>8}{row}"
        )
    n_errors = sum(recorder.errors.values())
    print(
        f"{'all':<30}{len(everything) + n_errors:>10}{n_errors:>8}"
        f"{percentile(everything, 50):>10.1f}{percentile(everything, 99):>10.1f}"
        f"{max(everything):>10.1f}"
    )
    print(f"requests/s {(len(everything) + n_errors) / elapsed:.1f}; errors {n_errors}")
    for example in recorder.examples:
        print("  error:", example)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--duration-s", type=float, default=60.0)
    parser.add_argument("--steps", type=int, default=50, help="collapse training steps per run")
    parser.add_argument("--seeds", type=int, default=2, help="runs per experiment")
    parser.add_argument("--poll-s", type=float, default=0.25, help="pause between polls")
    parser.add_argument("--timeout-s", type=float, default=30.0, help="per-request timeout")
    parser.add_argument("--ray-cpus", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="2 clients for 3 s (CI)")
    args = parser.parse_args(argv)
    if args.smoke:
        parser.set_defaults(**SMOKE)
        args = parser.parse_args(argv)

    print(
        f"machine: {cpu_model()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, {platform.platform()}"
    )
    token = secrets.token_hex(16)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        process = start_service(Path(tmp) / "load.db", port, token, args.ray_cpus)
        try:
            wait_healthy(url, process)
            asyncio.run(run_load(url, token, args))
        finally:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


if __name__ == "__main__":
    main()
