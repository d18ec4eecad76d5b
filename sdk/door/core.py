"""The request-handling core behind both doors: from a `Call` (bytes in) to a `Reply` (bytes out).

In order, for a pipeline endpoint: a request id; the team (`Teams`: a team key at the proxy, the
client's own policy in the drop-in SDK); the method; the team's body limit; parse and edge checks
(sdk/requests.py); the team's pipeline; the answer's headers; every failure on the way through the
error ladder (sdk/door/replies.py:refusal). `prepare` and `run` are the two halves, so the proxy can
watch for a disconnect while the pipeline runs (it cannot before: the body is read from the same
channel). Everything beside the pipeline goes through `answer`: `/v1/models`, stored responses,
pass-through (sdk/passthrough/), and the provider-shaped 404/405 for any other path or method.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Iterable
from urllib.parse import parse_qsl

from sdk.door.bodies import BodyBudget, BodyHold
from sdk.door.call import Call, ClientGone
from sdk.door.keys import Teams
from sdk.door.replies import JSON, SSE, Reply, encoded, named, refusal, stream_failure, whole
from sdk.errors import NotFoundError, SlipstreamError
from sdk.models import model_body, models_body
from sdk.offload import HOLDING, TENANT
from sdk.passthrough import Client, family, forward
from sdk.pipeline import RequestContext, new_request_id
from sdk.requests import FORWARDED_HEADERS, parse_off_loop
from sdk.routing.translation.responses_streams import ending_as_responses
from sdk.routing.translation.streams import ChunkError
from sdk.runtime import TeamRuntime, slipstream_headers
from sdk.streams import end_after_the_reply
from sdk.types import Endpoint, LLMStream, Protocol, Timings

# The endpoint table: path -> pipeline endpoint. Both doors serve exactly these (the proxy mounts
# one handler per entry, the drop-in SDK looks the path up here).
PIPELINE: dict[str, Endpoint] = {
    "/v1/chat/completions": Endpoint.CHAT_COMPLETIONS,
    "/v1/messages": Endpoint.MESSAGES,
    "/v1/messages/count_tokens": Endpoint.COUNT_TOKENS,
    "/v1/embeddings": Endpoint.EMBEDDINGS,
    "/v1/responses": Endpoint.RESPONSES,
    "/v1/responses/input_tokens": Endpoint.RESPONSES_INPUT_TOKENS,
    "/v1/responses/compact": Endpoint.RESPONSES_COMPACT,
}
MODELS = "/v1/models"  # GET the team's models; GET /v1/models/{id} one of them (sdk/models.py)
STORED = re.compile(r"/v1/responses/([^/]+)(/input_items)?")  # a stored response (sdk/responses/api.py)
_FORWARDED = frozenset(name.encode() for name in FORWARDED_HEADERS)


def allowed(path: str) -> tuple[str, ...] | None:
    """The methods `path` takes; None where it is not a path Slipstream serves. Pass-through paths
    have their own table (sdk/passthrough/paths.py)."""
    if path in PIPELINE:
        return ("POST",)
    if path == MODELS or path.startswith(MODELS + "/"):
        return ("GET",)
    stored = STORED.fullmatch(path)
    if stored is not None:
        return ("GET",) if stored.group(2) else ("GET", "DELETE")
    return None


def protocol_for(path: str, headers: Iterable[tuple[bytes, bytes]]) -> Protocol:
    """Whose error shape a refusal on `path` takes: its endpoint's provider's; where the path alone
    does not say (models, an unknown path), Anthropic's when the client sends `anthropic-version`."""
    endpoint = PIPELINE.get(path)
    if endpoint is not None:
        return endpoint.protocol
    passed = family(path)
    if passed is not None:
        return passed[0]
    if STORED.fullmatch(path):
        return Protocol.OPENAI
    return Protocol.ANTHROPIC if any(name == b"anthropic-version" for name, _ in headers) else Protocol.OPENAI


