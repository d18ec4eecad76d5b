"""Prompt-cache planning, per upstream attempt: plan the body a provider receives, then verify the read.

The router calls it once per attempt, after it has chosen the target and translated the client's
request into the target's protocol (sdk/routing/router.py wraps the target's provider in `PlanningProvider`),
so the plan follows that provider's rules whatever door and protocol the client used: Anthropic
breakpoints on a Messages body, `prompt_cache_key` on a Chat body, and a fallback that changes
protocol is planned again. See sdk/promptcache/ and docs/prompt-cache.md.
Streams: Anthropic usage is known from `message_start`; OpenAI usage arrives in the last chunk,
so such a stream is watched to its end.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from sdk.offload import is_large, off_loop
from sdk.pipeline import PromptCacheReport, RequestContext
from sdk.policy import Policy, Price, PromptCachePolicy
from sdk.promptcache import responses_view, stats, tokens
from sdk.promptcache.fanout import wait_for_writer
from sdk.promptcache.optimizer import Optimizer, Plan
from sdk.providers.base import Provider
from sdk.services import Services
from sdk.state.guard import GuardedState
from sdk.streams import on_end
from sdk.types import Answer, Endpoint, LLMRequest, LLMStream, Timings

if TYPE_CHECKING:
    from sdk.promptcache.shared_ledger import SharedLedger

_ENDPOINTS = (Endpoint.MESSAGES, Endpoint.CHAT_COMPLETIONS)


def _readable(body: dict[str, object]) -> bool:
    """The top-level shapes the optimizer reads. A body with others goes upstream untouched: it is the
    provider's to refuse, and planning a cache for it must not fail first."""
    return (isinstance(body.get("messages"), list) and isinstance(body.get("tools", []), list)
            and isinstance(body.get("system", ""), (str, list)))


class PromptCachePlanner:
    """One team's prompt-cache optimizer, applied to every upstream attempt of its requests."""

    def __init__(self, team: str, config: PromptCachePolicy, shared: GuardedState | None = None,
                 pricing: dict[str, Price] | None = None):
        self.team = team
        self.config = config
        self.optimizer = Optimizer(team, config, pricing)
        self.shared: SharedLedger | None = None  # replicas share one ledger through Redis
        if shared is not None:
            from sdk.promptcache.shared_ledger import SharedLedger

            self.shared = SharedLedger(team, shared)
        # One plan at a time per team: a large request's plan is made in a worker thread, and the
        # optimizer's state (volatility learning, the ledger) is not shared between threads. Only the
        # same team's requests wait for it; other teams have optimizers of their own.
        self._planning = asyncio.Lock()

    async def sweep(self, now: float) -> None:
        """Let go of what has outlived every provider cache (`Optimizer.sweep`), between the team's plans."""
        async with self._planning:
            self.optimizer.sweep(now)

    def attempt(self, provider: Provider, ctx: RequestContext) -> Provider:
        """`provider` (the routing target's own, speaking its own protocol) with every body it is sent
        for this attempt planned first; the plan is reported on `ctx`."""
        return PlanningProvider(provider, self, ctx)

    async def planned(self, request: LLMRequest, send: Callable[[LLMRequest], Awaitable[Answer]], timings: Timings,
                      report: PromptCacheReport, rewrite: bool = True) -> Answer:
        """Plan `request` for its provider's prompt cache, `send` the planned request, verify the read.

        `request` is in the target provider's protocol: the body its upstream receives, or (`rewrite`
        False) a Chat view of a Responses body, of which `send` carries the key and salt back.
        """
        optimizer = self.optimizer
        large = is_large(request.size)  # hashing, tokenizing and scanning megabytes: off the loop
        async with self._planning:
            draft = await off_loop(optimizer.draft, request, rewrite) if large else optimizer.draft(request, rewrite)
            scope = optimizer.ledger.scope(*draft.scope)  # under the lock: a plan in a worker thread reads the scopes
        if self.shared is not None:  # what other replicas' requests cached, before placing breakpoints
            await self.shared.pull(scope, draft.scope, optimizer.cacheable(draft))
        async with self._planning:
            plan = await off_loop(optimizer.plan, draft, time.time()) if large else optimizer.plan(draft, time.time())
            optimizer.diagnose(plan)
        if self.config.warm_fanout and plan.prediction.pending is not None:
            with timings.upstream():  # waiting for another request's cache write is upstream time, not ours
                outcome = await wait_for_writer(plan.prediction.pending, self.config.fanout_max_wait_ms / 1000)
            stats.FANOUT_WAITS.labels(self.team, outcome).inc()
            optimizer.repredict(plan, time.time())
        report.moved, report.advice = optimizer.report_findings(plan)
        report.expected_read = plan.prediction.read
        report.miss_cause = plan.cause.label if plan.cause else ""
        report.repaired = len(plan.placement.remove) if plan.placement else 0
        report.canonicalized = plan.canonicalized
        if plan.body is not request.body:
            request = replace(request, body=plan.body)
        # Under the team's planning lock: another request's plan may be reading the ledger in a worker
        # thread (its scopes and their history), and begin writes and trims them.
        async with self._planning:
            optimizer.begin(plan, time.time(), self.config.warm_fanout)
        try:
            answer = await send(request)
        except BaseException:
            optimizer.ledger.discard(plan.scope, plan.writes)
            raise
        if answer.status != 200:  # refused: the provider cached nothing of it
            optimizer.ledger.discard(plan.scope, plan.writes)
            return answer
        optimizer.ledger.publish(plan.writes)  # the response has started: the provider's entries are readable
        if isinstance(answer, LLMStream) and not answer.usage.total_input_tokens:
            on_end(answer, lambda _completed: self._settle_at_end(plan, answer))  # usage comes with the events
        else:
            optimizer.settle(plan, answer.usage)  # may discard what the provider did not cache: before sharing
        if self.shared is not None:
            self.shared.push(draft.scope, plan)
        return answer

    def _settle_at_end(self, plan: Plan, stream: LLMStream) -> None:
        if stream.usage.total_input_tokens:  # an OpenAI stream without include_usage cannot be verified
            self.optimizer.settle(plan, stream.usage)


