"""Team limits, budget and spend as a pipeline stage.

Limits: requests and tokens per minute (token buckets, capacity = the per-minute figure, refilled
continuously) and a concurrency cap, for the team and, with `limits.per_key`, for each team key
(`RequestContext.key_id`). Budget: the team's spend in the current UTC day or month. One `admit`
call to the state backend checks all of them and charges the request buckets only if none refuses;
a refusal is a provider-shaped 429 with a retry-after and never reaches a provider. Tokens and spend
are charged from the answer's real usage when it completes (`settle`), so a bucket can go into debt
and then admits nothing until refilled: the long-run rate holds without guessing sizes up front.

Where the buckets live is the backend's business (sdk/state/): in process, or in Redis shared by
every replica.
"""

from __future__ import annotations

import math
import time
import secrets
from dataclasses import dataclass

from sdk import metrics
from sdk.errors import RateLimitedError
from sdk.pipeline import Handler, RequestContext
from sdk.policy import Policy, Price, RateLimits
from sdk.services import Services
from sdk.spend import budget_check, cost_usd, periods, price_of, spend_record
from sdk.state.backend import Admission, Cap, Rate, Refusal, Settlement, StateBackend
from sdk.streams import on_end
from sdk.types import Answer, LLMResponse, Usage


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

    def __init__(self, policy: Policy, state: StateBackend):
        self.state = state
        self.team = policy.team
        self.pricing = policy.pricing
        self.budget = policy.budget
        self._prices: dict[str, Price | None | object] = {}
        limits = policy.limits
        self.team_scope = _Scope.of(f"team {policy.team}", f"limit:{policy.team}", limits) if limits.active else None
        self.per_key = limits.per_key if limits.per_key.active else None

    def _scopes(self, ctx: RequestContext) -> list[_Scope]:
        scopes = [self.team_scope] if self.team_scope is not None else []
        if self.per_key is not None and ctx.key_id:
            scopes.append(_Scope.of(f"key {ctx.key_id}", f"limit:{self.team}:key:{ctx.key_id}", self.per_key))
        return scopes

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> Answer:
        scopes = self._scopes(ctx)
        rates = tuple(rate for scope in scopes for rate in (scope.requests, scope.tokens) if rate is not None)
        caps = tuple(scope.cap for scope in scopes if scope.cap is not None)
        admission = Admission(secrets.token_hex(16) if caps else "", rates, caps, budget_check(self.team, self.budget))
        if rates or caps or admission.budget is not None:
            trace = ctx.trace
            started = time.time_ns() if trace is not None else 0
            refusal = await self.state.admit(admission)
            if trace is not None:
                trace.stage("limits admit", started, {"slipstream.limits.outcome": "refused" if refusal else "admitted"})
            if refusal is not None:
                raise self._refused(refusal, scopes)
        try:
            answer = await call_next(ctx)
        except BaseException:
            self._settle(ctx, admission, None, "")
            raise
        if isinstance(answer, LLMResponse):
            self._settle(ctx, admission, answer.usage, answer.route)
        else:
            stream = answer
            # The slot is held until the stream ends; then its real usage is charged.
            on_end(stream, lambda _completed: self._settle(ctx, admission, stream.usage, stream.route))
        return answer

    def _settle(self, ctx: RequestContext, admission: Admission, usage: Usage | None, route: str) -> None:
        charges = ()
        spend = None
        if usage is not None:
            used = usage.total_input_tokens + usage.output_tokens
            charges = tuple((rate, used) for rate in admission.rates if rate.cost == 0 and used)
            if ctx.cache_status == "miss":  # a cached answer cost nothing upstream
                model = route.partition("/")[2] or ctx.request.model
                price = self._prices.get(model, _UNSEEN)
                if price is _UNSEEN:  # glob matching once per model, not per request
                    if len(self._prices) >= 1024:  # model names come from clients: keep the memo bounded
                        self._prices.clear()
                    price = self._prices[model] = price_of(model, self.pricing)
                usd = cost_usd(usage, price) if price is not None else 0.0
                if usd:
                    spend = spend_record(self.team, ctx.key_id, model, usd)
                    metrics.SPEND.labels(self.team, ctx.key_id or "", model).inc(usd)
        if admission.caps or charges or spend is not None:
            self.state.settle(Settlement(admission.lease, tuple(cap.key for cap in admission.caps), charges, spend))

    def _refused(self, refusal: Refusal, scopes: list[_Scope]) -> RateLimitedError:
        if refusal.kind == "budget":
            budget = self.budget
            period = next(p for p in periods() if p.name == budget.period)
            return _limited(f"budget: team {self.team} has spent ${refusal.value:.2f} of its {budget.period}ly budget "
                            f"of ${budget.usd:.2f}", period.keep_s - 86_400)
        if refusal.kind == "cap":
            scope = [s for s in scopes if s.cap is not None][refusal.index]
            return _limited(f"rate limit: {scope.name} has {int(refusal.value)} requests in flight, its limit of "
                            f"{scope.limits.max_concurrent}", refusal.wait_s)
        rate = [r for s in scopes for r in (s.requests, s.tokens) if r is not None][refusal.index]
        scope = next(s for s in scopes if rate in (s.requests, s.tokens))
        what = "requests" if rate is scope.requests else "tokens"
        return _limited(f"rate limit: {scope.name} is over its limit of {int(rate.per_minute)} {what} per minute", refusal.wait_s)


_UNSEEN = object()


def _limited(message: str, wait_s: float) -> RateLimitedError:
    seconds = max(1, math.ceil(wait_s))
    return RateLimitedError(f"{message}; retry in {seconds}s",
                            headers={"retry-after": str(seconds), "retry-after-ms": str(max(1, math.ceil(wait_s * 1000)))})


def build_limits(policy: Policy, services: Services) -> LimitsStage:
    """Always on: even a team without limits has its spend counted."""
    return LimitsStage(policy, services.state())
