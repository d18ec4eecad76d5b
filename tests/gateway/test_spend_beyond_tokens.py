"""What an answer costs beyond its plain tokens is the team's spend (docs/spend.md, "How a request is priced").

Anthropic's web search server tool and OpenAI's hosted web search bill each search ($10 per 1,000)
besides the tokens. The spend counted only tokens, so a budgeted team could search on the shared
account without limit: a search answered with 30 tokens cost $0.01 and was charged $0.0003. Each
search is charged now (Anthropic's `usage.server_tool_use.web_search_requests`, the Responses API's
`web_search_call` items), and a request that allows searches holds their worst cost against the
budget while it runs. Anthropic's 1-hour cache writes likewise cost more than its 5-minute ones (2x input
against 1.25x) and were charged at the 5-minute rate.
"""

from __future__ import annotations

import base64
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anthropic
import openai
import orjson
import pytest

from emulator.testing import RunningEmulator
from gateway.testing import running_proxy
from sdk.estimate import DEFAULT_SEARCHES, PDF_PAGE_TOKENS, hosted_steps, input_tokens, looped_input, search_limit
from sdk.spend import cost_usd, price_of, worst_cost_usd
from sdk.types import Endpoint, LLMRequest, Usage
from sdk.usage import responses_usage, usage_from_body
from tests.helpers import blank_pdf, spend_report, wait_until, write_policy

KEY = "sk-team-search-spend"
MODEL = "claude-sonnet-4-6"
SEARCH = {"type": "web_search_20250305", "name": "web_search"}
QUESTION = [{"role": "user", "content": "What happened in Lisbon this week?"}]
PLAIN = "retry: {max_attempts: 1}\nprompt_cache: {enabled: false}\n"


def _tokens_cost(usage: Any) -> float:
    """The answer's tokens at MODEL's price: what was charged before searches counted."""
    tokens = Usage(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens,
                   cache_read_tokens=usage.cache_read_input_tokens or 0, cache_write_tokens=usage.cache_creation_input_tokens or 0)
    price = price_of(MODEL, {})
    assert price is not None
    return cost_usd(tokens, price)


def _native_and_streamed(client: openai.OpenAI, **request: Any) -> tuple[list[Any], float]:
    """gpt-4.1's Responses answers to `request`, native and streamed, and what their tokens cost at the
    tests' price for it ($2 input, $8 output per million)."""
    answer = client.responses.create(model="gpt-4.1", **request)
    with client.responses.stream(model="gpt-4.1", **request) as stream:
        streamed = stream.get_final_response()
    tokens = sum((r.usage.input_tokens * 2 + r.usage.output_tokens * 8) / 1e6 for r in (answer, streamed) if r.usage)
    return [answer, streamed], tokens


def test_a_web_search_is_charged_native_and_streamed(tmp_path: Path, fresh_emulator: RunningEmulator) -> None:
    with running_proxy([write_policy(tmp_path, "search", KEY, fresh_emulator.url, extra=PLAIN)]) as proxy:
        client = anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0)
        message = client.messages.create(model=MODEL, max_tokens=64, messages=QUESTION, tools=[SEARCH])
        assert message.usage.server_tool_use is not None and message.usage.server_tool_use.web_search_requests == 1
        with client.messages.stream(model=MODEL, max_tokens=64, messages=QUESTION, tools=[SEARCH]) as stream:
            streamed = stream.get_final_message()
        assert streamed.usage.server_tool_use is not None and streamed.usage.server_tool_use.web_search_requests == 1
        spent = spend_report(proxy, KEY)["day"]["total"]
    # before: the tokens alone, about $0.0006 for both
    assert spent == pytest.approx(_tokens_cost(message.usage) + _tokens_cost(streamed.usage) + 2 * 10.0 / 1000, abs=2e-6)


def test_a_chat_clients_web_search_on_claude_is_charged(tmp_path: Path, fresh_emulator: RunningEmulator) -> None:
    """Chat's web_search_options reach Claude as its search tool (translation): the search is the team's spend."""
    with running_proxy([write_policy(tmp_path, "search", KEY, fresh_emulator.url, extra=PLAIN)]) as proxy:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0)
        for stream in (False, True):
            answer = client.chat.completions.create(model=MODEL, max_tokens=64, messages=QUESTION,
                                                    web_search_options={}, stream=stream,
                                                    **({"stream_options": {"include_usage": True}} if stream else {}))
            if stream:
                list(answer)
        by_model = spend_report(proxy, KEY)["day"]["by_model"]
    assert by_model[MODEL] > 2 * 10.0 / 1000  # two searches, and the tokens


