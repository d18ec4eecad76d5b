"""A budgeted team's request holds its media at the most the provider reading them may bill
(docs/spend.md, "Requests in flight: the bound"). Through the proxy with the official clients, the
emulator upstream; the hold read from `GET /v1/slipstream/spend` while a stream runs, never time.
"""

from __future__ import annotations

import base64
import io
import zipfile
from pathlib import Path
from typing import Any

import openai
import pytest

from emulator.testing import RunningEmulator
from gateway.testing import running_proxy
from sdk.estimate import ANTHROPIC_FACTOR, count_texts, input_tokens
from sdk.spend import price_of, worst_cost_usd
from sdk.types import Endpoint, LLMRequest, Protocol
from tests.helpers import anth, held_while_streaming, spend_report, wait_until, write_policy

KEY = "sk-team-media-holds"
PLAIN = "retry: {max_attempts: 1}\nprompt_cache: {enabled: false}\nbudget: {usd: 100, period: day}\n"
IMAGE = {"type": "image_url", "image_url": {"url": "https://example.com/chart.png", "detail": "high"}}


def _held(proxy: Any, client: openai.OpenAI, body: dict[str, Any]) -> float:
    """What `body`'s stream holds against the budget while it runs."""
    with client.chat.completions.create(**body, stream=True) as stream:
        next(iter(stream))  # in flight: its hold is on the budget
        return float(spend_report(proxy, KEY)["budget"]["held"])


def _ask(model: str, *parts: dict[str, Any]) -> dict[str, Any]:
    return {"model": model, "max_completion_tokens": 500, "messages": [{"role": "user", "content": [{"type": "text", "text": "Describe."}, *parts]}]}


def test_an_image_is_held_at_what_the_model_reading_it_bills(tmp_path: Path, fresh_emulator: RunningEmulator,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """gpt-4o-mini bills an image at 33x gpt-4o's tokens (2,833 + 5,667 a tile, up to 8 tiles: 48,169) at
    a 16th of the price; the hold counted every OpenAI image at 3,800 tokens, a 13th of its worst in USD."""
    monkeypatch.setattr(fresh_emulator.config, "per_output_token_ms", 5.0)  # still streaming when the hold is read
    with running_proxy([write_policy(tmp_path, "media", KEY, fresh_emulator.url, extra=PLAIN)]) as proxy:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0)
        mini = _held(proxy, client, _ask("gpt-4o-mini", IMAGE)) - _held(proxy, client, _ask("gpt-4o-mini"))
        full = _held(proxy, client, _ask("gpt-4o", IMAGE)) - _held(proxy, client, _ask("gpt-4o"))
    mini_price, full_price = price_of("gpt-4o-mini", {}), price_of("gpt-4o", {})
    assert mini_price is not None and full_price is not None
    assert mini == pytest.approx(48_169 * mini_price.input / 1e6, rel=1e-3)  # before: 3,800 tokens
    assert full == pytest.approx(3_800 * full_price.input / 1e6, rel=1e-3)  # unchanged: OpenAI's worst but gpt-4o-mini's


