"""How requests leave for a provider: which HTTP proxy they go through and which CAs they trust.

Where the official clients work, this must work too, so the same sources are read the same way:
the environment's `HTTPS_PROXY` / `HTTP_PROXY` / `ALL_PROXY` / `NO_PROXY` (either case, as urllib and
httpx read them: `urllib.request.getproxies_environment` does the reading, so lower case wins;
`NO_PROXY` lists hosts and domain suffixes (`example.com` and `.example.com` both cover
`api.example.com`), `host:port`, IP networks (`10.0.0.0/8`) or `*`), and `SSL_CERT_FILE` / `SSL_CERT_DIR` (OpenSSL's own variables, read by
`ssl.create_default_context`). They are read when a provider is built (the proxy starts, a
policy reloads, a drop-in client is made), as httpx reads them when a client is made. A provider's
policy keys `proxy`, `ca_bundle`, `client_cert` and `client_key` override them for that provider
(policies/README.md).

An https upstream is reached through a proxy with a CONNECT tunnel, an http one with requests in
absolute form; `user:password@` in the proxy URL becomes `Proxy-Authorization: Basic`. Only
`http://` proxies are supported (no SOCKS, no TLS to the proxy itself): anything else is a clear
error rather than a silent direct connection.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import os.path
import ssl
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit
from urllib.request import getproxies_environment

from sdk.errors import UpstreamUnreachableError

DIRECT = "direct"  # policy `proxy: direct`: never through a proxy, whatever the environment says
_MAX_PROXY_REPLY = 16 * 1024
_CA_VARIABLES = ("SSL_CERT_FILE", "SSL_CERT_DIR")


@dataclass(frozen=True, slots=True)
class Egress:
    """A provider's egress settings from its policy (None: the environment's, or the system's)."""

    proxy: str | None = None  # an http:// proxy URL, DIRECT, or None for the environment's
    ca_bundle: str | None = None  # a PEM file or a c_rehash'd directory; replaces the default trust store
    client_cert: str | None = None  # PEM certificate chain for upstreams that want a client certificate
    client_key: str | None = None  # its key, when not in the same file
    # The proxy variables (urllib's keys: https, http, all, no) and SSL_CERT_FILE / SSL_CERT_DIR as
    # they were when the provider was built; empty: no proxy from the environment.
    environment: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_environment(cls, proxy: str | None = None, ca_bundle: str | None = None, client_cert: str | None = None,
                         client_key: str | None = None) -> Egress:
        found = dict(getproxies_environment())
        found.update((name, os.environ[name]) for name in _CA_VARIABLES if os.environ.get(name))
        return cls(proxy, ca_bundle, client_cert, client_key, tuple(sorted(found.items())))

    def tls(self) -> TLSOptions:
        ca_environment = tuple((name, value) for name, value in self.environment if name in _CA_VARIABLES)
        return TLSOptions(self.ca_bundle, self.client_cert, self.client_key, ca_environment)


@dataclass(frozen=True, slots=True)
class Proxy:
    host: str
    port: int
    authorization: str | None  # the whole `Proxy-Authorization` value, or None
    shown: str  # for errors: without the credentials


@dataclass(frozen=True, slots=True)
class TLSOptions:
    ca_bundle: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    environment: tuple[tuple[str, str], ...] = ()  # SSL_CERT_FILE / SSL_CERT_DIR: a context is made per value


def parse_proxy(url: str) -> Proxy:
    parts = urlsplit(url if "://" in url else f"http://{url}")  # `HTTPS_PROXY=host:3128` is common and meant http
    if parts.scheme != "http" or not parts.hostname:
        raise UpstreamUnreachableError(f"proxy {parts.scheme}://{parts.hostname or ''} is not supported: give an http:// proxy URL")
    authorization = None
    if parts.username is not None:
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        authorization = "Basic " + base64.b64encode(pair).decode("ascii")
    port = parts.port or 80
    return Proxy(parts.hostname, port, authorization, f"http://{parts.hostname}:{port}")


