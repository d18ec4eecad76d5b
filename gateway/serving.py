"""Checks `slipstream serve` makes before it says it is serving: the port is free, and a policy's
fixed team key is not exposed beyond this machine without a word."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable

from sdk.policy import Policy


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