def test_a_request_that_may_search_holds_its_searches_against_the_budget(tmp_path: Path, fresh_emulator: RunningEmulator,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """While it runs, a request holds its worst cost against the budget (what bounds how far parallel
    requests can pass it): with searches allowed, their cost too (before: its tokens' alone)."""
    monkeypatch.setattr(fresh_emulator.config, "per_output_token_ms", 5.0)  # still streaming when the hold is read
    policy = write_policy(tmp_path, "search", KEY, fresh_emulator.url, extra=PLAIN + "budget: {usd: 100, period: day}\n")
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 2000, "messages": QUESTION, "tools": [{**SEARCH, "max_uses": 3}]}
    with running_proxy([policy]) as proxy:
        client = anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0)
        with client.messages.stream(**body) as stream:
            next(iter(stream))  # in flight: its hold is on the budget
            held = spend_report(proxy, KEY)["budget"]["held"]
    price = price_of(MODEL, {})
    assert price is not None
    request = LLMRequest(Endpoint.MESSAGES, body)
    # its tokens over the search loop (the prompt read at each of 4 steps: test_tool_loop_holds.py), and the searches
    tokens_only = worst_cost_usd(looped_input(input_tokens(request), hosted_steps(request), 2000), 2000, price)
    assert hosted_steps(request) == 3
    assert held == pytest.approx(tokens_only + 3 * 10.0 / 1000, rel=1e-3)


def test_file_searches_and_generated_images_are_charged(tmp_path: Path, fresh_emulator: RunningEmulator) -> None:
    """OpenAI bills each call of its file search tool ($2.50 per 1,000) and each image its image
    generation tool makes (at the image model's rates) besides the tokens. The spend counted the tokens
    and web searches only, so a team searched its files and drew images on the account every team shares
    uncounted (the images alone $0.40 in the test, $0 charged). Each `file_search_call` and
    `image_generation_call` item is charged now, native and streamed; a budgeted team is refused the
    image tool (403, nothing sent) until its price has `image_generation`."""
    priced = 'provider_objects: ["vs_team"]\npricing: {"gpt-4.1*": {input: 2, output: 8, image_generation: 0.2}}\n'
    tools: Any = [{"type": "file_search", "vector_store_ids": ["vs_team"]}, {"type": "image_generation"}]
    write_policy(tmp_path, "drawer", KEY, fresh_emulator.url, extra=PLAIN + priced)
    write_policy(tmp_path, "frugal", "sk-team-frugal-images", fresh_emulator.url,
                 extra=PLAIN + 'provider_objects: ["vs_team"]\nbudget: {usd: 5, period: day}\n')
    with running_proxy([tmp_path]) as proxy:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0)
        answers, tokens = _native_and_streamed(client, input="Find our logo and draw it.", tools=tools, max_output_tokens=2000)
        for response in answers:
            assert [item.type for item in response.output][:2] == ["file_search_call", "image_generation_call"]
        spent = wait_until(lambda: (total := spend_report(proxy, KEY)["day"]["total"]) > tokens and total, "the tools charged")
        assert spent == pytest.approx(tokens + 2 * (2.5 / 1000 + 0.2), abs=2e-6)

        frugal = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-team-frugal-images", max_retries=0)
        sent = fresh_emulator.stats()["requests_total"]
        with pytest.raises(openai.PermissionDeniedError, match="image_generation: USD_PER_IMAGE"):
            frugal.responses.create(model="gpt-4.1", input="Draw a logo.", tools=tools[1:], max_output_tokens=32)
        assert fresh_emulator.stats()["requests_total"] == sent  # refused before anything was sent
        searched = frugal.responses.create(model="gpt-4.1", input="Find our logo.", tools=tools[:1], max_output_tokens=32)
        assert searched.output[0].type == "file_search_call"  # a file search has a built-in price


