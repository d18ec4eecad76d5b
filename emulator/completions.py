"""OpenAI legacy completions: POST /v1/completions (stream and not).

`prompt` is a string, a list of strings, a token list or a list of token lists; each prompt gets
`n` choices (index = prompt * n + j). `max_tokens` defaults to 16 as on the real endpoint. No
prompt caching is reported (`cached_tokens` 0), and `suffix` is accepted and ignored.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import orjson

from . import openai_wire as wire
from .asgi import JSON_CT, SSE_HEADERS, Call
from .logprobs import completion_logprobs
from .models import openai_generates
from .reply import make_reply
from .streaming import respond_after, run_stream
from .text import choice_seed, count_tokens, encoding, seed_for, split_deltas

if TYPE_CHECKING:
    from .app import Emulator

FINISH = {"end": "stop", "max": "length", "stop_sequence": "stop", "tool": "stop"}


def _is_tokens(x: Any) -> bool:
    return isinstance(x, list) and bool(x) and all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in x)


def _prompts(p: Any) -> list[str] | None:
    if isinstance(p, str):
        return [p]
    if _is_tokens(p):
        return [encoding().decode(p)]
    if isinstance(p, list) and p and all(isinstance(x, str) or _is_tokens(x) for x in p):
        return [x if isinstance(x, str) else encoding().decode(x) for x in p]
    return None


def _validate(body: dict[str, Any]) -> wire.Problem | None:
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "you must provide a model parameter", None, None
    if body.get("prompt") is None:
        return "Missing required parameter: 'prompt'.", "prompt", "missing_required_parameter"
    if _prompts(body["prompt"]) is None:
        return ("Invalid type for 'prompt': expected one of a string, array of strings, array of "
                "integers or array of arrays of integers.", "prompt", "invalid_type")
    r = (wire.check_ranges(body, *wire.SAMPLING, *wire.PENALTIES)
         or wire.check_int(body, "max_tokens", 0) or wire.check_int(body, "n", 1))
    if r:
        return r
    lp = body.get("logprobs")
    if lp is not None and (not isinstance(lp, int) or isinstance(lp, bool) or not 0 <= lp <= 5):
        return "Invalid 'logprobs': expected an integer between 0 and 5.", "logprobs", "invalid_value"
    opts = body.get("stream_options")
    if opts is not None and (not body.get("stream") or not isinstance(opts, dict)):
        return ("The 'stream_options' parameter is only allowed as an object when 'stream' is "
                "enabled.", "stream_options", None)
    stop = body.get("stop")
    if stop is not None and not isinstance(stop, str) and not (
            isinstance(stop, list) and len(stop) <= 4 and all(isinstance(s, str) for s in stop)):
        return "Invalid type for 'stop': expected a string or array of strings.", "stop", "invalid_type"
    return None


async def completions(emu: Emulator, call: Call) -> None:
    req = await wire.begin(emu, call, _validate, openai_generates)
    if req is None:
        return
    body, model = req.body, req.model
    prompts = _prompts(body["prompt"]) or []
    n = body.get("n") or 1
    mt = body.get("max_tokens", 16)
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else (stop or [])
    lp = body.get("logprobs")
    natural = emu.natural_length(call)
    choices: list[dict[str, Any]] = []
    for i, p in enumerate(prompts):
        base = seed_for(model, p)
        for j in range(n):
            reply = make_reply(choice_seed(base, j), natural, mt, stops, None)
            text = (p + reply.text) if body.get("echo") else reply.text
            choices.append({"text": text, "index": i * n + j, "finish_reason": FINISH[reply.stop],
                            "logprobs": None if lp is None else completion_logprobs(text, lp, 0),
                            "_tokens": reply.output_tokens})
    prompt_tokens = sum(count_tokens(p) for p in prompts)
    out_tokens = sum(c.pop("_tokens") for c in choices)
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": out_tokens,
             "total_tokens": prompt_tokens + out_tokens}
    cid, created = emu.new_id("cmpl-"), int(time.time())
    base_obj = {"id": cid, "object": "text_completion", "created": created, "model": model,
                "system_fingerprint": "fp_emulator"}
    ttft = emu.config.ttft_seconds(prompt_tokens, 0)
    if req.stream:
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        events, tokens = _events(emu, base_obj, choices, usage, include_usage)
        err = wire.midstream_error(req.faults, model)
        headers = wire.headers(call)
        headers.extend(SSE_HEADERS)
        delay = emu.config.usage_delay_ms / 1000.0  # before the usage chunk, as for a Chat stream
        pauses = {len(events) - 2: delay} if include_usage and delay > 0 else None
        await run_stream(emu, call, headers, events, tokens, req.faults,
                         b"data: " + orjson.dumps(err) + b"\n\n", ttft, lambda: None, pauses)
        return
    headers = wire.headers(call)
    headers.append(JSON_CT)
    delay = ttft + emu.config.per_output_token_ms * out_tokens / 1000.0
    await respond_after(emu, call, delay, 200, orjson.dumps(dict(base_obj, choices=choices, usage=usage)),
                        headers, lambda: None)


def _events(emu: Emulator, base: dict[str, Any], choices: list[dict[str, Any]],
            usage: dict[str, Any], include_usage: bool) -> tuple[list[bytes], list[int]]:
    k = emu.config.tokens_per_delta
    ev: list[bytes] = []
    toks: list[int] = []

    def chunk(obj: dict[str, Any], tokens: int) -> None:
        ev.append(b"data: " + orjson.dumps(obj) + b"\n\n")
        toks.append(tokens)

    for c in choices:
        for piece in split_deltas(c["text"], k) if c["text"] else ():
            chunk(dict(base, choices=[{"text": piece, "index": c["index"], "logprobs": None,
                                       "finish_reason": None}]), k)
        chunk(dict(base, choices=[{"text": "", "index": c["index"], "logprobs": None,
                                   "finish_reason": c["finish_reason"]}]), 0)
    if include_usage:
        chunk(dict(base, choices=[], usage=usage), 0)
    ev.append(b"data: [DONE]\n\n")
    toks.append(0)
    return ev, toks
