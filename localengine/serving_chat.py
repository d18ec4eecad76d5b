"""OpenAI Chat Completions on top of the async engine: request parsing and the exact wire format.

Shared by the HTTP server (localengine/server.py) and the in-process gateway provider
(sdk/providers/local.py), so both produce byte-identical bodies and SSE events.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from localengine.engine.async_engine import AsyncLLMEngine
from localengine.outputs import Logprob, RequestOutput
from localengine.sampling_params import SamplingParams
from localengine.serving_common import (
    INERT_FIELDS,
    SAMPLING_FIELDS,
    RequestError,
    check_fields,
    check_model,
    check_stream_options,
    count,
    finish_reason,
    last_outputs,
    number,
    reseeded,
    running_usage,
    sampling_params,
    sse,
    steps,
    truncated,
)

# A template for checkpoints that ship none (e.g. random test models).
_FALLBACK_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


ChatRequestError = RequestError  # the name the gateway's local provider and older callers use

_CHAT_FIELDS = INERT_FIELDS | SAMPLING_FIELDS | {"messages", "max_completion_tokens", "top_logprobs", "tools",
                                                 "tool_choice", "parallel_tool_calls", "response_format"}


@dataclass(slots=True)
class ChatRequest:
    request_id: str
    model: str
    prompt_token_ids: list[int]
    params: SamplingParams
    n: int
    stream: bool
    include_usage: bool
    cache_salt: str | None
    top_logprobs: int | None  # None: logprobs not requested
    created: int
    continuous_usage: bool = False  # vLLM's stream_options.continuous_usage_stats


def _text_content(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in ("text", "refusal"):  # an image, audio or file is refused, never dropped unseen
                raise RequestError(f"this engine's models take text only: a message content part of type {kind!r} "
                                   "cannot be read (send 'text' parts)", param="messages")
            texts.append(str(part.get(kind) or ""))
        return "".join(texts)
    if content is None:
        return ""
    raise RequestError("message content must be a string or a list of text parts", param="messages")


def _refuse_unsupported(body: dict[str, Any]) -> None:
    """Features this engine cannot honour are refused, never silently dropped."""
    choice = body.get("tool_choice")
    if choice not in (None, "none") and not body.get("tools"):
        raise RequestError("When using `tool_choice`, `tools` must be set.", param="tool_choice")
    if body.get("tools") and body.get("tool_choice", "auto") != "none":
        raise RequestError("this engine does not support tool calling; send no 'tools' "
                           "(or tool_choice 'none')", param="tools")
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise RequestError("this engine supports only response_format {'type': 'text'} "
                           "(no JSON mode or structured outputs)", param="response_format")


def _top_logprobs(body: dict[str, Any]) -> int | None:
    """vLLM's rules: `logprobs` is a boolean; `top_logprobs` needs it true."""
    wanted = body.get("logprobs")
    if wanted is not None and not isinstance(wanted, bool):
        raise RequestError("'logprobs' must be a boolean", param="logprobs")
    top = number(body, "top_logprobs", None, int)
    if top is not None and top > 0 and not wanted:
        raise RequestError("when using `top_logprobs`, `logprobs` must be set to true.", param="top_logprobs")
    return (top or 0) if wanted else None


def prompt_token_ids(messages: list[Any], tokenizer: Any) -> list[int]:
    """The prompt of `messages` as the model reads it: rendered with its chat template, tokenized."""
    rendered = [{"role": str(m.get("role", "user")), "content": _text_content(m.get("content"))}
                for m in messages if isinstance(m, dict)]
    template = None if tokenizer.chat_template else _FALLBACK_TEMPLATE
    prompt = tokenizer.apply_chat_template(rendered, add_generation_prompt=True, tokenize=False,
                                           chat_template=template)
    # The template already holds any BOS the model wants; don't let the tokenizer add another.
    ids: list[int] = tokenizer.encode(prompt, add_special_tokens=False)
    return ids


