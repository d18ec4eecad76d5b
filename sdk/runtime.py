"""What both doors share: a team's built pipeline, and the registry that finds it by key.

`TeamRuntime` is immutable once built; a policy reload builds new ones and swaps the registry's
maps, so requests already in flight finish on the runtime they started with.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from sdk.errors import AuthenticationError, PolicyError, UpstreamHTTPError
from sdk.extras import require_extras
from sdk.limits.stage import LimitsStage
from sdk.models import ModelCatalog
from sdk.observability import metrics
from sdk.pipeline import CompressionReport, Pipeline, RequestContext
from sdk.policy import Policy, load_policies, policy_files
from sdk.promptcache.stage import PromptCachePlanner, build_prompt_cache
from sdk.providers import build_provider
from sdk.providers.base import Provider
from sdk.readiness import HasWarmUps, WarmUp
from sdk.responses.api import StoredResponses
from sdk.responses.store import StoreLimits
from sdk.routing.router import Router
from sdk.routing.shared_breaker import SharedBreakerStore
from sdk.services import Services
from sdk.stages import build_stages
from sdk.types import Answer, LLMRequest, LLMResponse, LLMStream, Usage

log = logging.getLogger("slipstream")
SWEEP_INTERVAL_S = 60.0  # how often the teams' prompt-cache memory is swept (TeamRegistry.sweep)


@dataclass(frozen=True)
class TeamRuntime:
    policy: Policy
    pipeline: Pipeline
    models: ModelCatalog
    providers: Mapping[str, Provider]
    responses: StoredResponses  # GET / DELETE / input_items of the team's stored responses
    warm_ups: tuple[WarmUp, ...] = ()  # what its providers and stages load before the first request
    planner: PromptCachePlanner | None = None  # its prompt-cache planning (the router runs it per attempt)

    @property
    def team(self) -> str:
        return self.policy.team

    @cached_property
    def limits(self) -> LimitsStage:
        """The team's limits stage (always in its pipeline), for what is answered beside the pipeline."""
        return next(stage for stage in self.pipeline.stages if isinstance(stage, LimitsStage))

    @classmethod
    def build(cls, policy: Policy, services: Services | None = None) -> TeamRuntime:
        require_extras(policy, f"team {policy.team}")
        services = services or Services()
        providers = {name: build_provider(name, config, services, policy.team) for name, config in policy.providers.items()}
        state = services.shared_state()
        breakers = SharedBreakerStore(policy.breaker, state, policy.team) if state is not None else None
        stages = build_stages(policy, services)
        services.response_limits[policy.team] = StoreLimits(**policy.responses_store.model_dump())
        planner = build_prompt_cache(policy, services)  # run by the router per attempt, on the target's body
        router = Router(policy.routes, providers, policy.retry, breaker=policy.breaker, hedging=policy.hedging,
                        team=policy.team, responses=services.response_store, planner=planner, store=breakers)
        warm_ups = tuple(w for part in [*stages, *providers.values()] if isinstance(part, HasWarmUps) for w in part.warm_ups())
        return cls(policy=policy, pipeline=Pipeline(stages, router),
                   models=ModelCatalog(policy.routes, providers, policy.models, policy.usable_objects()), providers=providers,
                   responses=StoredResponses(policy.team, services.response_store, providers), warm_ups=warm_ups,
                   planner=planner)

    async def handle(self, request: LLMRequest, ctx: RequestContext | None = None) -> tuple[Answer, RequestContext]:
        ctx = ctx or RequestContext(request=request, team=self.team)
        answer = await self.pipeline.run(ctx)
        return answer, ctx


def slipstream_headers(ctx: RequestContext, answer: Answer) -> dict[str, str]:
    """The x-slipstream-* headers of an answer (docs/observability.md), computed when headers are sent."""
    overhead_ms = max(0.0, (time.perf_counter() - ctx.timings.start - ctx.timings.upstream_s) * 1000)
    usage = answer.usage
    # An OpenAI stream reports usage only in its last chunk: unknown when headers go out.
    usage_known = not (isinstance(answer, LLMStream) and ctx.request.protocol == "openai")
    prompt_cache = f"expected_read={ctx.prompt_cache.expected_read}"
    if usage_known:
        prompt_cache = f"read={usage.cache_read_tokens};write={usage.cache_write_tokens};{prompt_cache}"
    report = ctx.prompt_cache  # optional fields, appended only when set (docs/prompt-cache.md)
    if report.miss_cause:
        prompt_cache += f";miss_cause={report.miss_cause}"
    for name, value in (("moved", report.moved), ("advice", report.advice), ("repaired", report.repaired),
                        ("canonicalized", int(report.canonicalized))):
        if value:
            prompt_cache += f";{name}={value}"
    headers = {
        "x-slipstream-cache": ctx.cache_status,
        "x-slipstream-route": answer.route,
        "x-slipstream-overhead-ms": f"{overhead_ms:.3f}",
        "x-slipstream-prompt-cache": prompt_cache,
        "x-slipstream-request-id": ctx.request_id,
    }
    if ctx.compression is not None:  # only where the team enabled compression (docs/compression.md)
        headers["x-slipstream-compression"] = _compression_header(ctx.compression)
    return headers


def upstream_error_headers(ctx: RequestContext, exc: UpstreamHTTPError) -> dict[str, str]:
    """A provider's error passed through as it is, with its headers and the x-slipstream-* ones
    (every answer carries them: which route answered, the cache status, the overhead)."""
    answered = LLMResponse(status=exc.status, body=exc.body, headers=exc.headers, usage=Usage(), route=exc.route)
    return {**exc.headers, **slipstream_headers(ctx, answered)}