def test_tool_calls_a_stream_showed_are_charged_when_its_client_leaves_early(tmp_path: Path, fresh_emulator: RunningEmulator) -> None:
    """A search or an image is billed once the provider has run it, and a stream shows it done (a
    Responses output item holding the image itself, Anthropic's `server_tool_use` block) long before
    the final usage that counts it. A client that left after it was charged the tokens it was sent and
    no call, so a team drew images and searched for the price of the text ($0 of the $0.20 image before).
    The calls a stream showed done are in its estimate now."""
    saved = fresh_emulator.config.per_output_token_ms, fresh_emulator.config.default_output_tokens
    fresh_emulator.config.per_output_token_ms, fresh_emulator.config.default_output_tokens = 5.0, 2000  # still open when left
    priced = 'pricing: {"gpt-4.1*": {input: 2, output: 8, image_generation: 0.2}}\n'
    try:
        with running_proxy([write_policy(tmp_path, "drawer", KEY, fresh_emulator.url, extra=PLAIN + priced)]) as proxy:
            client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0)
            with client.responses.create(model="gpt-4.1", input="Draw our logo.", tools=[{"type": "image_generation"}], stream=True) as stream:
                for event in stream:
                    if event.type == "response.output_item.done" and event.item.type == "image_generation_call":
                        break  # the image is in hand
            fresh_emulator.wait_for(lambda s: s["cancelled_streams"] == 1)
            drawn = wait_until(lambda: (total := spend_report(proxy, KEY)["day"]["total"]) > 0 and total, "the left stream charged")
            assert drawn >= 0.2  # the image, besides the tokens counted

            claude = anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0)
            with claude.messages.stream(model=MODEL, max_tokens=4000, messages=QUESTION, tools=[SEARCH]) as helper:
                next(iter(helper.text_stream))  # the search ran, its results came, the answer has begun
            fresh_emulator.wait_for(lambda s: s["cancelled_streams"] == 2)
            spent = wait_until(lambda: (total := spend_report(proxy, KEY)["day"]["total"]) > drawn and total, "the search charged")
            assert spent - drawn >= 10.0 / 1000  # the search, besides the tokens counted
    finally:
        fresh_emulator.config.per_output_token_ms, fresh_emulator.config.default_output_tokens = saved


def test_one_hour_cache_writes_are_charged_at_their_rate(tmp_path: Path, fresh_emulator: RunningEmulator) -> None:
    """Anthropic bills 1-hour cache writes at 2x input, 5-minute ones at 1.25x, and its usage says which
    were which; every write was charged at the 5-minute rate (62.5% of a 1-hour write's cost)."""
    system = [{"type": "text", "text": "Policy clause. " * 600, "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    with running_proxy([write_policy(tmp_path, "search", KEY, fresh_emulator.url, extra=PLAIN)]) as proxy:
        client = anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0)
        message = client.messages.create(model=MODEL, max_tokens=16, system=system, messages=QUESTION)
        spent = spend_report(proxy, KEY)["day"]["total"]
    usage = message.usage
    assert usage.cache_creation is not None and usage.cache_creation.ephemeral_1h_input_tokens == usage.cache_creation_input_tokens > 1024
    price = price_of(MODEL, {})
    assert price is not None
    expected = (usage.input_tokens * price.input + usage.output_tokens * price.output
                + usage.cache_creation_input_tokens * 2 * price.input) / 1e6
    assert spent == pytest.approx(expected, abs=2e-6)  # before: the writes at 1.25x input


def test_an_answer_served_on_openais_priority_tier_is_charged_its_rate(tmp_path: Path, fresh_emulator: RunningEmulator) -> None:
    """OpenAI bills `service_tier: priority` at about twice the standard token prices and `flex` at half,
    and says in the answer which tier served it; the spend priced every answer at the standard rate, so a
    budgeted team asking for priority used the shared account at twice what its budget counted."""
    with running_proxy([write_policy(tmp_path, "search", KEY, fresh_emulator.url, extra=PLAIN)]) as proxy:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0)
        costs: dict[str, float] = {}
        for tier in ("default", "priority", "flex"):
            before = spend_report(proxy, KEY)["day"]["total"]
            chat = client.chat.completions.create(model="gpt-4o", max_tokens=32, messages=QUESTION, service_tier=tier)
            assert chat.service_tier == tier
            stream = client.chat.completions.create(model="gpt-4o", max_tokens=32, messages=QUESTION, service_tier=tier,
                                                    stream=True, stream_options={"include_usage": True})
            chunks = list(stream)
            answer = client.responses.create(model="gpt-4o", max_output_tokens=32, input="What happened in Lisbon?", service_tier=tier)
            price = price_of("gpt-4o", {})
            assert price is not None and chunks[-1].usage is not None and answer.usage is not None
            standard = sum(cost_usd(Usage(input_tokens=u.prompt_tokens, output_tokens=u.completion_tokens), price)
                           for u in (chat.usage, chunks[-1].usage) if u is not None)
            standard += cost_usd(Usage(input_tokens=answer.usage.input_tokens, output_tokens=answer.usage.output_tokens), price)
            costs[tier] = (spend_report(proxy, KEY)["day"]["total"] - before) / standard
    assert costs == pytest.approx({"default": 1.0, "priority": 2.0, "flex": 0.5}, abs=0.01)  # before: 1.0 for each


