"""The planner does not keep a prefix out of the cache for good on one sign of volatility.

No breakpoint goes after volatile content left in place (reorder off; tool descriptions are never
moved), because such a prefix would be written at 1.25x on every call and never read. Two ways that
turned caching off for good, through the proxy with the official clients, the emulator as Anthropic's
cache:
- a learned label stayed for the team's life: one new prompt version (`v0 …` -> `v1 …`) reported
  `miss_cause=system_changed@system.0;advice=1` and then `write=0` on every request after it, the new
  prompt reused turn after turn included. Learned volatility is judged over a line's recent comparisons.
- a pattern only guesses at volatility: an example timestamp in a tool description, a knowledge-cutoff
  date, a workspace UUID are the same on every request, and each kept every breakpoint out of the
  team's requests (write=0, read=0 on every turn). A prefix through a finding that a recent request of
  the scope sent is not changing on every call.
A line or a timestamp that changes on every request must still be kept out of the cached prefix.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anthropic
import openai
import pytest

from gateway.testing import running_proxy
from tests.helpers import write_policy

KEY = "sk-prompt-cache-volatility"
MODEL = "claude-sonnet-5"  # minimum cacheable prefix: 1,024 tokens
BODY = "You are the support assistant: answer from the manual and cite its section. " * 120  # ~1,800 tokens
FIRST = "How do I reset the device?"  # the same first message: one conversation to the learner


def _fields(header: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in header.split(";"))


@pytest.fixture
def proxy(request, tmp_path, fresh_emulator):
    write_policy(tmp_path, f"pcversions-{request.node.name[5:14]}", KEY, fresh_emulator.url)
    with running_proxy([tmp_path], watch_interval_s=None) as running:
        yield running


def _anthropic_turns(client: anthropic.Anthropic, system: str | Callable[[int], str], turns: int = 2,
                     **kw: Any) -> list[tuple[int, int, dict[str, str]]]:
    """A conversation of `turns` requests: (cache_read_input_tokens, cache_creation_input_tokens, plan header)
    each; `system` may be a function of the turn."""
    messages: list[dict] = [{"role": "user", "content": FIRST}]
    out = []
    for turn in range(turns):
        raw = client.messages.with_raw_response.create(
            model=MODEL, max_tokens=8, system=system(turn) if callable(system) else system, messages=messages, **kw)
        usage = raw.parse().usage
        out.append((usage.cache_read_input_tokens or 0, usage.cache_creation_input_tokens or 0,
                    _fields(raw.headers["x-slipstream-prompt-cache"])))
        messages += [{"role": "assistant", "content": "Hold the button for five seconds."},
                     {"role": "user", "content": f"And after step {turn + 1}?"}]
    return out


def test_a_new_prompt_version_gets_its_caching_back_native_messages(proxy):
    client = anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0)
    v0 = _anthropic_turns(client, f"v0 {BODY}")
    assert v0[0][1] > 1000 and v0[1][0] > 1000  # written, then read
    changed, settled = _anthropic_turns(client, f"v1 {BODY}")
    # The request that changed the line: the change is reported, and nothing is written after it.
    assert changed[2]["miss_cause"] == "system_changed@system.0" and changed[2]["advice"] == "1"
    assert changed[:2] == (0, 0)
    # The next one sees the line unchanged: it is no longer volatile, the prefix is written again
    # (the old code: write=0 and advice=1 here and on every later request).
    assert settled[1] > 1000 and "advice" not in settled[2] and settled[2]["write"] == str(settled[1])
    # Reused turn after turn (the next conversations on v1), it is read.
    for _ in range(2):
        for read, _write, fields in _anthropic_turns(client, f"v1 {BODY}"):
            assert read > 1000 and fields["read"] == str(read) == fields["expected_read"]
            assert "advice" not in fields


def test_a_new_prompt_version_is_moved_once_with_reorder(tmp_path, fresh_emulator):
    """With reorder on, the learned line (here the whole one-line system prompt) was moved to the latest user
    turn on every later request, where no breakpoint goes: nothing written or read after the change."""
    write_policy(tmp_path, "pcversions-reorder", KEY, fresh_emulator.url, extra="prompt_cache: {reorder: true}\n")
    with running_proxy([tmp_path], watch_interval_s=None) as running:
        client = anthropic.Anthropic(base_url=running.url, api_key=KEY, max_retries=0)
        _anthropic_turns(client, f"v0 {BODY}")
        changed, settled = _anthropic_turns(client, f"v1 {BODY}")
        assert changed[2]["moved"] == "1"
        assert "moved" not in settled[2] and settled[1] > 1000  # old code: moved=1, write=0
        for read, _write, fields in _anthropic_turns(client, f"v1 {BODY}"):
            assert read > 1000 and "moved" not in fields


def test_a_new_prompt_version_gets_its_caching_back_openai_client_to_claude(proxy):
    """The same planner plans the Messages body a Chat request to Claude is translated into."""
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0)

    def conversation(system: str) -> list[tuple[int, int, dict[str, str]]]:
        messages: list[dict] = [{"role": "system", "content": system}, {"role": "user", "content": FIRST}]
        out = []
        for turn in range(2):
            raw = client.chat.completions.with_raw_response.create(model=MODEL, max_tokens=8, messages=messages)
            details = raw.parse().usage.prompt_tokens_details
            written = getattr(details, "cache_write_tokens", None) or 0  # Anthropic's cache_creation_input_tokens
            out.append((details.cached_tokens or 0, written, _fields(raw.headers["x-slipstream-prompt-cache"])))
            messages += [{"role": "assistant", "content": "Hold the button for five seconds."},
                         {"role": "user", "content": f"And after step {turn + 1}?"}]
        return out

    conversation(f"v0 {BODY}")
    changed, settled = conversation(f"v1 {BODY}")
    assert changed[2]["advice"] == "1" and changed[:2] == (0, 0)
    assert settled[1] > 1000 and "advice" not in settled[2]
    for read, _write, fields in conversation(f"v1 {BODY}"):
        assert read > 1000 and fields["read"] == str(read)


def test_two_prompt_variants_in_turn_are_each_read_from_the_cache(proxy):
    """An A/B test: two conversations, one per variant, interleaved, both opening with the same message
    (one conversation to the learner), so the line changes on every request, but always back to a
    value sent lately, whose prefix is cached: only the first switch is kept out (on the code before
    variants were remembered, every request after it: write=0, read=0, advice=1)."""
    client = anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0)
    threads: dict[str, list[dict]] = {v: [{"role": "user", "content": FIRST}] for v in ("A", "B")}
    seen: dict[str, list[tuple[int, int, dict[str, str]]]] = {"A": [], "B": []}
    for turn in range(4):
        for variant, messages in threads.items():
            raw = client.messages.with_raw_response.create(model=MODEL, max_tokens=8, system=f"Variant {variant}: {BODY}",
                                                           messages=messages)
            usage = raw.parse().usage
            seen[variant].append((usage.cache_read_input_tokens or 0, usage.cache_creation_input_tokens or 0,
                                  _fields(raw.headers["x-slipstream-prompt-cache"])))
            messages += [{"role": "assistant", "content": "Hold the button."}, {"role": "user", "content": f"Then {turn}?"}]
    a, b = seen["A"], seen["B"]
    assert a[0][1] > 1000 and b[0][:2] == (0, 0) and b[0][2]["advice"] == "1"  # the first switch: kept out
    assert b[1][1] > 1000 and "advice" not in b[1][2]  # B sent again: written
    for read, _write, fields in a[1:] + b[2:]:  # then each variant reads its own prefix
        assert read > 1000 and fields["read"] == str(read) and "advice" not in fields


def test_a_line_that_changes_on_every_request_stays_out_of_the_cached_prefix(proxy):
    """No pattern matches it (no digits, no id): only learning finds it, and it keeps finding it."""
    client = anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0)
    weather = ["sunny", "cloudy", "windy", "rainy", "foggy", "snowy", "stormy"]
    results = []
    for sky in weather:
        results += _anthropic_turns(client, f"The weather outside is {sky} today.\n{BODY}", turns=1)
    for read, write, fields in results[1:]:  # from the first change on: advice, nothing written, nothing read
        assert (read, write) == (0, 0) and fields["advice"] == "1"


def test_the_detector_judges_a_learned_line_over_its_latest_comparisons():
    from sdk.promptcache.volatility import LEARN_WINDOW, VolatilityDetector

    detector = VolatilityDetector()
    body = "\nBe brief.\nCite the manual."

    def volatile(text: str) -> bool:
        return any(f.kind == "learned" and f.movable for f in detector.scan("system.0", text, 1))

    assert not volatile("v0 You are the assistant." + body)
    assert volatile("v1 You are the assistant." + body)  # changed within the conversation: learned
    assert not volatile("v1 You are the assistant." + body)  # then unchanged: caching pays again
    for _ in range(LEARN_WINDOW):
        assert not volatile("v1 You are the assistant." + body)
    assert detector.learned == {} and detector._windows == {}  # forgotten
    # A line that changes on every request, to values not seen lately, stays volatile however long it goes on.
    assert all(volatile(f"v{i} You are the assistant." + body) for i in range(2, 3 * LEARN_WINDOW))
    # Two variants in turn (an A/B test under one opening message): each was sent lately, so after the
    # first switch, the line is not volatile.
    detector = VolatilityDetector()
    assert [volatile(f"{'AB'[i % 2]} variant of the assistant." + body) for i in range(8)] == [False, True] + [False] * 6


TOOL = {"name": "schedule", "description": "Book a meeting. start: an ISO 8601 time, e.g. 2025-01-01T09:00:00Z.",
        "input_schema": {"type": "object", "properties": {"start": {"type": "string"}}}}


@pytest.mark.parametrize(("system", "tools"), [
    pytest.param(BODY, [TOOL], id="example-timestamp-in-a-tool-description"),
    pytest.param("Knowledge cutoff: 2025-01-31.\n" + BODY, None, id="static-date"),
    pytest.param("Workspace 123e4567-e89b-12d3-a456-426614174000.\n" + BODY, None, id="static-uuid"),
])
def test_a_finding_that_recurs_unchanged_gets_its_breakpoints(proxy, system, tools):
    client = anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0)
    turns = _anthropic_turns(client, system, 4, **({"tools": tools} if tools else {}))
    assert all(fields["advice"] == "1" for *_, fields in turns)  # still reported
    assert turns[0][:2] == (0, 0)  # a prefix not seen before: kept out, as before
    assert turns[1][1] > 1000 and turns[1][2]["write"] == str(turns[1][1])  # seen again: written (old code: 0)
    for read, _write, fields in turns[2:]:
        assert read > 1000 and fields["read"] == str(read) == fields["expected_read"]


def test_a_timestamp_that_changes_on_every_request_stays_out_of_the_cached_prefix(proxy):
    client = anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0)
    turns = _anthropic_turns(client, lambda turn: f"Current time: 2026-05-01T10:00:0{turn}Z\n{BODY}", 4)
    assert all((read, write) == (0, 0) and fields["advice"] == "1" for read, write, fields in turns)
