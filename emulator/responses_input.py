"""Responses API request side: OpenAI's 400s, input items with ids, and the
Chat Completions view of the conversation.

The chat view is what prompt caching, token counting, tool choice and reply seeding work on, so
a conversation costs and caches the same whether it arrives as Chat Completions or Responses
(same model, same rendered prompt).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .openai_wire import SAMPLING, Problem, check_int, check_ranges, check_tool_choice

MESSAGE_ROLES = ("user", "assistant", "system", "developer")
_TEXT_PARTS = ("input_text", "output_text", "refusal", "summary_text", "reasoning_text")
_PART_TYPES = (*_TEXT_PARTS, "input_image", "input_file", "input_audio")
_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
# Items the emulator keeps in the conversation but never produces itself.
_PASSIVE_ITEMS = ("web_search_call", "file_search_call", "computer_call", "computer_call_output",
                  "image_generation_call", "code_interpreter_call", "local_shell_call",
                  "local_shell_call_output", "shell_call", "shell_call_output", "mcp_call",
                  "mcp_list_tools", "mcp_approval_request", "mcp_approval_response",
                  "custom_tool_call", "custom_tool_call_output", "apply_patch_call",
                  "apply_patch_call_output", "compaction")


def _type_name(v: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(v), type(v).__name__)


def validate(body: dict[str, Any], count_only: bool = False) -> Problem | None:
    """(message, param, code) of the first problem, or None."""
    model = body.get("model")
    if model is None and not count_only:
        return "Missing required parameter: 'model'.", "model", "missing_required_parameter"
    if model is not None and (not isinstance(model, str) or not model):
        return f"Invalid type for 'model': expected a string, but got {_type_name(model)} instead.", \
            "model", "invalid_type"
    inp = body.get("input")
    if inp is None and not body.get("previous_response_id") and not count_only:
        return "Missing required parameter: 'input'.", "input", "missing_required_parameter"
    if inp is not None and not isinstance(inp, (str, list)):
        return ("Invalid type for 'input': expected one of a string or array of input items, but got "
                f"{_type_name(inp)} instead.", "input", "invalid_type")
    if isinstance(inp, list):
        for i, item in enumerate(inp):
            p = _validate_item(item, f"input[{i}]")
            if p:
                return p
    for name, typ in (("instructions", str), ("previous_response_id", str), ("stream", bool),
                      ("store", bool), ("parallel_tool_calls", bool), ("prompt_cache_key", str)):
        v = body.get(name)
        if v is not None and not isinstance(v, typ):
            return (f"Invalid type for '{name}': expected a {_type_name(typ())}, but got "
                    f"{_type_name(v)} instead.", name, "invalid_type")
    for name in ("include", "metadata"):
        v = body.get(name)
        if v is not None and not (isinstance(v, list) and all(isinstance(x, str) for x in v)
                                  if name == "include" else isinstance(v, dict)):
            want = "an array of strings" if name == "include" else "an object"
            return f"Invalid type for '{name}': expected {want}, but got {_type_name(v)} instead.", \
                name, "invalid_type"
    if body.get("background"):
        return ("The emulator does not run background responses; send background=false.",
                "background", "unsupported_value")
    r = check_ranges(body, *SAMPLING) or check_int(body, "max_output_tokens", 16) \
        or check_int(body, "top_logprobs", 0)
    if r is None and (body.get("top_logprobs") or 0) > 20:
        r = ("Invalid 'top_logprobs': integer above maximum value. Expected a value <= 20, but got "
             f"{body['top_logprobs']} instead.", "top_logprobs", "integer_above_max_value")
    if r:
        return r
    return _validate_reasoning(body) or _validate_text(body) or _validate_tools(body)


def _validate_item(item: Any, p: str) -> Problem | None:
    if not isinstance(item, dict):
        return f"Invalid type for '{p}': expected an input item, but got {_type_name(item)} instead.", \
            p, "invalid_type"
    typ = item.get("type", "message" if "role" in item else None)
    if typ is None:
        return f"Missing required parameter: '{p}.type'.", f"{p}.type", "missing_required_parameter"
    if typ == "message":
        role = item.get("role")
        if role not in MESSAGE_ROLES:
            return (f"Invalid value: '{role}'. Supported values are: 'user', 'assistant', 'system', "
                    "and 'developer'.", f"{p}.role", "invalid_value")
        content = item.get("content")
        if isinstance(content, str):
            return None
        if not isinstance(content, list):
            return (f"Invalid type for '{p}.content': expected one of a string or array of input "
                    f"content parts, but got {_type_name(content)} instead.", f"{p}.content",
                    "invalid_type")
        for j, part in enumerate(content):
            pp = f"{p}.content[{j}]"
            if not isinstance(part, dict) or part.get("type") not in _PART_TYPES:
                got = part.get("type") if isinstance(part, dict) else _type_name(part)
                return (f"Invalid value: '{got}'. Supported values are: 'input_text', 'input_image', "
                        "'input_file', 'output_text' and 'refusal'.", f"{pp}.type", "invalid_value")
            if part["type"] in _TEXT_PARTS and not isinstance(part.get("text", part.get("refusal")), str):
                return f"Missing required parameter: '{pp}.text'.", f"{pp}.text", \
                    "missing_required_parameter"
        return None
    required: tuple[str, ...]
    if typ == "function_call":
        required = ("call_id", "name", "arguments")
    elif typ == "function_call_output":
        required = ("call_id", "output")
    elif typ == "reasoning":
        required = ("summary",)
    elif typ == "item_reference":
        return ("The emulator does not resolve item references; send the item itself.",
                f"{p}.type", "unsupported_value")
    elif typ in _PASSIVE_ITEMS:
        return None
    else:
        return f"Invalid value: '{typ}'. Unknown input item type.", f"{p}.type", "invalid_value"
    for k in required:
        if k not in item:
            return f"Missing required parameter: '{p}.{k}'.", f"{p}.{k}", "missing_required_parameter"
    for k in ("call_id", "name", "arguments"):
        if k in item and not isinstance(item[k], str):
            return (f"Invalid type for '{p}.{k}': expected a string, but got "
                    f"{_type_name(item[k])} instead.", f"{p}.{k}", "invalid_type")
    if typ == "function_call_output" and not isinstance(item["output"], (str, list)):
        return (f"Invalid type for '{p}.output': expected one of a string or array of content "
                f"parts, but got {_type_name(item['output'])} instead.", f"{p}.output", "invalid_type")
    return None


def _validate_reasoning(body: dict[str, Any]) -> Problem | None:
    r = body.get("reasoning")
    if r is None:
        return None
    if not isinstance(r, dict):
        return "Invalid type for 'reasoning': expected an object.", "reasoning", "invalid_type"
    effort = r.get("effort")
    if effort is not None and effort not in _EFFORTS:
        return (f"Invalid value: '{effort}'. Supported values are: 'none', 'minimal', 'low', "
                "'medium', 'high', and 'xhigh'.", "reasoning.effort", "invalid_value")
    return None


def _validate_text(body: dict[str, Any]) -> Problem | None:
    text = body.get("text")
    if text is None:
        return None
    if not isinstance(text, dict):
        return "Invalid type for 'text': expected an object.", "text", "invalid_type"
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_schema", "json_object"):
        got = fmt.get("type") if isinstance(fmt, dict) else fmt
        return (f"Invalid value: '{got}'. Supported values are: 'text', 'json_schema', and "
                "'json_object'.", "text.format.type", "invalid_value")
    if fmt["type"] == "json_schema":
        if not isinstance(fmt.get("name"), str) or not fmt["name"]:
            return "Missing required parameter: 'text.format.name'.", "text.format.name", \
                "missing_required_parameter"
        if not isinstance(fmt.get("schema"), dict):
            return "Missing required parameter: 'text.format.schema'.", "text.format.schema", \
                "missing_required_parameter"
    return None


def _validate_tools(body: dict[str, Any]) -> Problem | None:
    tools = body.get("tools")
    names: list[str] = []
    if tools is not None:
        if not isinstance(tools, list):
            return "Invalid type for 'tools': expected an array.", "tools", "invalid_type"
        for i, t in enumerate(tools):
            if not isinstance(t, dict) or not isinstance(t.get("type"), str):
                return f"Missing required parameter: 'tools[{i}].type'.", f"tools[{i}].type", \
                    "missing_required_parameter"
            if t["type"] == "function":
                if not isinstance(t.get("name"), str) or not t["name"]:
                    return f"Missing required parameter: 'tools[{i}].name'.", f"tools[{i}].name", \
                        "missing_required_parameter"
                names.append(t["name"])
    tc = body.get("tool_choice")
    if tc is None:
        return None
    return check_tool_choice(tc, names, tc.get("name") if isinstance(tc, dict) else None)


# --- normalisation ---------------------------------------------------------------------------


def input_items(raw: Any, new_id: Callable[[str], str]) -> list[dict[str, Any]]:
    """The request's input as stored items: typed, with ids, string content as parts."""
    if raw is None:
        return []
    if isinstance(raw, str):
        raw = [{"role": "user", "content": raw}]
    out = []
    for item in raw:
        it = dict(item)
        typ = it.setdefault("type", "message")
        if typ == "message":
            c = it.get("content")
            if isinstance(c, str):
                kind = "output_text" if it["role"] == "assistant" else "input_text"
                part: dict[str, Any] = {"type": kind, "text": c}
                if kind == "output_text":
                    part["annotations"] = []
                it["content"] = [part]
            it.setdefault("status", "completed")
            it.setdefault("id", new_id("msg_"))
        elif typ == "function_call_output":
            it.setdefault("status", "completed")
            it.setdefault("id", new_id("fco_"))
        elif typ == "function_call":
            it.setdefault("status", "completed")
            it.setdefault("id", new_id("fc_"))
        out.append(it)
    return out


