"""Anthropic Messages API: POST /v1/messages (+ ?beta=true) and /v1/messages/count_tokens.

Wire format per reference B.1-B.7; caching per A.4-A.11 (see caching.py).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import orjson

from . import anthropic_wire as wire
from .anthropic_stream import STOP_REASONS, content_blocks, plan_thinking, sse, stream_events
from .anthropic_wire import ERROR_MESSAGES
from .asgi import JSON_CT, SSE_HEADERS, Call
from .caching import CacheError, CachePlan, count_input_tokens, plan_anthropic
from .message_state import continued, diagnosed
from .models import anthropic_generates, anthropic_max_output, context_window
from .parallel import extra_calls, parallel_names
from .reply import ToolPick, choose_tool, make_reply, output_schema
from .streaming import respond_after, run_stream
from .text import seed_for
from .web_search import PAUSED_OUTPUT_TOKENS, pauses, resumes_paused_turn, searched, tool_problem, web_search_tool
from .web_search import VERSIONS as WEB_SEARCH_VERSIONS

if TYPE_CHECKING:
    from .app import Emulator

_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")
_TOOL_ID = re.compile(r"^[a-zA-Z0-9_-]+$")  # tool_use.id and tool_result.tool_use_id
# Models that still take `temperature` and `top_p` together (Claude Opus 4.1 and every later model refuse both).
# Models that do not take mid-conversation system messages (`role: "system"` in `messages`: Fable 5, Mythos 5,
# Opus 4.8 and Opus 5 do); names not listed take them here. The message paraphrases the API's.
_NO_SYSTEM_MESSAGES = re.compile(r"^claude-(3|(opus|sonnet|haiku)-4(-[0-7]|-2025|$)|sonnet-5)")
_FIXED_SAMPLING = re.compile(r"^claude-(opus-4-[78]|sonnet-5)")
_BOTH_SAMPLERS = re.compile(r"^claude-(instant|2|3)|^claude-(opus|sonnet)-4(-0|-2025|$)")

def _validate(body: dict[str, Any], count_only: bool) -> str | None:
    """First validation error, with the API's `path: message` style, or None."""
    model = body.get("model")
    if model is None:
        return "model: Field required"
    if not isinstance(model, str) or not model:
        return "model: Input should be a valid string"
    mt = body.get("max_tokens")
    if not count_only:
        if mt is None:
            return "max_tokens: Field required"
        if not isinstance(mt, int) or isinstance(mt, bool):
            return "max_tokens: Input should be a valid integer"
        if mt < 0:
            return "max_tokens: Input should be greater than or equal to 0"
        most = anthropic_max_output(model)
        if most is not None and mt > most:
            return f"max_tokens: {mt} > {most}, which is the maximum allowed number of output tokens for {model}"
    msgs = body.get("messages")
    if msgs is None:
        return "messages: Field required"
    if not isinstance(msgs, list):
        return "messages: Input should be a valid list"
    if not msgs:
        return "messages: at least one message is required"
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            return f"messages.{i}: Input should be a valid dictionary"
        if m.get("role") not in ("user", "assistant", "system"):
            return f"messages.{i}.role: Input should be 'user' or 'assistant'"
        if m["role"] == "system" and _NO_SYSTEM_MESSAGES.match(model):
            return f"messages.{i}.role: system messages are not supported by {model}; put instructions in `system`"
        if "content" not in m:
            return f"messages.{i}.content: Field required"
        c = m["content"]
        if not isinstance(c, (str, list)):
            return f"messages.{i}.content: Input should be a valid string or a valid list"
        if not c and not (i == len(msgs) - 1 and m["role"] == "assistant"):
            return (f"messages.{i}: all messages must have non-empty content except for the "
                    "optional final assistant message")
        if isinstance(c, list):
            for j, b in enumerate(c):
                err = _validate_block(b, f"messages.{i}.content.{j}") or _blank_text(b)
                if err:
                    return err
    system = body.get("system")
    if system is not None and not isinstance(system, str):
        if not isinstance(system, list):
            return "system: Input should be a valid string or a valid list"
        for j, b in enumerate(system):
            if not isinstance(b, dict) or b.get("type") != "text" or not isinstance(b.get("text"), str):
                return f"system.{j}: Input should be a text block"
    for name, hi in (("temperature", 1), ("top_p", 1)):
        v = body.get(name)
        if v is not None:
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                return f"{name}: Input should be a valid number"
            if v < 0:
                return f"{name}: Input should be greater than or equal to 0"
            if v > hi:
                return f"{name}: Input should be less than or equal to {hi}"
    if _FIXED_SAMPLING.match(model):  # Opus 4.7, 4.8, Sonnet 5: temperature only at its default, no top_p or top_k
        for name in ("temperature", "top_p", "top_k"):
            if body.get(name) is not None and not (name == "temperature" and body[name] == 1):
                return f"`{name}` is deprecated for this model."
    if body.get("temperature") is not None and body.get("top_p") is not None and not _BOTH_SAMPLERS.match(model):
        return "`temperature` and `top_p` cannot both be specified for this model. Please use only one."
    if "stream" in body and not isinstance(body["stream"], bool):
        return "stream: Input should be a valid boolean"
    ss = body.get("stop_sequences")
    if ss is not None and (not isinstance(ss, list) or not all(isinstance(s, str) for s in ss)):
        return "stop_sequences: Input should be a valid list of strings"
    if ss and not all(ss):
        return "stop_sequences: each stop sequence must be non-empty"
    if ss and not all(s.strip() for s in ss):  # "\n" as a stop, which OpenAI's APIs take (litellm#3286)
        return "stop_sequences: each stop sequence must contain non-whitespace"
    return _validate_tools(body, mt, count_only)


