"""What a budgeted team's request holds against its budget while it runs: its worst cost on the
dearest hosted target of its route (docs/spend.md's bound), or the 403 naming the `pricing:` entry
a target's model lacks. The limits stage admits with it (sdk/limits/stage.py); the pass-through
prices a batch's lines with it."""

from __future__ import annotations

from dataclasses import dataclass

from sdk import estimate
from sdk.errors import SlipstreamError
from sdk.estimate import choice_limit, input_tokens, output_limit, tool_call_limits, worst_input
from sdk.limits.attempts import dropped_reads, upstream_requests
from sdk.policy import Policy, Price
from sdk.spend import PriceBook, worst_cost_usd
from sdk.types import Endpoint, LLMRequest, Protocol

FREE = (Endpoint.COUNT_TOKENS, Endpoint.RESPONSES_INPUT_TOKENS)  # token counts cost nothing
RESERVE_EXACT_CHARS = 8 * 1024  # input text tokenized exactly for a reservation; beyond, counted by length


@dataclass(frozen=True, slots=True)
class _Priced:
    """A hosted target of a route, as a budget's hold prices it: its model, its provider's protocol, its price."""

    model: str
    protocol: Protocol
    price: Price


class WorstCost:
    """A team's worst-cost pricing of its requests, with the priced hosted targets of each model it asked for."""

    def __init__(self, policy: Policy, prices: PriceBook):
        self.team = policy.team
        self.policy = policy
        self.budget = policy.budget
        self.prices = prices
        self._targets: dict[str, tuple[_Priced, ...]] = {}  # requested model → its priced hosted targets (budgeted teams)

    def reservation(self, request: LLMRequest, exact: int = RESERVE_EXACT_CHARS, history: int = 0, token_rate: float = 1.0,
                    routed: bool = True) -> float:
        """USD a budgeted team's request holds while it runs: its worst cost (input counted, `exact`
        characters of it tokenized, with `history` tokens of a stored conversation it continues; the
        output limit it asks for or a default; its tokens times `token_rate`, 0.5 for a batch's request,
        and the hosted tool calls it allows in full; `routed`: through the router, whose retries and hedges may
        each read the prompt, `dropped_reads`) on the dearest hosted target of its route. Raises a 403
        naming the `pricing:` entry to add when a target's model has no price (or no fast-mode price,
        for a fast request; no image price, for one offering the image tool; no container price, for one
        offering the code interpreter or a hosted shell): a budget cannot hold
        against spend nobody can count. 0 for a team without a budget."""
        if self.budget is None or request.endpoint in FREE:
            return 0.0
        targets = self._targets.get(request.model)
        if targets is None:
            targets = self._priced_targets(request.model)
        if not targets:
            return 0.0
        prices = [target.price for target in targets]
        body = request.body
        fast = fast_mode(request)
        if fast and any(price.fast is None for price in prices):
            raise SlipstreamError(f"pricing: team {self.team} has a budget and Anthropic's fast mode (speed: fast) has no price for "
                                  f"model {request.model!r}, so its spend could not be counted; the gateway's operator must add "
                                  "`fast: MULTIPLIER` (of the standard token prices) to the model's pricing: entry (docs/spend.md)", status=403)
        calls = tool_call_limits(request)
        if calls.images and any(price.image_generation is None for price in prices):
            raise SlipstreamError(f"pricing: team {self.team} has a budget and the image generation tool has no price for model "
                                  f"{request.model!r}, so its spend could not be counted; the gateway's operator must add "
                                  "`image_generation: USD_PER_IMAGE` to the model's pricing: entry (docs/spend.md)", status=403)
        if calls.containers and any(price.code_interpreter is None for price in prices):
            raise SlipstreamError(f"pricing: team {self.team} has a budget and containers (the code interpreter's, the hosted "
                                  f"shell's) have no price for model "
                                  f"{request.model!r}, so its spend could not be counted; the gateway's operator must add "
                                  "`code_interpreter: USD_PER_CONTAINER` to the model's pricing: entry (docs/spend.md)", status=403)
        legs = self.legs(request)  # each of them the request's worst cost (Claude bills each its prompt and tool calls)
        counted, allowed = worst_input(request, exact), output_limit(request) if legs == 1 else choice_limit(request)
        tier, us_only = body.get("service_tier"), body.get("inference_geo") == "us"
        steps = estimate.hosted_steps(request)  # a hosted tool loop reads the prompt again at each step (docs/spend.md)
        result, listed = (estimate.result_tokens(request), estimate.listed_tools(request)) if steps else (0, 0)
        reads = dropped_reads(self.policy, request.model, len(targets)) if routed else 0  # the pass-through sends once

        def worst(t: _Priced) -> float:  # its images at the worst the target's model bills one (OpenAI's differ by model)
            prompt = counted.on(t.model, t.protocol) + history + listed
            read = estimate.looped_input(prompt, steps, allowed, result)
            looped = worst_cost_usd(read, allowed, t.price, calls, tier, us_only, fast, token_rate)
            return looped + reads * worst_cost_usd(prompt, 0, t.price, None, tier, us_only, fast, token_rate)

        return legs * max(worst(t) for t in targets)

    def legs(self, request: LLMRequest) -> int:
        return upstream_requests(self.policy, request)

    def own_call(self, request: LLMRequest, model: str) -> float:
        """USD a call the gateway makes itself for the team (a history summary, sent to `model` on a
        hosted provider without a route) holds against its budget: its worst cost. Raises the 403
        naming the `pricing:` entry when a budgeted team's `model` has no price. 0 without a budget."""
        if self.budget is None:
            return 0.0
        price = self.prices.price(model)
        if price is None:
            raise self._unpriced([model])
        return worst_cost_usd(input_tokens(request, RESERVE_EXACT_CHARS, worst=True), output_limit(request), price)

    def _priced_targets(self, model: str) -> tuple[_Priced, ...]:
        route = self.policy.route_for(model)
        if route is None:
            return ()  # the router answers 404
        prices: list[_Priced] = []
        missing: list[str] = []
        for target in route.targets:
            kind = self.policy.providers[target.provider].kind
            if kind == "local":
                continue  # the bundled engine costs nothing per token
            name = target.model or model
            price = self.prices.price(name)
            if price is None:
                missing.append(name)
            else:
                prices.append(_Priced(name, Protocol.ANTHROPIC if kind == "anthropic" else Protocol.OPENAI, price))
        if missing:
            raise self._unpriced(missing)
        if len(self._targets) >= 1024:  # model names come from clients: keep the memo bounded
            self._targets.clear()
        self._targets[model] = found = tuple(prices)
        return found

    def _unpriced(self, missing: list[str]) -> SlipstreamError:
        """The 403 for a budgeted team's call to models without a price: a budget cannot hold
        against spend nobody can count."""
        names = ", ".join(repr(name) for name in dict.fromkeys(missing))
        return SlipstreamError(
            f"pricing: team {self.team} has a budget and model {names} has no price, so its spend could not be "
            f"counted; the gateway's operator must add it to the team's policy, e.g. pricing: {{\"{missing[0]}\": "
            "{input: USD_PER_MILLION_TOKENS, output: USD_PER_MILLION_TOKENS}} (docs/spend.md)", status=403)


def fast_mode(request: LLMRequest) -> bool:
    """Whether the request asks for Anthropic's fast mode, which bills it at the price's `fast` rate."""
    return request.body.get("speed") == "fast"
