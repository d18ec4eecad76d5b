"""What an answer without usage is charged: tokens counted in the request and in what was streamed."""

from __future__ import annotations

import base64
import math

import orjson

from sdk.estimate import (
    ANTHROPIC_FACTOR,
    DEFAULT_OUTPUT_TOKENS,
    IMAGE_WORST,
    PDF_PAGE_TOKENS,
    PDF_PAGE_WORST,
    count_texts,
    input_tokens,
    media_of,
    output_limit,
)
from sdk.promptcache.tokens import IMAGE_TOKENS
from sdk.stream_tally import StreamTally
from sdk.types import Endpoint, LLMRequest, Protocol, Usage
from tests.helpers import blank_pdf


def _chunk(content: str) -> bytes:
    return b"data: " + orjson.dumps({"choices": [{"index": 0, "delta": {"content": content}}]}) + b"\n\n"


def test_openai_text_is_counted_until_the_usage_chunk() -> None:
    tally = StreamTally(Endpoint.CHAT_COMPLETIONS)
    tally.observe(_chunk("Hello") + _chunk(" there"))  # two events that arrived together
    tally.observe(_chunk(" friend"))
    assert not tally.final and tally.output_tokens(Protocol.OPENAI) == count_texts(["Hello", " there", " friend"], Protocol.OPENAI)
    tally.observe(b'data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":3}}\n\n')
    assert tally.final


def test_anthropic_counts_lean_high_and_never_below_what_was_reported() -> None:
    tally = StreamTally(Endpoint.MESSAGES)
    delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "word " * 50}}
    tally.observe(b"event: content_block_delta\ndata: " + orjson.dumps(delta) + b"\n\n")
    request = LLMRequest(Endpoint.MESSAGES, {"model": "claude-x", "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}]})
    reported = Usage(input_tokens=120, output_tokens=1)  # message_start's
    counted = tally.estimate(request, reported)
    assert counted.input_tokens == 120  # what the provider said stays
    assert counted.output_tokens == math.ceil(count_texts(["word " * 50], Protocol.OPENAI) * ANTHROPIC_FACTOR)
    tally.observe(b'event: message_delta\ndata: {"type":"message_delta","usage":{"output_tokens":51}}\n\n')
    assert tally.final


def test_input_counts_text_and_media_not_ids() -> None:
    body = {"model": "gpt-4o", "user": "u-123", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "describe this"},
                                     {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 100_000}}]}]}
    request = LLMRequest(Endpoint.CHAT_COMPLETIONS, body)
    assert input_tokens(request) == count_texts(["describe this"], Protocol.OPENAI) + IMAGE_TOKENS
    assert input_tokens(LLMRequest(Endpoint.CHAT_COMPLETIONS, body, size=10_000_000)) == math.ceil(10_000_000 / 3)
    # a budget's hold counts the most an image may cost, not a typical one
    assert input_tokens(request, worst=True) == count_texts(["describe this"], Protocol.OPENAI) + IMAGE_WORST[Protocol.OPENAI]


def test_a_pdf_counts_its_pages() -> None:
    """A PDF was one image's flat 1,000 tokens, in a hold and in an estimate: the providers bill it page
    by page (each page's text and image), so a 100-page document held and was charged about 1% of it."""
    pdf = base64.b64encode(blank_pdf(100, object_stream=True)).decode()
    source = {"type": "base64", "media_type": "application/pdf", "data": pdf}
    claude = LLMRequest(Endpoint.MESSAGES, {"model": "claude-x", "messages": [
        {"role": "user", "content": [{"type": "document", "source": source}]}]})
    assert input_tokens(claude) == 100 * PDF_PAGE_TOKENS
    assert input_tokens(claude, worst=True) == 100 * PDF_PAGE_WORST
    for part in ({"type": "file", "file": {"file_data": "data:application/pdf;base64," + pdf}},  # Chat
                 {"type": "input_file", "file_data": "data:application/pdf;base64," + pdf}):  # Responses
        chat = LLMRequest(Endpoint.CHAT_COMPLETIONS, {"model": "gpt-4o", "messages": [{"role": "user", "content": [part]}]})
        assert input_tokens(chat) == 100 * PDF_PAGE_TOKENS and input_tokens(chat, worst=True) == 100 * PDF_PAGE_WORST
    # a large body is counted by its size, its PDFs by their pages once counted off the loop (the limits stage)
    large = LLMRequest(Endpoint.MESSAGES, claude.body, size=300_000)
    large.media = media_of(large)
    assert input_tokens(large, worst=True) == math.ceil((300_000 - len(pdf)) / 3) + 100 * PDF_PAGE_WORST


def test_output_limits() -> None:
    chat = LLMRequest(Endpoint.CHAT_COMPLETIONS, {"model": "m", "messages": [], "max_completion_tokens": 100, "n": 3})
    assert output_limit(chat) == 300
    assert output_limit(LLMRequest(Endpoint.RESPONSES, {"model": "m", "input": "x"})) == DEFAULT_OUTPUT_TOKENS
    assert output_limit(LLMRequest(Endpoint.EMBEDDINGS, {"model": "m", "input": "x"})) == 0
