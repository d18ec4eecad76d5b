"""What a request cost: the provider's reported usage times a price table, and where spend is kept.

Prices are USD per million tokens, by model glob (first match wins; a team's `pricing:` map is
searched before the built-in table). Anthropic's usage splits cache writes by TTL
(`cache_creation.ephemeral_1h_input_tokens`): 5-minute writes are priced at `cache_write` (1.25× input),
1-hour ones at `cache_write_1h` (2×); OpenAI charges no write fee before GPT-5.6. Web searches are priced
per 1,000. The built-in figures and their public sources are in docs/spend.md.

Spend is kept per team in one record per day and one per month (UTC), fields `total`, `key:ID`,
`model:NAME`, `estimated` (the part of the total whose tokens the gateway counted because no usage
came back: sdk/estimate.py) and `batch:ID` (a budgeted team's batch, charged its worst cost when
created, until its results are read and charged instead); a team `budget` is checked against its period's `total` plus what
requests in flight hold (each holds its worst cost, `worst_cost_usd`, until it settles) before each call.
"""

from __future__ import annotations

import fnmatch
import functools
import time
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from sdk.policy import BudgetPolicy, Price
from sdk.state.backend import BudgetCheck, SpendRecord, StateBackend, team_slot
from sdk.types import Usage

# OpenAI bills web_search_preview on its non-reasoning models (gpt-4o, gpt-4.1) $25 per 1,000 calls,
# the web_search tool $10 on every model; which tool ran is not in the answer, so those models' searches
# are priced at the dearer rate (a budget must not be under-counted; a team pins its own in `pricing:`).
PREVIEW_SEARCH = 25.0
# Claude Sonnet 4.x and Opus 4.6 with the 1M-token context bill a request whose input passes 200,000 tokens
# at long-context rates: input (and cache) 2x, output 1.5x (Sonnet: $6 / $22.50 against $3 / $15).
LONG_CONTEXT = 200_000

# USD per million tokens: input, output, cache read, cache write (5m); Anthropic's 1-hour writes are 2x
# input; web searches per 1,000 are Price's default ($10, both providers) but where a model's searches
# cost more (PREVIEW_SEARCH).
BUILT_IN: tuple[tuple[str, Price], ...] = tuple(
    (glob, Price(input=i, output=o, cache_read=r, cache_write=w, cache_write_1h=2 * i if glob.startswith("claude-") else w,
                 web_search=PREVIEW_SEARCH if glob.startswith(("gpt-4o", "gpt-4.1")) else 10.0,
                 long_context_from=LONG_CONTEXT if glob.startswith(("claude-sonnet-4", "claude-opus-4-6")) else None))
    for glob, (i, o, r, w) in {
        # Anthropic: platform.claude.com/docs/en/about-claude/pricing (reads 0.1×, 5m writes 1.25× input)
        "claude-opus-4-5*": (5, 25, 0.5, 6.25),
        "claude-opus-4-6*": (5, 25, 0.5, 6.25),
        "claude-opus-5*": (5, 25, 0.5, 6.25),
        "claude-opus-4*": (15, 75, 1.5, 18.75),  # Opus 4 and 4.1
        "claude-sonnet-4*": (3, 15, 0.3, 3.75),
        "claude-sonnet-5*": (3, 15, 0.3, 3.75),
        "claude-3-7-sonnet*": (3, 15, 0.3, 3.75),
        "claude-haiku-4-5*": (1, 5, 0.1, 1.25),
        "claude-3-5-haiku*": (0.8, 4, 0.08, 1.0),
        # OpenAI: developers.openai.com/api/docs/pricing (no write fee; cached input 90% off on gpt-5.x,
        # 75% on gpt-4.1, 50% on gpt-4o)
        "gpt-5-nano*": (0.05, 0.4, 0.005, 0),
        "gpt-5-mini*": (0.25, 2, 0.025, 0),
        # gpt-5 and gpt-5.1 by name: later gpt-5.x cost more (gpt-5.2 $1.75 / $14), so a glob would under-price them
        "gpt-5": (1.25, 10, 0.125, 0), "gpt-5-2025-*": (1.25, 10, 0.125, 0), "gpt-5-chat-latest": (1.25, 10, 0.125, 0),
        "gpt-5-codex": (1.25, 10, 0.125, 0), "gpt-5.1": (1.25, 10, 0.125, 0), "gpt-5.1-2025-*": (1.25, 10, 0.125, 0),
        "gpt-5.1-chat-latest": (1.25, 10, 0.125, 0), "gpt-5.1-codex": (1.25, 10, 0.125, 0),
        "gpt-4.1-nano*": (0.1, 0.4, 0.025, 0),
        "gpt-4.1-mini*": (0.4, 1.6, 0.1, 0),
        "gpt-4.1*": (2, 8, 0.5, 0),
        "gpt-4o-mini*": (0.15, 0.6, 0.075, 0),
        "gpt-4o*": (2.5, 10, 1.25, 0),
        "gpt-4-turbo*": (10, 30, 10, 0),  # no cached-input discount
        # the o-series by exact name and dated snapshot only: o3-pro, o1-pro and the deep-research
        # models cost several times more, and an unknown name is refused to a budgeted team, not under-priced
        "o4-mini": (1.1, 4.4, 0.275, 0), "o4-mini-2025-*": (1.1, 4.4, 0.275, 0),
        "o3-mini": (1.1, 4.4, 0.55, 0), "o3-mini-2025-*": (1.1, 4.4, 0.55, 0),
        "o3": (2, 8, 0.5, 0), "o3-2025-*": (2, 8, 0.5, 0),
        "o1": (15, 60, 7.5, 0), "o1-2024-*": (15, 60, 7.5, 0),
        "text-embedding-3-small*": (0.02, 0, 0.02, 0),
        "text-embedding-3-large*": (0.13, 0, 0.13, 0),
        "text-embedding-ada-002*": (0.1, 0, 0.1, 0),
    }.items()
)


