"""Pass-through bodies stream both ways: an upload reaches the provider while the client is still
sending it, and a download reaches the client while the provider is still sending it.

The provider here is a small ASGI app on loopback (the network edge) that can tell the test what it
has received so far; what the official clients do on these endpoints against the emulator is in
test_passthrough.py.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.testing import RunningServer, running_proxy, serve_in_thread
from tests.helpers import write_policy

KEY = "sk-pass-stream"
MIB = 1024 * 1024


class Upstream:
    """Records uploads and serves a download in two parts, the second only once the test allows it."""

    def __init__(self) -> None:
        self.received = 0
        self.first_mib = threading.Event()
        self.release_rest = threading.Event()
        self.requests: list[dict[str, object]] = []

    async def __call__(self, scope, receive, send) -> None:
        assert scope["type"] == "http"
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        self.requests.append({"method": scope["method"], "path": scope["path"], "query": scope["query_string"], "headers": headers})
        while True:
            message = await receive()
            self.received += len(message.get("body", b""))
            if self.received >= MIB:
                self.first_mib.set()
            if not message.get("more_body"):
                break
        if scope["path"].endswith("/content"):
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/octet-stream")]})
            await send({"type": "http.response.body", "body": b"a" * 1000, "more_body": True})
            await asyncio.to_thread(self.release_rest.wait, 10)
            await send({"type": "http.response.body", "body": b"b" * 1000})
            return
        body = b'{"id": "file-abc", "object": "file", "bytes": %d}' % self.received
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def upstream() -> Iterator[tuple[Upstream, RunningServer]]:
    app = Upstream()
    with serve_in_thread(app, lifespan="off") as running:
        yield app, running


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, upstream) -> Iterator[RunningServer]:
    directory: Path = tmp_path_factory.mktemp("pass-policies")
    write_policy(directory, "passing", KEY, upstream[1].url, extra="limits: {max_upload_bytes: 16777216}\n")
    with running_proxy([directory]) as running:
        yield running


def test_upload_streams_while_the_client_sends(proxy, upstream):
    app, _ = upstream
    app.received = 0
    app.first_mib.clear()
    waited = []

    def body() -> Iterator[bytes]:
        yield b"x" * MIB
        # Held back until the provider has the first MiB: a proxy that buffered the upload would
        # never send it, and this wait would time out.
        waited.append(app.first_mib.wait(10))
        for _ in range(7):
            yield b"y" * MIB

    answer = httpx.post(f"{proxy.url}/v1/files", content=body(), timeout=30,
                        headers={"authorization": f"Bearer {KEY}", "content-type": "application/octet-stream"})
    assert answer.status_code == 200 and answer.json()["bytes"] == 8 * MIB and waited == [True]
    sent = app.requests[-1]
    assert sent["path"] == "/v1/files"
    assert sent["headers"]["authorization"] == "Bearer up-openai"  # the team key never reaches the provider
    assert sent["headers"]["transfer-encoding"] == "chunked"
    assert answer.headers["x-slipstream-route"] == "gpt/files"


def test_download_streams_while_the_provider_sends(proxy, upstream):
    app, _ = upstream
    app.release_rest.clear()
    with httpx.stream("GET", f"{proxy.url}/v1/files/file-abc/content?x=1", headers={"authorization": f"Bearer {KEY}"}) as answer:
        chunks = answer.iter_bytes()
        first = next(chunks)  # arrives before the provider has sent the rest
        assert first.startswith(b"a")
        app.release_rest.set()
        rest = b"".join(chunks)
    assert len(first + rest) == 2000 and rest.endswith(b"b" * 1000)
    assert app.requests[-1]["query"] == b"x=1"


def test_anthropic_batches_go_to_the_anthropic_provider_with_its_key(proxy, upstream):
    app, _ = upstream
    # the list: a batch id this team did not create would be answered 404 here (tests/gateway/test_passthrough_isolation.py)
    answer = httpx.get(f"{proxy.url}/v1/messages/batches", headers={"x-api-key": KEY, "anthropic-version": "2023-06-01",
                                                                           "anthropic-beta": "message-batches-2024-09-24"})
    assert answer.status_code == 200 and answer.headers["x-slipstream-route"] == "claude/messages_batches"
    sent = app.requests[-1]["headers"]
    assert sent["x-api-key"] == "up-anthropic" and sent["anthropic-beta"] == "message-batches-2024-09-24"
    assert "authorization" not in sent


def test_refusals_are_provider_shaped_and_never_reach_the_provider(proxy, upstream):
    app, _ = upstream
    before = len(app.requests)
    unauthenticated = httpx.post(f"{proxy.url}/v1/files", content=b"x", headers={"authorization": "Bearer wrong"})
    assert unauthenticated.status_code == 401 and unauthenticated.json()["error"]["code"] == "invalid_api_key"
    too_large = httpx.post(f"{proxy.url}/v1/files", content=b"x" * (17 * MIB), headers={"authorization": f"Bearer {KEY}"})
    assert too_large.status_code == 413 and "limit" in too_large.json()["error"]["message"]
    anthropic_shaped = httpx.get(f"{proxy.url}/v1/messages/batches", headers={"x-api-key": "wrong", "anthropic-version": "2023-06-01"})
    assert anthropic_shaped.json()["error"]["type"] == "authentication_error"
    assert len(app.requests) == before
