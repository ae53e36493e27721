"""A real multi-node Ray cluster on this one machine, for tests: `ray start --head` and worker
nodes that join it, each node in its own process session, and a `seedgrid serve` subprocess
driving it over HTTP.

Why a session per node: `ray stop` stops every Ray process on the machine (the pytest process's
own local Ray and other people's included), so a node is stopped by killing the processes of
its session instead. Every process of a node stays in the session of its `ray start` (Ray's
worker processes make their own process group but keep the session), so
`kill_node` takes down exactly one node: its raylet, object store, agents and workers.

Linux only (it reads /proc), like `ray start` itself.
"""

from __future__ import annotations

import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import Service

# Our fixed ports come from below the kernel's ephemeral range, where neither the OS (for
# outgoing connections) nor Ray (it asks the OS for free ports) picks.
FIXED_PORT_RANGE = (20_000, 32_000)
NODE_START_TIMEOUT_S = 60.0
SERVICE_START_TIMEOUT_S = 90.0
OBJECT_STORE_BYTES = 100 * 1024 * 1024
# `ray::<task name>` is the process title of a worker while it runs a task; the dispatcher names
# each task `seedgrid-run-<run id>`.
RUN_TITLE_PREFIX = "ray::seedgrid-run-"


@dataclass(frozen=True)
class Proc:
    pid: int
    session: int
    state: str  # Z: a zombie, already dead
    comm: str
    title: str  # the command line, or what the process set as its title


def processes() -> list[Proc]:
    """Every process of the machine, read from /proc."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            title = Path(entry.path, "cmdline").read_bytes()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue  # ended while we looked
        # comm is in parentheses and may itself hold spaces or parentheses
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        state, _ppid, _pgrp, session = stat[stat.rindex(")") + 2 :].split()[:4]
        found.append(
            Proc(
                int(entry.name),
                int(session),
                state,
                comm,
                title.replace(b"\0", b" ").decode(errors="replace").strip(),
            )
        )
    return found


def run_ids_of(proc: Proc) -> list[int]:
    """The seedgrid runs a Ray worker process is executing now: one, the seeds of a
    seed-batched task ("seedgrid-run-7,8,9"), or none."""
    if proc.state == "Z" or not proc.title.startswith(RUN_TITLE_PREFIX):
        return []
    return [int(i) for i in proc.title.removeprefix(RUN_TITLE_PREFIX).split()[0].split(",")]


def alive_in_sessions(sessions: Iterable[int]) -> list[Proc]:
    wanted = set(sessions)
    return [p for p in processes() if p.session in wanted and p.state != "Z"]


def kill_sessions(sessions: Iterable[int], timeout_s: float = 15.0) -> None:
    """SIGKILL every process of these sessions (again for any started meanwhile) until none
    is left alive."""
    wanted = set(sessions)
    deadline = time.monotonic() + timeout_s
    while left := alive_in_sessions(wanted):
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes survived SIGKILL: {[(p.pid, p.title) for p in left]}")
        for proc in left:
            try:
                os.kill(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def free_port(taken: set[int]) -> int:
    """A port below the ephemeral range that nothing listens on, and not in `taken`."""
    for _ in range(200):
        port = random.randrange(*FIXED_PORT_RANGE)
        if port in taken:
            continue
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
        taken.add(port)
        return port
    raise RuntimeError(f"no free port in {FIXED_PORT_RANGE}")


def _console_script(name: str, module: str) -> list[str]:
    """The command as installed next to this Python, else its module run by this Python."""
    script = Path(sys.executable).with_name(name)
    return [str(script)] if script.exists() else [sys.executable, "-m", module]


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


@dataclass
class RayNode:
    name: str
    num_cpus: int
    num_gpus: int
    process: subprocess.Popen[bytes]  # `ray start --block`, leader of the node's session
    log_path: Path
    node_id: str = ""  # Ray's hex node id, read from the raylet's command line once it is up

    @property
    def session(self) -> int:
        return self.process.pid

    def alive_processes(self) -> list[Proc]:
        return alive_in_sessions([self.session])

    def running_runs(self) -> set[int]:
        """The seedgrid runs this node's workers are executing now."""
        return {r for p in self.alive_processes() for r in run_ids_of(p)}


