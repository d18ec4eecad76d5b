"""The Litestar app: the proxy's endpoints, health, metrics, and the policy watcher's lifecycle."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from litestar import Litestar, Request, Response, get
from litestar.handlers import asgi
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.proxy import _team_key, make_handler
from sdk.errors import AuthenticationError
from sdk.metrics import REGISTRY
from sdk.promptcache.stats import report as prompt_cache_report
from sdk.providers.upstream import close_upstream_for_running_loop
from sdk.requests import models_body
from sdk.runtime import TeamRegistry
from sdk.types import Endpoint, Protocol


def create_app(policy_paths: list[str | Path], *, watch_interval_s: float | None = 1.0) -> Litestar:
    """Build the proxy for the given policy files or directories (errors raise PolicyError)."""
    registry = TeamRegistry(list(policy_paths))

    @get("/healthz", sync_to_thread=False)
    def healthz() -> dict[str, object]:
        return {"status": "ok", "teams": sorted(registry.teams)}

    @get("/metrics", sync_to_thread=False)
    def metrics() -> Response[bytes]:
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    @get("/v1/models", sync_to_thread=False)
    def models(request: Request) -> Response[bytes]:
        anthropic = "anthropic-version" in request.headers
        protocol = Protocol.ANTHROPIC if anthropic else Protocol.OPENAI
        try:
            team, _ = registry.authenticate(_team_key(list(request.scope["headers"])))
        except AuthenticationError as exc:
            return Response(exc.body(protocol), status_code=401, media_type="application/json")
        return Response(models_body(team.model_names(), protocol), media_type="application/json")

    @get("/v1/slipstream/cache-report", sync_to_thread=False)
    def cache_report(request: Request) -> Response[object]:
        """The caller's team prompt-cache summary (docs/prompt-cache.md); authenticated by team key."""
        try:
            team, _ = registry.authenticate(_team_key(list(request.scope["headers"])))
        except AuthenticationError as exc:
            return Response(exc.body(Protocol.OPENAI), status_code=401, media_type="application/json")
        return Response(prompt_cache_report(team.team))

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
        route_handlers=[healthz, metrics, models, cache_report, *proxied],
        lifespan=[lifespan],
        openapi_config=None,
        logging_config=None,  # the CLI configures logging; an embedding program keeps its own
        request_max_body_size=None,  # each team's limit is enforced by the proxy handler itself
    )
    app.state.registry = registry
    return app
