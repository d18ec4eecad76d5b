"""A document named by file id need not be a PDF: the Responses API reads a text, code or Office file as
its extracted text, billed as input tokens, up to the model's context window. It was held at a PDF's page
limit (100 pages at 3,000 tokens on OpenAI, 300,000 tokens), below a large text file's content on gpt-4.1's
1,047,576-token window (docs/spend.md, "A PDF named by file id or URL"). Through the proxy with the official
client, the emulator upstream; the hold read while a stream runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from emulator.testing import RunningEmulator
from gateway.testing import running_proxy
from sdk.estimate import input_tokens
from sdk.limits.stage import RESERVE_EXACT_CHARS
from sdk.spend import price_of, worst_cost_usd
from sdk.types import Endpoint, LLMRequest
from tests.helpers import oai, spend_report, write_policy

KEY = "sk-team-file-id-holds"
PLAIN = "retry: {max_attempts: 1}\nprompt_cache: {enabled: false}\n"


def test_a_file_named_by_id_holds_the_models_context_window_where_larger(tmp_path: Path, fresh_emulator: RunningEmulator,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """On gpt-4.1 a file named by id holds its 1,047,576-token window, not 300,000 tokens of pages, and a
    request beside it is refused where the budget had room for the page limit twice over."""
    monkeypatch.setattr(fresh_emulator.config, "per_output_token_ms", 20.0)  # still streaming when the hold is read
    model, price = "gpt-4.1", price_of("gpt-4.1", {})
    assert price is not None
    text: dict[str, Any] = {"type": "input_text", "text": "Summarise the log."}
    plain = input_tokens(LLMRequest(Endpoint.RESPONSES, {"model": model, "input": [{"role": "user", "content": [text]}]}),
                         RESERVE_EXACT_CHARS, worst=True)
    pages, window = worst_cost_usd(plain + 300_000, 200, price), worst_cost_usd(plain + 1_047_576, 200, price)
    budget = (2 * pages + window) / 2
    assert 2 * pages < budget < window
    policy = write_policy(tmp_path, "files", KEY, fresh_emulator.url, extra=PLAIN + f"budget: {{usd: {budget:.6f}, period: day}}\n")
    with running_proxy([policy]) as proxy:
        client = oai(proxy, KEY)
        uploaded = client.files.create(file=("server.log", b"GET /healthz 200\n" * 1000), purpose="user_data")
        named = {"type": "input_file", "file_id": uploaded.id}
        body = {"model": model, "max_output_tokens": 200, "input": [{"role": "user", "content": [text, named]}]}
        with client.responses.create(**body, stream=True) as stream:  # admitted: nothing spent or held yet
            next(iter(stream))
            held = spend_report(proxy, KEY)["budget"]["held"]
            with pytest.raises(openai.RateLimitError, match="budget"):  # before: admitted beside it
                client.responses.create(**body)
    assert held == pytest.approx(window, rel=1e-3)  # before: the page limit's 300,000 tokens
