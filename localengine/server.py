"""OpenAI-compatible HTTP server for the local engine (a bare ASGI app run by uvicorn).

    POST /v1/chat/completions   streaming (SSE, `data: [DONE]`) and not, with usage
    POST /v1/completions        the legacy Completions API (serving_completion.py)
    POST /invocations           either of the two, by the body's shape (vLLM's SageMaker route)
    GET  /v1/models             the served model
    GET  /metrics               Prometheus text, vLLM's metric names
    GET  /health                200 once the model is loaded

Bare ASGI rather than a framework because this server must notice a client disconnect while it
waits for the engine: a watcher task reads `http.disconnect` and cancels the request, and the
cancellation aborts the engine request (freeing its KV blocks) at once.

Validation follows vLLM's server (serving_common.py): a body that is not `application/json` is a
415, a missing `model` a 400, another model's name a 404 `model_not_found`, an unknown path a 404
that names the path.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

import orjson

from localengine.engine.async_engine import AsyncLLMEngine
from localengine.fair_executor import FairExecutor
from localengine.serving_chat import ChatRequest, chat_completion, chat_completion_events, parse_chat_request
from localengine.serving_common import RequestError, error_body
from localengine.serving_completion import CompletionRequest, completion, completion_events, parse_completion_request

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
MAX_BODY_BYTES = 32 << 20
LARGE_BODY_BYTES = 256 << 10  # read off the loop from here (sdk/offload.py's bound for the gateway)
# Whose request it is, for the turns of the pool that reads large bodies: the gateway sends its team's
# cache salt here when it calls its own engine (sdk/providers/local.py); otherwise the client's address.
TENANT_HEADER = b"x-engine-tenant"
_READER = FairExecutor(workers=2, name="localengine-read")


class EngineApp:
    def __init__(self, engine: AsyncLLMEngine, served_model_name: str, default_max_tokens: int | None = None):
        self.engine = engine
        self.served_model_name = served_model_name
        self.default_max_tokens = default_max_tokens  # a chat request without max_tokens; None: up to the context
        self.created = int(time.time())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        method, path = scope["method"], scope["path"].rstrip("/")
        routes = {"/v1/chat/completions": "POST", "/v1/completions": "POST", "/invocations": "POST",
                  "/v1/models": "GET", "/metrics": "GET", "/health": "GET"}
        if path not in routes:
            await _respond(send, 404, error_body(f"Invalid URL ({method} {scope['path']})", 404))
        elif routes[path] != method:
            await _respond(send, 405, error_body(f"{method} is not allowed on {path}; use {routes[path]}", 405))
        elif path in ("/v1/chat/completions", "/v1/completions", "/invocations"):
            await self._generate(scope, receive, send, path)
        elif path == "/v1/models":
            models = {"object": "list", "data": [{"id": self.served_model_name, "object": "model",
                                                   "created": self.created, "owned_by": "localengine"}]}
            await _respond(send, 200, orjson.dumps(models))
        elif path == "/metrics":
            await _respond(send, 200, self.engine.engine.metrics.render(), "text/plain; version=0.0.4; charset=utf-8")
        else:
            await _respond(send, 200, b"")

    async def _generate(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        raw = await _read_body(receive)
        if raw is None:
            await _respond(send, 413, error_body("request body too large", 413))
            return
        if _media_type(scope) != b"application/json":  # vLLM's rule: a form-encoded body is not read as JSON
            await _respond(send, 415, error_body("Unsupported Media Type: Only 'application/json' is allowed", 415))
            return
        try:
            # Reading a body of a few MiB (JSON, the chat template, the tokenizer) takes seconds: in a
            # worker thread, so the loop goes on answering every other client meanwhile, and the
            # tenants' large bodies take turns there.
            parsed = (await asyncio.wrap_future(_READER.submit(_tenant(scope), functools.partial(self._parse, path, raw)))
                      if len(raw) >= LARGE_BODY_BYTES else self._parse(path, raw))
        except RequestError as exc:
            await _respond(send, exc.status, error_body(str(exc), exc.status, exc.param, exc.code))
            return
        engine = self.engine
        work: Awaitable[None]
        if isinstance(parsed, ChatRequest):
            work = (self._stream(send, chat_completion_events(engine, parsed)) if parsed.stream
                    else self._complete(send, chat_completion(engine, parsed)))
        else:
            work = (self._stream(send, completion_events(engine, parsed)) if parsed.stream
                    else self._complete(send, completion(engine, parsed)))
        await _until_disconnect(receive, work)

    def _parse(self, path: str, raw: bytes) -> ChatRequest | CompletionRequest:
        try:
            body = json.loads(raw)  # not orjson: it reads an integer past 64 bits as a float (a seed's range check)
        except ValueError:  # not JSON, or not UTF-8
            raise RequestError("the request body is not valid JSON") from None
        if _is_chat(path, body):
            return parse_chat_request(body, self.engine, self.served_model_name, self.default_max_tokens)
        return parse_completion_request(body, self.engine, self.served_model_name)

    @staticmethod
    async def _complete(send: Send, body: Awaitable[dict[str, Any]]) -> None:
        try:
            data = await body
        except Exception as exc:  # engine failure: an OpenAI-shaped 500
            await _respond(send, 500, error_body(f"generation failed: {exc}", 500))
            return
        await _respond(send, 200, orjson.dumps(data))

    @staticmethod
    async def _stream(send: Send, events: AsyncGenerator[bytes, None]) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]})
        try:
            async for event in events:
                await send({"type": "http.response.body", "body": event, "more_body": True})
        except Exception as exc:  # after the first byte, errors travel in band
            await send({"type": "http.response.body", "body": b"data: " + error_body(f"generation failed: {exc}", 500)
                        + b"\n\n", "more_body": True})
        finally:
            await events.aclose()  # aborts the engine request if we stopped early
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _until_disconnect(receive: Receive, work: Awaitable[None]) -> None:
    """Run `work`; if the client disconnects first, cancel it (which aborts the engine request)."""

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(watch())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (task, watcher):
            t.cancel()
        await asyncio.gather(task, watcher, return_exceptions=True)
    if task.done() and not task.cancelled() and task.exception() is not None:
        raise task.exception()  # type: ignore[misc]


def _tenant(scope: Scope) -> str:
    headers: list[tuple[bytes, bytes]] = scope["headers"]  # ASGI's raw header pairs
    for name, value in headers:
        if name == TENANT_HEADER:
            return "h:" + value.decode("latin-1")
    client = scope.get("client")
    return "a:" + (str(client[0]) if client else "")


def _is_chat(path: str, body: Any) -> bool:
    """/invocations (vLLM's, for SageMaker) is chat when the body has `messages`, else completions."""
    if path == "/invocations":
        return isinstance(body, dict) and "messages" in body
    return path == "/v1/chat/completions"


def _media_type(scope: Scope) -> bytes:
    for name, value in scope["headers"]:
        if name == b"content-type":
            return bytes(value.split(b";", 1)[0].strip().lower())
    return b""


async def _read_body(receive: Receive) -> bytes | None:
    """The whole body (None past MAX_BODY_BYTES), joined once: adding each piece to the bytes so far
    copied them all again, about 8 GiB copied on the loop for a 32 MiB body in 64 KiB pieces."""
    pieces: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b""
        piece = message.get("body", b"")
        size += len(piece)
        if size > MAX_BODY_BYTES:
            return None
        pieces.append(piece)
        if not message.get("more_body"):
            return b"".join(pieces)


async def _respond(send: Send, status: int, body: bytes, content_type: str = "application/json") -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def create_app(engine: AsyncLLMEngine, served_model_name: str | None = None,
               default_max_tokens: int | None = None) -> EngineApp:
    return EngineApp(engine, served_model_name or engine.model_name, default_max_tokens)


def serve(model: str, host: str = "127.0.0.1", port: int = 8000, served_model_name: str | None = None,
          default_max_tokens: int | None = None, **engine_kwargs: Any) -> None:
    """Load `model` (a local HF directory, a GGUF file or a bundled name) and serve it until interrupted,
    answering to `served_model_name` (default: `model`). This is what `slipstream engine serve` runs."""
    import uvicorn

    engine = AsyncLLMEngine.from_args(model, **engine_kwargs)
    try:
        uvicorn.run(create_app(engine, served_model_name or model, default_max_tokens), host=host, port=port,
                    log_level="info")
    finally:
        engine.shutdown()


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Serve a local model with an OpenAI-compatible API.")
    parser.add_argument("--model", default="demo", help="local Hugging Face directory, or demo / demo-draft")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    cli = parser.parse_args()
    serve(cli.model, cli.host, cli.port)