class Door:
    """One door's core: the same steps for the proxy's ASGI handlers and the drop-in SDK's transport."""

    __slots__ = ("bodies", "teams")

    def __init__(self, teams: Teams, bodies: BodyBudget | None = None):
        self.teams = teams
        self.bodies = bodies or BodyBudget(None)  # the request bodies held at once (sdk/door/bodies.py)

    @contextlib.asynccontextmanager
    async def team(self, call: Call) -> AsyncIterator[TeamRuntime]:
        """The caller's team, for the gateway's own routes (spend, cache report, cache invalidation):
        raises the 401, and the 429 of its request limits, which the call counts against while it
        runs. No provider sees these calls, but each reads the state every team shares (Redis with
        replicas) or takes the response cache's one lock: unlimited, they were a way past the team's
        limits onto what every team waits on."""
        team, key_id = self.teams.authenticate(call)
        async with _counted(team, key_id):
            yield team

    async def prepare(self, endpoint: Endpoint, call: Call) -> tuple[TeamRuntime, RequestContext, BodyHold] | Reply:
        """Authenticate, check the method and the body limit, read and parse: the team, the
        request's context and its body's hold on the process's budget (`run` lets it go), or the
        refusal to send. `ClientGone` when the client left meanwhile."""
        timings = Timings()  # the overhead header counts from here
        request_id = new_request_id()  # named by every answer, refusals before the pipeline included
        team_name: str | None = None
        hold: BodyHold | None = None
        try:
            team, key_id = self.teams.authenticate(call)
            team_name = team.team
            TENANT.set(team_name)  # the heavy-work pool serves teams in turn (sdk/offload.py)
            if call.method != "POST":
                raise SlipstreamError(f"{call.method} is not allowed on {call.path}: use POST", status=405)
            hold = BodyHold(self.bodies, team_name)
            hold.need(0)  # the request's place, whatever its body (a connection of the process's)
            HOLDING.set(hold.need)  # a continuation's stored history counts too (sdk/responses/conversation.py)
            raw = await call.read(team.policy.limits.max_body_bytes, hold.need)
            forward = {name.decode(): value.decode("latin-1") for name, value in call.headers if name in _FORWARDED}
            request = await parse_off_loop(endpoint, raw, call.query, forward)
        except BaseException as exc:  # the body is let go however reading it ended: a refusal, the client gone, a cancel
            if hold is not None:
                hold.release()
            if isinstance(exc, ClientGone) or not isinstance(exc, Exception):
                raise
            return refusal(endpoint.protocol, exc, team_name, request_id)
        return team, RequestContext(request=request, team=team.team, timings=timings, key_id=key_id,
                                    request_id=request_id, parent=call.caller), hold

    async def run(self, team: TeamRuntime, ctx: RequestContext, hold: BodyHold, accounting_after_reply: bool = False) -> Reply:
        """The team's pipeline on a prepared request; its answer, or its failure, as a reply. The
        body's `hold` is let go when the answer is in hand, or, for a stream, when the reply is
        closed. With `accounting_after_reply` (the HTTP door), a stream's end callbacks run after
        the response has ended (sdk/streams.py:end_after_the_reply)."""
        try:
            answer = await team.pipeline.run(ctx)
            # The provider's headers that pass (rate limits, its request id), then Slipstream's own.
            sent = [(name.encode(), value.encode("latin-1"))
                    for headers in (answer.headers, slipstream_headers(ctx, answer)) for name, value in headers.items()]
            if isinstance(answer, LLMStream):
                if accounting_after_reply:
                    end_after_the_reply(answer)
                chunks = answer.events
                if ctx.request.endpoint is Endpoint.RESPONSES:  # a failure mid-stream ends it as Responses streams end
                    chunks = ending_as_responses(chunks, ctx.request.body, lambda exc: _failure(exc, ctx))
                return Reply(answer.status, [*SSE, *sent], chunks=chunks, close=hold.until(answer.aclose), stream_of=ctx)
            return Reply(answer.status, [*JSON, (b"content-length", str(len(answer.body)).encode()), *sent], answer.body)
        except Exception as exc:
            return refusal(ctx.request.protocol, exc, ctx.team, ctx.request_id, ctx)
        finally:
            if not hold.streaming:
                hold.release()

    async def answer(self, call: Call) -> Reply:
        """Any request: a pipeline endpoint's in one go (`prepare`, then `run`), and everything
        beside the pipeline — models, stored responses, pass-through, the 404/405 for the rest."""
        endpoint = PIPELINE.get(call.path)
        if endpoint is not None:
            prepared = await self.prepare(endpoint, call)
            return prepared if isinstance(prepared, Reply) else await self.run(*prepared)
        request_id = new_request_id()
        team_name: str | None = None
        try:
            team, key_id = self.teams.authenticate(call)
            team_name = team.team
            TENANT.set(team_name)
            if family(call.path) is not None:
                return await _passed(team, key_id, call, request_id, BodyHold(self.bodies, team.team))
            methods = allowed(call.path)
            if methods is None or call.method not in methods:
                raise _unserved(call, methods)
            # Stored responses and model lists may reach the provider under the key every team shares:
            # they count against the team's request limits like any other call.
            async with _counted(team, key_id):
                stored = STORED.fullmatch(call.path)
                if stored is not None:
                    return await _stored(team, call, stored, request_id)
                return await _models(team, call, request_id)
        except ClientGone:
            raise
        except Exception as exc:
            return refusal(protocol_for(call.path, call.headers), exc, team_name, request_id)

    def unrouted(self, call: Call) -> Reply:
        """A path Slipstream does not serve (404) or a method its path does not take (405), answered
        after the key is checked, so an unauthenticated caller learns nothing about the paths."""
        try:
            self.teams.authenticate(call)
            raise _unserved(call, allowed(call.path))
        except SlipstreamError as exc:
            return refusal(protocol_for(call.path, call.headers), exc, None, new_request_id())