def test_long_context_and_us_only_answers_are_charged_their_rates(tmp_path: Path, fresh_emulator: RunningEmulator) -> None:
    """Claude Sonnet 4.x bills a request past 200,000 input tokens at 2x input and 1.5x output, and one
    run in the US only (`inference_geo: us`) at 1.1x; both were charged at the standard rates. The
    threshold is the price's, so a team's own entry can set a low one (1,000 tokens here: no test
    sends 200,000)."""
    pricing = 'pricing: {"claude-sonnet-4*": {input: 3, output: 15, cache_read: 0.3, cache_write: 3.75, long_context_from: 1000}}\n'
    with running_proxy([write_policy(tmp_path, "search", KEY, fresh_emulator.url, extra=PLAIN + pricing)]) as proxy:
        client = anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0)
        rates = {}
        for name, words, extra in (("short", 20, {}), ("long", 1500, {}), ("us", 20, {"inference_geo": "us"})):
            before = spend_report(proxy, KEY)["day"]["total"]
            message = client.messages.create(model=MODEL, max_tokens=32, extra_body=extra,
                                             messages=[{"role": "user", "content": "Summarise: " + "clause " * words}])
            usage = message.usage
            assert (usage.input_tokens > 1000) == (name == "long")
            standard = (usage.input_tokens * 3 + usage.output_tokens * 15) / 1e6
            long_rate = (usage.input_tokens * 3 * 2 + usage.output_tokens * 15 * 1.5) / 1e6
            rates[name] = (spend_report(proxy, KEY)["day"]["total"] - before) / (long_rate if name == "long" else standard)
    assert rates == pytest.approx({"short": 1.0, "long": 1.0, "us": 1.1}, abs=0.01)  # before: long 0.6x its rate, us 1.0


def test_fast_mode_is_refused_to_a_budgeted_team_until_priced(tmp_path: Path, fresh_emulator: RunningEmulator) -> None:
    """Anthropic's fast mode (`speed: fast`) bills a request at a multiple of the standard prices, which
    its usage does not report and the built-in table does not hold: a budgeted team's fast requests were
    charged at the standard rate. They are refused (the 403 naming the `pricing:` key) until the team's
    price says what fast mode costs, then charged at it."""
    ask = {"model": MODEL, "max_tokens": 32, "messages": QUESTION, "extra_body": {"speed": "fast"}}
    unpriced = write_policy(tmp_path, "search", KEY, fresh_emulator.url, extra=PLAIN + "budget: {usd: 100, period: day}\n")
    with running_proxy([unpriced]) as proxy:
        client = anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0)
        with pytest.raises(anthropic.PermissionDeniedError) as refused:
            client.messages.create(**ask)
        assert "fast: MULTIPLIER" in refused.value.message
        assert fresh_emulator.stats()["requests_total"] == 0
    pricing = 'pricing: {"claude-sonnet-4*": {input: 3, output: 15, cache_read: 0.3, cache_write: 3.75, fast: 6}}\n'
    priced = write_policy(tmp_path, "search", KEY, fresh_emulator.url, extra=PLAIN + "budget: {usd: 100, period: day}\n" + pricing)
    with running_proxy([priced]) as proxy:
        usage = anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0).messages.create(**ask).usage
        spent = spend_report(proxy, KEY)["day"]["total"]
    assert spent == pytest.approx(6 * (usage.input_tokens * 3 + usage.output_tokens * 15) / 1e6, abs=2e-6)


def test_a_continuation_is_held_and_charged_for_the_conversation_it_sends(tmp_path: Path, fresh_emulator: RunningEmulator) -> None:
    """A Responses continuation (`previous_response_id`) sends the provider its whole stored conversation,
    which it bills as input on every turn; the limits stage counted only the new turn's body. So a
    continuation held a fraction of its worst cost against the budget, and one the client left before
    its first byte was charged only its new turn: a long conversation continued and abandoned turn
    after turn was read by the provider at the account's cost and almost never counted."""
    document = "The supplier shall deliver each lot within the agreed window. " * 800  # about 50,000 characters
    policy = write_policy(tmp_path, "search", KEY, fresh_emulator.url, extra=PLAIN + "budget: {usd: 100, period: day}\n")
    price = price_of("gpt-4o", {})
    assert price is not None
    with running_proxy([policy]) as proxy:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0)
        first = client.responses.create(model="gpt-4o", input=document, max_output_tokens=16)
        fresh_emulator.inject_fault("stall:ms=120000", model="gpt-*")  # the provider reads the prompt, then nothing comes
        impatient = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0, timeout=1.0)
        before = spend_report(proxy, KEY)["day"]["total"]
        with pytest.raises(openai.APITimeoutError):
            impatient.responses.create(model="gpt-4o", input="And the penalty?", previous_response_id=first.id,
                                       max_output_tokens=16, stream=True)
        fresh_emulator.wait_for(lambda s: s["cancelled_streams"] == 1)
        wait_until(lambda: spend_report(proxy, KEY)["day"]["total"] > before, "the abandoned continuation charged")
        charged = spend_report(proxy, KEY)["day"]["total"] - before
    # at least the conversation's text at 4 characters a token (the estimate leans high); before: its 4-word turn
    assert charged >= len(document) / 4 * price.input / 1e6


