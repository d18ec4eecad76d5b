"""Compression and prompt caching together, through the real proxy with the official Anthropic client.

A six-turn conversation whose first user turn pastes reference material (the issue's prompt shape).
Compression of that earlier turn is keyed by its content and the next question, so every request
sends the same compressed bytes and the emulator's prefix cache keeps reading them. Input cost uses
Anthropic's multipliers (docs: prompt caching pricing): uncached 1, cache write 1.25 (5-minute TTL),
cache read 0.1.
"""

from __future__ import annotations

import anthropic

from gateway.testing import running_proxy
from tests.compression.textdata import FILLER
from tests.helpers import requires_extra, write_policy

QUESTIONS = [
    "What happens when the iterator of a for loop is exhausted?",
    "Can an assert statement be disabled, and how?",
    "Which clause of a try statement always runs?",
    "What does a with statement call when its block is left?",
    "How does a while loop with an else clause behave after break?",
    "What is the point of a finally clause?",
]
SETTINGS = {
    "neither": "compression: {enabled: false}\nprompt_cache: {enabled: false}\n",
    "caching": "compression: {enabled: false}\nprompt_cache: {enabled: true}\n",
    "compression": "compression: {enabled: true}\nprompt_cache: {enabled: false}\n",
    "both": "compression: {enabled: true}\nprompt_cache: {enabled: true}\n",
}


def conversation_cost(client: anthropic.Anthropic) -> tuple[float, list[int], list[str]]:
    """Input cost in uncached-token units over six turns, the cache reads per turn, and the bytes
    of the compressed first turn as the provider saw them on each turn (from the header's report)."""
    messages: list[dict] = [
        {"role": "user", "content": "Reference documents:\n\n" + FILLER},
        {"role": "assistant", "content": "Thanks, I have read the documents. What would you like to know?"},
    ]
    cost, reads, headers = 0.0, [], []
    for question in QUESTIONS:
        messages.append({"role": "user", "content": question})
        raw = client.messages.with_raw_response.create(model="claude-sonnet-5", max_tokens=32, messages=messages)
        usage = raw.parse().usage
        cost += usage.input_tokens + 1.25 * (usage.cache_creation_input_tokens or 0) + 0.1 * (usage.cache_read_input_tokens or 0)
        reads.append(usage.cache_read_input_tokens or 0)
        headers.append(raw.headers.get("x-slipstream-compression", ""))
        messages.append({"role": "assistant", "content": raw.parse().content[0].text})
    return cost, reads, headers


@requires_extra("semantic")
def test_compression_plus_prompt_caching_costs_less_than_either_alone(tmp_path, fresh_emulator):
    for team, extra in SETTINGS.items():
        write_policy(tmp_path, team, f"key-{team}", fresh_emulator.url, extra=extra)
    with running_proxy([tmp_path], watch_interval_s=None) as proxy:
        results = {team: conversation_cost(anthropic.Anthropic(base_url=proxy.url, api_key=f"key-{team}", max_retries=0)) for team in SETTINGS}
    costs = {team: cost for team, (cost, _, _) in results.items()}
    _, reads, headers = results["both"]
    # The compressed earlier turn is the same every turn, so from turn 2 on the cache reads it.
    assert reads[0] == 0 and all(read > 1000 for read in reads[1:])
    assert all("compressed=earlier_turns:1" in header for header in headers)
    assert costs["both"] < costs["caching"] < costs["neither"] and costs["both"] < costs["compression"] < costs["neither"]
    assert results["caching"][1][1:] > reads[1:]  # caching alone reads more tokens, and pays for them all on turn 1
    # Compression alone pays for the whole compressed prefix on every turn; together it is read at 0.1.
    assert costs["both"] < 0.6 * costs["compression"]