# Variants the built-in globs would match but that bill otherwise: audio and realtime tokens (8-16x the
# text rates), search models (a fee per request), the -pro models (gpt-5-pro: 12x gpt-5). Only a team's
# own `pricing:` prices them; a budgeted team is refused them otherwise, never under-charged.
NOT_BUILT_IN = ("*audio*", "*realtime*", "*transcribe*", "*tts*", "*search*", "*-pro", "*-pro-*", "*deep-research*")


def price_of(model: str, overrides: dict[str, Price]) -> Price | None:
    for glob, price in overrides.items():
        if fnmatch.fnmatchcase(model, glob):
            return price
    if any(fnmatch.fnmatchcase(model, glob) for glob in NOT_BUILT_IN):
        return None
    for glob, price in BUILT_IN:
        if fnmatch.fnmatchcase(model, glob):
            return price
    return None


class PriceBook:
    """One team's prices (its policy's `pricing:`, then the built-in table), each model's glob match made
    once rather than per request; the memo is bounded, since model names come from clients."""

    MAX_MODELS = 1024

    def __init__(self, overrides: dict[str, Price]):
        self.overrides = overrides
        self._memo: dict[str, Price | None] = {}

    def __contains__(self, model: str) -> bool:
        return model in self._memo

    def price(self, model: str) -> Price | None:
        try:
            return self._memo[model]
        except KeyError:
            if len(self._memo) >= self.MAX_MODELS:
                self._memo.clear()
            found = self._memo[model] = price_of(model, self.overrides)
            return found


def tier_rate(price: Price, tier: object) -> float:
    """What OpenAI's service tier multiplies token prices by: `priority` and `flex` are billed at their
    own rates (its pricing page), anything else at the standard one."""
    return price.priority if tier == "priority" else price.flex if tier == "flex" else 1.0


def _surcharge(price: Price, us_only: bool, fast: bool) -> float:
    """What Anthropic's US-only inference and fast mode multiply token prices by."""
    return (price.us_only if us_only else 1.0) * ((price.fast or 1.0) if fast else 1.0)


def _long(price: Price, input_tokens: int) -> tuple[float, float]:
    """The input-side and output multipliers for a request of `input_tokens`: the long-context rates past
    the price's threshold, else 1."""
    if price.long_context_from is not None and input_tokens > price.long_context_from:
        return price.long_input, price.long_output
    return 1.0, 1.0


def cost_usd(usage: Usage, price: Price, token_rate: float = 1.0) -> float:
    """What `usage` costs at `price`: its tokens times `token_rate` (0.5 at batch rates, which
    discount tokens only) and the per-call fees of the tools the provider ran in full."""
    written_5m = usage.cache_write_tokens - usage.cache_write_1h_tokens
    inputs = (usage.input_tokens * price.input + usage.cache_read_tokens * (price.cache_read or 0.0)
              + written_5m * (price.cache_write or 0.0) + usage.cache_write_1h_tokens * (price.cache_write_1h or 0.0))
    long_input, long_output = _long(price, usage.total_input_tokens)
    tokens = (inputs * long_input + usage.output_tokens * price.output * long_output) / 1e6
    rate = tier_rate(price, usage.service_tier) * _surcharge(price, usage.inference_geo == "us", usage.fast)
    return tokens * rate * token_rate + tool_fees(usage, price)


def tool_fees(calls: Usage, price: Price) -> float:
    """USD for the hosted tool calls the provider bills per call besides the tokens: web searches and
    file searches (per 1,000), images of the image generation tool and the code interpreter's containers
    (each; none where not priced)."""
    return ((calls.web_searches * price.web_search + calls.file_searches * price.file_search) / 1e3
            + calls.images * (price.image_generation or 0.0) + calls.containers * (price.code_interpreter or 0.0))