def test_a_compaction_is_held_and_charged_for_the_conversation_it_compacts(tmp_path: Path, fresh_emulator: RunningEmulator) -> None:
    """`/v1/responses/compact` with `previous_response_id` has the provider read the whole stored
    conversation, and bill it as input, as a continuation does; the continuation's fix counted the
    stored chain on /v1/responses only, so a compaction held and was charged for its few bytes of body:
    a team compacting a long conversation and leaving before the answer had the conversation read at the
    shared account's cost, charged about nothing ($0 in the test before)."""
    document = "The supplier shall deliver each lot within the agreed window. " * 800  # about 50,000 characters
    policy = write_policy(tmp_path, "search", KEY, fresh_emulator.url, extra=PLAIN + "budget: {usd: 100, period: day}\n")
    price = price_of("gpt-4o", {})
    assert price is not None
    with running_proxy([policy]) as proxy:
        first = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0).responses.create(
            model="gpt-4o", input=document, max_output_tokens=16)
        fresh_emulator.inject_fault("stall:ms=120000", model="gpt-*")  # the provider reads the conversation, then nothing comes
        impatient = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0, timeout=1.0)
        before = spend_report(proxy, KEY)["day"]["total"]
        with pytest.raises(openai.APITimeoutError):
            impatient.responses.compact(model="gpt-4o", previous_response_id=first.id)
        fresh_emulator.wait_for(lambda s: s["cancelled_requests"] == 1)
        wait_until(lambda: spend_report(proxy, KEY)["day"]["total"] > before, "the abandoned compaction charged")
        charged = spend_report(proxy, KEY)["day"]["total"] - before
    assert charged >= len(document) / 4 * price.input / 1e6  # the conversation's text at 4 characters a token


@pytest.mark.parametrize("model", ["gpt-5-pro", "gpt-5.2", "gpt-4o-audio-preview", "gpt-4o-mini-search-preview"])
def test_a_variant_that_bills_more_is_not_priced_as_its_family(tmp_path: Path, fresh_emulator: RunningEmulator, model: str) -> None:
    """The built-in globs priced gpt-5-pro (12x gpt-5) and gpt-5.2 as gpt-5, audio and search models as
    gpt-4o: a budgeted team spent several times what its budget counted. They have no built-in price
    now, so a budgeted team is refused them (the 403 naming the `pricing:` entry) until one is given."""
    policy = write_policy(tmp_path, "search", KEY, fresh_emulator.url, extra=PLAIN + "budget: {usd: 100, period: day}\n")
    with running_proxy([policy]) as proxy:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0)
        with pytest.raises(openai.PermissionDeniedError) as refused:
            client.chat.completions.create(model=model, max_tokens=16, messages=QUESTION)
        assert f"'{model}' has no price" in refused.value.message
    assert fresh_emulator.stats()["requests_total"] == 0
    own = price_of("gpt-4o", {})
    assert own is not None and price_of(model, {model: own}) is own  # a team's own price is used