def parse_chat_request(body: Any, engine: AsyncLLMEngine, served_model: str | None = None,
                       default_max_tokens: int | None = None) -> ChatRequest:
    """Validate an OpenAI chat request and render its prompt with the model's chat template.
    `served_model`: the one name this server answers to (None: whatever the body names).
    `default_max_tokens`: for a request that names none (None: up to the context, as vLLM)."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    model = check_model(body, served_model) if served_model is not None else str(body.get("model") or engine.model_name)
    check_fields(body, _CHAT_FIELDS)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list", param="messages")
    n = count(body, "n", engine)
    _refuse_unsupported(body)
    stream_options = check_stream_options(body)
    top_logprobs = _top_logprobs(body)
    prompt_ids = truncated(body, prompt_token_ids(messages, engine.tokenizer), engine.engine.max_model_len)
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    params = sampling_params(body, engine, len(prompt_ids), logprobs=top_logprobs,
                             default_max_tokens=default_max_tokens, max_tokens_key=key)
    salt = body.get("cache_salt")
    return ChatRequest(
        request_id=f"chatcmpl-{uuid.uuid4().hex}",
        model=model,
        prompt_token_ids=prompt_ids,
        params=params,
        n=n,
        stream=body.get("stream") is True,
        include_usage=stream_options.include_usage,
        cache_salt=salt if isinstance(salt, str) else None,
        top_logprobs=top_logprobs,
        created=int(time.time()),
        continuous_usage=stream_options.continuous_usage,
    )


def usage(outs: list[RequestOutput]) -> dict[str, Any]:
    """Usage of one prompt's n choices: the prompt counted once (as OpenAI does), every completion."""
    prompt, completion = len(outs[0].prompt_token_ids), sum(len(o.outputs[0].token_ids) for o in outs)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": outs[0].num_cached_tokens},
    }


def partial_usage(prompt_tokens: int, latest: list[RequestOutput | None]) -> dict[str, Any]:
    """`usage` of choices that may not have finished (a stream its client left): the prompt, read
    once the engine started on it, and the tokens each choice had generated by its last output."""
    seen = [o for o in latest if o is not None]
    completion = sum(len(o.outputs[0].token_ids) for o in seen)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": seen[0].num_cached_tokens if seen else 0}}


def _gpt2_byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet (Llama 3, Qwen, SmolLM2 and the tiny test models use it): the
    character each byte is written as in a token's piece, back to the byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), ord("\xff") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{chr(b): b for b in printable}, **{chr(256 + i): b for i, b in enumerate(others)}}


_BYTE_DECODER = _gpt2_byte_decoder()
_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte tokens


def token_bytes(tokenizer: Any, token_id: int, text: str) -> list[int]:
    """OpenAI's `bytes` of a token: its own UTF-8 bytes, so that a client joining the bytes of the tokens
    of a character split across tokens gets the character. Decoded alone, such a token is U+FFFD, whose
    bytes (239, 191, 189) are not the token's; its piece (byte-level BPE, or SentencePiece's <0xNN>)
    gives the real ones."""
    if "\ufffd" not in text:
        return list(text.encode())
    piece = tokenizer.convert_ids_to_tokens(token_id)
    if isinstance(piece, str):
        if match := _BYTE_FALLBACK.fullmatch(piece):
            return [int(match.group(1), 16)]
        if piece and all(c in _BYTE_DECODER for c in piece):
            return [_BYTE_DECODER[c] for c in piece]
    return list(text.encode())


def _logprobs(req: ChatRequest, tokenizer: Any, token_ids: list[int],
              entries: list[dict[int, Logprob]] | None) -> dict[str, Any] | None:
    if req.top_logprobs is None or entries is None:
        return None

    def item(tid: int, lp: float) -> dict[str, Any]:
        text = tokenizer.decode([tid])
        return {"token": text, "logprob": lp, "bytes": token_bytes(tokenizer, tid, text)}

    content = []
    for tid, entry in zip(token_ids, entries, strict=False):
        top = sorted(((t, e) for t, e in entry.items() if e.rank is not None), key=lambda x: x[1].rank or 0)
        content.append({**item(tid, entry[tid].logprob),
                        "top_logprobs": [item(t, e.logprob) for t, e in top[: req.top_logprobs]]})
    return {"content": content, "refusal": None}


