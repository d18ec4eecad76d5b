"""The `kind: local` provider: Slipstream's bundled engine, in process or over HTTP.

In process, one engine per model per process is created on first use (weights load in a worker
thread, model steps run in the engine's own thread, never on the event loop) and answers with the
same OpenAI Chat Completions bytes the engine's HTTP server sends; embeddings come from the bundled
MiniLM model (sdk/providers/local_embeddings.py). With `base_url`, requests go over HTTP to a
running `slipstream engine serve` or any other OpenAI-compatible server.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncGenerator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import orjson

from sdk.errors import ProviderUnavailableError, SlipstreamError
from sdk.offload import off_loop, off_loop_if_large
from sdk.providers.base import HTTPProvider
from sdk.providers.keys import KeyRing
from sdk.providers.local_embeddings import MODEL_ID as EMBEDDING_MODEL
from sdk.providers.local_embeddings import LocalEmbeddings
from sdk.providers.openai import OpenAIDialect
from sdk.providers.upstream import Timeouts, UpstreamClient
from sdk.readiness import WarmUp
from sdk.services import MODEL_LOAD_LOCK, Services
from sdk.sse import StreamObserver
from sdk.types import (
    Answer,
    Endpoint,
    LLMRequest,
    LLMResponse,
    LLMStream,
    Protocol,
    Timings,
    Usage,
)

if TYPE_CHECKING:
    from localengine.engine.async_engine import AsyncLLMEngine
    from localengine.serving_chat import ChatRequest


# The engine server reads large bodies in turns by this header's value (localengine/server.py:TENANT_HEADER).
ENGINE_TENANT_HEADER = "x-engine-tenant"


def team_cache_salt(team: str) -> str:
    """A team's prefix-cache salt: fixed length and derived from the team's name, so no client's
    salt can equal another team's (clients' salts only ever follow it, after a ':')."""
    return "slipstream-" + hashlib.blake2b(team.encode(), digest_size=12, person=b"cache-salt").hexdigest()


class LocalProvider:
    """`engine_args` (LLM keyword arguments) apply when this provider creates the process's engine
    for `model`; a provider created later for the same model shares that engine as it is.
    `default_max_tokens` caps, in process, a chat request that names no max_tokens."""

    protocol = Protocol.OPENAI
    gen_ai_provider = "slipstream.localengine"  # gen_ai.provider.name on trace spans

    def __init__(self, name: str, model: str, base_url: str | None = None, api_key: str = "local",
                 timeouts: Timeouts = Timeouts(), engine_args: dict[str, Any] | None = None,
                 services: Services | None = None, cache_salt: str = "", default_max_tokens: int | None = None,
                 client: UpstreamClient | None = None):
        self.name = name
        self.default_max_tokens = default_max_tokens  # in process: a request naming no max_tokens (None: up to the context)
        self.model = model
        self.cache_salt = cache_salt
        self.engine_args = engine_args or {}
        self._loaded: AsyncLLMEngine | None = None  # once loaded, requests skip the worker-thread hop
        self._embeddings = LocalEmbeddings(name, services or Services(), cache_salt)
        self._http = (
            HTTPProvider(name=name, dialect=OpenAIDialect(), base_url=base_url.rstrip("/"), keys=KeyRing((api_key,)),
                         timeouts=timeouts, client=client)
            if base_url
            else None
        )

    def warm_ups(self) -> list[WarmUp]:
        """In process, the model to load before the first request (the proxy's /readyz waits for it)."""
        if self._http is not None:
            return []
        label = f"local engine {self.model!r}" + (" with speculative decoding" if self.engine_args else "")
        return [WarmUp(label, self._load_engine, self._rehearse)]

    def _load_engine(self) -> None:
        with MODEL_LOAD_LOCK:  # the import too: it pulls in torch and transformers (sdk/services.py)
            from localengine.engine.async_engine import get_shared_engine

            self._loaded = get_shared_engine(self.model, **self.engine_args)

    async def _rehearse(self) -> None:
        """One chat request the way `send` answers it, on the serving loop: the first request pays
        one-time setup (the chat template, the first model steps) that a client's request should not."""
        from localengine.serving_chat import chat_completion, parse_chat_request

        engine = await self._engine()
        await chat_completion(engine, parse_chat_request({"messages": [{"role": "user", "content": "warm up"}], "max_tokens": 8}, engine))

    async def send(self, request: LLMRequest, timings: Timings) -> Answer:
        if request.protocol is not Protocol.OPENAI:
            raise SlipstreamError(
                f"provider {self.name!r} (local engine) speaks OpenAI Chat Completions and cannot serve "
                f"a {request.protocol} request",
                status=400,
            )
        if request.endpoint is Endpoint.EMBEDDINGS:
            if self._http is not None:
                return await self._http.send(request, timings)
            return await self._embeddings.send(request, timings)
        request = replace(request, body=self._salted(request.body))
        if self._http is not None:
            # The engine server reads large bodies in turns by tenant (localengine/server.py:TENANT_HEADER).
            return await self._http.send(replace(request, forward_headers={**request.forward_headers,
                                                                           ENGINE_TENANT_HEADER: self.cache_salt}), timings)
        from localengine.serving_chat import parse_chat_request
        from localengine.serving_common import RequestError

        with timings.upstream():
            engine = await self._engine()
            body, cap = {**request.body, "model": self.model}, self.default_max_tokens
            try:  # the engine's own model answers, whatever name the client asked for: say so
                # Rendering the template and tokenizing take seconds for a few MiB (15 s for 16 MiB):
                # a large prompt is read in the heavy-work pool, not on the loop every team shares.
                chat = await off_loop_if_large(request.size, parse_chat_request, body, engine, default_max_tokens=cap)
            except RequestError as exc:
                raise SlipstreamError(str(exc), status=exc.status) from exc
            route = f"{self.name}/{self.model}"
            if not chat.stream:
                return await self._complete(engine, chat, route)
        return self._stream(engine, chat, route, timings)

    def _salted(self, body: dict[str, Any]) -> dict[str, Any]:
        """The body with this team's `cache_salt` (vLLM's name): prefix-cache blocks are keyed by it, so
        one team's cached prompt is never read by another's, and `cached_tokens` says nothing about
        other teams. A client's own salt can only split its team's cache further, never leave it."""
        own = body.get("cache_salt")
        return {**body, "cache_salt": f"{self.cache_salt}:{own}" if isinstance(own, str) and own else self.cache_salt}

    async def count_input(self, chat: dict[str, Any]) -> int | None:
        """The prompt tokens of a Chat body, by the engine's own tokenizer and chat template (the
        `prompt_tokens` its answer would report); None over HTTP, where no counting endpoint is."""
        if self._http is not None:
            return None
        from localengine.serving_chat import prompt_token_ids
        from localengine.serving_common import RequestError

        engine = await self._engine()
        messages = chat.get("messages")
        if not isinstance(messages, list):
            raise SlipstreamError("'messages' must be a list", status=400)
        try:  # the team's turn in the heavy-work pool: seconds for a few MiB, and asyncio's pool is first come, first served
            return len(await off_loop(prompt_token_ids, messages, engine.tokenizer))
        except RequestError as exc:
            raise SlipstreamError(str(exc), status=exc.status) from exc

    async def list_models(self) -> list[dict[str, Any]]:
        """What this provider serves: the server's own list over HTTP; in process, the engine's model
        and the bundled embedding model."""
        if self._http is not None:
            return await self._http.list_models()
        return [{"id": self.model}, {"id": EMBEDDING_MODEL}]

    async def _engine(self) -> AsyncLLMEngine:
        if self._loaded is not None:
            return self._loaded
        def load() -> AsyncLLMEngine:
            with MODEL_LOAD_LOCK:  # the import too, as in _load_engine
                from localengine.engine.async_engine import get_shared_engine

                return get_shared_engine(self.model, **self.engine_args)

        try:
            self._loaded = await asyncio.to_thread(load)
            return self._loaded
        except (FileNotFoundError, NotImplementedError, ValueError, MemoryError) as exc:
            # Unavailable, not failed: the router moves on to the route's next target.
            raise ProviderUnavailableError(f"provider {self.name!r}: local engine cannot load model "
                                           f"{self.model!r}: {exc}") from exc

    @staticmethod
    async def _complete(engine: AsyncLLMEngine, chat: ChatRequest, route: str) -> LLMResponse:
        from localengine.serving_chat import chat_completion

        data = await chat_completion(engine, chat)
        return LLMResponse(status=200, body=orjson.dumps(data), headers={}, usage=usage_of(data["usage"]), route=route)

    @staticmethod
    def _stream(engine: AsyncLLMEngine, chat: ChatRequest, route: str, timings: Timings) -> LLMStream:
        from localengine.serving_chat import chat_completion_events, engine_request_ids

        usage = Usage()

        def fill(raw: dict[str, Any]) -> None:
            """The engine's own count, always (even when the client did not ask for usage in the stream),
            and when the client left mid-stream the tokens generated until then: final, so the gateway
            charges it rather than an estimate of the text the client was sent."""
            filled = usage_of(raw)
            usage.input_tokens, usage.output_tokens = filled.input_tokens, filled.output_tokens
            usage.cache_read_tokens = filled.cache_read_tokens
            usage.final = True

        source = chat_completion_events(engine, chat, on_usage=fill)
        observer = StreamObserver(Endpoint.CHAT_COMPLETIONS, usage, timings)
        events = _observed(source, observer, route)

        async def close() -> None:
            await events.aclose()
            for rid in engine_request_ids(chat.request_id, chat.n):  # idempotent: frees the KV blocks even if nothing was read
                engine.abort(rid)

        return LLMStream(status=200, events=events, headers={}, usage=usage, route=route, close=close,
                         finish_reasons=observer.finish_reasons)


def usage_of(raw: dict[str, Any]) -> Usage:
    cached = raw.get("prompt_tokens_details", {}).get("cached_tokens", 0)
    return Usage(input_tokens=raw["prompt_tokens"] - cached, output_tokens=raw["completion_tokens"],
                 cache_read_tokens=cached)


async def _observed(source: AsyncGenerator[bytes, None], observer: StreamObserver, route: str) -> AsyncGenerator[bytes, None]:
    """Forward events, marking token times; closing this closes the source, aborting the request."""
    try:
        async for event in source:
            observer.observe(event, time.perf_counter())
            yield event
    except Exception as exc:  # after the first byte, failures end the stream in band
        yield SlipstreamError(f"{route} failed mid-stream: {exc}", status=500).sse_event(Protocol.OPENAI)
    finally:
        await source.aclose()