def test_searches_allowed_and_counted_in_each_protocol() -> None:
    """The counts the charge and the hold rest on, for the shapes the emulator does not serve."""
    def limit(endpoint: Endpoint, body: dict[str, Any]) -> int:
        return search_limit(LLMRequest(endpoint, body))

    assert limit(Endpoint.MESSAGES, {"tools": [{"type": "function", "name": "web_search"}]}) == 0
    assert limit(Endpoint.MESSAGES, {"tools": [{**SEARCH, "max_uses": 3}]}) == 3
    assert limit(Endpoint.RESPONSES, {"tools": [{"type": "web_search"}], "max_tool_calls": 2}) == 2
    assert limit(Endpoint.RESPONSES, {"tools": [{"type": "web_search_preview"}]}) == DEFAULT_SEARCHES
    assert limit(Endpoint.CHAT_COMPLETIONS, {"web_search_options": {}}) == DEFAULT_SEARCHES
    response = {"usage": {"input_tokens": 50, "output_tokens": 9},
                "output": [{"type": "web_search_call", "id": "ws_1", "status": "completed"},
                           {"type": "web_search_call", "id": "ws_2", "status": "completed"}, {"type": "message"}]}
    assert responses_usage(response).web_searches == 2
    assert usage_from_body(Endpoint.RESPONSES, orjson.dumps(response)).web_searches == 2
    gpt = price_of("gpt-4o", {})
    assert gpt is not None and cost_usd(Usage(web_searches=4), gpt) == pytest.approx(0.1)  # web_search_preview's $25 per 1,000
    standard = worst_cost_usd(1000, 100, gpt)
    assert worst_cost_usd(1000, 100, gpt, tier="priority") == pytest.approx(2 * standard)  # held at the tier's rate
    assert worst_cost_usd(1000, 100, gpt, tier="flex") == standard  # a flex request may be served at the standard rate


def test_referenced_items_are_held_and_charged_when_the_client_leaves_early(tmp_path: Path, fresh_emulator: RunningEmulator) -> None:
    """An `item_reference` is sent to the provider as the stored item itself, which it bills as input,
    but the limits stage counted only the request's body: a request referencing a stored document held
    the cost of a few bytes, and one abandoned before its usage was charged them, so a team re-sent its
    large stored items turn after turn, at the shared account's cost, for the price of their ids."""
    document = "The supplier shall deliver each lot within the agreed window. " * 800  # about 50,000 characters
    policy = write_policy(tmp_path, "search", KEY, fresh_emulator.url, extra=PLAIN + "budget: {usd: 100, period: day}\n")
    price = price_of("gpt-4o", {})
    assert price is not None
    with running_proxy([policy]) as proxy:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0)
        said = {"type": "message", "id": "msg_terms", "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": document, "annotations": []}]}  # an item with its own id
        client.responses.create(model="gpt-4o", input=[said, {"role": "user", "content": "Noted?"}], max_output_tokens=16)
        fresh_emulator.inject_fault("stall:ms=120000", model="gpt-*")  # the provider reads the prompt, then nothing comes
        impatient = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0, timeout=1.0)
        before = spend_report(proxy, KEY)["day"]["total"]
        with pytest.raises(openai.APITimeoutError):
            impatient.responses.create(model="gpt-4o", max_output_tokens=16, stream=True, input=[
                {"type": "item_reference", "id": "msg_terms"}, {"type": "item_reference", "id": "msg_terms"},
                {"role": "user", "content": "And the penalty?"}])
        fresh_emulator.wait_for(lambda s: s["cancelled_streams"] == 1)
        wait_until(lambda: spend_report(proxy, KEY)["day"]["total"] > before, "the abandoned request charged")
        charged = spend_report(proxy, KEY)["day"]["total"] - before
    # both copies of the document at 4 characters a token (the estimate leans high); before: the ids and 3 words
    assert charged >= 2 * len(document) / 4 * price.input / 1e6


def test_a_plain_text_documents_text_is_held_and_charged_when_the_client_leaves_early(tmp_path: Path,
                                                                                      fresh_emulator: RunningEmulator) -> None:
    """An Anthropic document whose source is plain text (`{"type": "text", "media_type": "text/plain",
    "data": TEXT}`) is billed as its text, but the limits stage counted every `data` as one image's
    fixed 1,000 tokens: a request carrying a 50,000-character contract held and, abandoned before its
    first byte, was charged about 1,200 tokens for the 10,000 the provider read, so a team sent
    its documents again and again on the shared account for a tenth of their price (and parallel such
    requests each held a tenth of their worst cost against the budget)."""
    document = "The supplier shall deliver each lot within the agreed window. " * 800  # about 50,000 characters
    policy = write_policy(tmp_path, "search", KEY, fresh_emulator.url, extra=PLAIN + "budget: {usd: 100, period: day}\n")
    price = price_of(MODEL, {})
    assert price is not None
    source = {"type": "text", "media_type": "text/plain", "data": document}
    ask = [{"role": "user", "content": [{"type": "document", "source": source}, {"type": "text", "text": "The penalty?"}]}]
    with running_proxy([policy]) as proxy:
        fresh_emulator.inject_fault("stall:ms=120000", model="claude-*")  # the provider reads the prompt, then nothing comes
        impatient = anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0, timeout=1.0)
        before = spend_report(proxy, KEY)["day"]["total"]
        with pytest.raises(anthropic.APITimeoutError):
            impatient.messages.create(model=MODEL, max_tokens=16, messages=ask, stream=True)
        fresh_emulator.wait_for(lambda s: s["cancelled_streams"] == 1)
        wait_until(lambda: spend_report(proxy, KEY)["day"]["total"] > before, "the abandoned request charged")
        charged = spend_report(proxy, KEY)["day"]["total"] - before
    # at least the document counted as text (as the same words in a text block are); before: 1,000 tokens for it
    as_text = input_tokens(LLMRequest(Endpoint.MESSAGES, {"messages": [{"role": "user", "content": document}]}))
    assert as_text > 5_000
    assert charged >= as_text * price.input / 1e6


