"""What a Redis URL names: one server, a master watched by Sentinel, or a Redis Cluster.

| URL | what it reaches |
|---|---|
| `redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]` | one server (redis-py's `Redis.from_url` form) |
| `redis+sentinel://[[USER]:PASSWORD@]HOST[:PORT][,HOST[:PORT]…]/SERVICE[/DB]` | the master the sentinels name for SERVICE (port 26379 by default; the form of the `redis-sentinel-url` package for redis-py); a failover is followed |
| `redis+cluster://[[USER]:PASSWORD@]HOST[:PORT][,HOST[:PORT]…]` | a Redis Cluster, its slot map read from any node listed (the seed nodes redis-py's `RedisCluster` takes); database 0 only |

`rediss`, `rediss+sentinel` and `rediss+cluster` are the same over TLS, with redis-py's query names:
`ssl_ca_certs=PATH` (trust this CA file instead of the system's store), `ssl_cert_reqs=required|optional|none`,
`ssl_check_hostname=true|false`, `ssl_certfile=PATH` and `ssl_keyfile=PATH` (a client certificate,
for a server with `tls-auth-clients yes`). The URL's user and password are the data nodes'; sentinels
that ask for their own give them as `sentinel_username=` / `sentinel_password=`, and are spoken to
over TLS only with `sentinel_tls=true` (Sentinel often listens in plain text beside TLS data nodes).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote, urlsplit

from sdk.state import masked_url

TLS_OPTIONS = ("ssl_ca_certs", "ssl_cert_reqs", "ssl_check_hostname", "ssl_certfile", "ssl_keyfile")
SENTINEL_OPTIONS = ("sentinel_username", "sentinel_password", "sentinel_tls")
_MODES = {"redis": "single", "redis+sentinel": "sentinel", "redis+cluster": "cluster"}
_CERT_REQS = {"required": ssl.CERT_REQUIRED, "optional": ssl.CERT_OPTIONAL, "none": ssl.CERT_NONE}
_YES = ("true", "1", "yes")


@dataclass(frozen=True, slots=True)
class Auth:
    """How to open a connection: TLS, credentials, database (AUTH and SELECT after connecting)."""

    tls: ssl.SSLContext | None = None
    username: str | None = None
    password: str | None = None
    db: int = 0


@dataclass(frozen=True, slots=True)
class Target:
    mode: str  # single | sentinel | cluster
    nodes: tuple[tuple[str, int], ...]  # the server; the sentinels; the cluster's seed nodes
    auth: Auth  # for the data nodes
    service: str = ""  # sentinel: the master's name
    sentinel_auth: Auth = Auth()  # for the sentinels

    @classmethod
    def parse(cls, url: str) -> Target:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        mode = _MODES.get(scheme.replace("rediss", "redis", 1))
        if mode is None:
            raise ValueError(f"not a Redis URL: {masked_url(url)!r} (redis://, redis+sentinel://, redis+cluster://, or rediss… for TLS)")
        tls = scheme.startswith("rediss")
        options = dict(parse_qsl(parts.query))
        known = TLS_OPTIONS + (SENTINEL_OPTIONS if mode == "sentinel" else ())
        unknown = sorted(options.keys() - set(known))
        if unknown:
            raise ValueError(f"state URL: unknown option(s) {', '.join(unknown)}; known: prefix, timeout_ms, {', '.join(known)}")
        if not tls and options.keys() & set(TLS_OPTIONS):
            raise ValueError("state URL: TLS options need a rediss:// URL")
        userinfo, at, hosts = parts.netloc.rpartition("@")
        user, _, password = userinfo.partition(":")
        default_port = 26379 if mode == "sentinel" else 6379
        nodes = tuple(_node(host, default_port) for host in (hosts or "127.0.0.1").split(","))
        if mode == "single" and len(nodes) > 1:
            raise ValueError("state URL: several hosts need redis+sentinel:// or redis+cluster://")
        path = [unquote(piece) for piece in parts.path.split("/") if piece]
        service = path.pop(0) if mode == "sentinel" and path else ""
        if mode == "sentinel" and not service:
            raise ValueError("state URL: a sentinel URL names its master: redis+sentinel://HOST:PORT[,HOST:PORT…]/SERVICE[/DB]")
        if len(path) > 1 or (path and not path[0].isdigit()):
            raise ValueError(f"state URL: {parts.path!r} does not end in a database number")
        db = int(path[0]) if path else 0
        if mode == "cluster" and db:
            raise ValueError("state URL: a Redis Cluster has database 0 only")
        context = tls_context(options) if tls else None
        auth = Auth(context, unquote(user) or None if at else None, unquote(password) if password else None, db)
        sentinel_auth = Auth(context if options.get("sentinel_tls", "").lower() in _YES else None,
                             options.get("sentinel_username"), options.get("sentinel_password"))
        return cls(mode, nodes, auth, service, sentinel_auth)


def _node(text: str, default_port: int) -> tuple[str, int]:
    host, colon, port = text.rpartition(":")
    if not colon or host.endswith("[") or (text.startswith("[") and not host.endswith("]")):
        host, port = text, str(default_port)  # no port (an IPv6 address in brackets has colons of its own)
    host = host.strip("[]")
    if not host or not port.isdigit():
        raise ValueError(f"state URL: {text!r} is not HOST:PORT")
    return host, int(port)


def tls_context(options: dict[str, str]) -> ssl.SSLContext:
    """The TLS settings a `rediss…` URL's query asks for (names as redis-py spells them); files that
    cannot be read are refused now, not at the first connection (which would only degrade the replica)."""
    reqs = options.get("ssl_cert_reqs", "required").lower()
    if reqs not in _CERT_REQS:
        raise ValueError(f"state URL: ssl_cert_reqs={reqs!r}: expected required, optional or none")
    try:
        context = ssl.create_default_context(cafile=options.get("ssl_ca_certs"))  # a CA file replaces the system's store
        if "ssl_certfile" in options:
            context.load_cert_chain(options["ssl_certfile"], options.get("ssl_keyfile"))
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"state URL: cannot load the TLS files it names: {exc}") from exc
    context.check_hostname = reqs == "required" and options.get("ssl_check_hostname", "true").lower() in _YES
    context.verify_mode = _CERT_REQS[reqs]
    return context