@contextlib.asynccontextmanager
async def _counted(team: TeamRuntime, key_id: str) -> AsyncIterator[None]:
    """A call beside the pipeline, admitted by the team's (and the key's) request and concurrency
    limits, not its budget, and holding its slot until it ends: the 429 when they refuse."""
    admission = await team.limits.admit(key_id, budget=False)
    try:
        yield
    finally:
        team.limits.settle(admission, key_id, "", None)


def _failure(exc: Exception, ctx: RequestContext) -> ChunkError:
    error = stream_failure(exc, ctx)
    return ChunkError(error.status, error.message)


def _unserved(call: Call, methods: tuple[str, ...] | None) -> SlipstreamError:
    if methods is None:
        return NotFoundError(f"{call.method} {call.path} is not an endpoint Slipstream serves (docs/api.md lists them)")
    return SlipstreamError(f"{call.method} is not allowed on {call.path}: use {' or '.join(methods)}", status=405)


async def _models(team: TeamRuntime, call: Call, request_id: str) -> Reply:
    """The models the team may call, in the shape of the client's provider (Anthropic's paginated)."""
    protocol = protocol_for(call.path, call.headers)
    if call.path == MODELS:
        body = models_body(await team.models.models(), protocol, dict(parse_qsl(call.query)))
    else:
        body = model_body(await team.models.model(call.path.removeprefix(MODELS).lstrip("/")), protocol)
    return whole(200, named([], request_id), body)


async def _stored(team: TeamRuntime, call: Call, stored: re.Match[str], request_id: str) -> Reply:
    """GET / DELETE of a stored response, or its input items: from the store or the native provider
    that holds it (sdk/responses/api.py)."""
    response_id = stored.group(1)
    if stored.group(2):
        answer = await team.responses.input_items(response_id, call.query)
    elif call.method == "GET":
        answer = await team.responses.retrieve(response_id, call.query)
    else:
        answer = await team.responses.delete(response_id)
    return whole(answer.status, named(encoded(answer.headers), request_id), answer.body)


async def _passed(team: TeamRuntime, key_id: str, call: Call, request_id: str, hold: BodyHold) -> Reply:
    """A pass-through request (sdk/passthrough/): every check is `forward`'s; the body streams both ways.
    A body `forward` reads whole (a completion's, a batch create's) is held in the process's budget
    (`hold`) until the answer has ended, as a pipeline request's is: outside it, a team past its share
    had as many more taken as it sent, each up to its body or upload limit."""
    body, length = call.upload()
    headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in call.headers}
    try:
        hold.need(0)  # the request's place, whatever its body (a connection of the process's)
        passed = await forward(team, call.method, call.raw_path(), call.query, headers, body, length,
                               Client(call.origin(), key_id, call.caller, request_id), hold.need)
    except BaseException:
        hold.release()
        raise
    sent = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in passed.headers]
    return Reply(passed.status, sent, chunks=passed.body(), close=hold.until(passed.aclose))