class LocalRayCluster:
    """A head node and worker nodes started with `ray start --block` on this machine.

    All nodes share one temp dir of our own (Ray puts a joining node's files in the head's session
    directory anyway) and one random cluster token (RAY_AUTH_MODE=token; set explicitly because a
    joining `ray start` does not pick up ~/.ray/auth_token by itself, and so that no file of the
    user's home is read or written).
    """

    def __init__(self) -> None:
        # short: Unix socket paths under it must stay below 108 bytes
        self.root = Path(tempfile.mkdtemp(prefix="sg-ray-", dir="/tmp"))
        self.ports: set[int] = set()
        self.nodes: list[RayNode] = []
        self.address = ""
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        self.env.update(
            RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32), RAY_USAGE_STATS_ENABLED="0"
        )
        self._ray = _console_script("ray", "ray.scripts.scripts")

    def _start(
        self, name: str, args: list[str], num_cpus: int, num_gpus: int, env: dict[str, str]
    ) -> RayNode:
        log_path = self.root / f"{name}.log"
        command = [
            *self._ray,
            "start",
            "--block",
            "--disable-usage-stats",
            "--node-name",
            name,
            "--node-ip-address",
            "127.0.0.1",
            "--num-cpus",
            str(num_cpus),
            "--num-gpus",
            str(num_gpus),
            "--object-store-memory",
            str(OBJECT_STORE_BYTES),
            # 0: workers bind to ports the OS picks (the default range is shared
            # between nodes on one machine)
            "--min-worker-port",
            "0",
            "--max-worker-port",
            "0",
            "--dashboard-agent-listen-port",
            str(free_port(self.ports)),
            *args,
        ]
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        node = RayNode(name, num_cpus, num_gpus, process, log_path)
        self.nodes.append(node)
        return node

    def start_head(self, num_cpus: int, **ray_config: str) -> RayNode:
        """The head; `ray_config` becomes RAY_<name> variables of its processes (GCS settings)."""
        env = {**self.env, **{f"RAY_{k}": v for k, v in ray_config.items()}}
        head = self._start(
            "head",
            [
                "--head",
                "--port",
                str(free_port(self.ports)),
                "--temp-dir",
                str(self.root),
                "--include-dashboard",
                "false",
                "--dashboard-port",
                str(free_port(self.ports)),
            ],
            num_cpus,
            0,
            env,
        )
        self.wait_ready(head)
        self.address = (self.root / "ray_current_cluster").read_text().strip()
        return head

    def add_node(self, name: str, num_cpus: int, num_gpus: int) -> RayNode:
        """A worker node joining the head; `wait_ready` it before relying on it.

        Returns once the node's raylet has bound its sockets: nodes of one session on one
        machine name their raylet and object store sockets by the first unused number, so a
        node started before the previous one's sockets exist takes the same names and dies."""
        assert self.address, "start the head first"
        node = self._start(name, ["--address", self.address], num_cpus, num_gpus, self.env)
        deadline = time.monotonic() + NODE_START_TIMEOUT_S
        while not self._sockets_bound(node):
            if node.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{node.name}'s raylet did not start:\n{_tail(node.log_path)}")
            time.sleep(0.05)
        return node

    @staticmethod
    def _sockets_bound(node: RayNode) -> bool:
        raylets = [p for p in node.alive_processes() if p.comm == "raylet"]
        if not raylets:
            return False
        flags = ("--raylet_socket_name=", "--store_socket_name=")
        paths = [a.split("=", 1)[1] for a in raylets[0].title.split() if a.startswith(flags)]
        return len(paths) == 2 and all(os.path.exists(p) for p in paths)

    def wait_ready(self, node: RayNode, timeout_s: float = NODE_START_TIMEOUT_S) -> None:
        """Until `ray start` reports the node started (registered with the GCS) and its raylet
        runs; reads its node id then."""
        deadline = time.monotonic() + timeout_s
        while True:
            if node.process.poll() is not None:
                raise RuntimeError(
                    f"ray start of {node.name} exited with "
                    f"{node.process.returncode}:\n{_tail(node.log_path)}"
                )
            started = b"Ray runtime started" in node.log_path.read_bytes()
            raylets = [p for p in node.alive_processes() if p.comm == "raylet"]
            if started and raylets:
                flag = next(a for a in raylets[0].title.split() if a.startswith("--node_id="))
                node.node_id = flag.removeprefix("--node_id=")
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{node.name} did not start in {timeout_s} s:\n{_tail(node.log_path)}"
                )
            time.sleep(0.1)

    def kill_node(self, node: RayNode) -> None:
        """Every process of one node dies at once, as in a machine crash."""
        kill_sessions([node.session])
        node.process.wait(10)

    def shutdown(self) -> None:
        kill_sessions([n.session for n in self.nodes])
        for node in self.nodes:
            node.process.wait(10)
        shutil.rmtree(self.root, ignore_errors=True)

    def sessions(self) -> list[int]:
        return [n.session for n in self.nodes]


