"""The Litestar app: the proxy's endpoints, health, metrics, and the policy watcher's lifecycle."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated

from litestar import Litestar, Request, Response, delete, get
from litestar.handlers import asgi
from litestar.params import QueryParameter
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.proxy import team_key, make_handler
from sdk.errors import AuthenticationError
from sdk.metrics import REGISTRY
from sdk.promptcache.stats import report as prompt_cache_report
from sdk.providers.upstream import close_upstream_for_running_loop
from sdk.requests import models_body
from sdk.runtime import TeamRegistry, TeamRuntime
from sdk.types import Endpoint, Protocol


def _protocol(request: Request) -> Protocol:
    return Protocol.ANTHROPIC if "anthropic-version" in request.headers else Protocol.OPENAI


def _auth_failed(request: Request, exc: AuthenticationError) -> Response[bytes]:
    return Response(exc.body(_protocol(request)), status_code=401, media_type="application/json")


def create_app(policy_paths: list[str | Path], *, watch_interval_s: float | None = 1.0) -> Litestar:
    """Build the proxy for the given policy files or directories (errors raise PolicyError)."""
    registry = TeamRegistry(list(policy_paths))

    @get("/healthz", sync_to_thread=False)
    def healthz() -> dict[str, object]:
        return {"status": "ok", "teams": sorted(registry.teams)}

    @get("/metrics", sync_to_thread=False)
    def metrics() -> Response[bytes]:
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    def team_of(request: Request) -> TeamRuntime:
        """The caller's team; an unknown key raises AuthenticationError (answered by `_auth_failed`)."""
        return registry.authenticate(team_key(list(request.scope["headers"])))[0]

    @get("/v1/models", sync_to_thread=False)
    def models(request: Request) -> Response[bytes]:
        return Response(models_body(team_of(request).model_names(), _protocol(request)), media_type="application/json")

    @get("/v1/slipstream/cache-report", sync_to_thread=False)
    def cache_report(request: Request) -> Response[object]:
        """The caller's team prompt-cache summary (docs/prompt-cache.md)."""
        return Response(prompt_cache_report(team_of(request).team))

    @delete("/v1/slipstream/cache", status_code=200, sync_to_thread=True)
    def invalidate_cache(request: Request, key: Annotated[str | None, QueryParameter()] = None) -> dict[str, int]:
        """Drop the caller's team's response-cache entries: all of them, or the one `?key=` names
        (the `x-slipstream-cache-key` header of the answer it produced)."""
        team = team_of(request).team
        cache = registry.services.response_cache()
        removed = cache.invalidate_key(key, team=team) if key else cache.invalidate_team(team)
        return {"removed": removed}

    proxied = [
        asgi("/v1/chat/completions", is_mount=False, copy_scope=False)(make_handler(registry, Endpoint.CHAT_COMPLETIONS)),
        asgi("/v1/messages", is_mount=False, copy_scope=False)(make_handler(registry, Endpoint.MESSAGES)),
        asgi("/v1/messages/count_tokens", is_mount=False, copy_scope=False)(make_handler(registry, Endpoint.COUNT_TOKENS)),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(_: Litestar) -> AsyncIterator[None]:
        watcher = asyncio.create_task(registry.watch(watch_interval_s)) if watch_interval_s else None
        try:
            yield
        finally:
            if watcher is not None:
                watcher.cancel()
            await close_upstream_for_running_loop()

    app = Litestar(
        route_handlers=[healthz, metrics, models, cache_report, invalidate_cache, *proxied],
        lifespan=[lifespan],
        openapi_config=None,
        logging_config=None,  # the CLI configures logging; an embedding program keeps its own
        request_max_body_size=None,
        exception_handlers={AuthenticationError: _auth_failed},  # each team's limit is enforced by the proxy handler itself
    )
    app.state.registry = registry
    return app
