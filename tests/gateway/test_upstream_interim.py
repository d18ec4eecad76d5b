"""An upstream's interim answer (1xx) is not taken for its answer, so no team is given another's.

Through the proxy with the official openai client. HTTP/1.1 lets a server send interim answers before
the final one (100 Continue, 103 Early Hints: a CDN or proxy in front of a provider, an OpenAI-compatible
server), and a client must read past them. The gateway's upstream client took the first head it parsed
for the answer: team alpha's request ended with the 103, and its connection went back to the pool
every team's requests to that provider share with alpha's final answer still to come, so the next request
on it, team beta's, was given alpha's answer. The upstream here is a small HTTP/1.1 server on loopback
that sends alpha a 103 and holds alpha's answer until beta has asked.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from pathlib import Path

import orjson

from gateway.testing import running_proxy
from tests.helpers import PATIENCE_S, oai, wait_until, write_policy

PLAIN = "retry: {max_attempts: 1}\nprompt_cache: {enabled: false}\n"


def _answer(text: str) -> bytes:
    body = orjson.dumps({"id": "chatcmpl-x", "object": "chat.completion", "created": 1, "model": "gpt-4o-mini",
                         "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                         "usage": {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}})
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body


class _Upstream:
    """Answers each request in turn; a request from alpha gets a 103 at once and its answer only once beta
    has asked (on this connection or another), so a client that took the 103 for the answer is caught."""

    def __init__(self) -> None:
        self.hinted = threading.Event()
        self._beta_asked: asyncio.Event | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self._beta_asked is not None
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            while True:
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))
                asked = orjson.loads(await reader.readexactly(length))["messages"][-1]["content"]
                if not asked.startswith("alpha"):
                    self._beta_asked.set()
                    writer.write(_answer("beta's own answer"))
                    await writer.drain()
                    head = await reader.readuntil(b"\r\n\r\n")
                    continue
                writer.write(b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n")
                await writer.drain()
                self.hinted.set()
                # alpha's answer once beta has asked: on this connection (a client that took the 103 for the
                # answer sends its next request here, and is given alpha's answer for it) or on another
                following = asyncio.ensure_future(reader.readuntil(b"\r\n\r\n"))
                elsewhere = asyncio.ensure_future(self._beta_asked.wait())
                await asyncio.wait({following, elsewhere}, timeout=PATIENCE_S, return_when=asyncio.FIRST_COMPLETED)
                elsewhere.cancel()
                writer.write(_answer("alpha's launch is on Tuesday"))
                await writer.drain()
                head = await following
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    @contextmanager
    def serving(self) -> Iterator[str]:
        loop = asyncio.new_event_loop()
        started = threading.Event()
        port: list[int] = []
        stop: list[asyncio.Event] = []

        async def serve() -> None:
            self._beta_asked = asyncio.Event()
            stop.append(asyncio.Event())
            server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
            port.append(server.sockets[0].getsockname()[1])
            started.set()
            async with server:
                await stop[0].wait()
                handlers = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
                for task in handlers:
                    task.cancel()
                await asyncio.gather(*handlers, return_exceptions=True)

        thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
        thread.start()
        started.wait(PATIENCE_S)
        try:
            yield f"http://127.0.0.1:{port[0]}"
        finally:
            loop.call_soon_threadsafe(stop[0].set)
            thread.join(PATIENCE_S)
            loop.close()


def test_an_interim_answer_is_read_past_and_never_reaches_another_team(tmp_path: Path) -> None:
    """alpha gets its own answer after the 103, and beta its own: on the old code alpha's request ended with
    the 103 and beta, on the connection it left, was given alpha's answer (its body held alpha's answer, then
    its own)."""
    upstream = _Upstream()
    with upstream.serving() as url:
        write_policy(tmp_path, "alpha", "sk-alpha-hints", url, extra=PLAIN)
        write_policy(tmp_path, "beta", "sk-beta-hints", url, extra=PLAIN)  # the same provider key and origin: one pool
        with running_proxy([tmp_path]) as proxy, ThreadPoolExecutor(1) as pool:
            alpha, beta = oai(proxy, "sk-alpha-hints"), oai(proxy, "sk-beta-hints")

            def ask(client, text: str) -> str:  # type: ignore[no-untyped-def]
                answer = client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": text}])
                return answer.choices[0].message.content or ""

            alphas = pool.submit(ask, alpha, "alpha: when is our launch?")
            wait_until(upstream.hinted.is_set, "the upstream sent alpha its 103")
            # On the old code alpha's request ends with the 103 here; the fix keeps it waiting for its answer.
            with suppress(AssertionError):
                wait_until(alphas.done, "alpha's request ended", timeout_s=2.0)
            raw = beta.chat.completions.with_raw_response.create(model="gpt-4o-mini",
                                                                 messages=[{"role": "user", "content": "beta: what is ours?"}])
            assert "Tuesday" not in raw.text  # before: alpha's answer came first in beta's body
            assert orjson.loads(raw.content)["choices"][0]["message"]["content"] == "beta's own answer"
            assert alphas.result() == "alpha's launch is on Tuesday"  # before: an error for the 103