def _chat_part(part: dict[str, Any]) -> dict[str, Any]:
    t = part.get("type")
    if t in _TEXT_PARTS:
        return {"type": "text", "text": part.get("text", part.get("refusal", ""))}
    if t == "input_image":
        return {"type": "image_url", "image_url": {"url": part.get("image_url") or part.get("file_id")}}
    return part


def chat_view(body: dict[str, Any], items: list[dict[str, Any]]) -> dict[str, Any]:
    """The Chat Completions body this Responses request amounts to (messages, tools, formats)."""
    msgs: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str):
        msgs.append({"role": "developer", "content": body["instructions"]})
    for it in items:
        typ = it.get("type")
        if typ == "message":
            msgs.append({"role": it["role"], "content": [_chat_part(p) for p in it["content"]]})
        elif typ == "function_call":
            msgs.append({"role": "assistant", "content": None, "tool_calls": [{
                "id": it["call_id"], "type": "function",
                "function": {"name": it["name"], "arguments": it["arguments"]}}]})
        elif typ == "function_call_output":
            out = it["output"]
            content = out if isinstance(out, str) else [_chat_part(p) for p in out if isinstance(p, dict)]
            msgs.append({"role": "tool", "tool_call_id": it["call_id"], "content": content})
        # Earlier turns' reasoning is dropped from the prompt, as OpenAI does between turns.
    view: dict[str, Any] = {"messages": msgs}
    tools = []
    for t in body.get("tools") or ():
        if t.get("type") == "function":
            fn = {k: t[k] for k in ("name", "description", "parameters", "strict") if k in t}
            tools.append({"type": "function", "function": fn})
        else:
            tools.append(t)
    if tools:
        view["tools"] = tools
    tc = body.get("tool_choice")
    if isinstance(tc, dict):
        tc = ({"type": "function", "function": {"name": tc.get("name")}}
              if tc.get("type") == "function" else "auto")
    if tc is not None and tools:
        view["tool_choice"] = tc
    if body.get("parallel_tool_calls") is False:  # one call a turn (parallel.py)
        view["parallel_tool_calls"] = False
    fmt = (body.get("text") or {}).get("format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        view["response_format"] = {"type": "json_schema", "json_schema": {
            k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}}
    elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
        view["response_format"] = {"type": "json_object"}
    return view
