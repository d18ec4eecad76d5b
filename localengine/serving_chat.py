"""OpenAI Chat Completions on top of the async engine: request parsing and the exact wire format.

Shared by the HTTP server (localengine/server.py) and the in-process gateway provider
(sdk/providers/local.py), so both produce byte-identical bodies and SSE events.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import orjson

from localengine.engine.async_engine import AsyncLLMEngine
from localengine.outputs import Logprob, RequestOutput
from localengine.sampling_params import SamplingParams

# A template for checkpoints that ship none (e.g. random test models).
_FALLBACK_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


class ChatRequestError(ValueError):
    def __init__(self, message: str, status: int = 400, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.param = param


def error_body(message: str, status: int = 400, param: str | None = None) -> bytes:
    kind = "invalid_request_error" if status < 500 else "internal_server_error"
    code = "model_not_found" if status == 404 else None
    return orjson.dumps({"error": {"message": message, "type": kind, "param": param, "code": code}})


@dataclass(slots=True)
class ChatRequest:
    request_id: str
    model: str
    prompt_token_ids: list[int]
    params: SamplingParams
    stream: bool
    include_usage: bool
    cache_salt: str | None
    top_logprobs: int | None  # None: logprobs not requested
    created: int


def _text_content(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        return "".join(parts)
    if content is None:
        return ""
    raise ChatRequestError("message content must be a string or a list of text parts", param="messages")


def _number(body: dict[str, Any], key: str, default: Any, kind: type | tuple[type, ...]) -> Any:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ChatRequestError(f"'{key}' must be a number", param=key)
    return value


def _refuse_unsupported(body: dict[str, Any]) -> None:
    """Features this engine cannot honour are refused, never silently dropped."""
    if body.get("tools") and body.get("tool_choice", "auto") != "none":
        raise ChatRequestError("this engine does not support tool calling; send no 'tools' "
                               "(or tool_choice 'none')", param="tools")
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise ChatRequestError("this engine supports only response_format {'type': 'text'} "
                               "(no JSON mode or structured outputs)", param="response_format")


def _logit_bias(body: dict[str, Any], vocab_size: int) -> dict[int, float] | None:
    raw = body.get("logit_bias")
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ChatRequestError("'logit_bias' must map token ids to numbers in [-100, 100]", param="logit_bias")
    bias: dict[int, float] = {}
    for key, value in raw.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise ChatRequestError(f"logit_bias key {key!r} is not a token id", param="logit_bias") from None
        if not 0 <= token < vocab_size:
            raise ChatRequestError(f"logit_bias token {token} is outside this model's vocabulary of {vocab_size}",
                                   param="logit_bias")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not -100 <= value <= 100:
            raise ChatRequestError(f"logit_bias for {key} must be a number in [-100, 100]", param="logit_bias")
        bias[token] = float(value)
    return bias


def parse_chat_request(body: Any, engine: AsyncLLMEngine, served_model: str | None = None) -> ChatRequest:
    """Validate an OpenAI chat request and render its prompt with the model's chat template."""
    if not isinstance(body, dict):
        raise ChatRequestError("the request body must be a JSON object")
    model = body.get("model")
    if served_model is not None and model != served_model:
        raise ChatRequestError(f"The model `{model}` does not exist.", status=404, param="model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ChatRequestError("'messages' must be a non-empty list", param="messages")
    if _number(body, "n", 1, int) != 1:
        raise ChatRequestError("only n=1 is supported", param="n")
    _refuse_unsupported(body)
    rendered = [{"role": str(m.get("role", "user")), "content": _text_content(m.get("content"))}
                for m in messages if isinstance(m, dict)]
    tokenizer = engine.tokenizer
    template = None if tokenizer.chat_template else _FALLBACK_TEMPLATE
    prompt = tokenizer.apply_chat_template(rendered, add_generation_prompt=True, tokenize=False,
                                           chat_template=template)
    # The template already holds any BOS the model wants; don't let the tokenizer add another.
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    max_len = engine.engine.max_model_len
    if len(prompt_ids) >= max_len:
        raise ChatRequestError(f"the prompt has {len(prompt_ids)} tokens; this model's context is {max_len}",
                               param="messages")
    max_tokens = _number(body, "max_completion_tokens", None, int) or _number(body, "max_tokens", None, int)
    stop = body.get("stop")
    if stop is not None and not isinstance(stop, (str, list)):
        raise ChatRequestError("'stop' must be a string or a list of strings", param="stop")
    top_logprobs = _number(body, "top_logprobs", 0, int) if body.get("logprobs") is True else None
    stream_options = body.get("stream_options") or {}
    logit_bias = _logit_bias(body, engine.engine.model_runner.model.args.vocab_size)
    try:
        params = SamplingParams(
            temperature=float(_number(body, "temperature", 1.0, (int, float))),
            top_p=float(_number(body, "top_p", 1.0, (int, float))),
            top_k=_number(body, "top_k", -1, int),  # vLLM's extra parameter
            seed=_number(body, "seed", None, int),
            max_tokens=min(max_tokens or max_len, max_len - len(prompt_ids)),
            stop=stop,
            stop_token_ids=list(body.get("stop_token_ids") or []),
            ignore_eos=bool(body.get("ignore_eos", False)),
            logprobs=top_logprobs,
            presence_penalty=float(_number(body, "presence_penalty", 0.0, (int, float))),
            frequency_penalty=float(_number(body, "frequency_penalty", 0.0, (int, float))),
            repetition_penalty=float(_number(body, "repetition_penalty", 1.0, (int, float))),  # vLLM's extra
            logit_bias=logit_bias,
        )
    except ValueError as exc:
        raise ChatRequestError(str(exc)) from exc
    salt = body.get("cache_salt")
    return ChatRequest(
        request_id=f"chatcmpl-{uuid.uuid4().hex}",
        model=model if isinstance(model, str) else engine.model_name,
        prompt_token_ids=prompt_ids,
        params=params,
        stream=body.get("stream") is True,
        include_usage=isinstance(stream_options, dict) and stream_options.get("include_usage") is True,
        cache_salt=salt if isinstance(salt, str) else None,
        top_logprobs=top_logprobs,
        created=int(time.time()),
    )


def usage(out: RequestOutput) -> dict[str, Any]:
    prompt, completion = len(out.prompt_token_ids), len(out.outputs[0].token_ids)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": out.num_cached_tokens},
    }