def _blank_text(block: dict[str, Any]) -> str | None:
    """Anthropic's 400 for a text block in a message, or in a tool result, that says nothing (one with a cache_control
    marker gets the cache validation's own message: caching.py)."""
    inner = block.get("content") if block.get("type") == "tool_result" else None
    for b in [block, *(inner if isinstance(inner, list) else ())]:
        if (isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str) and not b["text"].strip()
                and b.get("cache_control") is None):
            return ("messages: text content blocks must be non-empty" if not b["text"]
                    else "messages: text content blocks must contain non-whitespace text")
    return None


def _validate_block(b: Any, path: str) -> str | None:
    if not isinstance(b, dict):
        return f"{path}: Input should be a valid dictionary"
    t = b.get("type")
    if not isinstance(t, str):
        return f"{path}.type: Field required"
    if t == "text" and not isinstance(b.get("text"), str):
        return f"{path}.text.text: Field required"
    if t == "tool_use":
        for k in ("id", "name", "input"):
            if k not in b:
                return f"{path}.tool_use.{k}: Field required"
        if not isinstance(b["input"], dict):
            return f"{path}.tool_use.input: Input should be a valid dictionary"
        if not _TOOL_ID.match(str(b["id"])):
            return f"{path}.tool_use.id: String should match pattern '^[a-zA-Z0-9_-]+$'"
    if t == "tool_result":
        if not isinstance(b.get("tool_use_id"), str):
            return f"{path}.tool_result.tool_use_id: Field required"
        if not _TOOL_ID.match(b["tool_use_id"]):
            return f"{path}.tool_result.tool_use_id: String should match pattern '^[a-zA-Z0-9_-]+$'"
    return None