def test_a_pdfs_pages_are_held_and_charged_when_the_client_leaves_early(tmp_path: Path, fresh_emulator: RunningEmulator) -> None:
    """Anthropic bills a PDF page by page (each page's text and its image, 1,500 to 3,000 tokens a page),
    but the limits stage counted a PDF as one image's flat 1,000 tokens: a 100-page document held about
    1% of its worst cost, so a second such request was admitted beside it (parallel requests overshot a
    budget by far more than one reservation), and one abandoned before its first byte was charged about
    1% of what the provider read. The hold counts its pages at a dense page's cost now, and the charge
    at a typical page's."""
    pdf = base64.b64encode(blank_pdf(100, object_stream=True)).decode()  # the page tree in an object stream
    source = {"type": "base64", "media_type": "application/pdf", "data": pdf}
    ask = [{"role": "user", "content": [{"type": "document", "source": source}, {"type": "text", "text": "Summarise."}]}]
    # 100 pages at 3,000 tokens, at the dearer of input and cache writes ($3.75 per million): about $1.13 held
    policy = write_policy(tmp_path, "search", KEY, fresh_emulator.url, extra=PLAIN + "budget: {usd: 1, period: day}\n")
    price = price_of(MODEL, {})
    assert price is not None
    with running_proxy([policy]) as proxy:
        fresh_emulator.inject_fault("stall:ms=120000", model="claude-*")  # the provider reads the prompt, then nothing comes
        impatient = anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0, timeout=5.0)
        other = anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0)
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(impatient.messages.create, model=MODEL, max_tokens=16, messages=ask, stream=True)
            fresh_emulator.wait_for(lambda s: s["open_requests"] == 1)  # the first is held while the provider reads it
            with pytest.raises(anthropic.RateLimitError, match="budget"):
                other.messages.create(model=MODEL, max_tokens=16, messages=ask)
            with pytest.raises(anthropic.APITimeoutError):
                first.result()
        fresh_emulator.wait_for(lambda s: s["cancelled_streams"] == 1)
        charged = wait_until(lambda: (total := spend_report(proxy, KEY)["day"]["total"]) > 0 and total, "the abandoned request charged")
    assert charged >= 100 * PDF_PAGE_TOKENS * price.input / 1e6  # before: 1,000 tokens for the document


def test_a_search_a_translated_stream_ran_is_charged_when_its_client_leaves_early(tmp_path: Path, fresh_emulator: RunningEmulator) -> None:
    """A Chat client's `web_search_options` run Claude's search tool, but the Chat stream it reads has no
    place for Claude's `server_tool_use` block, so the tally of what the client was sent could not count
    the search: a client that left after the answer began, before the final usage, was charged the
    text and no search ($10 per 1,000 on the shared account, uncounted before). The upstream stream's own
    usage counts a search block as it passes, until the final usage gives the provider's count."""
    saved = fresh_emulator.config.per_output_token_ms, fresh_emulator.config.default_output_tokens
    fresh_emulator.config.per_output_token_ms, fresh_emulator.config.default_output_tokens = 5.0, 2000  # still open when left
    try:
        with running_proxy([write_policy(tmp_path, "search", KEY, fresh_emulator.url, extra=PLAIN)]) as proxy:
            client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0)
            with client.chat.completions.create(model=MODEL, max_tokens=4000, messages=QUESTION, web_search_options={},
                                                stream=True, stream_options={"include_usage": True}) as stream:
                next(chunk for chunk in stream if chunk.choices and chunk.choices[0].delta.content)  # the answer has begun
            fresh_emulator.wait_for(lambda s: s["cancelled_streams"] == 1)
            spent = wait_until(lambda: (total := spend_report(proxy, KEY)["day"]["total"]) > 0 and total, "the left stream charged")
    finally:
        fresh_emulator.config.per_output_token_ms, fresh_emulator.config.default_output_tokens = saved
    assert spent >= 10.0 / 1000  # the search, besides the tokens counted


