"""Pipeline stages by name, and the order a team's pipeline runs them in.

The order is data: `STAGE_ORDER` lists stage names outermost first; the router is always last.
Prompt-cache planning is not a stage: it needs the target's protocol, which only the router knows,
so the router runs it per attempt (sdk/promptcache/stage.py).
Each factory returns None when the team's policy leaves its stage off, so a disabled feature costs
nothing per request.
"""

from __future__ import annotations

from collections.abc import Callable

from sdk.cache.embedding_stage import build_embedding_cache
from sdk.cache.stage import build_cache
from sdk.compression.stage import build_compression
from sdk.limits.stage import build_limits
from sdk.observability.stage import build_metrics
from sdk.pipeline import Stage
from sdk.policy import Policy
from sdk.services import Services

StageFactory = Callable[[Policy, Services], Stage | None]

STAGE_ORDER: tuple[str, ...] = ("metrics", "limits", "embedding_cache", "cache", "compression")
FACTORIES: dict[str, StageFactory] = {
    "metrics": build_metrics,
    "limits": build_limits,
    "embedding_cache": build_embedding_cache,
    "cache": build_cache,
    "compression": build_compression,
}


def build_stages(policy: Policy, services: Services) -> list[Stage]:
    stages = [FACTORIES[name](policy, services) for name in STAGE_ORDER]
    return [stage for stage in stages if stage is not None]