def _compression_header(report: CompressionReport) -> str:
    """`before=N;after=M[;compressed=PLACE:K,...][;refused=K][;left=PLACE:REASON:K,...][;history=...]`."""
    value = f"before={report.before};after={report.after}"
    if report.compressed:
        value += ";compressed=" + ",".join(f"{place}:{n}" for place, n in sorted(report.compressed.items()))
    if report.refused:
        value += f";refused={report.refused}"
    if report.left:
        value += ";left=" + ",".join(f"{why}:{n}" for why, n in sorted(report.left.items()))
    if report.history:
        value += f";history={report.history}"
    return value


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def _shared_provider_keys(policies: Sequence[Policy]) -> frozenset[str]:
    """Hosted-provider keys that more than one of the teams' policies holds."""
    holders = Counter(key for policy in policies for key in {key for config in policy.providers.values()
                                                              if config.kind != "local" for key in config.resolve_api_keys()})
    return frozenset(key for key, teams in holders.items() if teams > 1)


class TeamRegistry:
    """Team keys → runtimes, loaded from policy files and reloaded when they change.

    Keys are looked up by their SHA-256 digest and then compared with `hmac.compare_digest`, so the
    time taken does not depend on how much of a key matched.
    """

    def __init__(self, paths: Sequence[str | Path], services: Services | None = None):
        self.paths = [Path(p) for p in paths]
        self.services = services or Services()
        self._by_digest: dict[bytes, tuple[bytes, TeamRuntime]] = {}
        self.teams: dict[str, TeamRuntime] = {}
        self._stamp: dict[Path, int] = {}
        self.load()

    def load(self) -> None:
        """Build every team; on any error the previous state stays in force and PolicyError is raised."""
        stamp = self._current_stamp()
        policies = load_policies(self.paths)
        teams: dict[str, TeamRuntime] = {}
        by_digest = {}
        unreachable = []
        self.services.shared_provider_keys = _shared_provider_keys([p for p in policies.values() if p.resolved_keys()])
        for policy in policies.values():
            keys = policy.resolved_keys()
            if not keys:
                # Nobody could reach it: building its stages (a cache model, say) would cost for nothing.
                unreachable.append(policy.team)
                continue
            runtime = teams[policy.team] = TeamRuntime.build(policy, self.services)
            for key in keys:
                by_digest[_digest(key)] = (key.encode(), runtime)
        if unreachable:
            log.warning("not serving team%s %s: no team key is set (see `slipstream policy check`)",
                        "s" if len(unreachable) > 1 else "", ", ".join(unreachable))
        self.teams, self._by_digest, self._stamp = teams, by_digest, stamp

    def authenticate(self, key: str | None) -> tuple[TeamRuntime, str]:
        """The key's team, and a key id (a digest prefix, never the key) for per-key limits."""
        if not key:
            raise AuthenticationError("missing team key: send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'")
        digest = _digest(key)
        entry = self._by_digest.get(digest)
        if entry is None or not hmac.compare_digest(entry[0], key.encode()):
            raise AuthenticationError("invalid team key")
        return entry[1], digest[:6].hex()

    def _current_stamp(self) -> dict[Path, int]:
        stamp: dict[Path, int] = {}
        for file in policy_files(self.paths):
            try:
                stamp[file] = os.stat(file).st_mtime_ns
            except FileNotFoundError:
                continue
        return stamp

    def reload_if_changed(self) -> bool:
        stamp = self._current_stamp()
        if stamp == self._stamp:
            return False
        try:
            self.load()
        except Exception as exc:  # any failure is a policy error: the watcher must outlive it
            metrics.POLICY_RELOADS.labels("error").inc()
            if isinstance(exc, PolicyError):  # its text names files and key paths, never values
                log.error("policy reload failed; keeping the policies in force:\n%s", exc)
            else:
                log.error("policy reload failed (%s); keeping the policies in force", type(exc).__name__, exc_info=exc)
            # Report once per change, not every poll; stamped as before the read, so a write that landed
            # during it (an editor's save in two writes, the first read half-done) is read next poll.
            # Stamped after, that write was never read: this process (one worker of several) kept the
            # old policy while the others served the new one.
            self._stamp = stamp
            return False
        metrics.POLICY_RELOADS.labels("ok").inc()
        log.info("policies reloaded: %s", ", ".join(sorted(self.teams)))
        return True

    def warm_ups(self) -> list[WarmUp]:
        """What every served team needs loaded (duplicates are loaded once by name, in sdk/readiness.py)."""
        return [warm_up for runtime in self.teams.values() for warm_up in runtime.warm_ups]

    async def sweep(self, interval_s: float | None = None) -> None:
        """Every `interval_s` (SWEEP_INTERVAL_S), let each team's prompt-cache planner go of what has outlived every provider
        cache (its memory is the team's, in the process every team shares); run as a background task."""
        while True:
            await asyncio.sleep(interval_s or SWEEP_INTERVAL_S)
            now = time.time()
            for runtime in list(self.teams.values()):
                if runtime.planner is not None:
                    await runtime.planner.sweep(now)
                    await asyncio.sleep(0)  # one team's sweep a loop turn, not every team's at once

    async def watch(self, interval_s: float = 1.0, on_reload: Callable[[], None] | None = None) -> None:
        """Poll the policy files and reload on change; run as a background task."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                if await asyncio.to_thread(self.reload_if_changed) and on_reload is not None:
                    on_reload()
            except Exception:  # e.g. a policy directory that vanished: log, count, keep watching
                metrics.POLICY_RELOADS.labels("error").inc()
                log.exception("policy watcher: checking the policy files failed; still watching")
