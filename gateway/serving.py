"""How `slipstream serve` runs: the checks it makes before it says it is serving (the port is free, a
policy's fixed team key is not exposed beyond this machine without a word, the admin key is not in
argv), and the uvicorn server with the edge limits (gateway/edge.py) that tests start the same way."""

from __future__ import annotations

import ipaddress
import resource
import socket
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import uvicorn
from uvicorn.supervisors import Multiprocess

from gateway.edge import EdgeConfig, EdgeLimits
from sdk.observability.exposition import shared_metrics_dir
from sdk.policy import Policy

# What every server of the proxy runs with, `slipstream serve` and gateway/testing.py alike.
SERVER_OPTIONS: dict[str, Any] = {"loop": "uvloop", "log_level": "warning", "access_log": False}
_SPARE_FDS = 256  # beyond the client connections: upstream connections, files, Redis, the log


def server_config(app: Any, edge: EdgeLimits, **options: Any) -> EdgeConfig:
    return EdgeConfig(app, edge, **{**SERVER_OPTIONS, **options})


def run_server(config: EdgeConfig) -> None:
    """`uvicorn.run`, with our config class: one process, or `config.workers` sharing one socket;
    each serving process settles its garbage collector once its app is loaded (gateway/collector.py).
    Workers write their metrics where every one of them can read all (sdk/observability/exposition.py)."""
    config.serving = True
    if config.workers > 1:
        with shared_metrics_dir():  # one /metrics page for all of them (sdk/observability/exposition.py)
            Multiprocess(config, sockets=[config.bind_socket()]).run()
    else:
        uvicorn.Server(config).run()


def file_limit_warning(edge: EdgeLimits) -> str | None:
    """Raise the open-file limit to fit the connection cap (up to the hard limit); say so when it cannot."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = edge.max_connections + _SPARE_FDS
    if soft != resource.RLIM_INFINITY and soft < wanted:
        soft = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    if soft != resource.RLIM_INFINITY and soft < wanted:
        return (f"the open-file limit ({soft}) is below --max-connections {edge.max_connections} plus {_SPARE_FDS} spare: "
                "past it new connections fail at accept; raise `ulimit -n` or lower --max-connections")
    return None


def admin_key_from(given: str | None, file: Path | None) -> tuple[str | None, str | None]:
    """The admin key from `--admin-key-file` (its first line) or `--admin-key`, and a warning for the
    latter: a command line is visible to every user of the machine (`ps`, /proc/PID/cmdline)."""
    if file is not None:
        return file.read_text().strip() or None, None
    if given is not None:
        return given, ("--admin-key puts the admin key in the command line, where any user of this machine can read it "
                       "(ps, /proc); give it as $SLIPSTREAM_ADMIN_KEY or --admin-key-file PATH instead")
    return None, None


def port_problem(host: str, port: int) -> str | None:
    """Why the proxy could not listen on host:port, or None. Binds the way uvicorn will (SO_REUSEADDR,
    so a port left in TIME_WAIT by a stopped proxy still counts as free) and lets go at once."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"cannot listen on {host}:{port}: unknown host ({exc.strerror})"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            hint = " (another program is listening there: stop it or choose another --port)" if exc.errno in (98, 48) else ""
            return f"cannot listen on {host}:{port}: {exc.strerror}{hint}"
    return None


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def fixed_key_warnings(host: str, served: Iterable[Policy]) -> list[str]:
    """One warning per served team that accepts a key written in its policy file (`value:`), when
    listening beyond loopback: anyone who can read the repository can use that key."""
    if _loopback(host):
        return []
    return [
        f"listening on {host} (reachable from other machines) while team {team!r} accepts a fixed key written in "
        f"its policy file (api_keys: {{value: ...}}); remove it and give the key by environment variable "
        f"({{env: NAME}}) before exposing the proxy"
        for team, policy in sorted((policy.team, policy) for policy in served)
        if any(ref.value is not None for ref in policy.api_keys)
    ]
