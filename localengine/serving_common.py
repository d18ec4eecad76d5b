"""What the Chat Completions and Completions endpoints share: errors, field checks, sampling.

The rules are vLLM's OpenAI server's (vllm/entrypoints/openai/protocol.py), so a client tested
against vLLM gets the same 400s here: `top_logprobs`/`logprobs` above 20, `stream_options` without
`stream`, a `seed` outside a signed 64-bit integer, `stop_token_ids` outside the vocabulary, a
prompt plus `max_tokens` longer than the context. Where vLLM would quietly ignore a field it does
not know, this server refuses it with a 400 that names it: a field the engine cannot honour is
never silently dropped. Fields that cannot change the answer (`user`, `metadata`, ...) are accepted.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import orjson

from localengine.engine.async_engine import AsyncLLMEngine
from localengine.outputs import Logprob, RequestOutput
from localengine.sampling_params import SamplingParams

MAX_LOGPROBS = 20  # vLLM's default max_logprobs
_INT64 = 1 << 63
# Accepted everywhere, and changing nothing in the answer.
INERT_FIELDS = frozenset({"user", "metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key",
                          "prompt_cache_retention", "cache_salt", "stream", "stream_options", "model"})
# Sampling fields both endpoints honour: OpenAI's, then vLLM's extra parameters.
SAMPLING_FIELDS = frozenset({"max_tokens", "temperature", "top_p", "n", "stop", "seed", "presence_penalty",
                             "frequency_penalty", "logit_bias", "logprobs", "top_k", "min_tokens",
                             "repetition_penalty", "stop_token_ids", "ignore_eos", "skip_special_tokens",
                             "include_stop_str_in_output", "truncate_prompt_tokens", "truncation_side"})
# Why the commonest refused fields are refused (any other unknown field gets a generic message).
_REFUSED = {
    "prompt_logprobs": "prompt logprobs are not computed by this engine",
    "echo": "echo is not supported on this endpoint",
    "suffix": "suffix (fill-in-the-middle) is not supported by this engine",
    "best_of": "best_of other than n is not supported (no beam search or reranking)",
    "use_beam_search": "beam search is not supported",
    "min_p": "min_p sampling is not supported",
    "guided_json": "guided decoding is not supported", "guided_regex": "guided decoding is not supported",
    "guided_choice": "guided decoding is not supported", "guided_grammar": "guided decoding is not supported",
    "guided_decoding_backend": "guided decoding is not supported",
    "guided_whitespace_pattern": "guided decoding is not supported",
    "structured_outputs": "structured outputs are not supported",
    "functions": "function calling is not supported", "function_call": "function calling is not supported",
    "audio": "audio output is not supported", "prediction": "predicted outputs are not supported",
    "web_search_options": "web search is not supported", "reasoning_effort": "this model has no reasoning mode",
}
T = TypeVar("T")


class RequestError(ValueError):
    """A request this server refuses: an OpenAI-shaped error with this status and `param`."""

    def __init__(self, message: str, status: int = 400, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.param = param
        self.code = code


def error_body(message: str, status: int = 400, param: str | None = None, code: str | None = None) -> bytes:
    kind = "invalid_request_error" if status < 500 else "internal_server_error"
    return orjson.dumps({"error": {"message": message, "type": kind, "param": param, "code": code}})


def check_fields(body: dict[str, Any], allowed: frozenset[str]) -> None:
    """Refuse, by name, every field outside `allowed` that asks for something (null, false and an
    `n`-equal best_of ask for nothing)."""
    for key, value in body.items():
        if key in allowed or value is None or value is False:
            continue
        if key == "best_of" and value == body.get("n", 1):
            continue
        reason = _REFUSED.get(key, "it is not a parameter this engine supports")
        raise RequestError(f"'{key}' is not supported: {reason}", param=key)


def check_model(body: dict[str, Any], served_model: str | None) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise RequestError("'model' is required: the name of the served model", param="model")
    if served_model is not None and model != served_model:
        raise RequestError(f"The model `{model}` does not exist.", status=404, param="model", code="model_not_found")
    return model


def number(body: dict[str, Any], key: str, default: Any, kind: type | tuple[type, ...]) -> Any:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, kind):
        raise RequestError(f"'{key}' must be {'an integer' if kind is int else 'a number'}", param=key)
    return value


@dataclass(frozen=True, slots=True)
class StreamOptions:
    include_usage: bool = False  # a last chunk with the usage and no choices
    continuous_usage: bool = False  # vLLM's continuous_usage_stats: every chunk carries the usage so far


def check_stream_options(body: dict[str, Any]) -> StreamOptions:
    """What the stream reports of its usage; stream_options without stream is vLLM's 400."""
    options = body.get("stream_options")
    if options is None:
        return StreamOptions()
    if body.get("stream") is not True:
        raise RequestError("Stream options (`stream_options`) can only be defined when `stream=True`.",
                           param="stream_options")
    if not isinstance(options, dict):
        raise RequestError("'stream_options' must be an object", param="stream_options")
    include = options.get("include_usage") is True
    return StreamOptions(include, include and options.get("continuous_usage_stats") is True)


