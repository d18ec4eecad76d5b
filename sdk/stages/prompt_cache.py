"""The prompt-cache stage: plan the request for the provider's prompt cache, then verify the read.

Innermost stage, right before the router, so it sees exactly the body that goes upstream (after
any compression) and the usage that comes back. See sdk/promptcache/ and docs/prompt-cache.md.
Streams: Anthropic usage is known from `message_start`, which the router has already read when
the stream is returned; OpenAI usage arrives in the last chunk, so the stream is watched to its end.
"""

from __future__ import annotations

import time
from dataclasses import replace

from sdk.pipeline import Handler, RequestContext
from sdk.policy import Policy, PromptCachePolicy
from sdk.promptcache import stats, tokens
from sdk.promptcache.fanout import wait_for_writer
from sdk.promptcache.optimizer import Optimizer, Plan
from sdk.services import Services
from sdk.streams import on_end
from sdk.types import Answer, Endpoint, LLMStream, Protocol

_ENDPOINTS = (Endpoint.MESSAGES, Endpoint.CHAT_COMPLETIONS)


def _readable(body: dict[str, object]) -> bool:
    """The top-level shapes the optimizer reads. A body with others goes upstream untouched: it is the
    provider's to refuse, and planning a cache for it must not fail first."""
    return (isinstance(body.get("messages"), list) and isinstance(body.get("tools", []), list)
            and isinstance(body.get("system", ""), (str, list)))


class PromptCacheStage:
    name = "prompt_cache"

    def __init__(self, team: str, config: PromptCachePolicy):
        self.team = team
        self.config = config
        self.optimizer = Optimizer(team, config)

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> Answer:
        request = ctx.request
        if request.endpoint not in _ENDPOINTS or not _readable(request.body):
            return await call_next(ctx)
        optimizer = self.optimizer
        plan = optimizer.prepare(request, time.time())
        optimizer.diagnose(plan)
        if self.config.warm_fanout and plan.prediction.pending is not None:
            started = time.perf_counter()
            outcome = await wait_for_writer(plan.prediction.pending, self.config.fanout_max_wait_ms / 1000)
            ctx.timings.upstream_s += time.perf_counter() - started  # waiting is upstream time, not ours
            stats.FANOUT_WAITS.labels(self.team, outcome).inc()
            optimizer.repredict(plan, time.time())
        moved, advice = optimizer.report_findings(plan)
        report = ctx.prompt_cache
        report.expected_read = plan.prediction.read
        report.miss_cause = plan.cause.label if plan.cause else ""
        report.moved, report.advice = moved, advice
        report.repaired = len(plan.placement.remove) if plan.placement else 0
        report.canonicalized = plan.canonicalized
        if plan.body is not request.body:
            ctx.request = replace(request, body=plan.body)
        optimizer.begin(plan, time.time(), self.config.warm_fanout)
        try:
            answer = await call_next(ctx)
        except BaseException:
            optimizer.ledger.discard(plan.scope, plan.writes)
            raise
        optimizer.ledger.publish(plan.writes)  # the response has started: the provider's entries are readable
        if answer.status != 200:
            return answer
        if isinstance(answer, LLMStream) and plan.protocol is Protocol.OPENAI:
            on_end(answer, lambda completed: self._settle_at_end(plan, answer, completed))
        else:
            optimizer.settle(plan, answer.usage)
        return answer

    def _settle_at_end(self, plan: Plan, stream: LLMStream, completed: bool) -> None:
        if completed and stream.usage.total_input_tokens:  # without include_usage nothing can be verified
            self.optimizer.settle(plan, stream.usage)


def build_prompt_cache(policy: Policy, services: Services) -> PromptCacheStage | None:
    config = policy.prompt_cache
    if not config.enabled:
        return None
    tokens.load_encoding()  # at build time (startup, reload thread), not on a team's first request
    return PromptCacheStage(policy.team, config)