class PlanningProvider:
    """A target's provider for one attempt: what it is sent is planned for its own prompt cache."""

    def __init__(self, inner: Provider, planner: PromptCachePlanner, ctx: RequestContext):
        self.inner = inner
        self.name = inner.name
        self.protocol = inner.protocol
        self.planner = planner
        self.ctx = ctx

    async def list_models(self) -> list[dict[str, Any]]:
        return await self.inner.list_models()

    async def send(self, request: LLMRequest, timings: Timings) -> Answer:
        native_responses = request.endpoint is Endpoint.RESPONSES and responses_view.plannable(request.body)
        if not native_responses and (request.endpoint not in _ENDPOINTS or not _readable(request.body)):
            return await self.inner.send(request, timings)
        view = responses_view.chat_view(request) if native_responses else request
        trace = self.ctx.trace
        started = time.time_ns() if trace is not None else 0
        report = PromptCacheReport()  # this attempt's; the request reports the one that answered

        async def send(planned: LLMRequest) -> Answer:
            if trace is not None:  # the plan is made (and any fan-out wait over): its span ends here
                trace.stage("prompt_cache plan", started, _plan_attributes(report))
            if native_responses:
                planned = responses_view.carry_back(request, planned.body, view.body)
            return await self.inner.send(planned, timings)

        answer = await self.planner.planned(view, send, timings, report, rewrite=not native_responses)
        self.ctx.prompt_cache = report
        return answer


def _plan_attributes(report: PromptCacheReport) -> dict[str, object]:
    return {"slipstream.prompt_cache.expected_read": report.expected_read,
            "slipstream.prompt_cache.miss_cause": report.miss_cause or "none",
            "slipstream.prompt_cache.moved": report.moved, "slipstream.prompt_cache.advice": report.advice,
            "slipstream.prompt_cache.repaired": report.repaired, "slipstream.prompt_cache.canonicalized": report.canonicalized}


def build_prompt_cache(policy: Policy, services: Services) -> PromptCachePlanner | None:
    config = policy.prompt_cache
    if not config.enabled:
        return None
    tokens.load_encoding()  # at build time (startup, reload thread), not on a team's first request
    shared = services.shared_state()
    return PromptCachePlanner(policy.team, config, shared if isinstance(shared, GuardedState) else None, policy.pricing)