def choose_proxy(scheme: str, host: str, port: int, egress: Egress) -> Proxy | None:
    """The proxy a request to scheme://host:port goes through, or None for a direct connection."""
    if egress.proxy == DIRECT:
        return None
    if egress.proxy is not None:
        return parse_proxy(egress.proxy)  # the policy names it for this provider: NO_PROXY does not apply
    environment = dict(egress.environment)
    url = environment.get(scheme) or environment.get("all")
    if not url or bypassed(host, port, environment.get("no", "")):
        return None
    return parse_proxy(url)


def bypassed(host: str, port: int, no_proxy: str) -> bool:
    """Whether `NO_PROXY` covers host:port (entries: `*`, host or domain suffix, `host:port`, IP network)."""
    host = host.lower().strip("[]")
    for entry in (part.strip().lower() for part in no_proxy.split(",")):
        if not entry:
            continue
        if entry == "*":
            return True
        name, _, wanted_port = entry.rpartition(":") if entry.count(":") == 1 else (entry, "", "")
        if wanted_port and wanted_port != str(port):
            continue
        name = name.strip("[]").lstrip(".")
        if host == name or host.endswith("." + name) or _in_network(host, name):
            return True
    return False


def _in_network(host: str, entry: str) -> bool:
    try:
        return ipaddress.ip_address(host) in ipaddress.ip_network(entry, strict=False)
    except ValueError:
        return False  # a name, not an address or a network


def tls_context(options: TLSOptions) -> ssl.SSLContext:
    """Verification on, hostnames checked; a `ca_bundle` replaces the system store (as `verify=PATH` does in httpx)."""
    bundle = options.ca_bundle
    try:
        if bundle is None:
            context = ssl.create_default_context()  # honours SSL_CERT_FILE / SSL_CERT_DIR
        elif os.path.isdir(bundle):
            context = ssl.create_default_context(capath=bundle)
        else:
            context = ssl.create_default_context(cafile=bundle)
        if options.client_cert:
            context.load_cert_chain(options.client_cert, options.client_key)
    except (OSError, ssl.SSLError) as exc:
        raise UpstreamUnreachableError(f"cannot load the TLS files of this provider ({exc})") from exc
    return context


class _TunnelReply(asyncio.Protocol):
    """Collects the proxy's answer to CONNECT; the tunnel's bytes then belong to the TLS layer."""

    def __init__(self) -> None:
        self.answer: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._buffer = bytearray()

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        end = self._buffer.find(b"\r\n\r\n")
        if not self.answer.done() and (end >= 0 or len(self._buffer) > _MAX_PROXY_REPLY):
            self.answer.set_result(bytes(self._buffer[:end]))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.answer.done():
            self.answer.set_exception(UpstreamUnreachableError("the proxy closed the connection before answering CONNECT"))


async def open_tunnel(proxy: Proxy, host: str, port: int) -> asyncio.Transport:
    """A transport to `host:port` through `proxy` (CONNECT); the caller starts TLS on it."""
    loop = asyncio.get_running_loop()
    transport, reply = await loop.create_connection(_TunnelReply, proxy.host, proxy.port)
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    auth = f"Proxy-Authorization: {proxy.authorization}\r\n" if proxy.authorization else ""
    transport.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{auth}\r\n".encode("latin-1"))
    try:
        head = await reply.answer
    except BaseException:
        transport.abort()
        raise
    status_line = head.split(b"\r\n", 1)[0].decode("latin-1", "replace")
    fields = status_line.split(" ", 2)
    if len(fields) < 2 or not fields[0].startswith("HTTP/") or not fields[1].startswith("2"):
        transport.abort()
        raise UpstreamUnreachableError(f"proxy {proxy.shown} refused the tunnel to {target}: {status_line[:120]!r}")
    return transport
