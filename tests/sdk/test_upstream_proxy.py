"""Both doors reach a provider through an egress proxy and trust a private CA, as the official clients do.

The provider is the emulator behind a TLS front with a throwaway CA's certificate (https://localhost),
and the proxy is a small HTTP proxy started here (CONNECT tunnels, absolute-form requests), which
counts what goes through it: a request that reached the emulator directly leaves its counts as they were.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ssl
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx
import openai
import pytest

import sdk
from emulator.testing import RunningEmulator, running_emulator
from gateway.testing import running_proxy
from sdk.errors import UpstreamUnreachableError
from sdk.providers.egress import Egress
from sdk.providers.http1 import Caller, Http1Upstream
from sdk.providers.upstream import Timeouts
from tests.state.conftest import tls_files  # noqa: F401 - the throwaway CA, server and client certificates

TEAM_KEY = "sk-egress-team"
MESSAGES = [{"role": "user", "content": "hello through the proxy"}]
T = TypeVar("T")
PROXY_VARIABLES = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY", "SSL_CERT_FILE", "SSL_CERT_DIR")


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


def _basic(head: bytes) -> str | None:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"proxy-authorization":
            return base64.b64decode(value.split()[1]).decode()
    return None


class Loopback:
    """A thread with its own loop serving the counting proxy and a TLS front for the emulator."""

    def __init__(self, emulator_port: int, server_tls: ssl.SSLContext) -> None:
        self.emulator_port = emulator_port
        self.server_tls = server_tls
        self.tunnels: list[str] = []  # CONNECT targets
        self.forwarded: list[str] = []  # absolute-form request targets
        self.credentials: list[str | None] = []  # user:password from Proxy-Authorization, per proxy connection
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> Loopback:
        self._thread.start()
        self._servers = [self._run(asyncio.start_server(self._proxy, "127.0.0.1", 0)),
                         self._run(asyncio.start_server(self._front, "127.0.0.1", 0, ssl=self.server_tls))]
        self.proxy_url = f"http://127.0.0.1:{self._servers[0].sockets[0].getsockname()[1]}"
        self.upstream_url = f"https://localhost:{self._servers[1].sockets[0].getsockname()[1]}"
        return self

    def __exit__(self, *exc: object) -> None:
        for server in self._servers:
            server.close()
        self._run(self._cancel_all())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        self.loop.close()

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=10)

    @staticmethod
    async def _cancel_all() -> None:
        """Cancel the relays and wait for them to unwind: a task left cancelling when the loop stops
        is reported as destroyed while pending at the interpreter's exit."""
        tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _front(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """TLS terminated here, the bytes relayed to the emulator: an https provider on loopback."""
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.emulator_port)
        await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))

    async def _proxy(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
            return
        method, target, _ = head.split(b"\r\n", 1)[0].decode().split(" ")
        self.credentials.append(_basic(head))
        if method == "CONNECT":
            host, port = target.rsplit(":", 1)
            upstream_reader, upstream_writer = await asyncio.open_connection(host, int(port))
            self.tunnels.append(target)
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))
            return
        origin = urlsplit(target)
        upstream_reader, upstream_writer = await asyncio.open_connection(origin.hostname, origin.port)
        relay = asyncio.create_task(_pipe(upstream_reader, writer))
        try:
            while True:  # each request of the kept-alive connection, rewritten to origin form
                self.forwarded.append(target)
                _line, rest = head.split(b"\r\n", 1)
                length = next((int(h.split(b":")[1]) for h in rest.split(b"\r\n") if h.lower().startswith(b"content-length")), 0)
                path = urlsplit(target)._replace(scheme="", netloc="").geturl().encode()
                upstream_writer.write(b"%s %s HTTP/1.1\r\n%s" % (method.encode(), path, rest) + await reader.readexactly(length))
                head = await reader.readuntil(b"\r\n\r\n")
                method, target, _ = head.split(b"\r\n", 1)[0].decode().split(" ")
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            upstream_writer.close()
            relay.cancel()


@pytest.fixture(scope="module")
def upstream() -> Iterator[RunningEmulator]:
    with running_emulator() as emulator:
        yield emulator


@pytest.fixture
def loopback(upstream: RunningEmulator, tls_files: dict[str, Path]) -> Iterator[Loopback]:  # noqa: F811
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(tls_files["server"], tls_files["server_key"])
    with Loopback(int(upstream.url.rsplit(":", 1)[1]), server_tls) as running:
        yield running


@pytest.fixture(autouse=True)
def _no_proxy_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sets the variables it is about, in either case, from an environment without any."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


def _policy(directory: Path, base_url: str, provider_extra: str = "") -> Path:
    directory.mkdir(exist_ok=True)
    path = directory / "egress.yaml"
    path.write_text(f"""team: egress
api_keys: [{{value: "{TEAM_KEY}"}}]
providers:
  gpt: {{kind: openai, base_url: "{base_url}/v1", api_key: "up-openai", connect_timeout_s: 5{provider_extra}}}
routes:
  - targets: [{{provider: gpt}}]
retry: {{max_attempts: 1}}
prompt_cache: {{enabled: false}}
""")
    return path


def _ask_through_the_drop_in(policy: Path) -> str:
    client = sdk.OpenAI(policy=policy, max_retries=0)
    try:
        return client.chat.completions.create(model="gpt-4o", messages=MESSAGES).choices[0].message.content or ""
    finally:
        client.close()


