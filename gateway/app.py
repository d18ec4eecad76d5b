"""The Litestar app: the proxy's endpoints, health, metrics, and the policy watcher's lifecycle.

Every handler is a module-level function; what it needs lives on `app.state` (`create_app` puts it
there): the team registry, the door core (`door`, sdk/door/), the readiness tracker, the admin key.
The pipeline endpoints and the pass-through are raw ASGI (gateway/proxy.py); `/v1/models` and the
stored responses are framework routes, but they too are answered by the door core, as are the
provider-shaped 404/405 for any other path or method.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Annotated, Any, cast

from litestar import Litestar, Request, Response, delete, get, route
from litestar.datastructures import State
from litestar.di import NamedDependency, Provide
from litestar.enums import HttpMethod
from litestar.exceptions import HTTPException, MethodNotAllowedException, NotFoundException
from litestar.handlers import asgi
from litestar.params import QueryParameter
from prometheus_client import CONTENT_TYPE_LATEST

from gateway.admin import AdminKey, admin_guard
from gateway.edge import EdgeLimits
from gateway.proxy import AsgiCall, Receive, door_handler
from gateway.proxy import Scope as ASGIScope
from gateway.refusals import auth_failure
from gateway.ui import UI_HANDLERS
from sdk.cache.keys import is_entry_key
from sdk.door import PIPELINE, Door, KeyedTeams, Reply, protocol_for, refusal
from sdk.door.bodies import DEFAULT_BUDGET_BYTES, BodyBudget
from sdk.errors import InvalidRequestError, SlipstreamError
from sdk.observability import live_stats, live_workers, tracing
from sdk.observability.exposition import exposition
from sdk.offload import HEAVY_POOL
from sdk.passthrough import PREFIXES as PASSTHROUGH_PREFIXES
from sdk.pipeline import REQUEST_ID_HEADER, new_request_id
from sdk.promptcache.stats import report as prompt_cache_report
from sdk.providers.upstream import close_upstream_for_running_loop
from sdk.readiness import Readiness
from sdk.runtime import TeamRegistry, TeamRuntime
from sdk.services import Services
from sdk.spend import spend_report
from sdk.state import backend_status

# --- answers in the provider's shape ------------------------------------------------------------------


def _response(reply: Reply) -> Response[bytes]:
    """A door core's whole reply as a framework response (its headers carry type, length and request id)."""
    headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in reply.headers}
    return Response(reply.body, status_code=reply.status, headers=headers, media_type=headers.get("content-type"))


def _call(request: Request[Any, Any, State]) -> AsgiCall:
    return AsgiCall(cast("ASGIScope", request.scope), cast("Receive", request.receive))


def _refused(request: Request[Any, Any, State], exc: Exception) -> Response[bytes]:
    """A failure behind a framework route, through the door core's error ladder: Slipstream's own
    refusals, Litestar's (a bad query parameter, ...), and a bug of ours as a logged, counted 500."""
    if isinstance(exc, HTTPException):
        exc = SlipstreamError(str(exc.detail), status=exc.status_code, headers=exc.headers)
    return _response(refusal(protocol_for(request.url.path, request.scope["headers"]), exc, None, new_request_id()))


def _unrouted(request: Request[Any, Any, State], _: NotFoundException | MethodNotAllowedException) -> Response[bytes]:
    """Litestar found no handler (path) or the handler takes another method: the door core's 404/405."""
    door: Door = request.app.state.door
    return _response(door.unrouted(_call(request)))


def _named(response: Response[Any]) -> Response[Any]:
    """Every answer names a request id (`x-slipstream-request-id`): the door core's answers carry
    their own; anything else the app answers (health, metrics, the status page) gets one here.
    An `after_request` hook runs for framework handlers only, so the door core's ASGI routes (every
    proxied request) pay nothing for it; a `before_send` hook wrapped every send of every request."""
    if REQUEST_ID_HEADER not in response.headers:
        response.headers[REQUEST_ID_HEADER] = new_request_id()
    return response


# --- the door core's routes ---------------------------------------------------------------------------

# One ASGI handler per pipeline endpoint of the door core's table, and one for the pass-through mounts.
SHUTDOWN_SETTLE_S = 10.0  # a bound on the wait for cancelled requests to end at shutdown (they take a few loop turns)
PIPELINE_ROUTES = [asgi(path, is_mount=False, copy_scope=False)(door_handler(endpoint)) for path, endpoint in PIPELINE.items()]
PASSTHROUGH_ROUTE = asgi(list(PASSTHROUGH_PREFIXES), is_mount=True, copy_scope=True)(door_handler(None))


