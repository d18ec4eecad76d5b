"""What the status page shows, gathered from the process: the live buckets (sdk/observability/live_stats.py; every
worker's under `--workers`, sdk/observability/live_workers.py), each
team's breakers (its router's store) and spend against budget (the state backend, shared by replicas).

Reads only; the buckets' arithmetic runs in a worker thread on a snapshot taken on the loop.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field

from sdk.observability import live_stats, live_workers
from sdk.observability.live_stats import RouteWindow, Snapshot, Window
from sdk.observability.metrics import RouteLabels
from sdk.routing.router import Router
from sdk.runtime import TeamRegistry, TeamRuntime
from sdk.spend import spend_report
from sdk.state.backend import StateBackend

TOP_CAUSES = 5


@dataclass(frozen=True)
class Chart:
    """One small time-series chart: its series share the window's bucket times."""

    id: str
    group: str  # charts of one group share a row: the team's, then one row per route
    title: str
    kind: str  # traffic | ttft | e2e | caches (the page styles and tests by it)
    unit: str
    series: dict[str, list[float | None]]
    dashed: tuple[str, ...] = ()  # series drawn dashed (what was expected, beside what happened)


@dataclass(frozen=True)
class TeamStatus:
    team: str
    served: bool  # False: the team left the policies and only its recent traffic remains
    totals: dict[str, int]
    routes: list[RouteWindow]
    top_causes: list[tuple[str, int]]
    response_cache: bool  # the policy has a response cache
    compression: bool
    breakers: dict[str, str]  # target -> closed | open | half_open
    breakers_enabled: bool
    spend: dict[str, object] | None  # sdk/spend.py:spend_report
    charts: list[Chart] = field(default_factory=list)


@dataclass(frozen=True)
class Status:
    generated_at: float
    pid: int  # the process that answered
    workers: int  # the processes whose numbers the page adds up (`--workers`; 1 otherwise)
    bucket_s: int
    times: list[float]
    teams: list[TeamStatus]

    @property
    def window_s(self) -> int:
        return self.bucket_s * len(self.times)


async def gather(registry: TeamRegistry, state: StateBackend) -> Status:
    recorder = live_stats.recorder() or live_stats.enable()
    window, workers = await asyncio.to_thread(_window, recorder.snapshot())  # the snapshot on the loop that records
    runtimes = registry.teams
    teams = []
    for team in sorted(set(runtimes) | set(window.teams())):
        runtime = runtimes.get(team)
        routes = window.of_team(team)
        series, totals, causes = live_stats.merge(routes)
        teams.append(TeamStatus(
            team=team,
            served=runtime is not None,
            totals=totals,
            routes=routes,
            top_causes=causes.most_common(TOP_CAUSES),
            response_cache=runtime is not None and runtime.policy.semantic_cache.enabled,
            compression=runtime is not None and runtime.policy.compression.enabled,
            breakers=await _breakers(runtime) if runtime is not None else {},
            breakers_enabled=runtime is not None and runtime.policy.breaker.enabled,
            spend=await spend_report(state, team, runtime.policy.budget) if runtime is not None else None,
            charts=_charts(team, routes, series),
        ))
    return Status(time.time(), os.getpid(), workers, window.bucket_s, window.times, teams)


def _window(own: Snapshot) -> tuple[Window, int]:
    """This process's buckets, with the other workers' added under `--workers`, and how many processes that is."""
    shared = live_workers.shared_dir()
    copies = live_workers.others(shared) if shared is not None else []
    return live_workers.merged(own, copies).window(), 1 + len(copies)


async def _breakers(runtime: TeamRuntime) -> dict[str, str]:
    """Every target the policy names with its model, and every other one the router has tried."""
    router = runtime.pipeline.terminal
    if not isinstance(router, Router):
        return {}
    targets = sorted(RouteLabels(runtime.policy).known | set(router.stats.keys()))
    return {target: str(await router.breakers.state(target)) for target in targets}


def _ratio(numerators: list[int], denominators: list[int]) -> list[float | None]:
    return [round(100 * n / d, 1) if d else None for n, d in zip(numerators, denominators, strict=True)]


def _charts(team: str, routes: list[RouteWindow], series: dict[str, list[int]]) -> list[Chart]:
    charts = []
    if series:
        hits = [a + b for a, b in zip(series["exact_hits"], series["semantic_hits"], strict=True)]
        charts.append(Chart(f"{team}|caches", "", "prompt-cache read share and response-cache hits", "caches", "%", {
            "prompt-cache read": _ratio(series["cache_read_tokens"], series["input_tokens"]),
            "expected read": _ratio(series["expected_read_tokens"], series["input_tokens"]),
            "response-cache hits": _ratio(hits, series["requests"]),
        }, dashed=("expected read",)))
    for route in routes:
        name = route.route
        charts.append(Chart(f"{team}|{name}|traffic", name, f"{name}: requests, errors", "traffic", "per bucket", {
            "requests": [float(v) for v in route.counts["requests"]],
            "errors": [float(v) for v in route.counts["errors"]],
        }))
        if route.e2e_total_ms["p50"] is not None:  # answered requests in the window (not only refusals)
            charts.append(Chart(f"{team}|{name}|ttft", name, f"{name}: time to first token", "ttft", "ms", dict(route.ttft_ms)))
            charts.append(Chart(f"{team}|{name}|e2e", name, f"{name}: end-to-end", "e2e", "ms", dict(route.e2e_ms)))
    return charts
