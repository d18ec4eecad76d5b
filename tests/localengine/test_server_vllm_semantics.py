"""What real clients of vLLM's and OpenAI's servers rely on, against `slipstream engine serve` with the
official `openai` client: echo with max_tokens 0 (scoring harnesses: the prompt back, nothing
generated), stop strings spanning stream chunks (held back, never sent), and finish_reason `stop`
for a stop token that is also the last token max_tokens allows."""

from __future__ import annotations

from typing import Any

import openai
import pytest

PROMPT = "The quick brown"


@pytest.fixture
def client(tiny_client: openai.OpenAI) -> openai.OpenAI:
    return tiny_client


def test_echo_with_max_tokens_zero_answers_the_prompt(client):
    """OpenAI and vLLM answer it with the prompt and no completion tokens; it was a 400
    ("max_tokens must be at least 1")."""
    prompts = [PROMPT, "Hello, world"]
    whole = client.completions.create(model="tiny", prompt=prompts, max_tokens=0, echo=True, n=2,
                                      extra_body={"return_token_ids": True})
    assert [(c.index, c.text, c.finish_reason) for c in whole.choices] == [
        (0, PROMPT, "length"), (1, PROMPT, "length"), (2, prompts[1], "length"), (3, prompts[1], "length")]
    assert all(c.model_extra["token_ids"] == [] for c in whole.choices)
    assert whole.usage is not None and whole.usage.completion_tokens == 0
    assert whole.usage.prompt_tokens == sum(len(c.model_extra["prompt_token_ids"]) for c in whole.choices[::2])
    chunks = list(client.completions.create(model="tiny", prompt=prompts, max_tokens=0, echo=True, n=2, stream=True,
                                            stream_options={"include_usage": True}))
    streamed = {c.choices[0].index: (c.choices[0].text, c.choices[0].finish_reason) for c in chunks if c.choices}
    assert streamed == {c.index: (c.text, c.finish_reason) for c in whole.choices}
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 0
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    with pytest.raises(openai.BadRequestError):  # without echo, max_tokens 0 stays vLLM's 400
        client.completions.create(model="tiny", prompt=PROMPT, max_tokens=0)


def _streamed_text(stream: Any) -> tuple[str, str | None]:
    text, reason = "", None
    for chunk in stream:
        for choice in chunk.choices:
            text += choice.text if hasattr(choice, "text") else (choice.delta.content or "")
            reason = choice.finish_reason or reason
    return text, reason


@pytest.mark.parametrize("chat", [False, True])
def test_a_stop_string_across_chunks_is_held_back_and_never_sent(client, chat):
    kw: dict[str, Any] = dict(model="tiny", max_tokens=30, temperature=0, extra_body={"ignore_eos": True})
    ask = ((lambda **k: client.chat.completions.create(messages=[{"role": "user", "content": PROMPT}], **k)) if chat
           else (lambda **k: client.completions.create(prompt=PROMPT, **k)))
    free = ask(**kw).choices[0]
    text = free.message.content if chat else free.text
    stop = text[10:16]  # several tokens of the answer (one character a token in places), so several chunks
    assert len(stop) == 6 and text.index(stop) == 10
    whole = ask(stop=[stop], **kw).choices[0]
    assert (whole.message.content if chat else whole.text) == text[:10] and whole.finish_reason == "stop"
    assert _streamed_text(ask(stop=[stop], stream=True, **kw)) == (text[:10], "stop")


def test_a_stop_token_at_the_last_allowed_token_finishes_for_stop(client):
    """The end-of-text token as the one token max_tokens allows: `stop` (vLLM checks stop before length)."""
    eos = {"0": 100}  # the tiny model's eos_token_id
    res = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=1, logit_bias=eos)
    assert (res.choices[0].text, res.choices[0].finish_reason) == ("", "stop")
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=1,
                                          logit_bias=eos)
    assert chat.choices[0].finish_reason == "stop" and chat.choices[0].model_extra["stop_reason"] is None
