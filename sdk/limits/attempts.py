"""How many upstream requests one client request may make, each billed its prompt: what a budget's hold
multiplies (sdk/limits/stage.py:LimitsStage.reservation)."""

from __future__ import annotations

from sdk.policy import Policy
from sdk.types import Endpoint, LLMRequest


def upstream_requests(policy: Policy, request: LLMRequest) -> int:
    """The upstream requests `request` makes: a Chat request for `n` choices on a route that can reach a
    Claude target, which takes one request per choice (sdk/routing/translation/choices.py), makes n."""
    n = request.body.get("n")
    if request.endpoint is not Endpoint.CHAT_COMPLETIONS or not isinstance(n, int) or n <= 1:
        return 1
    route = policy.route_for(request.model)
    claude = route is not None and any(policy.providers[t.provider].kind == "anthropic" for t in route.targets)
    return n if claude else 1


def dropped_reads(policy: Policy, model: str, hosted: int) -> int:
    """The attempts the router may send and drop before their first byte, each a prompt the provider read
    and bills (the limits stage charges each, `_charge_reads`): with a first-byte timeout or hedging, every
    attempt of the route's `hosted` targets but the one that answers (`retry.max_attempts` a target); without
    either, an attempt is dropped only with its request, which the request's own hold covers."""
    retry = policy.retry
    if retry.first_byte_timeout_ms is None and not policy.hedging.enabled:
        return 0
    route = policy.route_for(model)
    total = len(route.targets) if route is not None else hosted
    return min(hosted * retry.max_attempts, total * retry.max_attempts - 1)