def test_a_pdf_named_by_url_holds_the_providers_page_limit_and_settles_on_usage(tmp_path: Path, fresh_emulator: RunningEmulator,
                                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A PDF named by file id or URL is not in the request, so its pages cannot be counted; it was held
    as one image (4,800 tokens) whatever its pages, so requests beside it were admitted against a
    budget it could take by itself. It holds the most pages Claude reads in one request now (600 at
    3,000 tokens, within a 1M-token context window): alone it is admitted however little is left (a
    request is admitted while spend and holds are under the budget), a request beside it is not, and
    once it ends its usage is charged and its hold let go."""
    monkeypatch.setattr(fresh_emulator.config, "per_output_token_ms", 5.0)  # still streaming when the hold is read
    model = "claude-haiku-4-5"  # no long-context rates: the hold is linear in its tokens
    document = {"type": "document", "source": {"type": "url", "url": "https://example.com/annual-report.pdf"}}
    text = [{"type": "text", "text": "Summarise."}]
    body = {"model": model, "max_tokens": 500, "messages": [{"role": "user", "content": [document, *text]}]}
    policy = write_policy(tmp_path, "media", KEY, fresh_emulator.url, extra=PLAIN.replace("usd: 100", "usd: 1"))
    price = price_of(model, {})
    assert price is not None
    with running_proxy([policy]) as proxy:
        held = held_while_streaming(proxy, KEY, body, beside=body)  # before: admitted beside it
        wait_until(lambda: spend_report(proxy, KEY)["budget"]["held"] == 0, "its hold let go")
        assert spend_report(proxy, KEY)["day"]["total"] < 0.01  # charged what the provider read, not the hold
        assert anth(proxy, KEY).messages.create(**body).content  # the budget is open again
    plain = input_tokens(LLMRequest(Endpoint.MESSAGES, {**body, "messages": [{"role": "user", "content": text}]}))
    # 600 pages at 3,000 tokens are 1.8M: the most a context window reads, 1M tokens (before: 4,800)
    assert held == pytest.approx(worst_cost_usd(plain + 1_000_000, 500, price), rel=1e-3)


def test_a_chat_request_answered_by_claude_holds_its_text_as_claude_counts_it(tmp_path: Path, fresh_emulator: RunningEmulator,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A request's text was held at the count of the request's own dialect: a Chat request that a route
    sends to Claude was held at cl100k's count, a sixth below the 1.2x of it that the gateway estimates
    Claude's tokenizer makes of English prose (sdk/estimate.py). The hold counts it by the target's."""
    monkeypatch.setattr(fresh_emulator.config, "per_output_token_ms", 5.0)
    text = "The lighthouse keeper climbed the steps, trimmed the wick and wrote the weather in his book. " * 40
    model = "claude-sonnet-4-5"

    def ask(words: str) -> dict[str, Any]:
        return {"model": model, "max_completion_tokens": 500, "messages": [{"role": "user", "content": words}]}

    with running_proxy([write_policy(tmp_path, "media", KEY, fresh_emulator.url, extra=PLAIN)]) as proxy:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0)
        longer = _held(proxy, client, ask(text)) - _held(proxy, client, ask("Hi."))
    price = price_of(model, {})
    assert price is not None
    tokens = count_texts([text], Protocol.OPENAI) - count_texts(["Hi."], Protocol.OPENAI)
    per_token = worst_cost_usd(1_000, 0, price) / 1_000  # the dearest input price (a cache write's), below long-context rates
    assert longer == pytest.approx(tokens * ANTHROPIC_FACTOR * per_token, rel=2e-3)  # before: tokens x 1.0


def test_a_document_sent_inline_that_is_not_a_pdf_is_held_and_charged_as_its_text(tmp_path: Path, fresh_emulator: RunningEmulator,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The Responses API takes any document as an `input_file`'s base64 `file_data` and bills the text it
    extracts from one that is not a PDF (a text or code file, a Word document) as input tokens. Such a
    file was held as one image (3,800 tokens) and, its client gone before the usage, charged 1,000: a
    150,000-character text file (50,000 tokens at its length) and a Word file of 300,000 characters that
    compress to a few kilobytes alike. Its text counts by its length now (an Office file's by its
    archive's uncompressed size), in the hold and in the estimate."""
    monkeypatch.setattr(fresh_emulator.config, "per_output_token_ms", 5.0)  # still streaming when the hold is read
    text = ("The tenant shall keep the premises in good repair and return them as found. " * 4_000)[:300_000]
    packed = io.BytesIO()
    with zipfile.ZipFile(packed, "w", zipfile.ZIP_DEFLATED) as docx:
        docx.writestr("word/document.xml", text)
    plain_file = "data:text/plain;base64," + base64.b64encode(text[:150_000].encode()).decode()  # a body under 256 KiB
    word_file = ("data:application/vnd.openxmlformats-officedocument.wordprocessingml.document;base64,"
                 + base64.b64encode(packed.getvalue()).decode())
    assert len(word_file) < 10_000  # a few kilobytes on the wire

    def body(*files: str) -> dict[str, Any]:
        parts = [{"type": "input_file", "filename": "lease", "file_data": data} for data in files]
        return {"model": "gpt-4.1", "max_output_tokens": 500,
                "input": [{"role": "user", "content": [{"type": "input_text", "text": "Summarise."}, *parts]}]}

    def held(client: openai.OpenAI, request: dict[str, Any]) -> float:
        with client.responses.create(**request, stream=True) as stream:
            next(iter(stream))
            return float(spend_report(proxy, KEY)["budget"]["held"])

    price = price_of("gpt-4.1", {})
    assert price is not None
    with running_proxy([write_policy(tmp_path, "media", KEY, fresh_emulator.url, extra=PLAIN)]) as proxy:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0)
        bare = held(client, body())
        for data, tokens in ((plain_file, 50_000), (word_file, 100_000)):  # before: 3,800 tokens each
            assert held(client, body(data)) - bare == pytest.approx(tokens * price.input / 1e6, rel=0.01)
        before = spend_report(proxy, KEY)["day"]["total"]
        with client.responses.create(**body(word_file), stream=True) as stream:
            next(iter(stream))  # the client leaves before the usage: the file's text is charged as estimated
        spent = wait_until(lambda: (total := spend_report(proxy, KEY)["day"]["total"]) > before and total, "charged")
        assert spent - before > 100_000 * price.input / 1e6  # before: 1,000 tokens for the file
