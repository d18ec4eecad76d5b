"""One team's large Redis writes do not hold every other command of the process, through the proxy."""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx
import openai

from gateway.testing import running_proxy
from tests.responses.conftest import policy_text

HOLD_AFTER = 1 << 20  # bytes a connection sends before the link holds the rest


class SlowLink:
    """A TCP relay to Redis standing for a network that carries megabytes slowly: a connection that has
    sent HOLD_AFTER bytes is held there until `release` (the rest of a large write still on its way)."""

    def __init__(self, port: int):
        self.port = port
        self.held = threading.Event()
        self.release = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url_port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.port))
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, upstream: bool) -> None:
        sent = 0
        try:
            while chunk := source.recv(65536):
                if upstream and sent + len(chunk) > HOLD_AFTER and not self.release.is_set():
                    sink.sendall(chunk[: max(0, HOLD_AFTER - sent)])
                    self.held.set()
                    self.release.wait(60)
                    chunk = chunk[max(0, HOLD_AFTER - sent):]
                sink.sendall(chunk)
                sent += len(chunk)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                end.close()

    def close(self) -> None:
        self.release.set()
        self._listener.close()


@contextmanager
def slow_link(port: int) -> Iterator[SlowLink]:
    link = SlowLink(port)
    try:
        yield link
    finally:
        link.close()


def test_a_teams_large_stored_response_does_not_hold_another_teams_calls(tmp_path, monkeypatch, fresh_emulator, redis_server):
    """The response store's Redis calls, every team's, went on one connection, pipelined, and Redis
    answers a connection's commands in order: a team's stored response (its input, up to its body
    limit) written at the network's pace held every other team's stored-response calls behind it, up
    to the store's 10 s timeout, after which each fell back to the replica's own store (a continuation
    on another replica: a 404). Here alpha's 2 MiB record is held on the wire after its first MiB: on
    the old code beta's small response waited out the timeout behind it. A call of BULK_BYTES or more
    goes on connections of its own now, and beta is answered while alpha's record is held."""
    monkeypatch.setenv("SLIPSTREAM_DATA_DIR", str(tmp_path / "data"))
    (tmp_path / "alpha.yaml").write_text(policy_text("alpha", "sk-alpha", fresh_emulator.url))
    (tmp_path / "beta.yaml").write_text(policy_text("beta", "sk-beta", fresh_emulator.url))
    with slow_link(redis_server.port) as link:
        url = f"redis://127.0.0.1:{link.url_port}/0?prefix=t{uuid.uuid4().hex[:8]}&timeout_ms=2000"
        with running_proxy([tmp_path], state_url=url) as proxy, ThreadPoolExecutor(2) as pool:
            alpha = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-alpha", max_retries=0, timeout=60)
            beta = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-beta", max_retries=0, timeout=60)
            assert beta.responses.create(model="oai-4o", input="Warm up.", max_output_tokens=16).id  # connections made
            large = pool.submit(alpha.responses.create, model="oai-4o", input="Document: " + "fjord " * 350_000, max_output_tokens=16)
            assert link.held.wait(30), "alpha's record did not reach the link"
            try:
                answered = beta.responses.create(model="oai-4o", input="A short question?", max_output_tokens=16)
                retrieved = beta.responses.retrieve(answered.id)
                up = "slipstream_state_backend_up 1.0" in httpx.get(f"{proxy.url}/metrics").text
                still_held = not link.release.is_set() and not large.done()
            finally:
                link.release.set()
            assert large.result().id
    assert retrieved.id == answered.id
    assert still_held  # beta was answered while alpha's record was still on its way
    assert up  # and the state backend stayed up
