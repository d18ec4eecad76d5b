"""Team limits, budget and spend as a pipeline stage.

Limits: requests and tokens per minute (token buckets, capacity = the per-minute figure, refilled
continuously) and a concurrency cap, for the team and, with `limits.per_key`, for each team key
(`RequestContext.key_id`). Budget: the team's spend in the current UTC day or month. One `admit`
call to the state backend checks all of them and charges the request buckets only if none refuses;
a refusal is a provider-shaped 429 with a retry-after and never reaches a provider. Tokens and spend
are charged from the answer's real usage when it completes (`settle`), so a bucket can go into debt
and then admits nothing until refilled: the long-run rate holds without guessing sizes up front.

Every answer is charged: a stream that ends without its usage event (the client left, the upstream
cut it) is charged from the tokens counted in the request and in what was streamed
(sdk/estimate.py), marked `estimated` in the spend record and the access log. A team with a budget
is refused (403, before anything leaves) a model the price table does not know, and each of its
requests holds its worst cost against the budget while it runs (`reservation`; the bound:
docs/spend.md).

Where the buckets live is the backend's business (sdk/state/): in process, or in Redis shared by
every replica.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import orjson

from sdk.errors import RateLimitedError
from sdk.estimate import CHARS_PER_TOKEN, input_tokens, media_of
from sdk.limits.reservation import RESERVE_EXACT_CHARS as RESERVE_EXACT_CHARS  # re-exported: callers size holds by it
from sdk.limits.reservation import WorstCost, fast_mode
from sdk.observability import metrics
from sdk.observability.tracing.records import RequestTrace
from sdk.offload import HOLDING, is_large, off_loop, off_loop_if_large
from sdk.pipeline import Handler, RequestContext
from sdk.policy import Policy, RateLimits
from sdk.promptcache.keys import with_team_ids
from sdk.responses.conversation import READ
from sdk.responses.store import ResponseStore, StoredResponse
from sdk.services import Services
from sdk.spend import (
    PriceBook,
    budget_check,
    cost_usd,
    created_batch_record,
    periods,
    spend_record,
)
from sdk.state.answer_ids import check_audio, may_answer_audio, recorded
from sdk.state.backend import Admission, Cap, Rate, Refusal, Settlement, SpendRecord, StateBackend, team_slot
from sdk.state.message_threads import check_messages, may_name_messages
from sdk.state.message_threads import recorded as recorded_messages
from sdk.state.ownership import check_account_objects, ownership_of
from sdk.stream_tally import StreamTally
from sdk.streams import on_end
from sdk.types import Answer, Endpoint, LLMRequest, LLMResponse, Usage

log = logging.getLogger("slipstream.spend")
UNPRICED_WARNINGS = 16  # unpriced models logged per team, then one line saying the rest are not
_CONTINUED = (Endpoint.RESPONSES, Endpoint.RESPONSES_COMPACT)  # billed for the stored conversation they name
_PERIODLY = {"day": "daily", "month": "monthly"}  # a budget's period in a refusal's words


@dataclass(frozen=True, slots=True)
class _Scope:
    """The limits of the team or of one key, as backend keys."""

    name: str  # "team search" | "key 3fa2c1": what a refusal says
    limits: RateLimits
    requests: Rate | None
    tokens: Rate | None
    cap: Cap | None

    @classmethod
    def of(cls, name: str, key: str, limits: RateLimits) -> _Scope:
        return cls(
            name, limits,
            Rate(f"{key}:rpm", limits.requests_per_minute, 1) if limits.requests_per_minute else None,
            Rate(f"{key}:tpm", limits.tokens_per_minute, 0) if limits.tokens_per_minute else None,
            Cap(f"{key}:conc", limits.max_concurrent) if limits.max_concurrent else None,
        )


class LimitsStage:
    name = "limits"

    def __init__(self, policy: Policy, state: StateBackend, responses: Callable[[], ResponseStore] | None = None):
        self.state = state
        self.responses = responses  # the stored conversations a Responses continuation sends on
        self.team = policy.team
        self.policy = policy
        self.budget = policy.budget
        self.prices = PriceBook(policy.pricing)
        self.model_labels = metrics.ModelLabels(policy)
        self.provider_objects = policy.usable_objects()
        self._unpriced_warnings = 0
        self.worst = WorstCost(policy, self.prices)  # what a budgeted request holds while it runs
        limits = policy.limits
        self.team_scope = _Scope.of(f"team {policy.team}", f"limit:{team_slot(policy.team)}", limits) if limits.active else None
        self.per_key = limits.per_key if limits.per_key.active else None

    def _scopes(self, key_id: str) -> list[_Scope]:
        scopes = [self.team_scope] if self.team_scope is not None else []
        if self.per_key is not None and key_id:
            scopes.append(_Scope.of(f"key {key_id}", f"limit:{team_slot(self.team)}:key:{key_id}", self.per_key))
        return scopes

    async def admit(self, key_id: str, budget: bool = True, trace: RequestTrace | None = None, reserve: float = 0.0,
                    requests: int = 1, limits: bool = True, lease: str = "", span: str = "limits admit") -> Admission:
        """Check and charge the team's (and the key's) limits and, with `budget`, its budget, holding
        `reserve` USD against it until `settle` (`reservation(request)` computes it), counting `requests`
        against the request buckets and concurrency caps (`legs`); a refusal raises the provider-shaped 429. The pipeline and
        the pass-through (sdk/passthrough/) both admit here. Without `limits`, the budget only, its hold
        under `lease` when given (the lease of the request's admission to its limits: one settlement ends both)."""
        scopes = self._scopes(key_id) if limits else []
        rates = tuple(rate for scope in scopes for rate in (scope.requests, scope.tokens) if rate is not None)
        caps = tuple(scope.cap for scope in scopes if scope.cap is not None)
        if requests > 1:
            rates, caps = self._counted(rates, caps, scopes, requests)
        check = budget_check(self.team, self.budget, reserve) if budget else None
        admission = Admission(lease, rates, caps, check)
        if admission.holds and not lease:  # a lease names its slots and its hold
            admission = Admission(secrets.token_hex(16), rates, caps, check)
        if rates or caps or admission.budget is not None:
            started = time.time_ns() if trace is not None else 0
            refusal = await self.state.admit(admission)
            if trace is not None:
                trace.stage(span, started, {"slipstream.limits.outcome": "refused" if refusal else "admitted"})
            if refusal is not None:
                raise self._refused(refusal, scopes, requests)
        return admission

    async def admit_budget(self, limited: Admission, key_id: str, reserve: float, trace: RequestTrace | None = None) -> Admission:
        """The budget's part of a request `limited` admitted to its rates and concurrency (`admit(budget=False)`,
        before the work that tells its worst cost): `reserve` held under the same lease. The admission
        that settles both."""
        held = await self.admit(key_id, trace=trace, reserve=reserve, limits=False, lease=limited.lease,
                                span="limits budget" if limited.rates or limited.caps else "limits admit")
        return Admission(held.lease or limited.lease, limited.rates, limited.caps, held.budget)

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> Answer:
        # Every pipeline request passes here once its team is known: a client's own provider
        # prompt_cache_key and end-user ids are namespaced to the team before anything else reads the body.
        ctx.request = with_team_ids(ctx.request, self.team)
        # A file or account object the request names is read by the provider under the shared key:
        # the team's own files only, and the account objects its policy lists.
        check_account_objects(self.provider_objects, (ctx.request.body,))
        # The team's rates and concurrency first: a request past them is refused before it costs a lookup in the
        # stores every team's requests use (up to 10,000 files named, audio ids, a stored conversation read).
        limited = await self.admit(ctx.key_id, budget=False, trace=ctx.trace, requests=self.legs(ctx.request))
        owners = ownership_of(self.state)
        read: dict[tuple[str, str], StoredResponse] = {}  # what it continues, read once for its targets too (conversation.READ)
        try:
            await owners.check_files(self.team, (ctx.request.body,), ctx.request.size)
            await check_audio(owners, self.team, [ctx.request.body], ctx.request.size)  # an earlier answer's audio, read by id
            if is_large(ctx.request.size):  # its PDFs' pages, for the hold and any estimate (a walk: off the loop)
                ctx.request.media = await off_loop(media_of, ctx.request)
            (history,) = await self.history_tokens([ctx.request], read)
            if may_name_messages(ctx.request):  # an earlier answer's Thread or prompt, read by id; a Thread's context is billed again
                history += await check_messages(owners, self.team, ctx.request.body)
            # Then its budget, which holds its worst cost: what it continues and the media it sends counted.
            admission = await self.admit_budget(limited, ctx.key_id, self.reservation(ctx.request, history=history), ctx.trace)
        except BaseException:
            if limited.holds:
                self.settle(limited, ctx.key_id, "", None)  # its slots go back; its rate charge stays (it was a request)
            raise
        reading = READ.set(read) if read else None
        try:
            answer = await call_next(ctx)
            if may_answer_audio(ctx.request):  # its audio ids are the team's before the client has them
                answer = await recorded(owners, self.team, answer)
            elif may_name_messages(ctx.request):  # its id is the team's, for a later turn to continue or compare with
                answer = await recorded_messages(owners, self.team, ctx.request, answer)
        except asyncio.CancelledError:
            self._settle_cancelled(ctx, admission, history)
            raise
        except BaseException:
            self._settle(ctx, admission, None, "", history=history)
            raise
        finally:
            if reading is not None:
                READ.reset(reading)
        if isinstance(answer, LLMResponse):
            self._settle(ctx, admission, answer.usage, answer.route, history=history)
        else:
            stream = answer
            tally = StreamTally(ctx.request.endpoint)
            # Each item is counted as it is handed on (a client that leaves at once after an item is
            # charged for it: the provider produced it). The slot is held until the stream ends; then
            # its usage is charged (counted if none came).
            on_end(stream, lambda _completed: self._settle(ctx, admission, stream.usage, stream.route, tally, history), tally.observe)
        return answer

    async def history_tokens(self, requests: Sequence[LLMRequest], read: dict[tuple[str, str], StoredResponse] | None = None) -> list[int]:
        """For each request, the input tokens a Responses continuation or compaction sends besides its
        own body: its stored conversation (the provider reads it again, and bills it, on every turn and
        to compact it) and the stored items its `item_reference`s name (each sent as the item itself,
        once per reference), counted by length as a large body is. Each conversation and item is read
        once for all of them (a batch's lines); an id the team does not hold counts nothing (a 404).
        With `read` (a pipeline request, whose target reads the previous response next), that response is
        read whole, its record kept there, rather than only its conversation's size."""
        if self.responses is None or all(request.endpoint not in _CONTINUED for request in requests):
            return [0] * len(requests)  # the common case, on every request: nothing stored to count
        continued = [request.body if request.endpoint in _CONTINUED else {} for request in requests]
        references = [_referenced(body) for body in continued]
        if self.responses is None or not any(body.get("previous_response_id") is not None or ids
                                             for body, ids in zip(continued, references, strict=True)):
            return [0] * len(requests)
        store = self.responses()
        chains: dict[str, int] = {}
        for body in continued:
            if isinstance(previous := body.get("previous_response_id"), str) and previous not in chains:
                if read is None:
                    chains[previous] = await store.chain_bytes(self.team, previous)
                elif (record := await store.get(self.team, previous)) is not None:
                    chains[previous], read[(self.team, previous)] = record.chain_bytes, record
        sizes: dict[str, int] = {}
        if named := list(dict.fromkeys(item_id for ids in references for item_id in ids)):
            # the records holding them are held in the process's body budget before they are read
            HOLDING.get()(sum(request.size for request in requests) + await store.item_bytes(self.team, named))
            for item_id, (record, item) in (await store.find_items(self.team, named)).items():
                # the item's JSON is what is sent (serialized in the heavy-work pool when its record is large)
                sizes[item_id] = len(await off_loop_if_large(record.chain_bytes, orjson.dumps, item))
        tokens = []
        for body, ids in zip(continued, references, strict=True):
            previous = body.get("previous_response_id")
            chars = (chains.get(previous, 0) if isinstance(previous, str) else 0) + sum(sizes.get(item_id, 0) for item_id in ids)
            tokens.append(math.ceil(chars / CHARS_PER_TOKEN))
        return tokens

    def reservation(self, request: LLMRequest, exact: int = RESERVE_EXACT_CHARS, history: int = 0, token_rate: float = 1.0,
                    routed: bool = True) -> float:
        """USD a budgeted team's request holds while it runs (`WorstCost.reservation`); 0 without a budget."""
        return self.worst.reservation(request, exact, history, token_rate, routed)

    def legs(self, request: LLMRequest) -> int:
        return self.worst.legs(request)

    def own_call_reservation(self, request: LLMRequest, model: str) -> float:
        """USD a call the gateway makes itself for the team holds against its budget (`WorstCost.own_call`)."""
        return self.worst.own_call(request, model)

    def _counted(self, rates: tuple[Rate, ...], caps: tuple[Cap, ...], scopes: list[_Scope],
                 requests: int) -> tuple[tuple[Rate, ...], tuple[Cap, ...]]:
        """`rates` with each request bucket charged `requests`, and `caps` with each lease taking `requests`
        slots (each upstream request is in flight on the account); more than a bucket or cap holds is refused
        now, a 429 as for any limit but saying no wait makes it fit (as OpenAI's "Request too large" 429 does)."""
        for scope in scopes:
            for limit, what in ((scope.limits.requests_per_minute, "requests per minute"),
                                (scope.limits.max_concurrent, "requests in flight")):
                if limit and requests > limit:
                    raise _too_large(requests, f"{scope.name}'s limit of {int(limit)} {what}")
        return (tuple(replace(rate, cost=rate.cost * requests) for rate in rates),
                tuple(replace(cap, weight=requests) for cap in caps))

    async def hold_batch(self, worst: float) -> Admission | None:
        """Hold a batch's worst cost (`worst` USD, at batch rates) against the budget while the call
        creating it runs, or refuse it with the budget's 429 unless all of it fits what is left (the
        period's spend and what requests in flight hold taken off). Checked and held in one step, so
        batches created together cannot each fit the same remainder: one for the host where workers share
        only their files (`--workers N --local-state`: a transaction of the spend file, sdk/state/spend_file.py),
        one script in Redis. None without a budget. Once the
        batch exists its hold becomes spend (`charge_created_batch`); otherwise `release_hold`."""
        budget = self.budget
        if budget is None or not worst:
            return None
        check = budget_check(self.team, budget, worst)
        assert check is not None
        # A check admits while spend and holds stay under its `usd`: this one, only if `worst` fits whole.
        hold = Admission(secrets.token_hex(16), budget=replace(check, usd=budget.usd - worst), batch=True)
        refusal = await self.state.admit(hold)
        if refusal is not None:
            period = next(p for p in periods() if p.name == budget.period)
            left = budget.usd - refusal.value
            raise _limited(f"budget: team {self.team}'s batch at batch rates may cost up to ${worst:.6f}, more than the "
                           f"${max(0.0, left):.6f} left of its {_PERIODLY[budget.period]} budget of ${budget.usd:.2f} "
                           "(counting what requests in flight may still cost)", period.keep_s - 86_400)
        return hold

    def charge_created_batch(self, hold: Admission, batch_id: str) -> SpendRecord:
        """A created batch runs after the call that made it has answered, so no hold can cover it: its
        worst cost is charged now (to `total` and `batch:ID`), where calls made while it runs and later
        batches count it, and where it stays if its results are never read through the gateway (the
        provider bills them all the same). Returns the charge, which `true_up_batch` takes back once
        its results are charged instead (the caller keeps it where every worker and replica finds it)."""
        assert hold.budget is not None
        charged = created_batch_record(self.team, batch_id, hold.budget.reserve)
        self.state.settle(Settlement(hold.lease, budget=hold.budget, spend=charged))
        return charged

    def release_hold(self, hold: Admission) -> None:
        """Let go of a batch's hold: the call that would have created it failed."""
        self.state.settle(Settlement(hold.lease, budget=hold.budget))

    def true_up_batch(self, charged: SpendRecord) -> None:
        """Take back a batch's creation charge (`charged`, as `charge_created_batch` made it: the same
        amount from the same records and fields), once its results have been charged (at most once:
        the caller's claim). The amount is the one charged, not read back from the spend records: a
        worker of `--workers N` reads them up to a second late (sdk/state/spend_file.py), so one
        reading them soon after another worker created the batch found nothing to take back."""
        self.state.settle(Settlement("", spend=SpendRecord(-charged.usd, charged.records, charged.fields)))

    def _hosted(self, model: str) -> bool:
        """Whether `model` may be served by a hosted provider (the bundled engine's cost nothing)."""
        route = self.policy.route_for(model)
        return route is None or any(self.policy.providers[t.provider].kind != "local" for t in route.targets)

    def _settle_cancelled(self, ctx: RequestContext, admission: Admission, history: int) -> None:
        """The client left before the answer started. Once an attempt went upstream the provider was
        reading the prompt (and bills it), so its input is charged, counted here; cancelling before
        the first byte must not be a way around a budget."""
        if not ctx.attempts or ctx.cache_status != "miss":
            self._settle(ctx, admission, None, "")
            return
        ctx.usage_estimated = True
        # Every leg the cancel dropped was recorded by the router; an answer it had already returned
        # (the cancel came after the router) is one prompt read too. The last read settles the hold.
        models = ctx.abandoned or [ctx.route.partition("/")[2] or self._first_target_model(ctx.request.model)]
        self._charge_reads(ctx, admission, models[1:], history)
        self.settle(admission, ctx.key_id, models[0], _read(ctx.request, history), estimated=True)

    def _charge_reads(self, ctx: RequestContext, admission: Admission, models: list[str], history: int) -> None:
        """Charge a prompt read for each of `models`, counted (estimated): attempts the provider was
        sent and the gateway dropped before their answer (a first-byte timeout, a hedge leg that lost,
        legs cancelled with their request). The provider bills what it read, so a team's retries and
        hedges are its spend and its tokens, not the shared account's. Charged before the request's
        own settlement lets its budget hold go. Answers dropped whole (`ctx.discarded`: a failed fan-out's
        other choices) are charged with the usage the provider reported."""
        if not models and not ctx.discarded:
            return  # as nearly every request: counting its prompt (tokenizing it) would be spent on nothing
        charge_only = Admission("", admission.rates)  # holds nothing: buckets and spend only
        for model, usage in ctx.discarded:
            self.settle(charge_only, ctx.key_id, model, usage)
        read = _read(ctx.request, history) if models else Usage()
        for model in models:
            self.settle(charge_only, ctx.key_id, model, read, estimated=True)

    def _first_target_model(self, model: str) -> str:
        route = self.policy.route_for(model)
        return (route.targets[0].model or model) if route is not None else model

    def _settle(self, ctx: RequestContext, admission: Admission, usage: Usage | None, route: str,
                tally: StreamTally | None = None, history: int = 0) -> None:
        estimated = False
        if usage is not None and tally is not None and not (tally.final or usage.final):
            # No usage event came: charge what was sent and streamed, counted here
            # (in place, so the metrics and the access log report the same counts).
            counted = tally.estimate(ctx.request, usage, history)
            usage.input_tokens, usage.output_tokens = counted.input_tokens, counted.output_tokens
            usage.web_searches, usage.file_searches, usage.images = counted.web_searches, counted.file_searches, counted.images
            usage.containers = counted.containers
            ctx.usage_estimated = estimated = True
        elif usage is not None and usage.estimated:  # counted by the gateway where it ended the stream (a stop it applies)
            ctx.usage_estimated = estimated = True
        if usage is not None and fast_mode(ctx.request):
            usage.fast = True  # billed at fast mode's rates; the usage does not say so
        self._charge_reads(ctx, admission, ctx.abandoned, history)
        # a cached answer cost nothing upstream: its tokens count against the buckets, not the budget
        self.settle(admission, ctx.key_id, route.partition("/")[2] or ctx.request.model, usage,
                    rate=1.0 if ctx.cache_status == "miss" else 0.0, estimated=estimated)

    def settle(self, admission: Admission, key_id: str, model: str, usage: Usage | None, rate: float = 1.0,
               estimated: bool = False) -> None:
        """Release `admission`'s slots and budget hold, charge `usage` to its token buckets and,
        priced for `model`, to spend: its tokens times `rate` (1 for a call, 0.5 at batch rates, which
        discount tokens only, not per-call fees), nothing when `rate` is 0 (nothing was spent upstream);
        `estimated` marks usage the gateway counted itself."""
        charges: tuple[tuple[Rate, float], ...] = ()
        spend = None
        if usage is not None:
            used = usage.total_input_tokens + usage.output_tokens
            charges = tuple((r, used) for r in admission.rates if r.cost == 0 and used)
            if rate:
                seen = model in self.prices
                price = self.prices.price(model)
                if price is None and not seen and self._hosted(model):
                    self._warn_unpriced(model)
                usd = cost_usd(usage, price, token_rate=rate) if price is not None else 0.0
                if usd:
                    label = self.model_labels(model)  # model names come from clients: bounded
                    spend = spend_record(self.team, key_id, label, usd, estimated)
                    metrics.child(metrics.SPEND, self.team, key_id or "", label).inc(usd)
        if admission.holds or charges or spend is not None:
            self.state.settle(Settlement(admission.lease, tuple(cap.key for cap in admission.caps), charges, spend,
                                         admission.budget))

    def _warn_unpriced(self, model: str) -> None:
        """Once per model, for the first few: model names come from clients, and one naming a new
        model per request must not write a log line per request."""
        self._unpriced_warnings += 1
        if self._unpriced_warnings <= UNPRICED_WARNINGS:
            log.warning("team %s: model %r has no price, so its spend is not counted; add it under `pricing:` "
                        "(docs/spend.md)%s", self.team, model,
                        "; further unpriced models of this team are not logged" if self._unpriced_warnings == UNPRICED_WARNINGS else "")

    def _refused(self, refusal: Refusal, scopes: list[_Scope], requests: int = 1) -> RateLimitedError:
        budget = self.budget
        if refusal.kind == "budget" and budget is not None:
            period = next(p for p in periods() if p.name == budget.period)
            # the value counts what requests in flight hold (their worst cost) beside what was spent
            return _limited(f"budget: team {self.team} has spent ${refusal.value:.2f} of its {_PERIODLY[budget.period]} budget "
                            f"of ${budget.usd:.2f} (counting what requests in flight may still cost)", period.keep_s - 86_400)
        if refusal.kind == "cap":
            scope = [s for s in scopes if s.cap is not None][refusal.index]
            if refusal.too_large:  # above this replica's share of the cap while the shared store is away
                return _too_large(requests, f"the {int(refusal.value)} of {scope.name}'s limit of {scope.limits.max_concurrent} "
                                            "requests in flight this replica may admit while the shared state store is unreachable")
            more = f" and this request makes {requests} (one per choice on a Claude target)" if requests > 1 else ""
            return _limited(f"rate limit: {scope.name} has {int(refusal.value)} requests in flight{more}, its limit of "
                            f"{scope.limits.max_concurrent}", refusal.wait_s)
        rate = [r for s in scopes for r in (s.requests, s.tokens) if r is not None][refusal.index]
        scope = next(s for s in scopes if rate in (s.requests, s.tokens))
        what = "requests" if rate is scope.requests else "tokens"
        if refusal.too_large:  # above this replica's share of the bucket while the shared store is away
            return _too_large(requests, f"the {refusal.value:g} of {scope.name}'s limit of {int(rate.per_minute)} {what} per "
                                        "minute this replica may admit while the shared state store is unreachable")
        return _limited(f"rate limit: {scope.name} is over its limit of {int(rate.per_minute)} {what} per minute", refusal.wait_s)


def _read(request: LLMRequest, history: int) -> Usage:
    """What the provider bills for reading the request's prompt (its stored `history` tokens too), counted."""
    return Usage(input_tokens=input_tokens(request) + history, fast=fast_mode(request))


def _too_large(requests: int, limit: str) -> RateLimitedError:
    """A 429 that says no wait makes the request fit (no retry-after), as OpenAI's "Request too large" does."""
    return RateLimitedError(f"rate limit: request too large: it makes {requests} upstream requests (one per choice on a "
                            f"Claude target), more than {limit}; ask for fewer choices (n)")


def _limited(message: str, wait_s: float) -> RateLimitedError:
    seconds = max(1, math.ceil(wait_s))
    return RateLimitedError(f"{message}; retry in {seconds}s",
                            headers={"retry-after": str(seconds), "retry-after-ms": str(max(1, math.ceil(wait_s * 1000)))})


def build_limits(policy: Policy, services: Services) -> LimitsStage:
    """Always on: even a team without limits has its spend counted."""
    return LimitsStage(policy, services.state(), services.response_store)


def _referenced(body: dict[str, Any]) -> list[str]:
    """The item ids a Responses body's `item_reference`s name, once per reference."""
    items = body.get("input")
    return [item["id"] for item in items if isinstance(item, dict) and item.get("type") == "item_reference"
            and isinstance(item.get("id"), str)] if isinstance(items, list) else []
