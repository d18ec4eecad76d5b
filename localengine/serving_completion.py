"""OpenAI's legacy Completions (`POST /v1/completions`) on top of the async engine.

What evaluation harnesses and code-completion clients send: one prompt or a batch (strings or
token ids), `n` choices per prompt (choice index = prompt index * n + j, as OpenAI numbers them),
`echo` (with `max_tokens` 0: the prompt back, nothing generated), `logprobs` (0-20 alternatives per
token, OpenAI's legacy shape), `stop`, streaming.
Refused with a 400 naming the field: `suffix` (no fill-in-the-middle), `echo` together with
`logprobs` (that needs the prompt's logprobs, which the engine does not compute), `best_of` > n.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from localengine.engine.async_engine import AsyncLLMEngine
from localengine.outputs import Logprob, RequestOutput
from localengine.sampling_params import SamplingParams
from localengine.serving_chat import generations
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
    running_usage,
    sampling_params,
    sse,
    steps,
    truncated,
)

_FIELDS = INERT_FIELDS | SAMPLING_FIELDS | {"prompt", "echo", "return_token_ids"}
OPENAI_DEFAULT_MAX_TOKENS = 16  # the Completions API's default, unlike Chat's "up to the context"


@dataclass(slots=True)
class CompletionRequest:
    request_id: str
    model: str
    prompts: list[list[int]]
    prompt_texts: list[str]  # what echo prepends
    params: list[SamplingParams]  # per prompt (max_tokens depends on its length)
    n: int
    echo: bool
    echo_only: bool  # echo with max_tokens 0 (OpenAI's and vLLM's): the prompt back, nothing generated
    return_token_ids: bool  # vLLM's: each choice carries its prompt's and its own token ids
    logprobs: int | None
    stream: bool
    include_usage: bool
    continuous_usage: bool  # vLLM's stream_options.continuous_usage_stats
    cache_salt: str | None
    created: int


def _prompts(body: dict[str, Any], engine: AsyncLLMEngine) -> list[list[int]]:
    raw = body.get("prompt")
    vocab = engine.engine.model_runner.model.args.vocab_size

    def ids(p: Any) -> list[int]:
        if isinstance(p, str):
            return list(engine.tokenizer.encode(p, add_special_tokens=True))
        if isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
            outside = [t for t in p if not 0 <= t < vocab]
            if outside:  # vLLM's words
                raise RequestError(f"Token ids {outside} are out of vocabulary (this model has {vocab} tokens)",
                                   param="prompt")
            return list(p)
        raise RequestError("'prompt' must be a string, a list of strings, a list of token ids or a list of such lists",
                           param="prompt")

    if isinstance(raw, str) or (isinstance(raw, list) and raw and isinstance(raw[0], int)):
        prompts = [ids(raw)]
    elif isinstance(raw, list) and raw:
        prompts = [ids(p) for p in raw]
    else:
        raise RequestError("'prompt' is required: a string, a list of strings or token ids", param="prompt")
    if any(not p for p in prompts):
        raise RequestError("a prompt must not be empty", param="prompt")
    return [truncated(body, p, engine.engine.max_model_len) for p in prompts]


def parse_completion_request(body: Any, engine: AsyncLLMEngine, served_model: str | None = None) -> CompletionRequest:
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    model = check_model(body, served_model) if served_model is not None else str(body.get("model") or engine.model_name)
    if body.get("prompt") in (None, "", []) and not body.get("prompt_embeds"):  # vLLM's check and words
        raise RequestError("Either prompt or prompt_embeds must be provided and non-empty.", param="prompt")
    if body.get("suffix") is not None:
        raise RequestError("'suffix' is not supported: this engine does no fill-in-the-middle", param="suffix")
    check_fields(body, _FIELDS)
    logprobs = number(body, "logprobs", None, int)
    echo = body.get("echo") is True
    if echo and logprobs is not None:
        raise RequestError("'echo' with 'logprobs' needs the prompt's logprobs, which this engine does not compute",
                           param="echo")
    n = count(body, "n", engine)
    stream_options = check_stream_options(body)
    prompts = _prompts(body, engine)
    max_tokens = body.get("max_tokens")
    echo_only = echo and max_tokens == 0 and not isinstance(max_tokens, bool)
    checked = {**body, "max_tokens": 1} if echo_only else body  # the other fields still checked as for any request
    params = [sampling_params(checked, engine, len(p), logprobs=logprobs, default_max_tokens=OPENAI_DEFAULT_MAX_TOKENS)
              for p in prompts]
    salt = body.get("cache_salt")
    return CompletionRequest(
        request_id=f"cmpl-{uuid.uuid4().hex}", model=model, prompts=prompts,
        prompt_texts=[engine.tokenizer.decode(p) for p in prompts] if echo else [""] * len(prompts),
        params=params, n=n, echo=echo, echo_only=echo_only, return_token_ids=body.get("return_token_ids") is True, logprobs=logprobs, stream=body.get("stream") is True,
        include_usage=stream_options.include_usage, continuous_usage=stream_options.continuous_usage, cache_salt=salt if isinstance(salt, str) else None, created=int(time.time()))


def _streams(engine: AsyncLLMEngine, req: CompletionRequest) -> list[AsyncIterator[RequestOutput]]:
    """Every choice of every prompt, in OpenAI's order (prompt-major)."""
    return [s for k, (ids, params) in enumerate(zip(req.prompts, req.params, strict=True))
            for s in generations(engine, ids, params, req.request_id, req.n, req.cache_salt, first=k * req.n)]