def _validate_tools(body: dict[str, Any], mt: Any, count_only: bool) -> str | None:
    tools = body.get("tools")
    names: list[str] = []
    if tools is not None:
        if not isinstance(tools, list):
            return "tools: Input should be a valid list"
        for i, t in enumerate(tools):
            if not isinstance(t, dict):
                return f"tools.{i}: Input should be a valid dictionary"
            if t.get("type") in (None, "custom"):
                if not isinstance(t.get("name"), str) or not _TOOL_NAME.match(t["name"]):
                    return f"tools.{i}.custom.name: String should match pattern '^[a-zA-Z0-9_-]{{1,128}}$'"
                if not isinstance(t.get("input_schema"), dict):
                    return f"tools.{i}.custom.input_schema: Field required"
                problem = _schema_problem(t["input_schema"], f"tools.{i}.custom.input_schema") if t.get("strict") is True else None
                if problem:
                    return problem
            elif t.get("type") in WEB_SEARCH_VERSIONS and (problem := tool_problem(t, f"tools.{i}")):
                return problem
            if isinstance(t.get("name"), str):
                names.append(t["name"])
    tc = body.get("tool_choice")
    if tc is not None:
        if not isinstance(tc, dict) or tc.get("type") not in ("auto", "any", "tool", "none"):
            return ("tool_choice: Input tag does not match any of the expected tags: "
                    "'auto', 'any', 'tool', 'none'")
        if tc["type"] == "tool":
            if not isinstance(tc.get("name"), str):
                return "tool_choice.tool.name: Field required"
            if tc["name"] not in names:
                return f"Tool '{tc['name']}' not found in provided tools"
        if tc["type"] in ("any", "tool") and not names:
            return "tool_choice may only be specified while providing tools."
    th = body.get("thinking")
    if th is not None:
        if not isinstance(th, dict) or th.get("type") not in ("enabled", "adaptive", "disabled"):
            return ("thinking: Input tag does not match any of the expected tags: "
                    "'enabled', 'adaptive', 'disabled'")
        if th["type"] == "enabled":
            bt = th.get("budget_tokens")
            if not isinstance(bt, int) or bt < 1024:
                return "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"
            if not count_only and isinstance(mt, int) and mt and bt >= mt:
                return "`max_tokens` must be greater than `thinking.budget_tokens`."
        if th.get("display") not in (None, "summarized", "omitted"):
            return "thinking.display: Input should be 'summarized' or 'omitted'"
        if th["type"] != "disabled" and isinstance(tc, dict) and tc.get("type") in ("any", "tool"):
            return "Thinking may not be enabled when tool_choice forces tool use."
        if th["type"] == "enabled" and not count_only:
            err = _unthought_turn(body["messages"])
            if err:
                return err
    oc = body.get("output_config")
    if oc is not None:
        err = _validate_output_config(oc, str(body.get("model")))
        if err:
            return err
    if not count_only and mt == 0:
        if body.get("stream"):
            return "max_tokens: 0 is not supported with stream=true"
        if isinstance(th, dict) and th.get("type") == "enabled":
            return "max_tokens: 0 is not supported with extended thinking"
        if isinstance(tc, dict) and tc.get("type") in ("any", "tool"):
            return "max_tokens: 0 is not supported with tool_choice of type 'any' or 'tool'"
        if isinstance(oc, dict) and oc.get("format") is not None:
            return "max_tokens: 0 is not supported with output_config.format"
    return None


# output_config.effort by model (Anthropic's effort docs): Opus 4.5 low to high; Opus and Sonnet 4.6 max as
# well; Opus 4.7 and later and the 5 models xhigh too; Sonnet 4.5, Haiku 4.5 and the models before take
# none. Names not listed take every level here. The messages paraphrase the API's.
_EFFORTS = ((re.compile(r"^claude-(opus-4-[78]|opus-5|sonnet-5|fable|mythos)"), ("low", "medium", "high", "xhigh", "max")),
            (re.compile(r"^claude-(opus|sonnet)-4-6"), ("low", "medium", "high", "max")),
            (re.compile(r"^claude-opus-4-5"), ("low", "medium", "high")),
            (re.compile(r"^claude-(sonnet-4-5|haiku-4-5|opus-4(-0|-1|-2025|$)|sonnet-4(-0|-2025|$)|3)"), ()))


def _validate_output_config(oc: Any, model: str) -> str | None:
    if not isinstance(oc, dict):
        return "output_config: Input should be a valid dictionary"
    if oc.get("effort") not in (None, "low", "medium", "high", "xhigh", "max"):
        return "output_config.effort: Input should be 'low', 'medium', 'high', 'xhigh' or 'max'"
    levels = next((levels for pattern, levels in _EFFORTS if pattern.match(model)), None)
    if oc.get("effort") is not None and levels is not None and oc["effort"] not in levels:
        return (f"output_config.effort: '{oc['effort']}' is not supported by {model}" if levels
                else f"output_config.effort: the effort parameter is not supported by {model}")
    fmt = oc.get("format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "json_schema"
                            or not isinstance(fmt.get("schema"), dict)):
        return "output_config.format: Input should be {'type': 'json_schema', 'schema': {...}}"
    return _schema_problem(fmt["schema"], "output_config.format.schema") if fmt is not None else None


# What structured outputs refuse in a schema (Anthropic's structured-outputs docs, "JSON Schema limitations"):
# an object without `additionalProperties: false`, numeric, string-length and object-size constraints,
# and array sizes other than `minItems` 0 or 1. The messages paraphrase the API's.
_NOT_SUPPORTED = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minLength", "maxLength",
                  "maxItems", "minProperties", "maxProperties")


