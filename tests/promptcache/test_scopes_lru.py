"""A team's busy prompt-cache scope is not dropped for its newest one.

The ledger keeps at most MAX_SCOPES scopes (one per provider cache: protocol, model, OpenAI
prompt_cache_key) per team, and dropped the first made when a new one came, however recently it was
used. A team whose OpenAI traffic spans many cache keys (a key per user, as OpenAI recommends, or many
system prompts, each its own gateway key) dropped its Claude scope again and again, and with it the
prefixes its Claude conversations had written: a tool loop turn that adds more than Anthropic's
20-block lookback reads the previous turn only through the planner's anchor on the longest live prefix
the ledger knows, so it read the system prompt only. Scopes are dropped least recently used first.
Through the proxy with the official clients, the emulator as both providers.
"""

from __future__ import annotations

import anthropic
import openai

from gateway.testing import running_proxy
from sdk.promptcache.ledger import Ledger
from tests.helpers import write_policy

KEY = "sk-prompt-cache-scopes"
SYSTEM = "You are the support assistant: answer from the manual and cite its section. " * 120  # ~1,800 tokens
DOCUMENT = "The device manual, chapter one: the reset button sits under the battery cover. " * 100


def _tool_round(i: int) -> list[dict]:
    """One assistant turn calling 12 tools and the user turn with their 12 results: 24 blocks."""
    calls = [{"type": "tool_use", "id": f"t{i}_{k}", "name": "lookup", "input": {"page": k}} for k in range(12)]
    results = [{"type": "tool_result", "tool_use_id": f"t{i}_{k}", "content": f"page {k}: nothing"} for k in range(12)]
    return [{"role": "assistant", "content": calls}, {"role": "user", "content": results}]


def test_a_busy_claude_scope_outlives_a_teams_many_openai_cache_keys(tmp_path, fresh_emulator, monkeypatch):
    monkeypatch.setattr(Ledger, "MAX_SCOPES", 3)  # 256 in production: three keep the test short
    write_policy(tmp_path, "pcscopes", KEY, fresh_emulator.url)
    tools = [{"name": "lookup", "description": "Read a manual page.",
              "input_schema": {"type": "object", "properties": {"page": {"type": "integer"}}}}]
    with running_proxy([tmp_path], watch_interval_s=None) as proxy:
        claude = anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0)
        gpt = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0)
        messages: list[dict] = [{"role": "user", "content": DOCUMENT + "\nHow do I reset the device?"}]
        reads = []
        for turn in range(3):
            answer = claude.messages.create(model="claude-sonnet-5", max_tokens=8, system=SYSTEM, tools=tools, messages=messages)
            reads.append(answer.usage.cache_read_input_tokens or 0)
            for user in range(2):  # the team's OpenAI traffic: a cache key per user, each its own scope
                gpt.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hello"}],
                                            prompt_cache_key=f"user-{turn}-{user}")
            messages += _tool_round(turn)
    assert reads[0] == 0
    # Each turn reads the whole previous turn (the document included), not only the system prompt and tools.
    assert reads[1] > 3000 and reads[2] > reads[1] + 200, reads  # old code: [0, 3430, 1822], the system prompt's only