# Tokens decoded behind the newest: what a token's text depends on before it (SentencePiece's leading space, a
# character split across byte tokens, spaces cleaned up before punctuation).
_OFFSET_CONTEXT = 8


class TextOffsets:
    """`text_offset`: where each of a choice's tokens starts in its text (after the echoed prompt),
    from the tokens alone, so a streamed answer gets the same offsets as the whole one however its
    chunks fell. Token i starts at the part of the text of tokens 0..i-1 that token i leaves as it
    is; a token that only continues a character still incomplete (a multi-byte UTF-8 character split
    across byte tokens, shown as U+FFFD until complete) starts where that character starts.

    The text is not decoded whole at each token (that was quadratic in the answer's length): it is a
    head, of which only the length is kept, and a window of the last tokens, decoded at each token,
    which moves on once it holds 2 x _OFFSET_CONTEXT tokens to the last _OFFSET_CONTEXT, where those
    tokens decoded alone are how the window's text ends (not where they would cut a character), and not
    within a run of SentencePiece byte tokens (its byte fallback decodes a run whole: a stray byte at its
    end turns every character of the run to U+FFFD)."""

    def __init__(self, tokenizer: Any, skip_special_tokens: bool, start: int):
        self._tokenizer, self._skip, self._start = tokenizer, skip_special_tokens, start
        self._special = frozenset(getattr(tokenizer, "all_special_ids", ()) or ())
        self._ids: list[int] = []
        self._from = 0  # the window's first token
        self._head = 0  # the length of the text before the window
        self._head_incomplete = False  # whether that text ends in U+FFFD
        self._window = ""  # the window's tokens decoded: the text is the head's and this

    def add(self, token_ids: list[int]) -> list[int]:
        """The offsets of these next tokens of the choice."""
        offsets = []
        for tid in token_ids:
            self._ids.append(tid)
            before, window = self._window, self._decode(self._ids[self._from:])
            incomplete = before.endswith("\ufffd") if before else self._head_incomplete
            if window == before and incomplete and tid not in self._special:
                at = self._head + len(before) - 1  # a byte more of the character still incomplete: it starts there
            else:
                at = self._head + _shared_start(before, window)
            offsets.append(self._start + at)
            self._window = window
            self._slide()
        return offsets

    def _decode(self, ids: list[int]) -> str:
        text: str = self._tokenizer.decode(ids, skip_special_tokens=self._skip)
        return text

    def _byte_piece(self, token_id: int) -> bool:
        """Whether the token is a SentencePiece byte token (`<0xNN>`, byte fallback)."""
        convert = getattr(self._tokenizer, "convert_ids_to_tokens", None)
        piece = convert(token_id) if convert is not None else None
        return isinstance(piece, str) and len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">")

    def _slide(self) -> None:
        """Move the window on to its last _OFFSET_CONTEXT tokens, once it holds twice that, where their text alone
        ends the window's; else it waits for a later token."""
        if len(self._ids) - self._from < 2 * _OFFSET_CONTEXT or self._window.endswith("\ufffd"):
            return
        at = len(self._ids) - _OFFSET_CONTEXT
        if self._byte_piece(self._ids[at - 1]) and self._byte_piece(self._ids[at]):
            return  # within a run of SentencePiece byte tokens, which a later stray byte turns to U+FFFD whole
        tail = self._decode(self._ids[at:])
        if not self._window.endswith(tail):
            return
        kept = len(self._window) - len(tail)
        if kept:
            self._head += kept
            self._head_incomplete = self._window[kept - 1] == "\ufffd"
        self._from, self._window = at, tail


def _shared_start(before: str, text: str) -> int:
    """How many characters the two texts start with alike."""
    if text.startswith(before):
        return len(before)
    at = 0
    for a, b in zip(before, text, strict=False):
        if a != b:
            break
        at += 1
    return at


def _logprobs(tokenizer: Any, token_ids: list[int], entries: list[dict[int, Logprob]] | None, k: int | None,
              offsets: TextOffsets) -> dict[str, Any] | None:
    """OpenAI's legacy shape: tokens, their logprobs, the top-k alternatives and character offsets."""
    if k is None or entries is None:
        return None
    tokens, token_logprobs, top = [], [], []
    for tid, entry in zip(token_ids, entries, strict=False):
        tokens.append(tokenizer.decode([tid]))
        token_logprobs.append(entry[tid].logprob)
        ranked = sorted(((t, e) for t, e in entry.items() if e.rank is not None), key=lambda x: x[1].rank or 0)
        # vLLM's: the top k and the sampled token (so k or k + 1 entries; logprobs=0 gives the sampled one)
        top.append({tokenizer.decode([t]): e.logprob for t, e in [*ranked[:k], (tid, entry[tid])]})
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top,
            "text_offset": offsets.add(token_ids[:len(tokens)])}