def _schema_problem(schema: Any, where: str) -> str | None:
    """What structured outputs (and strict tools, held to the same subset) refuse in `schema`, or None."""
    if not isinstance(schema, dict):
        return None
    if (schema.get("type") == "object" or "properties" in schema) and schema.get("additionalProperties") is not False:
        return f"{where}: For 'object' type, 'additionalProperties' must be explicitly set to false"
    for key in _NOT_SUPPORTED:
        if key in schema or (key == "maxItems" and schema.get("minItems", 0) not in (0, 1)):
            return f"{where}: For '{schema.get('type')}' type, property '{key if key in schema else 'minItems'}' is not supported"
    inner = [*(schema.get("properties") or {}).values(), *(schema.get("$defs") or {}).values(), schema.get("items"),
             *(schema.get("anyOf") or ()), *(schema.get("allOf") or ())]
    return next((problem for problem in (_schema_problem(sub, where) for sub in inner) if problem), None)


def _turn(messages: list[dict[str, Any]]) -> tuple[str, bool, set[str]]:
    """(text of the user's last own message, whether the conversation ends with tool results,
    tools called since that message). A user message made only of tool_results is not 'own'."""
    def blocks(m: dict[str, Any]) -> list[dict[str, Any]]:
        c = m.get("content")
        return [b for b in c if isinstance(b, dict)] if isinstance(c, list) else []

    last = messages[-1] if messages else {}
    after_result = last.get("role") == "user" and any(b.get("type") == "tool_result" for b in blocks(last))
    called: set[str] = set()
    for m in reversed(messages):
        bs = blocks(m)
        if m.get("role") == "assistant":
            called.update(b.get("name", "") for b in bs if b.get("type") == "tool_use")
        elif m.get("role") == "user" and (isinstance(m.get("content"), str)
                                         or any(b.get("type") != "tool_result" for b in bs)):
            c = m["content"]
            text = c if isinstance(c, str) else "\n".join(b.get("text", "") for b in bs if b.get("type") == "text")
            return text, after_result, called
    return "", after_result, called


def _unthought_turn(messages: list[dict[str, Any]]) -> str | None:
    """With thinking enabled, a conversation in a tool loop (ending with tool results) must send back the
    thinking block that opened the assistant's turn: the first assistant message after the user's last own
    message starts with it (Anthropic's extended-thinking docs, "Preserving thinking blocks"; the message is the API's)."""
    last = messages[-1]
    content = last.get("content")
    if last.get("role") != "user" or not isinstance(content, list) or not any(
            isinstance(b, dict) and b.get("type") == "tool_result" for b in content):
        return None
    first: int | None = None
    for i in range(len(messages) - 2, -1, -1):
        m, c = messages[i], messages[i].get("content")
        if m.get("role") == "assistant":
            first = i
        elif isinstance(c, str) or any(isinstance(b, dict) and b.get("type") != "tool_result" for b in c or ()):
            break  # the user's last own message: the turn began after it
    opening = messages[first].get("content") if first is not None else None
    kind = (opening[0].get("type") if isinstance(opening, list) and opening and isinstance(opening[0], dict)
            else "text")
    if first is None or kind in ("thinking", "redacted_thinking"):
        return None
    return (f"messages.{first}.content.0.type: Expected `thinking` or `redacted_thinking`, but found `{kind}`. "
            "When `thinking` is enabled, a final `assistant` message must start with a thinking block (preceeding "
            "the lastmost set of `tool_use` and `tool_result` blocks). We recommend you include thinking blocks "
            "from previous turns. To avoid this requirement, disable `thinking`. Please consult our documentation "
            "at https://docs.claude.com/en/docs/build-with-claude/extended-thinking")


