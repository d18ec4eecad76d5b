"""OpenAI Chat Completions: POST /v1/chat/completions.

Wire format per reference C.3-C.7; automatic prefix caching per C.1 (see caching.py).
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any

import orjson

from . import openai_wire as wire
from .asgi import JSON_CT, SSE_HEADERS, Call
from .caching import CachePlan, openai_prompt_blob, plan_openai
from .chat_stream import Choice, chunks
from .logprobs import chat_entries
from .models import REASONING_TOKENS, bills_cache_writes, context_window, openai_generates
from .parallel import extra_calls, interleaves, parallel_names
from .reply import ToolPick, choose_tool, make_reply, output_schema
from .streaming import respond_after, run_stream
from .text import choice_seed, seed_for

if TYPE_CHECKING:
    from .app import Emulator

ROLES = ("system", "developer", "user", "assistant", "tool", "function")
USER_MAX = 64  # characters of `user` (longer: OpenAI's 400 string_above_max_length)
FUNCTION_NAME_MAX = 64  # characters of a function tool's name (longer: the same 400)
TOOL_ID_MAX = 40  # characters of a tool call id (longer: the same 400)


def _validate(body: dict[str, Any]) -> wire.Problem | None:
    """(message, param, code) of the first problem, or None."""
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "you must provide a model parameter", None, None
    msgs = body.get("messages")
    if msgs is None:
        return "Missing required parameter: 'messages'.", "messages", "missing_required_parameter"
    if not isinstance(msgs, list):
        return ("Invalid type for 'messages': expected an array of objects, but got "
                f"{type(msgs).__name__} instead.", "messages", "invalid_type")
    if not msgs:
        return ("Invalid 'messages': empty array. Expected an array with minimum length 1, but got "
                "an empty array instead.", "messages", "empty_array")
    for i, m in enumerate(msgs):
        p = f"messages[{i}]"
        if not isinstance(m, dict):
            return f"Invalid type for '{p}': expected an object.", p, "invalid_type"
        role = m.get("role")
        if role is None:
            return f"Missing required parameter: '{p}.role'.", f"{p}.role", "missing_required_parameter"
        if role not in ROLES:
            return (f"Invalid value: '{role}'. Supported values are: 'system', 'assistant', 'user', "
                    "'function', 'tool', and 'developer'.", f"{p}.role", "invalid_value")
        c = m.get("content")
        if c is None and not (role == "assistant" and (m.get("tool_calls") or m.get("audio") or "content" in m)):
            return (f"Missing required parameter: '{p}.content'.", f"{p}.content",
                    "missing_required_parameter")
        if c is not None and not isinstance(c, (str, list)):
            return (f"Invalid type for '{p}.content': expected one of a string or array of objects.",
                    f"{p}.content", "invalid_type")
        if role == "tool" and not isinstance(m.get("tool_call_id"), str):
            return (f"Missing required parameter: '{p}.tool_call_id'.", f"{p}.tool_call_id",
                    "missing_required_parameter")
        ids = [(f"{p}.tool_call_id", m["tool_call_id"])] if role == "tool" else []
        ids += [(f"{p}.tool_calls[{j}].id", c.get("id")) for j, c in enumerate(m.get("tool_calls") or ()) if isinstance(c, dict)]
        long = next(((where, i) for where, i in ids if isinstance(i, str) and len(i) > TOOL_ID_MAX), None)
        if long:
            return (f"Invalid '{long[0]}': string too long. Expected a string with maximum length {TOOL_ID_MAX}, but "
                    f"got a string with length {len(long[1])} instead.", long[0], "string_above_max_length")
    r = (wire.check_ranges(body, *wire.SAMPLING, *wire.PENALTIES)
         or wire.check_int(body, "max_tokens", 1) or wire.check_int(body, "max_completion_tokens", 1))
    if r:
        return r
    r = _reasoning_problem(body)
    if r:
        return r
    user = body.get("user")
    if isinstance(user, str) and len(user) > USER_MAX:
        return (f"Invalid 'user': string too long. Expected a string with maximum length {USER_MAX}, but got a "
                f"string with length {len(user)} instead.", "user", "string_above_max_length")
    n = body.get("n")
    if n is not None and (not isinstance(n, int) or n < 1 or n > 128):
        return "Invalid 'n': expected an integer between 1 and 128.", "n", "invalid_value"
    lp, top = body.get("logprobs"), body.get("top_logprobs")
    if lp is not None and not isinstance(lp, bool):
        return "Invalid type for 'logprobs': expected a boolean.", "logprobs", "invalid_type"
    if top is not None:
        if not isinstance(top, int) or isinstance(top, bool) or not 0 <= top <= 20:
            return "Invalid 'top_logprobs': expected an integer between 0 and 20.", "top_logprobs", \
                "invalid_value"
        if not lp:
            return ("Invalid value for 'top_logprobs': 'logprobs' must be set to true when "
                    "'top_logprobs' is used.", "top_logprobs", None)
    rf = body.get("response_format")
    if rf is not None:
        if not isinstance(rf, dict) or rf.get("type") not in ("text", "json_object", "json_schema"):
            return ("Invalid value for 'response_format.type': supported values are 'text', "
                    "'json_object' and 'json_schema'.", "response_format.type", "invalid_value")
        js = rf.get("json_schema")
        if rf["type"] == "json_schema" and (not isinstance(js, dict) or not isinstance(js.get("name"), str)):
            return ("Missing required parameter: 'response_format.json_schema.name'.",
                    "response_format.json_schema.name", "missing_required_parameter")
        if rf["type"] == "json_schema" and isinstance(js, dict) and js.get("strict") is True:
            problem = _strict_problem(js.get("schema"), ())
            if problem:
                return (f"Invalid schema for response_format '{js['name']}': {problem}", "response_format", None)
    if "stream" in body and not isinstance(body["stream"], bool) and body["stream"] is not None:
        return "Invalid type for 'stream': expected a boolean.", "stream", "invalid_type"
    opts = body.get("stream_options")
    if opts is not None:
        if not body.get("stream"):
            return ("The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                    "stream_options", None)
        if not isinstance(opts, dict):
            return ("Invalid type for 'stream_options': expected an object, but got "
                    f"{type(opts).__name__} instead.", "stream_options", "invalid_type")
    stop = body.get("stop")
    if stop is not None and not isinstance(stop, str):
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            return "Invalid type for 'stop': expected a string or array of strings.", "stop", "invalid_type"
        if len(stop) > 4:
            return ("Invalid 'stop': array too long. Expected an array with maximum length 4, but got "
                    f"an array with length {len(stop)} instead.", "stop", "array_above_max_length")
    return _validate_tools(body)


# Reasoning models (the o-series, gpt-5 but not its -chat models) sample as they do: a temperature or top_p
# other than 1 is a 400 ("Unsupported value"), and they take no stop sequences ("Unsupported parameter").
# gpt-5.1 to 5.5 (not their codex or pro models) default to reasoning effort none, and take temperature and top_p
# there (OpenAI's GPT-5.1/5.2 guides: "only supported when reasoning effort is none").
_REASONS = re.compile(r"^(o\d|gpt-5(?!.*-chat))")
_SAMPLES_UNREASONED = re.compile(r"^gpt-5\.[1-5](-mini|-nano)?(-\d{4}-\d{2}-\d{2})?$")


def _reasoning_problem(body: dict[str, Any]) -> wire.Problem | None:
    if not _REASONS.match(body["model"]):
        return None
    unreasoned = _SAMPLES_UNREASONED.match(body["model"]) and body.get("reasoning_effort") in (None, "none")
    for key in ("temperature", "top_p"):
        if body.get(key) not in (None, 1) and not unreasoned:
            return (f"Unsupported value: '{key}' does not support {body[key]} with this model. Only the default (1) "
                    "value is supported.", key, "unsupported_value")
    if body.get("stop") is not None:  # the parameter itself, an empty list too: it is not one these models take
        return "Unsupported parameter: 'stop' is not supported with this model.", "stop", "unsupported_parameter"
    return None


def _strict_problem(schema: Any, context: tuple[str, ...]) -> str | None:
    """Structured Outputs' rule for a strict schema: every object lists all its properties in `required`
    and sets `additionalProperties: false` (OpenAI's message, with the path as `context`)."""
    if not isinstance(schema, dict):
        return None
    props = schema.get("properties")
    if schema.get("type") == "object" or isinstance(props, dict):
        missing = [key for key in props or {} if key not in (schema.get("required") or ())]
        if missing:
            return (f"In context={context}, 'required' is required to be supplied and to be an array including every "
                    f"key in properties. Missing '{missing[0]}'.")
        if schema.get("additionalProperties") is not False:
            return f"In context={context}, 'additionalProperties' is required to be supplied and to be false."
    inner: list[tuple[tuple[str, ...], Any]] = [(("properties", key), sub) for key, sub in (props or {}).items()]
    inner += [(("$defs", key), sub) for key, sub in (schema.get("$defs") or {}).items()]
    inner += [(("anyOf", str(i)), sub) for i, sub in enumerate(schema.get("anyOf") or ())]
    if "items" in schema:
        inner.append((("items",), schema["items"]))
    return next((p for p in (_strict_problem(sub, context + path) for path, sub in inner) if p), None)


def _validate_tools(body: dict[str, Any]) -> wire.Problem | None:
    tools = body.get("tools")
    names: list[str] = []
    if tools is not None:
        if not isinstance(tools, list):
            return "Invalid type for 'tools': expected an array.", "tools", "invalid_type"
        for i, t in enumerate(tools):
            if not isinstance(t, dict):
                return f"Invalid type for 'tools[{i}]': expected an object.", f"tools[{i}]", "invalid_type"
            if t.get("type", "function") == "function":
                fn = t.get("function")
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    return (f"Missing required parameter: 'tools[{i}].function.name'.",
                            f"tools[{i}].function.name", "missing_required_parameter")
                if len(fn["name"]) > FUNCTION_NAME_MAX:
                    return (f"Invalid 'tools[{i}].function.name': string too long. Expected a string with maximum length "
                            f"{FUNCTION_NAME_MAX}, but got a string with length {len(fn['name'])} instead.",
                            f"tools[{i}].function.name", "string_above_max_length")
                problem = _strict_problem(fn.get("parameters"), ()) if fn.get("strict") is True else None
                if problem:
                    return f"Invalid schema for function '{fn['name']}': {problem}", f"tools[{i}].function.parameters", None
                names.append(fn["name"])
    tc = body.get("tool_choice")
    if tc is None:
        return None
    if not tools:
        return ("Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are "
                "specified.", "tool_choice", None)
    fn = tc.get("function") if isinstance(tc, dict) else None
    return wire.check_tool_choice(tc, names, fn.get("name") if isinstance(fn, dict) else None)


# A structured-output request whose last user message says "refuse to answer" is refused, as OpenAI's
# models refuse what they will not answer: `message.refusal` in place of the content, finish_reason stop.
REFUSAL = "I'm sorry, but I can't help with that request."


def _last_user_text(body: dict[str, Any]) -> str:
    msgs = body["messages"]
    start = max((i for i, m in enumerate(msgs) if m.get("role") == "user"), default=-1)
    if start < 0:
        return ""
    c = msgs[start].get("content")
    return c if isinstance(c, str) else " ".join(
        p.get("text", "") for p in c or () if isinstance(p, dict) and p.get("type") == "text")


def pick_tool(body: dict[str, Any]) -> ToolPick | None:
    """`none` never calls, a named function always does, otherwise reply.choose_tool decides."""
    fns = [t["function"] for t in body.get("tools") or ()
           if t.get("type", "function") == "function" and isinstance(t.get("function"), dict)]
    if not fns:
        return None
    by_name = {f["name"]: f.get("parameters") or {"type": "object", "properties": {}} for f in fns}
    tc = body.get("tool_choice") or "auto"
    if tc == "none":
        return None
    if isinstance(tc, dict):
        name = (tc.get("function") or {}).get("name")
        return ToolPick(name, by_name[name], False) if isinstance(name, str) and name in by_name else None
    msgs = body["messages"]
    start = max((i for i, m in enumerate(msgs) if m.get("role") == "user"), default=-1)
    text = _last_user_text(body)
    called = {tc.get("function", {}).get("name") for m in msgs[start + 1:] if m.get("role") == "assistant"
              for tc in m.get("tool_calls") or () if isinstance(tc, dict)}
    after_result = msgs[-1].get("role") == "tool"
    name = choose_tool(list(by_name), tc == "required", text, after_result, called)
    if not name:
        return None
    both = [] if after_result else parallel_names(text, list(by_name), body.get("parallel_tool_calls") is False)
    if both:  # a parallel turn: every function the text names, in the tools' order
        name = both[0]
    return ToolPick(name, by_name[name], False, extra_calls(both, by_name))


def _reasoning(body: dict[str, Any]) -> int:
    """Hidden reasoning tokens, as the Responses endpoint bills them, for a reasoning model asked for an effort
    (`reasoning_effort` sent: a request without one reasons for nothing here, so the many tests that route to
    gpt-5 or o3 keep their counts)."""
    return REASONING_TOKENS.get(body.get("reasoning_effort") or "", 0) if _REASONS.match(body["model"]) else 0


def _usage(plan: CachePlan, out: int, reasoning: int = 0) -> dict[str, Any]:
    """`out` includes the `reasoning` tokens, as OpenAI's completion_tokens do."""
    return {
        "prompt_tokens": plan.total,
        "completion_tokens": out,
        "total_tokens": plan.total + out,
        "prompt_tokens_details": {"cached_tokens": plan.read, "cache_write_tokens": plan.write,
                                  "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": reasoning, "audio_tokens": 0,
                                      "accepted_prediction_tokens": 0,
                                      "rejected_prediction_tokens": 0},
    }


def _absent_file(emu: Emulator, value: Any, key: str) -> str | None:
    """The first `file` part's `file.file_id` that names no file of this key (deleted, or never made)."""
    if isinstance(value, list):
        return next((fid for v in value if (fid := _absent_file(emu, v, key)) is not None), None)
    if not isinstance(value, dict):
        return None
    inner = value.get("file") if value.get("type") == "file" else None
    fid = inner.get("file_id") if isinstance(inner, dict) else None
    if isinstance(fid, str):
        return fid if emu.state.files.get(fid, key) is None else None
    return _absent_file(emu, value.get("content"), key)


async def chat_completions(emu: Emulator, call: Call) -> None:
    req = await wire.begin(emu, call, _validate, openai_generates)
    if req is None:
        return
    body, key, model, stream, faults = req.body, req.key, req.model, req.stream, req.faults
    if (absent := _absent_file(emu, body.get("messages"), key)) is not None:
        await wire.not_found(emu, call, f"No such File object: {absent}", "messages")
        return
    cfg = emu.config
    blob = openai_prompt_blob(body)
    mt = body.get("max_completion_tokens") or body.get("max_tokens")
    if await wire.over_the_minute(emu, call, key, model, len(blob) // 4 + (mt or 0)):
        return
    window = context_window(model, cfg.context_windows)
    if window is not None and len(blob) // 4 > window:
        await wire.bad(emu, call, f"This model's maximum context length is {window} tokens. However, your messages "
                       f"resulted in {len(blob) // 4} tokens. Please reduce the length of the messages.", "messages",
                       "context_length_exceeded")
        return
    scope = f"{key}\x00{model}\x00{body.get('prompt_cache_key') or ''}"
    plan = plan_openai(emu.state.openai_cache, blob, scope, call.start, cfg.openai_cache_ttl_s, bills_cache_writes(model))
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else (stop or [])
    natural = emu.natural_length(call)
    seed = seed_for(model, body["messages"])
    tool = pick_tool(body)
    schema = output_schema(body.get("response_format"))
    replies = [make_reply(choice_seed(seed, i), natural, mt, stops, tool, schema, cut_calls=True)
               for i in range(body.get("n") or 1)]
    top = body.get("top_logprobs") or 0
    refusal = REFUSAL if schema is not None and not tool and "refuse to answer" in _last_user_text(body).lower() else None
    spoken = isinstance(body.get("audio"), dict) and "audio" in (body.get("modalities") or ())
    named = isinstance(body.get("tool_choice"), dict) and body["tool_choice"].get("type") == "function"
    choices = [Choice(i, r, [emu.new_id("call_") for _ in r.calls()],
                      chat_entries(r.text, top) if body.get("logprobs") else None, refusal,
                      emu.new_id("audio_") if spoken and not r.tool_name else "", named,
                      interleaves(_last_user_text(body)))
               for i, r in enumerate(replies)]
    cid = emu.new_id("chatcmpl-")
    created = int(time.time())
    ttft = cfg.ttft_seconds(plan.uncached, plan.read)
    reasoning = _reasoning(body) * len(replies)  # per choice, outside its reply's max_tokens budget (tests size replies by it)
    out_tokens = sum(r.output_tokens for r in replies) + reasoning
    if stream:
        opts = body.get("stream_options") or {}
        head = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                "service_tier": wire.served_tier(body), "system_fingerprint": "fp_emulator"}
        usage = _usage(plan, out_tokens, reasoning) if opts.get("include_usage") else None
        events, tokens = chunks(head, choices, usage, cfg.tokens_per_delta)
        err_ev = b"data: " + orjson.dumps(wire.midstream_error(faults, model)) + b"\n\n"
        headers = wire.headers(call)
        headers.extend(SSE_HEADERS)
        pauses = {len(events) - 2: cfg.usage_delay_ms / 1000.0} if usage is not None and cfg.usage_delay_ms > 0 else None
        await run_stream(emu, call, headers, events, tokens, faults, err_ev, ttft, plan.commit, pauses)
        return
    out = {"id": cid, "object": "chat.completion", "created": created, "model": model,
           "choices": [c.message() for c in choices], "usage": _usage(plan, out_tokens, reasoning),
           "service_tier": wire.served_tier(body), "system_fingerprint": "fp_emulator"}
    headers = wire.headers(call)
    headers.append(JSON_CT)
    delay = ttft + cfg.per_output_token_ms * max(r.output_tokens for r in replies) / 1000.0
    await respond_after(emu, call, delay, 200, orjson.dumps(out), headers, plan.commit)