@route(["/v1/models", "/v1/models/{model_id:path}", "/v1/responses/{response_id:str}", "/v1/responses/{response_id:str}/input_items"],
       http_method=[HttpMethod.GET, HttpMethod.DELETE], status_code=200)
async def beside_the_pipeline(request: Request[Any, Any, State]) -> Response[bytes]:
    """`/v1/models`, `/v1/models/{id}` and the stored responses: the door core reads the path."""
    door: Door = request.app.state.door
    return _response(await door.answer(_call(request)))


# --- the gateway's own routes -------------------------------------------------------------------------


async def _team(request: Request[Any, Any, State]) -> AsyncIterator[TeamRuntime]:
    """Dependency: the caller's team; a missing or unknown key is the door core's 401, and the call
    counts against the team's request limits until its handler has answered (the door core's 429)."""
    door: Door = request.app.state.door
    async with door.team(_call(request)) as team:
        yield team


@get("/healthz", sync_to_thread=False)
def healthz() -> dict[str, object]:
    """Liveness: the process answers (no team names to anyone who can reach the port). Readiness is /readyz."""
    return {"status": "ok"}


@get("/readyz", sync_to_thread=False)
def readyz(state: State) -> Response[dict[str, object]]:
    """200 once what the served policies need is loaded (sdk/readiness.py); 503 with each part's state before.
    `state` shows the state backend: a degraded one (Redis away, local state) still serves, so stays ready.
    No team names: anyone who can reach the port may ask."""
    readiness: Readiness = state.readiness
    registry: TeamRegistry = state.registry
    body = {**readiness.body(), "state": backend_status(registry.services.state())}
    return Response(body, status_code=200 if readiness.ready else 503)


@get("/metrics", guards=[admin_guard])
async def metrics() -> Response[bytes]:
    # Rendering walks every series: in a thread, so a scrape never holds the loop.
    return Response(await asyncio.to_thread(exposition), media_type=CONTENT_TYPE_LATEST)


@get("/v1/slipstream/cache-report", sync_to_thread=False)
def cache_report(team: NamedDependency[TeamRuntime]) -> Response[object]:
    """The caller's team prompt-cache summary (docs/prompt-cache.md)."""
    return Response(prompt_cache_report(team.team))


@get("/v1/slipstream/spend")
async def spend(team: NamedDependency[TeamRuntime], state: State) -> Response[object]:
    """The caller's team spend this UTC day and month, by key and model (docs/spend.md)."""
    registry: TeamRegistry = state.registry
    return Response(await spend_report(registry.services.state(), team.team, team.policy.budget))


@delete("/v1/slipstream/cache", status_code=200)
async def invalidate_cache(team: NamedDependency[TeamRuntime], state: State,
                           key: Annotated[str | None, QueryParameter()] = None) -> dict[str, int]:
    """Drop the caller's team's response-cache entries: all of them, or the one `?key=` names
    (the `x-slipstream-cache-key` header of the answer it produced). Each is one of the team's turns in
    the cache stores' thread (ResponseCache.invalidate): in asyncio's default pool, first come, first served,
    one team's many calls held every other caller of it (policy reloads, /metrics, the shared cache's
    replication), and each took the store's writer lock every team's stores wait on."""
    if key is not None and not key.strip():
        raise InvalidRequestError("key: empty; give an entry's x-slipstream-cache-key, or leave 'key' out to drop every entry")
    if key is not None and not is_entry_key(key):  # shared with every replica through Redis: only a key an entry can have
        raise InvalidRequestError("key: not an entry's key; give the x-slipstream-cache-key header of the answer "
                                  "(64 lowercase hex digits), or leave 'key' out to drop every entry")
    services: Services = state.registry.services
    cache = await asyncio.wrap_future(HEAVY_POOL.submit(services.installed_response_cache, tenant=team.team))  # opened there the first time
    removed = await cache.invalidate(team.team, key or None) if cache is not None else 0
    return {"removed": removed if key else removed + services.embedding_cache().invalidate_team(team.team)}