def _pick_tool(body: dict[str, Any]) -> ToolPick | None:
    """`none` never calls, `tool` always calls that tool, otherwise reply.choose_tool decides.
    Auto calls are preceded by a short text block, as Claude's are."""
    tools = [t for t in body.get("tools") or () if isinstance(t.get("input_schema"), dict)]
    if not tools:
        return None
    tc = body.get("tool_choice") or {"type": "auto"}
    kind = tc.get("type")
    if kind == "none":
        return None
    by_name = {t["name"]: t for t in tools}
    if kind == "tool":
        return ToolPick(tc["name"], by_name[tc["name"]]["input_schema"], False)
    text, after_result, called = _turn(body["messages"])
    name = choose_tool(list(by_name), kind == "any", text, after_result, called)
    if not name:
        return None
    schemas = {n: t["input_schema"] for n, t in by_name.items()}
    both = [] if after_result else parallel_names(text, list(by_name), tc.get("disable_parallel_tool_use") is True)
    if both:  # a parallel turn: every tool the text names, in the tools' order
        name = both[0]
    return ToolPick(name, schemas[name], kind != "any", extra_calls(both, schemas))


def _usage(plan: CachePlan, output_tokens: int, body: dict[str, Any]) -> dict[str, Any]:
    """The answer's usage; `inference_geo` says where it ran: `us` when the request asked (billed 1.1x), else `global`."""
    return {
        "input_tokens": plan.input_tokens,
        "cache_creation_input_tokens": plan.write,
        "cache_read_input_tokens": plan.read,
        "cache_creation": {"ephemeral_5m_input_tokens": plan.write_5m,
                           "ephemeral_1h_input_tokens": plan.write_1h},
        "output_tokens": output_tokens,
        "service_tier": "standard",
        "inference_geo": "us" if body.get("inference_geo") == "us" else "global",
    }


async def messages(emu: Emulator, call: Call) -> None:
    pre = await wire.preamble(emu, call)
    if pre is None:
        return
    body, key = pre  # the key scopes the prompt cache (one workspace per key)
    model = body.get("model")
    stream = body.get("stream") is True
    handled, faults = await wire.pre_faults(emu, call, model, stream)
    if handled:
        return
    err = _validate(body, count_only=False)
    if err:
        await wire.error(emu, call, 400, err)
        return
    model = str(model)  # _validate refused a body without one
    if not anthropic_generates(model):
        await wire.error(emu, call, 404, f"model: {model}")
        return
    thread = body.get("thread") if isinstance(body.get("thread"), dict) else None
    if thread is not None and thread.get("type") == "continue":  # the new turn after the conversation the Thread holds
        held = continued(emu, key, thread)
        if isinstance(held, str):
            await _thread_refused(emu, call, thread.get("previous_message_id"), held)
            return
        body = {**body, "messages": held + body["messages"]}
    cfg = emu.config
    window, prompt = context_window(model, cfg.context_windows), count_input_tokens(body)
    if window is not None and prompt > window:
        await wire.error(emu, call, 400, f"prompt is too long: {prompt} tokens > {window} maximum")
        return
    try:
        plan = plan_anthropic(emu.state.anthropic_cache, body, key, model, call.start,
                              cfg.cache_lookback, cfg.max_breakpoints)
    except CacheError as e:
        await wire.error(emu, call, 400, str(e))
        return
    seed = seed_for(model, body["messages"])
    thinking = plan_thinking(body, seed)
    spent = thinking.tokens if thinking else 0  # thinking counts against max_tokens
    fmt = (body.get("output_config") or {}).get("format")
    schema = fmt["schema"] if fmt else output_schema({"type": "json_object"}) if _asks_for_json(body) else None
    reply = make_reply(seed, emu.natural_length(call), max(0, body["max_tokens"] - spent),
                       body.get("stop_sequences") or [], _pick_tool(body), schema)
    prefill = _prefill(body["messages"])
    if schema is not None and prefill and reply.text.startswith(prefill):  # the answer continues the prefill
        reply.text = reply.text[len(prefill):]
    elif not fmt and schema is not None and reply.stop == "end" and _FENCES_JSON.match(model):
        reply.text = f"```json\n{reply.text}\n```"  # as Claude 4.6+ often answers "JSON and nothing else"
    out_tokens = reply.output_tokens + spent
    tool_ids = [emu.new_id("toolu_") for _ in reply.calls()]
    content, usage = content_blocks(reply, tool_ids, thinking) if body["max_tokens"] else [], _usage(plan, out_tokens, body)
    if spent:  # the thinking within output_tokens (the anthropic SDK's OutputTokensDetails.thinking_tokens)
        usage["output_tokens_details"] = {"thinking_tokens": spent}
    search = web_search_tool(body) if body["max_tokens"] else None
    stop = STOP_REASONS[reply.stop]
    if search is not None and not resumes_paused_turn(body):  # one search before the answer (web_search.py)
        content = searched(body, search, content, emu.new_id("srvtoolu_"))
        usage["server_tool_use"] = {"web_search_requests": 1}
        if pauses(body):  # the turn paused after its search, to be sent back as it is (web_search.py)
            content, stop = content[:2], "pause_turn"
            usage["output_tokens"] = out_tokens = spent + PAUSED_OUTPUT_TOKENS
    out = {"id": emu.new_id("msg_"), "type": "message", "role": "assistant", "model": model, "content": content,
           "stop_reason": stop, "stop_sequence": reply.stop_sequence, "usage": usage}
    if (diagnostics := diagnosed(emu, key, body, str(out["id"]))) is not None:
        out["diagnostics"] = diagnostics
    if thread is not None and content:  # held under the answer's id, for the workspace's key (what one account shares)
        emu.state.threads[(key, str(out["id"]))] = [*body["messages"], {"role": "assistant", "content": content}]
    ttft = cfg.ttft_seconds(plan.uncached, plan.read)
    if stream:
        events, tokens = stream_events(out, reply, thinking, _usage(plan, 1, body), cfg.tokens_per_delta)
        err_type = faults.midstream_type if faults else "overloaded_error"
        err_ev = sse("error", {"type": "error", "error": {
            "type": err_type, "message": ERROR_MESSAGES.get(err_type, err_type)}})
        headers = wire.headers(call) + (wire.PRIORITY_HEADERS if cfg.priority_tier else [])
        headers.extend(SSE_HEADERS)
        await run_stream(emu, call, headers, events, tokens, faults, err_ev, ttft, plan.commit)
        return
    headers = wire.headers(call) + (wire.PRIORITY_HEADERS if cfg.priority_tier else [])
    headers.append(JSON_CT)
    delay = ttft + cfg.per_output_token_ms * out_tokens / 1000.0
    await respond_after(emu, call, delay, 200, orjson.dumps(out), headers, plan.commit)