def running_usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """A chunk's usage under continuous_usage_stats: the prompt and this choice's tokens so far."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _logit_bias(body: dict[str, Any], vocab_size: int) -> dict[int, float] | None:
    raw = body.get("logit_bias")
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise RequestError("'logit_bias' must map token ids to numbers in [-100, 100]", param="logit_bias")
    not_ids = [key for key in raw if not _is_int(key)]
    if not_ids:  # every bad key at once, as vLLM reports them
        raise RequestError(f"logit_bias keys {not_ids} are not token ids", param="logit_bias")
    bias: dict[int, float] = {}
    for key, value in raw.items():
        token = int(key)
        if not 0 <= token < vocab_size:
            raise RequestError(f"logit_bias token {token} is outside this model's vocabulary of {vocab_size}",
                               param="logit_bias")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not -100 <= value <= 100:
            raise RequestError(f"logit_bias for {key} must be a number in [-100, 100]", param="logit_bias")
        bias[token] = float(value)
    return bias


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def _stop_token_ids(body: dict[str, Any], vocab_size: int) -> list[int]:
    raw = body.get("stop_token_ids") or []
    if not isinstance(raw, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in raw):
        raise RequestError("'stop_token_ids' must be a list of token ids", param="stop_token_ids")
    outside = [t for t in raw if not 0 <= t < vocab_size]
    if outside:
        raise RequestError(f"stop_token_ids {outside} are outside this model's vocabulary of {vocab_size}",
                           param="stop_token_ids")
    return list(raw)


def count(body: dict[str, Any], key: str, engine: AsyncLLMEngine) -> int:
    """`n`: how many choices per prompt (each is its own engine request sharing the prompt's blocks)."""
    n = number(body, key, 1, int)
    limit = engine.engine.config.max_num_seqs
    if not 1 <= n <= limit:
        raise RequestError(f"'{key}' must be between 1 and {limit}", param=key)
    return int(n)


def truncated(body: dict[str, Any], ids: list[int], max_len: int) -> list[int]:
    """vLLM's truncate_prompt_tokens (k tokens, -1: the context length) and truncation_side: "left"
    (the default) keeps the last k tokens, "right" the first k."""
    k = number(body, "truncate_prompt_tokens", None, int)
    if k is None:
        return ids
    if k == -1:
        k = max_len
    if not 1 <= k <= max_len:
        raise RequestError(f"'truncate_prompt_tokens' must be -1 or between 1 and the context length {max_len}",
                           param="truncate_prompt_tokens")
    side = body.get("truncation_side") or "left"
    if side not in ("left", "right"):
        raise RequestError("'truncation_side' must be 'left' or 'right'", param="truncation_side")
    return ids[:k] if side == "right" else ids[-k:]


def sampling_params(body: dict[str, Any], engine: AsyncLLMEngine, prompt_len: int, *, logprobs: int | None,
                    default_max_tokens: int | None, max_tokens_key: str = "max_tokens") -> SamplingParams:
    """SamplingParams from the request's fields, with vLLM's range checks."""
    vocab = engine.engine.model_runner.model.args.vocab_size
    max_len = engine.engine.max_model_len
    # vLLM's words (its OpenAI server's input validation): clients read the numbers out of them to lower
    # max_tokens or drop turns and ask again
    if prompt_len >= max_len:
        raise RequestError(f"This model's maximum context length is {max_len} tokens. However, your request has "
                           f"{prompt_len} input tokens. Please reduce the length of the input messages.",
                           param="messages" if "messages" in body else "prompt")
    max_tokens = number(body, max_tokens_key, None, int)
    if max_tokens is not None and prompt_len + max_tokens > max_len:
        raise RequestError(f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum "
                           f"context length is {max_len} tokens and your request has {prompt_len} input tokens "
                           f"({max_tokens} > {max_len} - {prompt_len}).", param=max_tokens_key)
    seed = number(body, "seed", None, int)
    if seed is not None and not -_INT64 <= seed < _INT64:
        # vLLM's wording (pydantic's, with its error type), which clients match on
        side, bound = ("less", _INT64 - 1) if seed > 0 else ("greater", -_INT64)
        raise RequestError(f"'seed' must be a signed 64-bit integer: Input should be {side} than or equal to "
                           f"{bound} [type={side}_than_equal, input_value={seed}]", param="seed")
    if logprobs is not None and not 0 <= logprobs <= MAX_LOGPROBS:
        key = "top_logprobs" if "messages" in body else "logprobs"
        raise RequestError(f"'{key}': requested sample logprobs of {logprobs}, which is outside the allowed range "
                           f"[0, {MAX_LOGPROBS}]", param=key)
    stop = body.get("stop")
    if stop is not None and not (isinstance(stop, str) or (isinstance(stop, list)
                                                           and all(isinstance(s, str) for s in stop))):
        raise RequestError("'stop' must be a string or a list of strings", param="stop")
    stop_token_ids, logit_bias = _stop_token_ids(body, vocab), _logit_bias(body, vocab)
    try:
        return SamplingParams(
            temperature=float(number(body, "temperature", 1.0, (int, float))),
            top_p=float(number(body, "top_p", 1.0, (int, float))),
            top_k=number(body, "top_k", -1, int),
            seed=seed,
            max_tokens=max_tokens if max_tokens is not None else min(default_max_tokens or max_len, max_len - prompt_len),
            min_tokens=number(body, "min_tokens", 0, int),
            stop=stop,
            stop_token_ids=stop_token_ids,
            ignore_eos=body.get("ignore_eos") is True,
            include_stop_str_in_output=body.get("include_stop_str_in_output") is True,
            skip_special_tokens=body.get("skip_special_tokens") is not False,
            logprobs=logprobs,
            presence_penalty=float(number(body, "presence_penalty", 0.0, (int, float))),
            frequency_penalty=float(number(body, "frequency_penalty", 0.0, (int, float))),
            repetition_penalty=float(number(body, "repetition_penalty", 1.0, (int, float))),
            logit_bias=logit_bias,
        )
    except ValueError as exc:
        raise RequestError(str(exc)) from exc


def reseeded(params: SamplingParams, i: int) -> SamplingParams:
    """The i-th of n choices: with a seed, each choice gets its own (seed + i), or all n would be equal."""
    if i == 0 or params.seed is None:
        return params
    return replace(params, seed=(params.seed + i + _INT64) % (2 * _INT64) - _INT64)


@dataclass(slots=True)
class _End:
    error: BaseException | None = None


async def merged(streams: list[AsyncIterator[T]]) -> AsyncGenerator[tuple[int, T], None]:
    """Items of several streams as they come, tagged with the stream's index. Closing this closes
    (so aborts) every stream still running; the first error ends it. A stream is read no faster than
    this is (at most one item of each waits here), so a slow reader leaves the items in the streams."""
    queue: asyncio.Queue[tuple[int, T] | _End] = asyncio.Queue(maxsize=len(streams))

    async def pump(i: int, stream: AsyncIterator[T]) -> None:
        try:
            async for item in stream:
                await queue.put((i, item))
        except Exception as exc:
            await queue.put(_End(exc))
            return
        await queue.put(_End())

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        running = len(tasks)
        while running:
            entry = await queue.get()
            if not isinstance(entry, _End):
                yield entry
            elif entry.error is not None:
                raise entry.error
            else:
                running -= 1
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def last_outputs(streams: list[AsyncIterator[T]]) -> list[T]:
    """The final item of each stream, run concurrently."""
    async def last(stream: AsyncIterator[T]) -> T:
        final: T | None = None
        async for item in stream:
            final = item
        assert final is not None
        return final

    return list(await asyncio.gather(*(last(s) for s in streams)))


def finish_reason(out: RequestOutput) -> str | None:
    reason = out.outputs[0].finish_reason
    return None if reason == "abort" else reason


def sse(data: dict[str, Any] | str) -> bytes:
    payload = data.encode() if isinstance(data, str) else orjson.dumps(data)
    return b"data: " + payload + b"\n\n"


@dataclass(slots=True)
class Step:
    """What one engine output adds to its choice since the choice's last output."""

    index: int  # the choice
    out: RequestOutput
    text: str
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]] | None  # None: not requested
    text_offset: int  # characters of the choice's text before this step
    first: bool  # no token of the choice came before this step


async def steps(streams: list[AsyncIterator[RequestOutput]]) -> AsyncGenerator[Step, None]:
    """The choices' outputs as they come (`merged`), each cut to what it adds. Closing this closes
    (so aborts) the streams."""
    sent_text, sent_tokens = [0] * len(streams), [0] * len(streams)
    async with aclosing(merged(streams)) as outputs:
        async for i, out in outputs:
            c = out.outputs[0]
            text, tokens = sent_text[i], sent_tokens[i]
            sent_text[i], sent_tokens[i] = len(c.text), len(c.token_ids)
            yield Step(i, out, c.text[text:], c.token_ids[tokens:],
                       c.logprobs[tokens:] if c.logprobs is not None else None, text, tokens == 0)
