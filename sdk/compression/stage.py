"""The compression stage: prune documents and compact history before the router's prompt-cache planning
plans each attempt (so breakpoints land on what is actually sent). See sdk/compression/ and docs/compression.md.

Compression only ever saves tokens: if it fails, the request goes upstream unchanged.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from sdk.compression import report
from sdk.compression.compressor import Compressor, DocumentSettings, Result
from sdk.compression.extractive import Budget
from sdk.compression.history import HistoryCompactor, Settings
from sdk.compression.scoring import static_vectors, warm_up_in_background
from sdk.compression.summarizer import Summarizer
from sdk.limits.stage import build_limits
from sdk.pipeline import Handler, RequestContext
from sdk.policy import CompressionPolicy, Policy
from sdk.providers import build_provider
from sdk.readiness import WarmUp
from sdk.services import Services
from sdk.types import Answer, Endpoint

_ENDPOINTS = (Endpoint.MESSAGES, Endpoint.CHAT_COMPLETIONS)  # count_tokens must count what the client sent
log = logging.getLogger("slipstream.compression")


class CompressionStage:
    name = "compression"

    def __init__(self, team: str, compressor: Compressor):
        self.team = team
        self.compressor = compressor

    def warm_ups(self) -> list[WarmUp]:
        compressor, parts = self.compressor, []
        if compressor.docs is not None:
            parts += (compressor.embedder().warm_ups() if compressor.docs.scorer == "contextual"
                      else [WarmUp("compression: MiniLM embedding table", static_vectors)])
        if compressor.pruner is not None:
            parts.append(WarmUp("compression: token-pruning model (demo)", compressor.pruner.load))
        return parts

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> Answer:
        request = ctx.request
        if request.endpoint not in _ENDPOINTS or not isinstance(request.body.get("messages"), list):
            return await call_next(ctx)
        trace = ctx.trace
        started_ns = time.time_ns() if trace is not None else 0
        started = time.perf_counter()
        try:
            result = await self.compressor.run(request.body, ctx.key_id, request.size)
        except Exception:  # compression only saves tokens; it must never cost the request
            log.exception("team %s: compression failed; sending the request unchanged", self.team)
            report.REQUESTS.labels(self.team, "error").inc()
            if trace is not None:
                trace.stage("compression", started_ns, {"slipstream.compression.outcome": "error"})
            return await call_next(ctx)
        report.SECONDS.labels(self.team).observe(time.perf_counter() - started)
        outcome = self._record(result)
        ctx.compression = result.report
        if trace is not None:
            summary = result.report
            trace.stage("compression", started_ns, {
                "slipstream.compression.outcome": outcome, "slipstream.compression.tokens_before": summary.before,
                "slipstream.compression.tokens_after": summary.after,
                "slipstream.compression.pieces": sum(summary.compressed.values()),
                "slipstream.compression.history": summary.history or "none",
            })
        if result.body is not request.body:
            ctx.request = replace(request, body=result.body)
        return await call_next(ctx)

    def _record(self, result: Result) -> str:
        """Count what compression did; its outcome: compressed, refused or unchanged."""
        summary = result.report
        report.TOKENS.labels(self.team, "before").inc(summary.before)
        report.TOKENS.labels(self.team, "after").inc(summary.after)
        if summary.refused:
            report.REFUSALS.labels(self.team).inc(summary.refused)
        for place, n in summary.compressed.items():
            report.PIECES.labels(self.team, place).inc(n)
        for why, n in summary.left.items():
            place, reason = why.split(":", 1)
            report.LEFT.labels(self.team, place, reason).inc(n)
        outcome = "compressed" if summary.after < summary.before else "refused" if summary.refused else "unchanged"
        report.REQUESTS.labels(self.team, outcome).inc()
        if log.isEnabledFor(logging.DEBUG):
            for found, removed in result.removed:
                log.debug(
                    "team %s: %s material (message %d) pruned against %r; removed %d units: %s",
                    self.team, found.place, found.message, found.query[:200], len(removed), " | ".join(removed)[:4000],
                )
        return outcome


def build_compression(policy: Policy, services: Services) -> CompressionStage | None:
    config = policy.compression
    if not config.enabled:
        return None
    docs = _document_settings(config)
    history = _history(policy, services) if config.history.enabled else None
    pruner = None
    if config.token_pruning.enabled:
        from sdk.compression.surprisal import TokenPruner

        pruner = TokenPruner(config.token_pruning.ratio, tuple(config.protect))
    if docs is None and history is None:
        return None
    if docs is not None and docs.scorer == "static":
        warm_up_in_background()
    return CompressionStage(policy.team, Compressor(policy.team, docs, history, services.embedder, pruner))


def _document_settings(config: CompressionPolicy) -> DocumentSettings | None:
    documents = config.documents
    if not documents.enabled:
        return None
    budget = Budget(documents.ratio, documents.max_tokens, documents.neighbours, documents.marker, tuple(config.protect))
    return DocumentSettings(documents.min_tokens, frozenset(config.scope), documents.scorer, budget)


def _history(policy: Policy, services: Services) -> HistoryCompactor:
    config = policy.compression
    assert config.summarizer is not None  # the policy validator requires one when history is enabled
    provider_config = policy.providers[config.summarizer.provider]
    provider = build_provider(config.summarizer.provider, provider_config, team=policy.team)
    model = config.summarizer.model or provider_config.model or "demo"
    # Its own LimitsStage over the same state backend: the buckets and the budget are the team's.
    summarize = Summarizer(provider, model, config.summarizer.max_tokens, build_limits(policy, services),
                           hosted=provider_config.kind != "local")
    return HistoryCompactor(policy.team, Settings(config.history.trigger_tokens, config.history.keep_turns), summarize)