def _offsets(engine: AsyncLLMEngine, req: CompletionRequest, i: int) -> TextOffsets:
    """Choice i's text offsets, counted from the start of its text (echoed prompt included)."""
    prompt = i // req.n
    return TextOffsets(engine.tokenizer, req.params[prompt].skip_special_tokens, len(req.prompt_texts[prompt]))


def _token_ids(req: CompletionRequest, i: int, new_ids: list[int], first: bool) -> dict[str, Any]:
    """return_token_ids: the choice's (new) token ids, and its prompt's ids in its first chunk."""
    if not req.return_token_ids:
        return {}
    return {"token_ids": list(new_ids), **({"prompt_token_ids": req.prompts[i // req.n]} if first else {})}


def completion_usage(req: CompletionRequest, finals: list[RequestOutput]) -> dict[str, Any]:
    prompt = sum(len(p) for p in req.prompts)
    completion = sum(len(f.outputs[0].token_ids) for f in finals)
    cached = sum(finals[k * req.n].num_cached_tokens for k in range(len(req.prompts))) if finals else 0
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def _echoed_only(req: CompletionRequest) -> list[dict[str, Any]]:
    """The choices of an echo with max_tokens 0: each its prompt, finished for length, as vLLM answers."""
    return [{"index": i, "text": req.prompt_texts[i // req.n], "finish_reason": "length", "logprobs": None,
             **_token_ids(req, i, [], first=True)} for i in range(len(req.prompts) * req.n)]


async def completion(engine: AsyncLLMEngine, req: CompletionRequest) -> dict[str, Any]:
    finals = [] if req.echo_only else await last_outputs(_streams(engine, req))
    choices = [{**c, "prompt_logprobs": None} for c in _echoed_only(req)] if req.echo_only else []
    for i, final in enumerate(finals):
        out, echoed = final.outputs[0], req.prompt_texts[i // req.n]
        choices.append({"index": i, "text": echoed + out.text, "finish_reason": finish_reason(final),
                        "logprobs": _logprobs(engine.tokenizer, out.token_ids, out.logprobs, req.logprobs,
                                              _offsets(engine, req, i)),
                        "prompt_logprobs": None,  # vLLM's field; prompt logprobs are refused, so always null
                        **_token_ids(req, i, out.token_ids, first=True)})
    return {"id": req.request_id, "object": "text_completion", "created": req.created, "model": req.model,
            "choices": choices, "usage": completion_usage(req, finals), "system_fingerprint": None}


async def completion_events(engine: AsyncLLMEngine, req: CompletionRequest) -> AsyncGenerator[bytes, None]:
    """SSE events of a streamed completion, ending in `data: [DONE]`; closing early aborts every choice."""
    base = {"id": req.request_id, "object": "text_completion", "created": req.created, "model": req.model,
            "system_fingerprint": None}
    tail = {"usage": None} if req.include_usage else {}

    def chunk(i: int, choice: dict[str, Any], tokens: int) -> bytes:
        usage = {"usage": running_usage(len(req.prompts[i // req.n]), tokens)} if req.continuous_usage else tail
        return sse({**base, "choices": [{"index": i, **choice}], **usage})

    if req.echo_only:
        for choice in _echoed_only(req):
            yield chunk(choice.pop("index"), choice, 0)
        if req.include_usage:
            yield sse({**base, "choices": [], "usage": completion_usage(req, [])})
        yield sse("[DONE]")
        return
    streams = _streams(engine, req)
    finals: list[RequestOutput | None] = [None] * len(streams)
    offsets = [_offsets(engine, req, i) for i in range(len(streams))]
    for i in range(len(streams)):
        if req.echo:
            yield chunk(i, {"text": req.prompt_texts[i // req.n], "logprobs": None, "finish_reason": None}, 0)
    async with aclosing(steps(streams)) as outputs:
        async for s in outputs:
            i, out = s.index, s.out
            if out.finished:
                finals[i] = out
            if s.text or s.token_ids or out.finished:
                yield chunk(i, {"text": s.text, "finish_reason": finish_reason(out) if out.finished else None,
                                "logprobs": _logprobs(engine.tokenizer, s.token_ids, s.logprobs, req.logprobs, offsets[i]),
                                **_token_ids(req, i, s.token_ids, first=s.first)},
                            len(out.outputs[0].token_ids))
    if req.include_usage:
        yield sse({**base, "choices": [], "usage": completion_usage(req, [f for f in finals if f is not None])})
    yield sse("[DONE]")
