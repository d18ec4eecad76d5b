"""The Litestar app: the proxy's endpoints, health, metrics, and the policy watcher's lifecycle."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Annotated, cast

from litestar import Litestar, Request, Response, delete, get
from litestar.exceptions import HTTPException, MethodNotAllowedException, NotFoundException
from litestar.handlers import asgi
from litestar.params import PathParameter, QueryParameter
from litestar.types import Message, Scope
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.admin import AdminKey, admin_guard
from gateway.passthrough import make_passthrough_handler
from gateway.proxy import Scope as ASGIScope
from gateway.proxy import authenticate, make_handler
from gateway.ui import ui_handlers
from sdk import live_stats, tracing
from sdk.errors import AuthenticationError, InvalidRequestError, NotFoundError, SlipstreamError, UpstreamHTTPError
from sdk.metrics import REGISTRY
from sdk.models import model_body, models_body
from sdk.passthrough import PREFIXES as PASSTHROUGH_PREFIXES
from sdk.pipeline import REQUEST_ID_HEADER, new_request_id
from sdk.promptcache.stats import report as prompt_cache_report
from sdk.providers.upstream import close_upstream_for_running_loop
from sdk.readiness import Readiness
from sdk.runtime import TeamRegistry, TeamRuntime
from sdk.services import Services
from sdk.spend import spend_report
from sdk.state import backend_status
from sdk.types import Endpoint, LLMResponse, Protocol
from sdk.unexpected import unexpected_error

_REQUEST_ID = REQUEST_ID_HEADER.encode()


def _protocol(request: Request) -> Protocol:
    return Protocol.ANTHROPIC if "anthropic-version" in request.headers else Protocol.OPENAI


def _answer_error(request: Request, exc: SlipstreamError) -> Response[bytes]:
    return Response(exc.body(_protocol(request)), status_code=exc.status, media_type="application/json", headers=exc.headers)


def _framework_error(request: Request, exc: HTTPException) -> Response[bytes]:
    """Litestar's other refusals (a bad query parameter, ...) in the provider's shape."""
    return _answer_error(request, SlipstreamError(str(exc.detail), status=exc.status_code, headers=exc.headers))


def _unexpected(request: Request, exc: Exception) -> Response[bytes]:
    """A bug of ours behind a framework route: a logged, counted, provider-shaped 500 (sdk/unexpected.py)."""
    return _answer_error(request, unexpected_error(exc, None))


async def _named(message: Message, scope: Scope) -> None:
    """Every answer names a request id (`x-slipstream-request-id`): pipeline answers carry their own
    (the access log's); anything else the app answers (a 404 path, a refused key, a stored response)
    gets a fresh one here."""
    if message["type"] == "http.response.start":
        headers = message.setdefault("headers", [])
        if not any(name == _REQUEST_ID for name, _ in headers):
            message["headers"] = [*headers, (_REQUEST_ID, new_request_id().encode())]


def create_app(
    policy_paths: Sequence[str | Path],
    *,
    watch_interval_s: float | None = 1.0,
    state_url: str | None = None,
    admin_key: str | None = None,
) -> Litestar:
    """Build the proxy for the given policy files or directories (errors raise PolicyError).

    `state_url` names the state backend (sdk/state/); None reads $SLIPSTREAM_STATE_URL.
    `admin_key` (default: $SLIPSTREAM_ADMIN_KEY) guards /metrics when set (gateway/admin.py) and the
    status page at /ui (gateway/ui/), which stays closed without one.
    """
    registry = TeamRegistry(list(policy_paths), Services(state_url=state_url))
    state = registry.services.state()  # opened now: a bad URL fails at start, not on the first request

    readiness = Readiness()
    live_stats.enable()  # the status page's buckets, fed by every team's metrics stage

    @get("/healthz", sync_to_thread=False)
    def healthz() -> dict[str, object]:
        """Liveness: the process answers (no team names to anyone who can reach the port). Readiness is /readyz."""
        return {"status": "ok"}

    @get("/readyz", sync_to_thread=False)
    def readyz() -> Response[dict[str, object]]:
        """200 once what the served policies need is loaded (sdk/readiness.py); 503 with each part's state before.
        `state` shows the state backend: a degraded one (Redis away, local state) still serves, so stays ready.
        No team names: anyone who can reach the port may ask."""
        body = {**readiness.body(), "state": backend_status(state)}
        return Response(body, status_code=200 if readiness.ready else 503)

    @get("/metrics", guards=[admin_guard])
    async def metrics() -> Response[bytes]:
        # Rendering walks every series: in a thread, so a scrape never holds the loop.
        return Response(await asyncio.to_thread(generate_latest, REGISTRY), media_type=CONTENT_TYPE_LATEST)

    def team_of(request: Request) -> TeamRuntime:
        """The caller's team; an unknown key raises AuthenticationError (answered by `_answer_error`)."""
        return authenticate(registry, cast("ASGIScope", request.scope))[0]

    @get("/v1/models")
    async def models(request: Request) -> Response[bytes]:
        """The models the caller's team may call (sdk/models.py), in the client's provider's shape."""
        listed = await team_of(request).models.models()
        return Response(models_body(listed, _protocol(request), dict(request.query_params)), media_type="application/json")

    @get("/v1/models/{model_id:path}")
    async def model(request: Request, model_id: Annotated[str, PathParameter()]) -> Response[bytes]:
        found = await team_of(request).models.model(model_id.lstrip("/"))
        return Response(model_body(found, _protocol(request)), media_type="application/json")

    def no_route(request: Request, exc: NotFoundException | MethodNotAllowedException) -> Response[bytes]:
        """Litestar found no handler (path) or the handler takes another method: answered in the
        provider's shape, after the key is checked so an unauthenticated caller learns nothing."""
        team_of(request)
        method, path = request.method, request.url.path
        if isinstance(exc, MethodNotAllowedException):
            error: SlipstreamError = SlipstreamError(f"{method} is not allowed on {path}", status=405)
        else:
            error = NotFoundError(f"{method} {path} is not an endpoint Slipstream serves (docs/api.md lists them)")
        return _answer_error(request, error)

    def routing_error(request: Request, exc: NotFoundException | MethodNotAllowedException) -> Response[bytes]:
        try:
            return no_route(request, exc)
        except AuthenticationError as failed:
            return _answer_error(request, failed)

    @get("/v1/slipstream/cache-report", sync_to_thread=False)
    def cache_report(request: Request) -> Response[object]:
        """The caller's team prompt-cache summary (docs/prompt-cache.md)."""
        return Response(prompt_cache_report(team_of(request).team))

    @get("/v1/slipstream/spend")
    async def spend(request: Request) -> Response[object]:
        """The caller's team spend this UTC day and month, by key and model (docs/spend.md)."""
        team = team_of(request)
        return Response(await spend_report(state, team.team, team.policy.budget))

    @delete("/v1/slipstream/cache", status_code=200, sync_to_thread=True)
    def invalidate_cache(request: Request, key: Annotated[str | None, QueryParameter()] = None) -> dict[str, int]:
        """Drop the caller's team's response-cache entries: all of them, or the one `?key=` names
        (the `x-slipstream-cache-key` header of the answer it produced)."""
        team = team_of(request).team
        if key is not None and not key.strip():
            raise InvalidRequestError("key: empty; give an entry's x-slipstream-cache-key, or leave 'key' out to drop every entry")
        cache = registry.services.response_cache()
        if key:
            return {"removed": cache.invalidate_key(key, team=team)}
        return {"removed": cache.invalidate_team(team) + registry.services.embedding_cache().invalidate_team(team)}

    async def stored(request: Request, answer: Callable[[TeamRuntime], Awaitable[LLMResponse]]) -> Response[bytes]:
        """A stored-response call for the caller's team; failures answered in OpenAI's error shape."""
        try:
            result = await answer(team_of(request))
        except UpstreamHTTPError as exc:
            return Response(exc.body, status_code=exc.status, media_type="application/json", headers=exc.headers)
        except SlipstreamError as exc:
            return Response(exc.body(Protocol.OPENAI), status_code=exc.status, media_type="application/json", headers=exc.headers)
        return Response(result.body, status_code=result.status, media_type="application/json", headers=result.headers)

    @get("/v1/responses/{response_id:str}")
    async def retrieve_response(request: Request, response_id: Annotated[str, PathParameter()]) -> Response[bytes]:
        query = request.scope["query_string"].decode("latin-1")
        return await stored(request, lambda team: team.responses.retrieve(response_id, query))

    @delete("/v1/responses/{response_id:str}", status_code=200)
    async def delete_response(request: Request, response_id: Annotated[str, PathParameter()]) -> Response[bytes]:
        return await stored(request, lambda team: team.responses.delete(response_id))

    @get("/v1/responses/{response_id:str}/input_items")
    async def response_input_items(request: Request, response_id: Annotated[str, PathParameter()]) -> Response[bytes]:
        query = request.scope["query_string"].decode("latin-1")
        return await stored(request, lambda team: team.responses.input_items(response_id, query))

    proxied = [
        asgi("/v1/chat/completions", is_mount=False, copy_scope=False)(make_handler(registry, Endpoint.CHAT_COMPLETIONS)),
        asgi("/v1/messages", is_mount=False, copy_scope=False)(make_handler(registry, Endpoint.MESSAGES)),
        asgi("/v1/messages/count_tokens", is_mount=False, copy_scope=False)(make_handler(registry, Endpoint.COUNT_TOKENS)),
        asgi("/v1/embeddings", is_mount=False, copy_scope=False)(make_handler(registry, Endpoint.EMBEDDINGS)),
        asgi("/v1/responses", is_mount=False, copy_scope=False)(make_handler(registry, Endpoint.RESPONSES)),
        asgi("/v1/responses/input_tokens", is_mount=False, copy_scope=False)(make_handler(registry, Endpoint.RESPONSES_INPUT_TOKENS)),
        asgi("/v1/responses/compact", is_mount=False, copy_scope=False)(make_handler(registry, Endpoint.RESPONSES_COMPACT)),
    ]
    responses = [retrieve_response, delete_response, response_input_items]
    passthrough = make_passthrough_handler(registry)
    passed = [asgi(prefix, is_mount=True, copy_scope=True)(passthrough) for prefix in PASSTHROUGH_PREFIXES]

    @contextlib.asynccontextmanager
    async def lifespan(_: Litestar) -> AsyncIterator[None]:
        def reloaded() -> None:  # a reload may add a team that needs a model loaded
            readiness.start(registry.warm_ups())

        reloaded()
        tracing.enabled()  # with an OTLP endpoint, tracing (and its export process) is set up now, not on the first request
        watcher = asyncio.create_task(registry.watch(watch_interval_s, reloaded)) if watch_interval_s else None
        start = getattr(state, "start", None)
        if start is not None:
            start()  # check in with the shared store now: replica count and flags before the first request
        try:
            yield
        finally:
            if watcher is not None:
                watcher.cancel()
            await registry.services.close()
            await close_upstream_for_running_loop()

    app = Litestar(
        route_handlers=[healthz, readyz, metrics, models, model, cache_report, spend, invalidate_cache, *proxied, *responses, *passed,
                        *ui_handlers(registry, state)],
        lifespan=[lifespan],
        before_send=[_named],
        openapi_config=None,
        logging_config=None,  # the CLI configures logging; an embedding program keeps its own
        request_max_body_size=None,
        # Errors are answers in the provider's shape (each team's body limit is enforced by the proxy handler itself).
        exception_handlers={
            SlipstreamError: _answer_error,
            NotFoundException: routing_error,
            MethodNotAllowedException: routing_error,
            HTTPException: _framework_error,
            Exception: _unexpected,
        },
    )
    app.state.registry = registry
    app.state.readiness = readiness
    app.state.admin_key = AdminKey.from_env(admin_key)
    return app


SERVE_PATHS_ENV = "SLIPSTREAM_SERVE_POLICIES"  # os.pathsep-separated, set by `slipstream serve --workers N`


def app_from_env() -> Litestar:
    """The app of one `--workers` process: policies and state URL from the environment the CLI set."""
    return create_app(os.environ[SERVE_PATHS_ENV].split(os.pathsep))