def test_a_batch_continuing_a_stored_conversation_is_checked_for_what_it_sends(tmp_path: Path, fresh_emulator: RunningEmulator) -> None:
    """A batch is created only if its worst cost fits what is left of the budget, and that check is all
    that bounds a batch whose results are never read through the gateway (docs/security.md). A
    `/v1/responses` line with `previous_response_id` or `item_reference`s has the provider read, and
    bill, the stored conversation and items, but the check counted each line's few bytes: a team with $1
    left created a batch of 60 lines each re-reading a 50,000-character conversation (about $1.25 at
    batch rates). Each line's stored input is counted now, and that batch is the budget's 429."""
    document = "The supplier shall deliver each lot within the agreed window. " * 800  # about 50,000 characters
    policy = write_policy(tmp_path, "search", KEY, fresh_emulator.url, extra=PLAIN + "budget: {usd: 1, period: day}\n")
    with running_proxy([policy]) as proxy:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0)
        said = {"type": "message", "id": "msg_terms", "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": document, "annotations": []}]}
        first = client.responses.create(model="gpt-4o", input=[said, {"role": "user", "content": "Noted?"}], max_output_tokens=16)

        def batch_of(body: dict[str, Any], lines: int) -> bytes:
            return b"".join(orjson.dumps({"custom_id": f"l{i}", "method": "POST", "url": "/v1/responses", "body": {
                "model": "gpt-4o", "max_output_tokens": 16, **body}}) + b"\n" for i in range(lines))

        for body in ({"input": "And the penalty?", "previous_response_id": first.id},
                     {"input": [{"type": "item_reference", "id": "msg_terms"}, {"role": "user", "content": "And the penalty?"}]}):
            source = client.files.create(file=("in.jsonl", batch_of(body, 60)), purpose="batch")
            with pytest.raises(openai.RateLimitError, match="budget"):
                client.batches.create(input_file_id=source.id, endpoint="/v1/responses", completion_window="24h")
        assert fresh_emulator.app.state.batches.entries == {}  # neither reached the provider
        small = client.files.create(file=("in.jsonl", batch_of({"input": "And the penalty?", "previous_response_id": first.id}, 2)),
                                    purpose="batch")
        assert client.batches.create(input_file_id=small.id, endpoint="/v1/responses", completion_window="24h").id  # what fits goes


def test_code_interpreter_containers_are_charged_and_refused_unpriced_to_a_budgeted_team(tmp_path: Path,
                                                                                         fresh_emulator: RunningEmulator) -> None:
    """OpenAI bills each container its code interpreter runs code in ($0.03 a session for 1 GB, up to
    $1.92 for 64 GB) besides the tokens, and no usage object counts it: a `{"type": "auto"}` container is
    made for the request on the account every team shares. The spend counted the tokens only, so a
    budgeted team ran code without limit. Each container an answer's `code_interpreter_call` items ran in
    is charged at the price's `code_interpreter` now (native and streamed), and a budgeted team is
    refused the tool (403, nothing sent) until its price has one; a request offering it holds a container."""
    priced = 'pricing: {"gpt-4.1*": {input: 2, output: 8, code_interpreter: 0.12}}\n'
    tools: Any = [{"type": "code_interpreter", "container": {"type": "auto"}}]
    write_policy(tmp_path, "coder", KEY, fresh_emulator.url, extra=PLAIN + priced + "budget: {usd: 5, period: day}\n")
    write_policy(tmp_path, "frugal", "sk-team-frugal-code", fresh_emulator.url, extra=PLAIN + "budget: {usd: 5, period: day}\n")
    with running_proxy([tmp_path]) as proxy:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0)
        answers, tokens = _native_and_streamed(client, input="What is six times seven?", tools=tools, max_output_tokens=64)
        for response in answers:
            assert response.output[0].type == "code_interpreter_call"
        spent = wait_until(lambda: (total := spend_report(proxy, KEY)["day"]["total"]) > tokens and total, "the containers charged")
        assert spent == pytest.approx(tokens + 2 * 0.12, abs=2e-6)  # before: the tokens alone

        frugal = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-team-frugal-code", max_retries=0)
        sent = fresh_emulator.stats()["requests_total"]
        with pytest.raises(openai.PermissionDeniedError, match="code_interpreter: USD_PER_CONTAINER"):
            frugal.responses.create(model="gpt-4.1", input="What is six times seven?", tools=tools, max_output_tokens=32)
        assert fresh_emulator.stats()["requests_total"] == sent  # refused before anything was sent