def engine_request_ids(request_id: str, n: int, first: int = 0) -> list[str]:
    """The engine's ids for the n choices of an API request (what aborting it must abort)."""
    return [f"{request_id}-{first + i}" for i in range(n)]


def generations(engine: AsyncLLMEngine, prompt_ids: list[int], params: SamplingParams, request_id: str, n: int,
                cache_salt: str | None, first: int = 0) -> list[AsyncIterator[RequestOutput]]:
    """One engine request per choice; after the first, the prompt's blocks come from the prefix cache."""
    return [engine.generate(prompt_ids, reseeded(params, i), rid, cache_salt)
            for i, rid in enumerate(engine_request_ids(request_id, n, first))]


async def chat_completion(engine: AsyncLLMEngine, req: ChatRequest) -> dict[str, Any]:
    finals = await last_outputs(generations(engine, req.prompt_token_ids, req.params, req.request_id, req.n,
                                            req.cache_salt))
    return {
        "id": req.request_id,
        "object": "chat.completion",
        "created": req.created,
        "model": req.model,
        "choices": [{
            "index": i,
            "message": {"role": "assistant", "content": final.outputs[0].text, "refusal": None, "annotations": []},
            "logprobs": _logprobs(req, engine.tokenizer, final.outputs[0].token_ids, final.outputs[0].logprobs),
            "finish_reason": finish_reason(final),
            "stop_reason": final.outputs[0].stop_reason,  # vLLM's field: the stop string or token id that ended it
        } for i, final in enumerate(finals)],
        "usage": usage(finals),
        "service_tier": "default",
        "system_fingerprint": None,
        "prompt_logprobs": None,  # vLLM's field; prompt logprobs are refused, so always null
    }


async def chat_completion_events(engine: AsyncLLMEngine, req: ChatRequest,
                                 on_usage: Callable[[dict[str, Any]], None] | None = None) -> AsyncGenerator[bytes, None]:
    """SSE events of a streamed chat completion, ending in `data: [DONE]`. A choice's last text comes
    in the chunk that carries its finish_reason (as vLLM sends it). Closing the iterator early
    aborts the engine requests. `on_usage` sees the usage even when the client did not ask for it
    in the stream."""
    base = {"id": req.request_id, "object": "chat.completion.chunk", "created": req.created, "model": req.model,
            "service_tier": "default", "system_fingerprint": None}
    tail = {"usage": None} if req.include_usage else {}
    prompt_tokens = len(req.prompt_token_ids)

    def chunk(index: int, delta: dict[str, Any], tokens: int, finish: str | None = None, logprobs: Any = None,
              stop_reason: int | str | None = None) -> bytes:
        choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        if finish is not None:  # vLLM's field: the stop string or token id that ended the choice
            choice["stop_reason"] = stop_reason
        extra = {"usage": running_usage(prompt_tokens, tokens)} if req.continuous_usage else tail
        return sse({**base, "choices": [choice], **extra})

    for i in range(req.n):
        yield chunk(i, {"role": "assistant", "content": "", "refusal": None}, 0)
    latest: list[RequestOutput | None] = [None] * req.n  # each choice's last output, finished or not
    streams = generations(engine, req.prompt_token_ids, req.params, req.request_id, req.n, req.cache_salt)
    try:
        async with aclosing(steps(streams)) as outputs:
            async for s in outputs:
                out, completion = s.out, s.out.outputs[0]
                latest[s.index] = out
                if out.finished or s.text or (req.top_logprobs is not None and s.token_ids):
                    yield chunk(s.index, {"content": s.text}, len(completion.token_ids),
                                finish_reason(out) if out.finished else None,
                                _logprobs(req, engine.tokenizer, s.token_ids, s.logprobs), completion.stop_reason)
    finally:  # also when the client left mid-stream (the requests aborted): what was generated until then
        if on_usage is not None:
            on_usage(partial_usage(len(req.prompt_token_ids), latest))
    done = [f for f in latest if f is not None and f.finished]
    assert len(done) == req.n
    if req.include_usage:
        yield sse({**base, "choices": [], "usage": usage(done)})
    yield sse("[DONE]")
