"""Prompt caching in an agentic loop: the cache hit rate, read from Slipstream's response headers.

The client below does what most agents do wrong: a timestamp and a request id at the top of the
system prompt, and tool schemas whose key order changes on every call. Slipstream canonicalizes
the tools, moves the volatile lines out of the cached prefix (`prompt_cache.reorder: true`) and
places the breakpoints; each answer's `x-slipstream-prompt-cache` header says what was read.

    python examples/prompt_caching.py
"""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime

import anthropic
from _local import TEAM_KEY, emulator_url, policy_file

from gateway.testing import running_proxy

INSTRUCTIONS = "You are a meticulous research agent. Follow the house rules below.\n" + "Rule: cite every source you use, verbatim. " * 200


def tools() -> list[dict]:
    """Two tool schemas, with their keys shuffled as a map-ordered serializer would."""
    def shuffled(d: dict) -> dict:
        items = list(d.items())
        random.shuffle(items)
        return {k: shuffled(v) if isinstance(v, dict) else v for k, v in items}

    search = {"name": "search", "description": "Search the web", "input_schema": {"type": "object", "properties": {"q": {"type": "string"}, "k": {"type": "integer"}}, "required": ["q"]}}
    fetch = {"name": "fetch", "description": "Fetch a URL", "input_schema": {"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]}}
    return [shuffled(search), shuffled(fetch)]


def system() -> str:
    return f"Current time: {datetime.now(UTC).isoformat()}\nRequest id: {uuid.uuid4()}\n{INSTRUCTIONS}"


def main() -> None:
    policy = "prompt_cache: {enabled: true, reorder: true, breakpoints: auto}\n"
    with emulator_url() as upstream, running_proxy([policy_file(upstream, policy)]) as proxy:
        client = anthropic.Anthropic(base_url=proxy.url, api_key=TEAM_KEY)
        messages: list[dict] = [{"role": "user", "content": "Find three papers on paged attention."}]
        read = total = 0
        for turn in range(6):
            raw = client.messages.with_raw_response.create(model="claude-sonnet-5", max_tokens=64, system=system(), tools=tools(), messages=messages)
            reply = raw.parse()
            usage = reply.usage
            turn_total = usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens
            read, total = read + usage.cache_read_input_tokens, total + turn_total
            print(f"turn {turn}: {raw.headers['x-slipstream-prompt-cache']}")
            messages += [
                {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in reply.content]},
                {"role": "user", "content": f"Good. Now look at result {turn + 1} more closely."},
            ]
        print(f"cache hit rate: {read / total:.0%} of {total} input tokens read from cache")


if __name__ == "__main__":
    main()
