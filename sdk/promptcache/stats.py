"""Per-team prompt-cache accounting: Prometheus series, a summary for `slipstream cache report`,
and the money a cache read saved at spend's prices.

Process-wide (survives policy reloads, like the Prometheus registry) and keyed by team name.
"""

from __future__ import annotations

import threading
from collections import Counter as Tally
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter

from sdk.observability.metrics import REGISTRY
from sdk.policy import Price

PREDICTED = Counter("slipstream_prompt_cache_expected_read_tokens_total", "Cache-read tokens the ledger predicted", ("team",), registry=REGISTRY)
EXPECTED_MISSES = Counter(
    "slipstream_prompt_cache_expected_miss_total",
    "Responses that read fewer cached tokens than the ledger predicted",
    ("team",), registry=REGISTRY,
)
MISSES = Counter(
    "slipstream_prompt_cache_miss_total",
    "Requests that could not read what a similar earlier request cached, by probable cause",
    ("team", "cause"), registry=REGISTRY,
)
MISSED_TOKENS = Counter("slipstream_prompt_cache_missed_tokens_total", "Tokens lost to cache misses, by cause", ("team", "cause"), registry=REGISTRY)
MOVES = Counter("slipstream_prompt_cache_moves_total", "Volatile lines moved out of the cached prefix (reorder)", ("team", "kind"), registry=REGISTRY)
ADVICE = Counter("slipstream_prompt_cache_advice_total", "Volatile content found and left in place", ("team", "kind"), registry=REGISTRY)
CANONICALIZED = Counter("slipstream_prompt_cache_canonicalized_total", "Requests whose tool schemas/inputs arrived in unstable key order", ("team",), registry=REGISTRY)
REPAIRS = Counter("slipstream_prompt_cache_repairs_total", "Requests whose cache_control markers were repaired", ("team",), registry=REGISTRY)
FANOUT_WAITS = Counter("slipstream_prompt_cache_fanout_waits_total", "Requests held until a sibling warmed the cache", ("team", "outcome"), registry=REGISTRY)

# Distinct miss causes (`KIND@PATH`) kept for a team's report. A path is wherever the team's prompts
# changed (`system.7`, `messages.412.content.3`, `tools.90`), so their number is the client's to choose,
# and this memory is process-wide and never let go: past the bound a new place counts under its kind.
MAX_CAUSES = 64

def saved_usd(price: Price | None, read: int, write: int) -> float:
    """Money saved against sending the same tokens uncached: reads at the cache-read price instead
    of the input price, less the premium paid for writes. Prices are spend's (the policy's
    `pricing:` first, then the built-in table); a model without one, a local model for instance,
    saves nothing that can be counted."""
    if price is None:
        return 0.0
    read_price = price.input if price.cache_read is None else price.cache_read
    write_price = price.input if price.cache_write is None else price.cache_write
    return (read * (price.input - read_price) - write * (write_price - price.input)) / 1e6


@dataclass
class TeamStats:
    requests: int = 0
    hits: int = 0  # responses that read something from cache
    input_tokens: int = 0  # all input: uncached + read + written
    read_tokens: int = 0
    write_tokens: int = 0
    expected_read_tokens: int = 0
    expected_misses: int = 0
    saved_usd: float = 0.0
    moves: int = 0
    advice: int = 0
    repairs: int = 0
    canonicalized: int = 0
    causes: Tally[str] = field(default_factory=Tally)
    examples: dict[str, str] = field(default_factory=dict)  # cause label -> latest excerpt

    def count_miss(self, label: str, kind: str, example: str) -> None:
        """Count a miss under its label, or under its kind once MAX_CAUSES labels are kept (the kinds are
        a handful, so the tally stays bounded however many places a team's prompts change at)."""
        if label not in self.causes and len(self.causes) >= MAX_CAUSES:
            label = kind
        self.causes[label] += 1
        self.examples[label] = example

    def summary(self, top: int = 5) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "hit_rate": round(self.hits / self.requests, 4) if self.requests else 0.0,
            "cached_token_share": round(self.read_tokens / self.input_tokens, 4) if self.input_tokens else 0.0,
            "input_tokens": self.input_tokens,
            "cache_read_tokens": self.read_tokens,
            "cache_write_tokens": self.write_tokens,
            "expected_read_tokens": self.expected_read_tokens,
            "expected_misses": self.expected_misses,
            "saved_usd": round(self.saved_usd, 6),
            "volatile_moved": self.moves,
            "volatile_advice": self.advice,
            "markers_repaired": self.repairs,
            "canonicalized": self.canonicalized,
            "top_miss_causes": [
                {"cause": cause, "count": count, "example": self.examples.get(cause, "")}
                for cause, count in self.causes.most_common(top)
            ],
        }


_LOCK = threading.Lock()
_TEAMS: dict[str, TeamStats] = {}


def team_stats(team: str) -> TeamStats:
    with _LOCK:
        found = _TEAMS.get(team)
        if found is None:
            found = _TEAMS[team] = TeamStats()
        return found


def report(team: str) -> dict[str, Any]:
    return {"team": team, **team_stats(team).summary()}
