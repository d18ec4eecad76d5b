"""What real clients of vLLM's and OpenAI's servers rely on, against `slipstream engine serve` with the
official `openai` client: echo with max_tokens 0 (scoring harnesses: the prompt back, nothing
generated), stop strings spanning stream chunks (held back, never sent), and finish_reason `stop`
for a stop token that is also the last token max_tokens allows."""

from __future__ import annotations

from typing import Any

import openai
import pytest

PROMPT = "The quick brown"
# The tiny tokenizer's tokens for the bytes of "é" (0xC3, 0xA9): favoured, the random model writes é from them
E_ACUTE_BYTES = {"128": 100, "103": 100}


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


@pytest.mark.parametrize("stream", [False, True])
def test_chat_logprobs_bytes_join_into_the_answer(client, stream):
    """OpenAI's `bytes` are each token's own UTF-8 bytes, so that a character split across tokens can be
    joined back; a byte token's were those of U+FFFD (239, 191, 189), its text decoded alone."""
    kw: dict[str, Any] = dict(model="tiny", messages=[{"role": "user", "content": PROMPT}], max_tokens=40,
                              temperature=0, logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True},
                              logit_bias=E_ACUTE_BYTES)
    if stream:
        text, content = "", []
        for chunk in client.chat.completions.create(stream=True, **kw):
            for choice in chunk.choices:
                text += choice.delta.content or ""
                content += choice.logprobs.content if choice.logprobs is not None else []
    else:
        choice = client.chat.completions.create(**kw).choices[0]
        text, content = choice.message.content, choice.logprobs.content
    assert len(content) == 40 and "\u00e9" in text  # an é written as its two byte tokens
    assert b"".join(bytes(t.bytes) for t in content).decode("utf-8", errors="replace") == text
    assert all(t.bytes == list(t.token.encode()) for t in content if "\ufffd" not in t.token)
    # The sampled token among its alternatives carries the same bytes
    assert all(top.bytes == t.bytes for t in content for top in t.top_logprobs if top.token == t.token
               and "\ufffd" not in t.token)


@pytest.mark.parametrize("stream", [False, True])
def test_bytes_held_for_an_incomplete_character_are_not_lost_at_the_end(client, stream):
    """Tokens held back while their character might still complete were dropped when the answer ended
    on them (here a run of lead bytes, each U+FFFD once the next comes): the text is the tokens' whole decode."""
    from tests.localengine.conftest import make_tokenizer

    kw: dict[str, Any] = dict(model="tiny", prompt=PROMPT, max_tokens=40, temperature=0, logit_bias=E_ACUTE_BYTES,
                              extra_body={"ignore_eos": True, "return_token_ids": True})
    text, ids = "", []
    for chunk in client.completions.create(stream=True, **kw) if stream else [client.completions.create(**kw)]:
        for choice in chunk.choices:
            text, ids = text + choice.text, ids + choice.model_extra["token_ids"]
    assert len(ids) == 40 and text == make_tokenizer().decode(ids) and text.endswith("\ufffd")


@pytest.mark.parametrize("chat", [False, True])
def test_context_length_errors_in_vllms_words(client, chat):
    """Clients (and the gateway's `truncation: auto`) read the numbers out of vLLM's messages to lower
    max_tokens or drop turns and ask again; the old wording was vLLM's of long ago."""
    ask = ((lambda **k: client.chat.completions.create(messages=[{"role": "user", "content": "hi"}], **k)) if chat
           else (lambda **k: client.completions.create(prompt=PROMPT, **k)))
    fits = ask(model="tiny", max_tokens=1)
    prompt = fits.usage.prompt_tokens
    with pytest.raises(openai.BadRequestError) as err:
        ask(model="tiny", max_tokens=500)
    assert err.value.body["message"] == (f"'max_tokens' or 'max_completion_tokens' is too large: 500. This model's maximum "
                                 f"context length is 128 tokens and your request has {prompt} input tokens "
                                 f"(500 > 128 - {prompt}).")
    assert err.value.param == "max_tokens"
    with pytest.raises(openai.BadRequestError) as err:
        if chat:
            client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi " * 200}], max_tokens=1)
        else:
            client.completions.create(model="tiny", prompt=[5] * 200, max_tokens=1)
    assert err.value.body["message"].startswith("This model's maximum context length is 128 tokens. However, your request has ")
    assert err.value.body["message"].endswith(" input tokens. Please reduce the length of the input messages.")


def test_a_stop_tokens_text_is_left_out_unless_asked_for(client):
    """vLLM leaves the stop token that ended a choice (stop_token_ids, the end of text) out of its text unless
    include_stop_str_in_output; its text was in the answer."""
    stop = {"5": 100}  # the tiny model's token 5, led to come first
    res = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=3, logit_bias=stop,
                                    extra_body={"stop_token_ids": [5], "return_token_ids": True})
    choice = res.choices[0]
    assert (choice.text, choice.finish_reason, choice.model_extra["token_ids"]) == ("", "stop", [5])
    kept = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=3, logit_bias=stop,
                                     extra_body={"stop_token_ids": [5], "include_stop_str_in_output": True})
    assert kept.choices[0].text != "" and kept.choices[0].finish_reason == "stop"
    streamed = list(client.completions.create(model="tiny", prompt=PROMPT, max_tokens=3, logit_bias=stop, stream=True,
                                              extra_body={"stop_token_ids": [5]}))
    assert "".join(c.choices[0].text for c in streamed if c.choices) == ""
    # The end-of-text token, shown as text (skip_special_tokens false): left out as well
    eos = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=3, logit_bias={"0": 100},
                                    extra_body={"skip_special_tokens": False})
    assert (eos.choices[0].text, eos.choices[0].finish_reason) == ("", "stop")