async def _thread_refused(emu: Emulator, call: Call, message_id: Any, code: str) -> None:
    """Anthropic's 404 for a `previous_message_id` no Thread is held under (the SDK's ThreadNotFoundError), or
    its 400 for one already continued (ThreadAlreadyContinuedError)."""
    status, kind, message = ((404, "not_found_error", f"No thread found for message {message_id}") if code == "thread_not_found"
                             else (400, "invalid_request_error", f"Message {message_id} has already been continued"))
    emu.count_status(status)
    await call.json(status, {"type": "error", "request_id": call.request_id,
                             "error": {"type": kind, "message": message, "details": {"error_code": code}}}, wire.headers(call))


# Claude models (4.6 and later) that wrap an answer asked for as JSON by instruction in a ```json code fence.
_FENCES_JSON = re.compile(r"^claude-(opus-4-[678]|sonnet-4-6|sonnet-5|opus-5|fable|mythos)")


def _asks_for_json(body: dict[str, Any]) -> bool:
    """A system prompt that asks for a JSON object (as JSON-mode clients and gateways write one): the
    model follows it, answering the object output_schema gives json_object."""
    system = body.get("system")
    text = system if isinstance(system, str) else " ".join(b.get("text", "") for b in system or () if isinstance(b, dict))
    return "json object" in text.lower()


def _prefill(messages: list[dict[str, Any]]) -> str:
    """The text of a final assistant turn (a prefill the answer continues), or ""."""
    last = messages[-1]
    if last.get("role") != "assistant":
        return ""
    content = last.get("content")
    return content if isinstance(content, str) else "".join(b.get("text", "") for b in content or () if b.get("type") == "text")


async def count_tokens(emu: Emulator, call: Call) -> None:
    pre = await wire.preamble(emu, call)
    if pre is None:
        return
    body = pre[0]
    handled, _ = await wire.pre_faults(emu, call, body.get("model"), False)
    if handled:
        return
    err = _validate(body, count_only=True)
    if err:
        await wire.error(emu, call, 400, err)
        return
    if not anthropic_generates(body["model"]):
        await wire.error(emu, call, 404, f"model: {body['model']}")
        return
    await wire.ok(emu, call, {"input_tokens": count_input_tokens(body)})
