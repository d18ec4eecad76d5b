"""What a pass-through request that runs a model is checked for before it leaves (sdk/passthrough/)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from sdk.passthrough.bodies import batch_params, keyed_body, keyed_params, requested_models
from sdk.providers.base import asking_usage
from sdk.state.message_threads import continued
from sdk.state.ownership import check_account_objects
from sdk.types import Endpoint, LLMRequest

if TYPE_CHECKING:
    from sdk.passthrough import _Exchange


def spend_checks(ex: _Exchange, request: dict[str, Any], raw: bytes, contexts: dict[str, int] | None = None) -> tuple[bytes, float, float]:
    """A request that runs a model, checked before it leaves: the account objects it names, its client
    ids keyed to the team (the body rewritten if any was), its models, its worst cost (a completion's
    hold, a message batch's, each request continuing a Thread with the context it holds, `contexts`, by
    the message id it continues). A message batch's every request is walked: in the heavy-work pool for a
    large body (up to the team's upload limit), not on the loop every team's requests share."""
    op, team = ex.op, ex.team.team
    batch = op.kind == "message_batch"
    check_account_objects(ex.limits.provider_objects, batch_params(request) if batch else (request,))
    if keyed_params(request, team) if batch else keyed_body(request, team):
        raw = orjson.dumps(request)
    if op.action == "complete":  # held against the budget until its answer ends
        if request.get("stream") is True and (asking := asking_usage(LLMRequest(Endpoint.CHAT_COMPLETIONS, request))) is not None:
            # its usage chunk, which the client did not ask for, charges it exactly (taken out of what it reads)
            request, ex.usage_asked = asking, True
            raw = orjson.dumps(request)
        ex.completion = LLMRequest(Endpoint.CHAT_COMPLETIONS, request, size=len(raw))
        ex.check_models(requested_models("", request))
        return raw, ex.worst_cost([ex.completion]), 0.0
    if batch:
        ex.check_models(requested_models(op.kind, request))
        params = batch_params(request)
        history = [contexts.get(continued(body) or "", 0) for body in params] if contexts else None
        return raw, 0.0, ex.worst_cost([LLMRequest(Endpoint.MESSAGES, body) for body in params], 0, history)
    return raw, 0.0, 0.0