class ServiceProcess(Service):
    """`seedgrid serve` (API + dispatcher) in a subprocess, joined to a `LocalRayCluster`, on a
    SQLite file; reached over HTTP like conftest's in-process `Service`."""

    def __init__(
        self, cluster: LocalRayCluster, db_path: Path, *args: str, **settings: str
    ) -> None:
        """`args`: more of `seedgrid serve`'s arguments; `settings`: SEEDGRID_* variables."""
        # Service's own __init__ wants an in-process server; its other helpers only need these.
        port = free_port(cluster.ports)
        self.db_path = db_path
        self.database_url = f"sqlite:///{db_path}"
        self.log_path = db_path.with_suffix(".log")
        self._engine = None
        env = {
            **cluster.env,
            "SEEDGRID_RAY_ADDRESS": cluster.address,
            "SEEDGRID_DATABASE_URL": self.database_url,
            "SEEDGRID_PORT": str(port),
            "SEEDGRID_LOG_LEVEL": "warning",
            **settings,
        }
        command = [*_console_script("seedgrid", "service.cli"), "serve", *args]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)

    @property
    def session(self) -> int:
        return self.process.pid

    def wait_healthy(
        self, cpus: float, gpus: float, timeout_s: float = SERVICE_START_TIMEOUT_S
    ) -> dict[str, Any]:
        """Until /healthz answers ok and the service's Ray sees these cluster totals."""
        deadline = time.monotonic() + timeout_s
        health: dict[str, Any] = {}
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"seedgrid serve exited with {self.process.returncode}:\n{_tail(self.log_path)}"
                )
            try:
                health = self.client.get("/healthz").json()
            except httpx.HTTPError:
                health = {}
            resources = health.get("cluster_resources", {})
            if (
                health.get("status") == "ok"
                and resources.get("CPU") == cpus
                and resources.get("GPU", 0) == gpus  # no GPU: no "GPU" key
            ):
                return health
            time.sleep(0.2)
        raise RuntimeError(
            f"seedgrid serve not healthy with {cpus} CPUs and {gpus} GPUs in "
            f"{timeout_s} s: {health}\n{_tail(self.log_path)}"
        )

    def run(self, run_id: int) -> dict[str, Any]:
        response = self.client.get(f"/runs/{run_id}")
        assert response.status_code == 200, response.text
        return response.json()

    def close(self) -> None:
        """SIGTERM (uvicorn shuts down, the dispatcher re-queues what runs), then SIGKILL."""
        self.client.close()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                pass
        kill_sessions([self.session])
        self.process.wait(10)
        if self._engine is not None:
            self._engine.dispose()


@dataclass
class RunActivity:
    """What the worker processes of the cluster were seen running, sample by sample."""

    # per sample: node name -> run ids its workers were running
    samples: list[dict[str, frozenset[int]]] = field(default_factory=list)
    # run id -> {(node name, worker pid)} it was seen running on
    placements: dict[int, set[tuple[str, int]]] = field(default_factory=lambda: defaultdict(set))

    def max_concurrent(self) -> dict[str, int]:
        """Per node, the most runs seen running at once in two consecutive samples: reading
        /proc is not atomic, so one sample can see a worker before it retitles itself idle and
        the worker that starts the next run on the freed GPU share after it took its title."""
        most: dict[str, int] = defaultdict(int)
        for now, after in zip(self.samples, self.samples[1:], strict=False):
            for node, runs in now.items():
                most[node] = max(most[node], len(runs & after.get(node, frozenset())))
        return dict(most)


class RunWatcher(threading.Thread):
    """Samples, from /proc, which seedgrid run each worker process of each node is executing:
    an observation made outside seedgrid and Ray, to check where runs went and how many a
    node ran at once."""

    def __init__(self, cluster: LocalRayCluster, interval_s: float = 0.05) -> None:
        super().__init__(name="run-watcher", daemon=True)
        self.node_by_session = {n.session: n.name for n in cluster.nodes}
        self.interval_s = interval_s
        self.activity = RunActivity()
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            sample: dict[str, set[int]] = defaultdict(set)
            for proc in processes():
                node = self.node_by_session.get(proc.session)
                if node is None:
                    continue
                for run_id in run_ids_of(proc):
                    sample[node].add(run_id)
                    self.activity.placements[run_id].add((node, proc.pid))
            self.activity.samples.append({k: frozenset(v) for k, v in sample.items()})
            self._halt.wait(self.interval_s)

    def __enter__(self) -> RunActivity:
        self.start()
        return self.activity

    def __exit__(self, *exc: object) -> None:
        self._halt.set()
        self.join(5)
