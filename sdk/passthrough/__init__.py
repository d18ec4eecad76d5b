"""Pass-through endpoints: what a provider serves that the pipeline does not transform.

`/v1/completions`, `/v1/batches…` and `/v1/files…` go to the team's first `kind: openai` provider,
`/v1/messages/batches…` to its first `kind: anthropic` provider (policy order), with that
provider's key in place of the client's team key. Both doors reach `forward` through the door core
(sdk/door/), so both enforce the same things, in this order:

1. The path is one of the operations served (sdk/passthrough/paths.py); dot segments and
   percent-encoding are refused before anything leaves.
2. The team's rate and concurrency limits, and its budget for what runs a model (a completion, a
   batch), are admitted by the pipeline's own limits stage (sdk/limits/stage.py): a completion
   holds its worst cost until its answer ends; a batch is created only if its worst cost at batch
   rates fits in what is left of the budget (checked and held in one step), and is then charged it
   until its results are read.
3. Every model a completion or batch names (the completion's `model`, each line of a batch's input
   file, each request of a message batch) must be a name the pipeline's door takes (a 400
   otherwise) and match one of the team's routes (the router's 404), and that route must have a
   target on this provider that keeps the name (a 404 otherwise: the name is sent as written).
4. Objects are the creating team's (sdk/state/ownership.py): an id the team does not own answers
   the provider's 404 without going upstream, list pages show only the team's own objects, and a
   batch's `input_file_id` and a list's cursor (`after`, `after_id`, `before_id`) must be the
   team's own, and so must every file a completion, a message batch's request or a batch input
   line names (sdk/state/ownership.py:referenced_files). `results_url` is pointed at the gateway.
   A client `prompt_cache_key` and end-user ids (`user`, `safety_identifier`, `metadata.user_id`)
   are namespaced to the team (a completion's, an uploaded file's lines', a message batch's
   params'), as the pipeline does for a call (sdk/promptcache/keys.py).
5. Spend: a completion's usage at the model's price; batch results at batch rates (half price)
   when they are read, replacing what a budgeted team's batch was charged when created (docs/spend.md). One access log line and the pass-through metrics per request.
6. A provider's 401/403 (it refused the gateway's key, and may echo it) is replaced by the
   gateway's own answer.

Bodies stream both ways where nothing needs reading: an upload is written upstream as the client
sends it (bounded by `limits.max_upload_bytes`; chunked, since keying its lines can change its
length); downloads, results and completions stream back as they arrive (scanned for usage as they
pass). A create's request and an object or list answer are small JSON, read whole. One attempt,
no retries: a streamed body cannot be sent twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import secrets
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from sdk.errors import (
    NotFoundError,
    RequestTooLargeError,
    SlipstreamError,
    UpstreamTimeoutError,
    UpstreamUnreachableError,
    account_rate_limited,
    credentials_refused,
    naming_provider,
)
from sdk.estimate import input_tokens, output_limit
from sdk.limits.stage import RESERVE_EXACT_CHARS, LimitsStage
from sdk.observability import access_log, metrics, tracing
from sdk.observability.tracing import Parent, RequestTrace
from sdk.offload import off_loop_if_large
from sdk.passthrough.bodies import (
    Tally,
    bounded,
    completion_events,
    input_file_parts,
    json_object,
    keyed_upload,
    once,
    read_object,
    tallied,
    whole,
)
from sdk.passthrough.listing import checked_object, own_pages
from sdk.passthrough.paths import PREFIXES, Operation, family, operation, upstream_headers
from sdk.passthrough.spends import spend_checks
from sdk.providers.base import HTTPProvider, account_header
from sdk.providers.upstream import UpstreamResponse, upstream_for_running_loop
from sdk.requests import check_model_name
from sdk.responses.conversation import Conversations, read_by_id
from sdk.routing.router import Router
from sdk.runtime import TeamRuntime
from sdk.sse import without_account_limits
from sdk.state import in_background
from sdk.state.answer_ids import AUDIO, check_audio
from sdk.state.backend import Admission
from sdk.state.message_threads import check_batch_requests
from sdk.state.ownership import KEEP_S, MISSING_FILE, Ownership, check_account_objects, ownership_of
from sdk.streams import close_after
from sdk.types import Endpoint, LLMRequest, Protocol, Usage

__all__ = ["PREFIXES", "Client", "Passed", "family", "forward"]

_DROP_RESPONSE = frozenset({"connection", "keep-alive", "transfer-encoding", "set-cookie", "trailer", "upgrade"})
BATCH_RATE = 0.5  # both providers bill a batch's tokens at half the price of a call (per-call tool fees in full)
_LOGGED_MODELS = 8  # a batch's model names in its access-log line and span; more are counted
BATCH_EXACT = 64  # a batch's first requests have their input tokenized for its worst cost; the rest counted by length
_LINE_ENDPOINTS = {"/v1/responses": Endpoint.RESPONSES, "/v1/embeddings": Endpoint.EMBEDDINGS}  # else counted as chat
_CURSORS = frozenset({"after", "before", "after_id", "before_id"})  # list parameters that name an object
_MISSING = {  # what the provider answers for an id it does not have, per kind of object
    "file": MISSING_FILE,
    "batch": "No batch found with id '{}'.",
    "message_batch": "message_batch: {} not found",
}


@dataclass(frozen=True, slots=True)
class Client:
    """Who asks, and where they reached the gateway."""

    origin: str  # scheme://host[:port] the client used: provider URLs in answers point back here
    key_id: str = ""  # which team key (a hash prefix), for per-key limits and the access log
    caller: Parent | None = None  # the application's current span, when the drop-in SDK forwards in process
    request_id: str = ""  # the door's id for this request (x-slipstream-request-id, the access log); "" for a new one


@dataclass(slots=True)
class Passed:
    """The answer: status, headers to send on, and the body as it arrives. `finish` runs once, when
    the body has passed in full (`ok`), was dropped (`cancelled`) or broke (`failed`)."""

    status: int
    headers: list[tuple[str, str]]
    chunks: AsyncIterator[bytes]
    finish: Callable[[str, BaseException | None], None]
    response: UpstreamResponse | None = None
    _ended: bool = field(default=False, init=False)

    async def body(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self.chunks:
                yield chunk
        except (GeneratorExit, asyncio.CancelledError):
            try:
                await close_after(self.chunks)  # the body's own end first: a completion stream reads on to its usage
            finally:
                self._end("cancelled")  # settled even if the read-on is cancelled in its turn
            raise
        except BaseException as exc:
            self._end("failed", exc)
            raise
        self._end("ok")

    def abort(self) -> None:
        if self.response is not None:
            self.response.abort()
        self._end("cancelled")

    async def aclose(self) -> None:
        """Once the body has ended, however: after a full read the connection is back in the pool
        already and this changes nothing; before, the connection is dropped (the upstream's cancel)."""
        self.abort()

    def _end(self, outcome: str, error: BaseException | None = None) -> None:
        if not self._ended:
            self._ended = True
            self.finish(outcome, error)


def provider_for(team: TeamRuntime, protocol: Protocol) -> HTTPProvider:
    for name in team.policy.providers:
        provider = team.providers[name]
        if isinstance(provider, HTTPProvider) and provider.protocol is protocol:
            return provider
    raise NotFoundError(f"team {team.team} has no {protocol} provider with a key to pass this request to: the "
                        f"pass-through (legacy completions, files, batches and the provider's other endpoints) goes to "
                        f"`kind: {protocol}` providers only; a local engine answers chat, messages and responses")


@dataclass(slots=True)
class _Exchange:
    """One pass-through request as it runs: what its checks, charges and log line need."""

    team: TeamRuntime
    client: Client
    op: Operation
    provider: HTTPProvider
    limits: LimitsStage
    owners: Ownership
    started: float = field(default_factory=time.perf_counter)
    request_id: str = ""
    model: str = ""
    completion: LLMRequest | None = None  # a completion's request, counted when its answer carries no usage
    usage_asked: bool = False  # the gateway, not the client, asked the completion's stream for its usage chunk
    admission: Admission | None = None
    batch_hold: Admission | None = None  # a batch's worst cost, held while the call creating it runs
    trace: RequestTrace | None = None

    @property
    def route(self) -> str:
        return f"{self.provider.name}/{self.op.family}"

    def not_found(self, kind: str, object_id: str) -> NotFoundError:
        return NotFoundError(_MISSING[kind].format(object_id))

    async def check_owner(self, kind: str, object_id: str) -> str | None:
        """Refuse an object the team does not own; for a file, the batch it is an output of."""
        if kind == "file":
            owned, batch = await self.owners.file(self.team.team, object_id)
        else:
            owned, batch = await self.owners.is_owner(self.team.team, kind, object_id), None
        if not owned:
            raise self.not_found(kind, object_id)
        return batch

    async def check_cursors(self, query: str) -> None:
        """A list page starts at the object its cursor names, so the cursor must be the team's own: the
        page after another team's id skipped the team's newer objects, telling the id apart from a
        made-up one (and when it was made)."""
        for name, value in parse_qsl(query):
            if name in _CURSORS:
                await self.check_owner(self.op.kind, value)

    def check_models(self, models: list[str]) -> None:
        """Refuse a model the pipeline would refuse: a name that is not printable ASCII of at most 256
        characters (400), one no route matches (the router's 404), and one whose route does not send
        it, as named, to this provider (404): the pass-through sends a model as the client names it
        to the team's first provider of its kind, so a route that renames it (`gpt-4o` → a target's
        `gpt-4o-mini`) or sends it elsewhere (a local engine) would be walked around."""
        router = self.team.pipeline.terminal
        assert isinstance(router, Router)
        distinct = list(dict.fromkeys(models))
        for model in distinct:
            check_model_name(model)
            route = router.route_for(model)
            if not any(t.provider == self.provider.name and t.model in (None, model) for t in route.targets):
                raise NotFoundError(f"this team's policy does not send model {model!r} as named to provider {self.provider.name}, "
                                    "where the pass-through sends it: use the pipeline's endpoints for it")
        shown = sorted(distinct)[:_LOGGED_MODELS]
        self.model = ",".join(shown + ([f"+{len(distinct) - len(shown)} more"] if len(distinct) > len(shown) else []))

    def worst_cost(self, requests: list[LLMRequest], first: int = 0, history: list[int] | None = None) -> float:
        """What these requests may cost at most (each one's reservation: input counted, with its
        `history` tokens of stored conversation and items, its output limit, the dearest target's
        price), at batch rates for a batch (whose requests are counted from its `first`). For a budgeted
        team, the limits stage's 403 when a model has no price. A completion counts like a chat request."""
        if self.op.action == "complete":
            return self.limits.reservation(requests[0], routed=False)
        history = history or [0] * len(requests)
        return sum(self.limits.reservation(request, RESERVE_EXACT_CHARS if first + i < BATCH_EXACT else 0, history=history[i],
                                           token_rate=BATCH_RATE, routed=False)
                   for i, request in enumerate(requests))

    async def check_batch_input(self, file_id: str, limit: int) -> float:
        """Check a batch's input file (the files and account objects its lines name, the models they
        run) a part at a time as it is read from the provider, and its worst cost at batch rates."""
        models: dict[str, None] = {}
        worst, count = 0.0, 0
        async with contextlib.aclosing(input_file_parts(self.provider, file_id, limit)) as parts:
            async for lines, size in parts:
                bodies = [line for _, line in lines]
                await self.owners.check_files(self.team.team, bodies, size)
                # a part of 256 KiB or more (a line may be 16 MiB) is walked in the heavy-work pool, as the team's work
                await check_audio(self.owners, self.team.team, bodies, size)
                await off_loop_if_large(size, check_account_objects, self.limits.provider_objects, bodies)
                await self.check_conversations(bodies)
                new = [model for model in dict.fromkeys(str(line.get("model") or "") for line in bodies) if model not in models]
                self.check_models(new)  # as they come: a name is never held unchecked (a line may be 16 MiB)
                models.update(dict.fromkeys(new))
                requests = [LLMRequest(_LINE_ENDPOINTS.get(url, Endpoint.CHAT_COMPLETIONS), line) for url, line in lines]
                # the provider reads (and bills) the stored conversation a line continues and the items it references
                history = await self.limits.history_tokens(requests) if self.limits.budget is not None else None
                worst += await off_loop_if_large(size, self.worst_cost, requests, count, history)
                count += len(lines)
        self.check_models(list(models))  # the names the access log and span show
        return worst

    async def check_conversations(self, bodies: list[dict[str, Any]]) -> None:
        """The stored responses and items batch lines name (`previous_response_id`, `item_reference`)
        must be the team's own, as on /v1/responses (sdk/responses/conversation.py): the provider
        resolves them itself, on the account every team shares, into an output file the team reads."""
        previous = [body["previous_response_id"] for body in bodies if body.get("previous_response_id") is not None]
        items = [item.get("id") for body in bodies if isinstance(inputs := body.get("input"), list)
                 for item in inputs if isinstance(item, dict) and item.get("type") == "item_reference"]
        items += [item_id for body in bodies for item_id in read_by_id(body.get("input"))]  # read by id too
        if not previous and not items:
            return
        if self.limits.responses is None:
            raise NotFoundError("this team has no stored responses for batch lines to continue or reference")
        await Conversations(self.team.team, self.limits.responses).check_held(previous, items)

    def settle(self, model: str = "", usage: Usage | None = None, estimated: bool = False) -> None:
        admission, self.admission = self.admission, None
        if admission is not None:
            self.limits.settle(admission, self.client.key_id, model or self.model, usage, estimated=estimated)
        hold, self.batch_hold = self.batch_hold, None
        if hold is not None:  # still held: no batch was created
            self.limits.release_hold(hold)

    def charge_batch(self, tally: Tally) -> None:
        for model, usage in tally.by_model.items():
            self.limits.settle(Admission(""), self.client.key_id, model, usage, rate=BATCH_RATE)

    def log(self, status: int | str, usage: Usage | None = None, estimated: bool = False) -> None:
        access_log.record_passthrough(self.team.team, self.client.key_id, self.request_id, f"passthrough:{self.op.family}",
                                      self.model, self.route, status, usage, self.started, estimated)

    def refused(self, exc: SlipstreamError) -> None:
        self.settle()
        metrics.PASSTHROUGH.labels(self.team.team, self.provider.name, self.op.family, str(exc.status)).inc()
        self.log(exc.status)
        tracing.end_passthrough(self.trace, "failed", exc.status, exc)

    def headers(self, response: UpstreamResponse, length: int | None = None) -> list[tuple[str, str]]:
        listed = {token.strip().lower() for token in response.headers.get("connection", "").split(",")}
        shared = self.provider.shared_account
        sent = [(k, v) for k, v in response.headers.items() if k not in _DROP_RESPONSE and k not in listed
                and not (length is not None and k == "content-length") and not account_header(k, shared)]
        if length is not None:
            sent.append(("content-length", str(length)))
        return [*sent, ("x-slipstream-route", self.route), ("x-slipstream-request-id", self.request_id)]


async def forward(team: TeamRuntime, method: str, raw_path: str, query: str, headers: Mapping[str, str],
                  body: bytes | AsyncIterable[bytes], length: int | None, client: Client,
                  need: Callable[[int], None] | None = None) -> Passed:
    """Check, send upstream and start answering one pass-through request; `raw_path` as the client
    wrote it (still percent-encoded). A refusal raises the provider-shaped SlipstreamError. A body read
    whole (what runs a model) is held in the process's body budget through `need` (sdk/door/bodies.py),
    as a pipeline request's is, until the caller lets it go when the answer has ended."""
    op = operation(method, raw_path)
    provider = provider_for(team, op.protocol)
    limits = team.limits
    ex = _Exchange(team, client, op, provider, limits, ownership_of(limits.state), request_id=client.request_id or secrets.token_hex(8))
    try:
        return await _forward(ex, method, query, headers, body, length, need)
    except (UpstreamUnreachableError, UpstreamTimeoutError) as exc:
        named = naming_provider(exc, provider.name)  # the client learns the provider's name, not its URL
        ex.refused(named)
        raise named from exc
    except SlipstreamError as exc:
        ex.refused(exc)
        raise
    except BaseException as exc:
        ex.settle()
        metrics.PASSTHROUGH.labels(team.team, provider.name, op.family, "error").inc()
        tracing.end_passthrough(ex.trace, "failed", error=exc)
        raise


async def _forward(ex: _Exchange, method: str, query: str, headers: Mapping[str, str],
                   body: bytes | AsyncIterable[bytes], length: int | None, need: Callable[[int], None] | None) -> Passed:
    op, team, provider = ex.op, ex.team, ex.provider
    limit = team.policy.limits.max_body_bytes if op.action == "complete" else team.policy.limits.max_upload_bytes
    if length is not None and length > limit:
        raise RequestTooLargeError(f"request body of {length} bytes is over this team's limit of {limit} bytes")
    output_of = None  # the batch a downloaded file is an output of
    reserve = batch_worst = 0.0
    request: dict[str, Any] = {}
    if op.spends:  # read whole: what it runs is checked before anything leaves
        # The team's rates and concurrency first: a request past them is refused before its body is read and checked
        # (its files looked up in the store every team shares, its batch's requests costed); its budget after.
        ex.admission = await ex.limits.admit(ex.client.key_id, budget=False)
        if need is not None and length is not None:
            need(length)  # held from its declared length, before a byte of it is read
        raw = await whole(body, limit, need)
        request = await off_loop_if_large(len(raw), json_object, raw, f"{method} {op.upstream_path}")
        await ex.owners.check_files(team.team, (request,), len(raw))  # a message batch's requests may name files
        # and earlier answers, by id: a Thread to continue (whose context each request is billed), a prompt to compare with
        contexts = await check_batch_requests(ex.owners, team.team, request) if op.kind == "message_batch" else {}
        raw, reserve, batch_worst = await off_loop_if_large(len(raw), spend_checks, ex, request, raw, contexts)
        body, length = raw, len(raw)
    if ex.admission is not None:
        ex.admission = await ex.limits.admit_budget(ex.admission, ex.client.key_id, reserve)
    else:
        ex.admission = await ex.limits.admit(ex.client.key_id, budget=False)
    if op.spends and op.kind == "batch":  # its models are in its input file, which must be the team's
        file_id = request.get("input_file_id")
        if not isinstance(file_id, str) or not (await ex.owners.file(team.team, file_id))[0]:
            raise ex.not_found("file", str(file_id))
        batch_worst = await ex.check_batch_input(file_id, limit)
    if batch_worst:  # it runs after this call answers: only a batch whose worst case fits is created
        ex.batch_hold = await ex.limits.hold_batch(batch_worst)
    if op.object_id:
        output_of = await ex.check_owner(op.kind, op.object_id)
    elif op.action == "list":
        await ex.check_cursors(query)
    elif op.kind == "file" and op.action == "create":  # a batch input file's client ids are keyed on the way
        body = keyed_upload(bounded(once(body) if isinstance(body, bytes) else body, limit), team.team, length)
        length = None
    elif not isinstance(body, bytes):
        body = bounded(body, limit)
    url = provider.base_url + op.upstream_path + (f"?{query}" if query else "")
    ex.trace, sent = tracing.begin_passthrough(team.team, method, op.family, provider, upstream_headers(headers), ex.client.caller)
    if ex.trace is not None:
        ex.trace.root.attributes["slipstream.route"] = ex.route
    sent = {**provider.dialect.auth(provider.keys.keys[provider.keys.order()[0]]), **sent}
    client = provider.client or upstream_for_running_loop()
    response = await client.request(method, url, sent, body, provider.timeouts, length)
    status = response.status
    metrics.PASSTHROUGH.labels(team.team, provider.name, op.family, str(status)).inc()
    metrics.PASSTHROUGH_SECONDS.labels(team.team, op.family).observe(time.perf_counter() - ex.started)
    if status in (401, 403):  # the provider refused the gateway's key; its body may echo it
        response.abort()
        refused = credentials_refused(op.protocol, status, provider.name)
        headers_out = [("content-type", "application/json"), ("content-length", str(len(refused))),
                       ("x-slipstream-route", ex.route), ("x-slipstream-request-id", ex.request_id)]
        return _answer(ex, status, headers_out, once(refused), None)
    if status == 429 and provider.shared_account:  # its message names the account and every team's use of it
        limited = account_rate_limited(op.protocol, await response.read(), provider.name)
        return _answer(ex, status, ex.headers(response, len(limited)), once(limited), None)
    if 200 <= status < 300 and op.action in ("create", "retrieve", "list", "cancel") and op.kind:
        data = await read_object(response)
        if op.action == "list":
            async def page(cursor: str) -> dict[str, Any] | None:
                more = await client.request("GET", f"{provider.base_url}{op.upstream_path}?{cursor}", sent, b"", provider.timeouts)
                if more.status != 200:
                    more.abort()  # the page so far is the answer
                    return None
                return await read_object(more)

            data = await own_pages(ex, data, query, page)
        rewritten = await checked_object(ex, data)
        if ex.batch_hold is not None and isinstance(batch_id := data.get("id"), str):
            hold, ex.batch_hold = ex.batch_hold, None
            await ex.owners.note_batch_charge(team.team, batch_id, ex.limits.charge_created_batch(hold, batch_id))
        return _answer(ex, status, ex.headers(response, len(rewritten)), once(rewritten), None)
    if 200 <= status < 300 and op.action == "delete":
        await ex.owners.disown(op.kind, op.object_id)
    tally = None
    streamed = "event-stream" in response.headers.get("content-type", "")
    if 200 <= status < 300 and (op.action in ("complete", "results") or output_of):
        tally = Tally(whole=op.action == "complete" and not streamed)
    # the audio ids in a batch's output are the team's, as those the pipeline answers it with (sdk/state/answer_ids.py)
    record = functools.partial(ex.owners.own, team.team, AUDIO) if output_of else None
    # a limit's in-band error in a completion stream names the account, where other teams share it
    shared = provider.name if op.action == "complete" and streamed and provider.shared_account else None
    if op.action == "complete" and streamed and tally is not None and ex.completion is not None:
        options = ex.completion.body.get("stream_options")
        asked = isinstance(options, dict) and options.get("include_usage") is True
        chunks = completion_events(response, tally, asked, ex.usage_asked, shared)
    else:
        chunks = tallied(response, tally, record)
        if shared is not None:
            chunks = without_account_limits(chunks, shared)
    return _answer(ex, status, ex.headers(response), chunks, tally, output_of or op.object_id, response)


def _answer(ex: _Exchange, status: int, headers: list[tuple[str, str]], chunks: AsyncIterator[bytes],
            tally: Tally | None, batch_id: str = "", response: UpstreamResponse | None = None) -> Passed:
    """The answer, and what happens when its body ends: the request's charge, its log line, its span."""

    def finish(outcome: str, error: BaseException | None) -> None:
        usage, estimated = None, False
        if tally is not None and ex.completion is not None:
            usage = next(iter(tally.by_model.values()), None)
            if usage is None:  # a stream without include_usage, or cut short: charged its worst case, marked
                usage, estimated = Usage(input_tokens(ex.completion), output_limit(ex.completion)), True
            ex.settle(next(iter(tally.by_model), ""), usage, estimated)
        else:
            ex.settle()
        if tally is not None and ex.op.action != "complete" and tally.by_model:
            if outcome == "ok" and status != 206:  # the first complete read of a batch's results is charged, once
                in_background(_charge_once(ex, tally, batch_id))
            else:  # a read cut short, or a part (a client's Range), is charged for what passed (a later complete read in full)
                ex.charge_batch(tally)
        ex.log(status if outcome == "ok" else outcome, usage, estimated)
        tracing.end_passthrough(ex.trace, outcome, status, error)

    return Passed(status, headers, chunks, finish, response)


async def _charge_once(ex: _Exchange, tally: Tally, batch_id: str) -> None:
    """The first complete read of a batch's results (with usage in them) is charged, and the worst
    cost its team was charged when it was created is taken back, once for the batch (an OpenAI batch
    has two result files). Both claimed where the ownership records are, with the creation charge:
    claimed in one process's memory, each worker (and the proxy after a restart) charged the results
    again, and each took the creation charge back again, read from spend records a worker sees up to a
    second late (a team's spend went below what it had been before the batch)."""
    team = ex.team.team
    if await ex.owners.claim(f"batch-charged:{team}:{batch_id}:{ex.op.object_id}", KEEP_S):
        ex.charge_batch(tally)
        charged = await ex.owners.batch_charge(team, batch_id)
        if charged is not None and await ex.owners.claim(f"batch-trued-up:{team}:{batch_id}", KEEP_S):
            ex.limits.true_up_batch(charged)