def test_both_doors_reach_an_https_provider_through_a_connect_proxy(loopback: Loopback, tls_files, tmp_path: Path,  # noqa: F811
                                                                    monkeypatch: pytest.MonkeyPatch):
    proxy = loopback.proxy_url.replace("http://", "http://egress%40corp:s3cret@")  # userinfo, percent-encoded
    monkeypatch.setenv("HTTPS_PROXY", proxy)
    policy = _policy(tmp_path / "policies", loopback.upstream_url, f', ca_bundle: "{tls_files["ca"]}"')
    target = loopback.upstream_url.removeprefix("https://")

    with running_proxy([policy.parent]) as gateway:
        client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=TEAM_KEY, max_retries=0,
                               http_client=httpx.Client(trust_env=False))  # the gateway itself is reached directly
        assert client.chat.completions.create(model="gpt-4o", messages=MESSAGES).choices[0].message.content
    assert loopback.tunnels == [target]  # the serve door went through the proxy, in one kept-alive tunnel
    assert loopback.credentials == ["egress@corp:s3cret"]

    assert _ask_through_the_drop_in(policy)
    assert loopback.tunnels == [target, target]  # and so did the drop-in door

    monkeypatch.setenv("no_proxy", "example.com, localhost")  # lower case, as urllib and httpx read it too
    assert _ask_through_the_drop_in(policy)
    assert len(loopback.tunnels) == 2  # NO_PROXY: straight to the provider


def test_the_policy_proxy_wins_over_the_environment(loopback: Loopback, tls_files, tmp_path: Path,  # noqa: F811
                                                   monkeypatch: pytest.MonkeyPatch):
    ca = f', ca_bundle: "{tls_files["ca"]}"'
    monkeypatch.setenv("ALL_PROXY", "http://127.0.0.1:9")  # nothing listens there: used, it would fail
    assert _ask_through_the_drop_in(_policy(tmp_path / "named", loopback.upstream_url, f', proxy: "{loopback.proxy_url}"{ca}'))
    assert len(loopback.tunnels) == 1 and loopback.credentials == [None]
    monkeypatch.setenv("HTTPS_PROXY", loopback.proxy_url)
    assert _ask_through_the_drop_in(_policy(tmp_path / "direct", loopback.upstream_url, f", proxy: direct{ca}"))
    assert len(loopback.tunnels) == 1  # `proxy: direct` ignores the environment's proxy


def test_an_http_provider_is_reached_through_the_proxy_in_absolute_form(loopback: Loopback, upstream: RunningEmulator,
                                                                        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("http_proxy", loopback.proxy_url)
    assert _ask_through_the_drop_in(_policy(tmp_path / "plain", upstream.url))
    assert loopback.forwarded == [f"{upstream.url}/v1/chat/completions"] and loopback.tunnels == []


def test_ssl_cert_file_is_trusted_and_a_missing_ca_is_a_clear_error(loopback: Loopback, tls_files, tmp_path: Path,  # noqa: F811
                                                                    monkeypatch: pytest.MonkeyPatch):
    policy = _policy(tmp_path / "env-ca", loopback.upstream_url)
    with pytest.raises(openai.APIStatusError) as refused:
        _ask_through_the_drop_in(policy)
    assert refused.value.status_code == 502 and "CERTIFICATE_VERIFY_FAILED" in str(refused.value)
    monkeypatch.setenv("SSL_CERT_FILE", str(tls_files["ca"]))  # OpenSSL's variable, read when the client is made
    assert _ask_through_the_drop_in(policy)


async def test_a_client_certificate_from_the_policy_is_presented(tls_files):  # noqa: F811
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(tls_files["ca"]))
    server_tls.load_cert_chain(tls_files["server"], tls_files["server_key"])
    server_tls.verify_mode = ssl.CERT_REQUIRED  # mutual TLS: no answer without a certificate from the CA

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=server_tls)
    url = f"https://localhost:{server.sockets[0].getsockname()[1]}/v1/x"
    client = Http1Upstream()
    trusting = Egress(ca_bundle=str(tls_files["ca"]))
    with_certificate = Egress(ca_bundle=str(tls_files["ca"]), client_cert=str(tls_files["client"]),
                              client_key=str(tls_files["client_key"]))
    quick = Timeouts(connect_s=5, first_byte_s=5, read_s=5)
    try:
        response = await client.request("GET", url, {}, b"", quick, caller=Caller(egress=with_certificate))
        assert await response.read() == b"ok"
        with pytest.raises(UpstreamUnreachableError):  # TLS 1.3 reports the refusal on the first read
            response = await client.request("GET", url, {}, b"", quick, caller=Caller(egress=trusting))
            await response.read()
    finally:
        await client.aclose()
        server.close()


def test_an_unsupported_proxy_is_refused_when_the_policy_loads(tmp_path: Path):
    from sdk.errors import PolicyError
    from sdk.policy import load_policy

    with pytest.raises(PolicyError, match=r"providers\.gpt\.proxy") as refused:
        load_policy(_policy(tmp_path / "socks", "https://api.example.com", ', proxy: "socks5://user:pw@10.0.0.1:1080"'))
    assert "pw" not in str(refused.value)  # a policy error never repeats the value (it may hold credentials)