# --- the app ------------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _lifespan(app: Litestar) -> AsyncIterator[None]:
    registry: TeamRegistry = app.state.registry
    readiness: Readiness = app.state.readiness

    def reloaded() -> None:  # a reload may add a team that needs a model loaded
        readiness.start(registry.warm_ups())

    reloaded()
    tracing.enabled()  # with an OTLP endpoint, tracing (and its export process) is set up now, not on the first request
    interval: float | None = app.state.watch_interval_s
    watcher = asyncio.create_task(registry.watch(interval, reloaded)) if interval else None
    sweeper = asyncio.create_task(registry.sweep())  # what the teams' prompt-cache planners no longer need
    start = getattr(registry.services.state(), "start", None)
    if start is not None:
        start()  # check in with the shared store now: replica count and flags before the first request
    shared = live_workers.shared_dir()  # under --workers: the status page adds up every worker's buckets
    publisher = asyncio.create_task(live_workers.publish(live_stats.enable(), shared)) if shared else None
    try:
        yield
    finally:
        if watcher is not None:
            watcher.cancel()
        sweeper.cancel()
        if publisher is not None:
            publisher.cancel()
        # uvicorn waits for the requests in flight, but past --shutdown-timeout it cancels them and goes
        # on without waiting: their ends (a stream's charge from what was sent) would reach a closed
        # state backend, and a team's spend be lost at every deploy. They end within a few loop turns.
        requests: set[asyncio.Task[Any]] = app.state.requests
        if requests:
            await asyncio.wait(requests, timeout=SHUTDOWN_SETTLE_S)
        await asyncio.sleep(0)  # an ended request's accounting runs on the next loop turn (sdk/streams.py:end_after_the_reply)
        await registry.services.close()
        await close_upstream_for_running_loop()


def create_app(
    policy_paths: Sequence[str | Path],
    *,
    watch_interval_s: float | None = 1.0,
    state_url: str | None = None,
    admin_key: str | None = None,
    body_bytes_in_flight: int | None = None,
    max_connections: int | None = None,
) -> Litestar:
    """Build the proxy for the given policy files or directories (errors raise PolicyError).

    `state_url` names the state backend (sdk/state/); None reads $SLIPSTREAM_STATE_URL.
    `admin_key` (default: $SLIPSTREAM_ADMIN_KEY) guards /metrics when set (gateway/admin.py) and the
    status page at /ui (gateway/ui/), which stays closed without one.
    `body_bytes_in_flight` (default: $SLIPSTREAM_BODY_BYTES_IN_FLIGHT, else 1 GiB) bounds the request
    bodies the process holds at once, each team its share (sdk/door/bodies.py).
    """
    registry = TeamRegistry(list(policy_paths), Services(state_url=state_url))
    registry.services.state()  # opened now: a bad URL fails at start, not on the first request
    live_stats.enable()  # the status page's buckets, fed by every team's metrics stage
    app = Litestar(
        route_handlers=[healthz, readyz, metrics, cache_report, spend, invalidate_cache, beside_the_pipeline, *PIPELINE_ROUTES,
                        PASSTHROUGH_ROUTE, *UI_HANDLERS],
        dependencies={"team": Provide(_team)},
        lifespan=[_lifespan],
        after_request=_named,
        openapi_config=None,
        logging_config=None,  # the CLI configures logging; an embedding program keeps its own
        request_max_body_size=None,
        # Errors are answers in the provider's shape (each team's body limit is enforced by the door core itself).
        exception_handlers={
            NotFoundException: _unrouted,
            MethodNotAllowedException: _unrouted,
            Exception: _refused,
        },
    )
    app.state.registry = registry
    budget = body_bytes_in_flight if body_bytes_in_flight is not None else int(os.environ.get(BODY_BUDGET_ENV) or DEFAULT_BUDGET_BYTES)
    if budget < 1:
        raise ValueError(f"--max-body-bytes-in-flight must be a positive number of bytes, not {budget}")
    connections = max_connections or int(os.environ.get(CONNECTIONS_ENV) or EdgeLimits.max_connections)
    bodies = BodyBudget(budget, requests=connections)  # each request holds at least its part: a connection's
    app.state.requests = set()  # pipeline and pass-through requests in flight (gateway/proxy.py:door_handler)
    app.state.door = Door(KeyedTeams(registry, functools.partial(auth_failure, "team")), bodies)
    app.state.readiness = Readiness()
    app.state.admin_key = AdminKey.from_env(admin_key)
    app.state.watch_interval_s = watch_interval_s
    return app


BODY_BUDGET_ENV = "SLIPSTREAM_BODY_BYTES_IN_FLIGHT"  # set by `slipstream serve --max-body-bytes-in-flight` for its workers
CONNECTIONS_ENV = "SLIPSTREAM_MAX_CONNECTIONS"  # set by `slipstream serve --max-connections` for its workers
SERVE_PATHS_ENV = "SLIPSTREAM_SERVE_POLICIES"  # os.pathsep-separated, set by `slipstream serve --workers N`


def app_from_env() -> Litestar:
    """The app of one `--workers` process: policies and state URL from the environment the CLI set."""
    return create_app(os.environ[SERVE_PATHS_ENV].split(os.pathsep))
