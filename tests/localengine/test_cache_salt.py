"""Teams on one local engine share no prefix-cache blocks: the gateway salts each team's requests.

Without the salt, `cached_tokens` was an oracle: team B could learn, block by block, whether team
A had sent a prompt. The salt is the gateway's (derived from the team), so a client cannot choose
another team's; a client's own `cache_salt` only splits its team's cache further.
"""

from __future__ import annotations

import orjson

from sdk.policy import Policy
from sdk.providers.local import team_cache_salt
from sdk.requests import parse_request
from sdk.runtime import TeamRuntime
from sdk.types import Endpoint

PROMPT = "def fibonacci(n):\n    " + "a, b = b, a + b  # the next pair\n    " * 12


def _team(name: str, model_dir: str) -> TeamRuntime:
    return TeamRuntime.build(Policy.model_validate({
        "team": name,
        "providers": {"local": {"kind": "local", "model": model_dir}},
        "routes": [{"targets": [{"provider": "local"}]}],
        "prompt_cache": {"enabled": False},
    }))


async def _cached(team: TeamRuntime, **extra) -> int:
    body = {"model": "any", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 2, "temperature": 0, **extra}
    answer, _ = await team.handle(parse_request(Endpoint.CHAT_COMPLETIONS, orjson.dumps(body), "", {}))
    assert answer.status == 200, answer.body
    return orjson.loads(answer.body)["usage"]["prompt_tokens_details"]["cached_tokens"]


async def test_team_b_reads_nothing_team_a_cached(llama_dir):
    alpha, beta = _team("alpha", str(llama_dir)), _team("beta", str(llama_dir))
    assert await _cached(alpha) == 0
    assert await _cached(alpha) > 0  # the same engine does cache: alpha reads its own prompt back
    assert await _cached(beta) == 0  # identical prompt, other team: nothing
    assert await _cached(beta, cache_salt=team_cache_salt("alpha")) == 0  # naming alpha's salt does not help
    assert await _cached(beta) > 0  # beta's own entry, once written