def worst_cost_usd(input_tokens: int, output_tokens: int, price: Price, calls: Usage | None = None, tier: object = None,
                   us_only: bool = False, fast: bool = False, token_rate: float = 1.0) -> float:
    """The most a request can cost: every input token at the dearest of the input and cache-write
    prices, every allowed output token at the output price (at long-context rates past the price's
    threshold), on the service tier it asks for (never below the standard rate: a provider may serve a
    flex request at it) and where it asks to run, the tokens times `token_rate` (batch rates), and the
    hosted tool `calls` it allows in full (a budget reservation)."""
    dearest = max(price.input, price.cache_write or 0.0, price.cache_write_1h or 0.0)
    long_input, long_output = _long(price, input_tokens)
    tokens = (input_tokens * dearest * long_input + output_tokens * price.output * long_output) / 1e6
    rate = max(1.0, tier_rate(price, tier)) * _surcharge(price, us_only, fast)
    return tokens * rate * token_rate + (tool_fees(calls, price) if calls is not None else 0.0)


@dataclass(frozen=True, slots=True)
class Period:
    name: str  # "day" | "month"
    id: str  # "2026-11-22" | "2026-11"
    keep_s: float  # until the period ends, and a day more so its spend can still be read


def periods(now: float | None = None) -> tuple[Period, Period]:
    now = time.time() if now is None else now
    day, day_end, month, month_end = _bounds(int(now // 86_400))
    return Period("day", day, day_end - now + 86_400), Period("month", month, month_end - now + 86_400)


@functools.lru_cache(maxsize=4)
def _bounds(epoch_day: int) -> tuple[str, float, str, float]:
    """The UTC day's and month's ids and end times (computed once a day, not per request)."""
    today = date(1970, 1, 1) + timedelta(days=epoch_day)
    month_start = today.replace(day=1)
    next_month = (month_start + timedelta(days=32)).replace(day=1)

    def start_of(day: date) -> float:
        return datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp()

    return today.isoformat(), start_of(today + timedelta(days=1)), month_start.isoformat()[:7], start_of(next_month)


def record_key(team: str, period: Period) -> str:
    return f"spend:{team_slot(team)}:{period.name}:{period.id}"  # the team's limits' slot: one script touches both


def budget_check(team: str, budget: BudgetPolicy | None, reserve: float = 0.0) -> BudgetCheck | None:
    """The admission check of a team's budget; `reserve` is held while the request runs."""
    if budget is None:
        return None
    period = next(p for p in periods() if p.name == budget.period)
    return BudgetCheck(record_key(team, period), budget.usd, reserve)


def spend_record(team: str, key_id: str | None, model: str, usd: float, estimated: bool = False) -> SpendRecord:
    """One request's spend; `estimated` when the gateway counted its tokens (no usage came back),
    added to the records' `estimated` field as well."""
    fields = ("total", f"model:{model}") + ((f"key:{key_id}",) if key_id else ()) + (("estimated",) if estimated else ())
    return SpendRecord(usd, tuple((record_key(team, p), p.keep_s) for p in periods()), fields)


def batch_field(batch_id: str) -> str:
    """The spend field holding what a budgeted team's batch was charged when created (its worst cost)
    until its results are charged (`LimitsStage.charge_created_batch`, `true_up_batch`)."""
    return f"batch:{batch_id}"


def created_batch_record(team: str, batch_id: str, usd: float) -> SpendRecord:
    """A created batch's worst cost, charged to `total` and its own field until its results are read."""
    return SpendRecord(usd, tuple((record_key(team, p), p.keep_s) for p in periods()), ("total", batch_field(batch_id)))


async def spend_report(state: StateBackend, team: str, budget: BudgetPolicy | None) -> dict[str, object]:
    """A team's spend this UTC day and month, by key and by model (GET /v1/slipstream/spend)."""
    report: dict[str, object] = {"team": team, "currency": "USD"}
    for period in periods():
        fields = await state.spend(record_key(team, period))
        report[period.name] = {
            "period": period.id,
            "total": round(fields.get("total", 0.0), 6),
            "estimated": round(fields.get("estimated", 0.0), 6),  # part of the total counted by the gateway
            "by_key": {name[4:]: round(usd, 6) for name, usd in sorted(fields.items()) if name.startswith("key:")},
            "by_model": {name[6:]: round(usd, 6) for name, usd in sorted(fields.items()) if name.startswith("model:")},
            # part of the total: batches charged their worst cost when created, whose results are not read yet
            "unread_batches": round(sum(usd for name, usd in fields.items() if name.startswith("batch:")), 6),
        }
    if budget is not None:
        spent = report[budget.period]["total"]  # type: ignore[index]
        record = record_key(team, next(p for p in periods() if p.name == budget.period))
        held = round(max(0.0, (await state.spend(record)).get("held", 0.0)), 6)
        report["budget"] = {"usd": budget.usd, "period": budget.period, "spent": spent, "held": held,
                            "remaining": round(max(0.0, budget.usd - spent), 6)}
    return report