def _logprobs(req: ChatRequest, tokenizer: Any, token_ids: list[int],
              entries: list[dict[int, Logprob]] | None) -> dict[str, Any] | None:
    if req.top_logprobs is None or entries is None:
        return None

    def item(tid: int, lp: float) -> dict[str, Any]:
        text = tokenizer.decode([tid])
        return {"token": text, "logprob": lp, "bytes": list(text.encode())}

    content = []
    for tid, entry in zip(token_ids, entries, strict=False):
        top = sorted(((t, e) for t, e in entry.items() if e.rank is not None), key=lambda x: x[1].rank or 0)
        content.append({**item(tid, entry[tid].logprob),
                        "top_logprobs": [item(t, e.logprob) for t, e in top[: req.top_logprobs]]})
    return {"content": content, "refusal": None}


def _finish_reason(out: RequestOutput) -> str | None:
    reason = out.outputs[0].finish_reason
    return None if reason == "abort" else reason


async def chat_completion(engine: AsyncLLMEngine, req: ChatRequest) -> dict[str, Any]:
    final: RequestOutput | None = None
    async for out in engine.generate(req.prompt_token_ids, req.params, req.request_id, req.cache_salt):
        final = out
    assert final is not None
    completion = final.outputs[0]
    return {
        "id": req.request_id,
        "object": "chat.completion",
        "created": req.created,
        "model": req.model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": completion.text, "refusal": None, "annotations": []},
            "logprobs": _logprobs(req, engine.tokenizer, completion.token_ids, completion.logprobs),
            "finish_reason": _finish_reason(final),
        }],
        "usage": usage(final),
        "service_tier": "default",
        "system_fingerprint": None,
    }


def sse(data: dict[str, Any] | str) -> bytes:
    payload = data.encode() if isinstance(data, str) else orjson.dumps(data)
    return b"data: " + payload + b"\n\n"


async def chat_completion_events(engine: AsyncLLMEngine, req: ChatRequest,
                                 on_usage: Callable[[dict[str, Any]], None] | None = None) -> AsyncIterator[bytes]:
    """SSE events of a streamed chat completion, ending in `data: [DONE]`. Closing the iterator
    early aborts the engine request. `on_usage` sees the usage even when the client did not ask
    for it in the stream."""
    base = {"id": req.request_id, "object": "chat.completion.chunk", "created": req.created, "model": req.model,
            "service_tier": "default", "system_fingerprint": None}
    tail = {"usage": None} if req.include_usage else {}

    def chunk(delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return sse({**base, "choices": [choice], **tail})

    yield chunk({"role": "assistant", "content": "", "refusal": None})
    sent_text, sent_tokens = 0, 0
    final: RequestOutput | None = None
    async for out in engine.generate(req.prompt_token_ids, req.params, req.request_id, req.cache_salt):
        final = out
        completion = out.outputs[0]
        delta = completion.text[sent_text:]
        new_ids = completion.token_ids[sent_tokens:]
        entries = completion.logprobs[sent_tokens:] if completion.logprobs is not None else None
        if delta or (req.top_logprobs is not None and new_ids):
            yield chunk({"content": delta}, logprobs=_logprobs(req, engine.tokenizer, new_ids, entries))
        sent_text, sent_tokens = len(completion.text), len(completion.token_ids)
    assert final is not None
    yield chunk({}, _finish_reason(final))
    if on_usage is not None:
        on_usage(usage(final))
    if req.include_usage:
        yield sse({**base, "choices": [], "usage": usage(final)})
    yield sse("[DONE]")
