"""A hosted tool loop is held as what the provider bills for it (docs/spend.md, "Hosted tool loops"): the
model samples once per server tool call and once after the last, each step reading the prompt, what it
wrote so far and every result so far, and the usage adds them up. The hold counted the prompt once.
Through the proxy with the official clients, the emulator upstream; the hold read while a stream runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from emulator.testing import RunningEmulator
from gateway.testing import running_proxy
from sdk.estimate import input_tokens
from sdk.limits.stage import RESERVE_EXACT_CHARS
from sdk.spend import price_of, worst_cost_usd
from sdk.types import Endpoint, LLMRequest, Usage
from tests.helpers import held_while_streaming, oai, spend_report, wait_until, write_policy

KEY = "sk-team-tool-loops"
RESULT = 10_000  # tokens a result is held at: sdk/estimate.py:RESULT, docs/spend.md
PLAIN = "retry: {max_attempts: 1}\nprompt_cache: {enabled: false}\n"
PROMPT = "Summarise this week's news from Lisbon, with sources. " + "Context: the reader follows city politics. " * 400


def test_a_messages_search_loop_holds_the_prompt_read_at_every_step(tmp_path: Path, fresh_emulator: RunningEmulator,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Claude's web search with max_uses 4 may sample five times, each reading the prompt again, the text
    written so far and the results so far: the hold counted the prompt once (with the searches' fees), so a
    request beside it was admitted where the budget had room for one loop only."""
    monkeypatch.setattr(fresh_emulator.config, "per_output_token_ms", 20.0)  # still streaming when the hold is read
    model = "claude-haiku-4-5"  # no long-context rates: the hold is linear in its tokens
    body: dict[str, Any] = {"model": model, "max_tokens": 300, "messages": [{"role": "user", "content": PROMPT}],
                            "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 4}]}
    price = price_of(model, {})
    assert price is not None
    prompt = input_tokens(LLMRequest(Endpoint.MESSAGES, body), RESERVE_EXACT_CHARS, worst=True)
    once = worst_cost_usd(prompt, 300, price, Usage(web_searches=4))  # what it held before
    looped = worst_cost_usd(5 * prompt + 4 * 300 + RESULT * 10, 300, price, Usage(web_searches=4))
    budget = (once + looped) / 2  # room for the old hold twice over, not for the loop beside anything
    assert 2 * once < budget < looped
    policy = write_policy(tmp_path, "loops", KEY, fresh_emulator.url, extra=PLAIN + f"budget: {{usd: {budget:.6f}, period: day}}\n")
    with running_proxy([policy]) as proxy:  # before: a request beside it was admitted
        held = held_while_streaming(proxy, KEY, body, beside={**body, "tools": [], "max_tokens": 10})
    assert held == pytest.approx(looped, rel=1e-3)  # before: `once`


def test_a_responses_hosted_tool_loop_holds_up_to_its_max_tool_calls(tmp_path: Path, fresh_emulator: RunningEmulator,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The Responses API's built-in tools loop the same way, up to the request's max_tool_calls (all its tools together)."""
    monkeypatch.setattr(fresh_emulator.config, "per_output_token_ms", 20.0)
    model = "gpt-4.1"
    body: dict[str, Any] = {"model": model, "input": PROMPT, "max_output_tokens": 300, "max_tool_calls": 3,
                            "tools": [{"type": "web_search"}]}
    price = price_of(model, {})
    assert price is not None
    prompt = input_tokens(LLMRequest(Endpoint.RESPONSES, body), RESERVE_EXACT_CHARS, worst=True)
    policy = write_policy(tmp_path, "loops", KEY, fresh_emulator.url, extra=PLAIN + "budget: {usd: 100, period: day}\n")
    with running_proxy([policy]) as proxy:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0)
        with client.responses.create(**body, stream=True) as stream:
            next(iter(stream))
            held = spend_report(proxy, KEY)["budget"]["held"]
    assert held == pytest.approx(worst_cost_usd(4 * prompt + 3 * 300 + RESULT * 6, 300, price,
                                                Usage(web_searches=3)), rel=1e-3)  # before: the prompt once


def test_a_search_loop_its_client_left_is_charged_each_step_it_showed(tmp_path: Path, fresh_emulator: RunningEmulator,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that leaves a stream before its final usage is charged an estimate; for a search loop it
    counted the input once (Anthropic's message_start reports the first step's), so leaving after the
    search and before the usage was a way to pay one prompt read for two. Each server tool call the stream
    showed counts a step now: the prompt again, the text so far and the result (RESULT tokens)."""
    monkeypatch.setattr(fresh_emulator.config, "per_output_token_ms", 5.0)  # still open when left
    monkeypatch.setattr(fresh_emulator.config, "default_output_tokens", 2000)
    model = "claude-haiku-4-5"
    price = price_of(model, {})
    assert price is not None
    with running_proxy([write_policy(tmp_path, "loops", KEY, fresh_emulator.url, extra=PLAIN)]) as proxy:
        client = anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0)
        with client.messages.stream(model=model, max_tokens=4000, messages=[{"role": "user", "content": "Lisbon news?"}],
                                    tools=[{"type": "web_search_20250305", "name": "web_search"}]) as helper:
            next(iter(helper.text_stream))  # the search ran, its results came, the answer has begun
        fresh_emulator.wait_for(lambda s: s["cancelled_streams"] == 1)
        spent = wait_until(lambda: (total := spend_report(proxy, KEY)["day"]["total"]) > 0 and total, "the left stream charged")
    assert spent - price.web_search / 1000 >= RESULT * price.input / 1e6  # before: the prompt once, a few tokens


def test_a_web_fetch_holds_the_results_its_max_content_tokens_allows(tmp_path: Path, fresh_emulator: RunningEmulator,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Claude's web fetch tool may bring back up to its `max_content_tokens` a fetch: each result is held at
    that where it is more than RESULT, read again at every later step."""
    monkeypatch.setattr(fresh_emulator.config, "per_output_token_ms", 20.0)
    model = "claude-haiku-4-5"
    body: dict[str, Any] = {"model": model, "max_tokens": 300, "messages": [{"role": "user", "content": PROMPT}],
                            "tools": [{"type": "web_fetch_20250910", "name": "web_fetch", "max_uses": 2, "max_content_tokens": 50_000}]}
    price = price_of(model, {})
    assert price is not None
    prompt = input_tokens(LLMRequest(Endpoint.MESSAGES, body), RESERVE_EXACT_CHARS, worst=True)
    policy = write_policy(tmp_path, "loops", KEY, fresh_emulator.url, extra=PLAIN + "budget: {usd: 100, period: day}\n")
    with running_proxy([policy]) as proxy, anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0).messages.stream(**body) as stream:
        next(iter(stream))
        held = spend_report(proxy, KEY)["budget"]["held"]
    assert held == pytest.approx(worst_cost_usd(3 * prompt + 2 * 300 + 50_000 * 3, 300, price), rel=1e-3)  # before: the prompt once


def test_an_mcp_servers_tools_and_calls_are_held(tmp_path: Path, fresh_emulator: RunningEmulator,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A remote MCP server's tool definitions are imported into the prompt every step reads, and its tools
    are called in the provider's loop (a Responses `mcp` tool; Anthropic's MCP connector, `mcp_servers`):
    the hold counted neither. The listing is held as a result in the prompt, the calls as 5 steps."""
    monkeypatch.setattr(fresh_emulator.config, "per_output_token_ms", 20.0)
    model = "gpt-4.1"
    server = {"type": "mcp", "server_label": "deepwiki", "server_url": "https://mcp.deepwiki.com/mcp", "require_approval": "never"}
    body: dict[str, Any] = {"model": model, "input": PROMPT, "max_output_tokens": 300, "tools": [server]}
    price = price_of(model, {})
    assert price is not None
    prompt = input_tokens(LLMRequest(Endpoint.RESPONSES, body), RESERVE_EXACT_CHARS, worst=True) + RESULT
    policy = write_policy(tmp_path, "loops", KEY, fresh_emulator.url, extra=PLAIN + "budget: {usd: 100, period: day}\n")
    claude = {"model": "claude-haiku-4-5", "max_tokens": 300, "messages": [{"role": "user", "content": PROMPT}],
              "mcp_servers": [{"type": "url", "url": "https://mcp.deepwiki.com/mcp", "name": "deepwiki"}]}
    haiku = price_of("claude-haiku-4-5", {})
    assert haiku is not None
    prompted = input_tokens(LLMRequest(Endpoint.MESSAGES, claude), RESERVE_EXACT_CHARS, worst=True) + RESULT
    with running_proxy([policy]) as proxy:
        with oai(proxy, KEY).responses.create(**body, stream=True) as stream:
            next(iter(stream))
            held = spend_report(proxy, KEY)["budget"]["held"]
        connector = anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0).beta.messages
        with connector.stream(**claude, betas=["mcp-client-2025-04-04"]) as beta_stream:
            next(iter(beta_stream))
            held_by_claude = spend_report(proxy, KEY)["budget"]["held"]
    assert held == pytest.approx(worst_cost_usd(6 * prompt + 5 * 300 + RESULT * 15, 300, price), rel=1e-3)  # before: the prompt once
    assert held_by_claude == pytest.approx(worst_cost_usd(6 * prompted + 5 * 300 + RESULT * 15, 300, haiku), rel=1e-3)  # before: once
