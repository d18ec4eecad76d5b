"""Chat Completions answers as Responses API answers: the complete body, and the response object.

The response object echoes the client's request settings as OpenAI's does (the SDKs and agent
frameworks read `tools`, `tool_choice`, `text`, ...) and holds every field the Open Responses
specification requires of one (`completed_at`, `presence_penalty`, `frequency_penalty`, function
tools with `strict`, ...; tests/routing/test_responses_spec.py checks them). Usage is moved field by field, never
estimated: Chat's `prompt_tokens` is Responses' `input_tokens` (both include cached and
cache-written tokens; an Anthropic upstream's three input counts were already summed on the way
to Chat, `bodies.usage_a2o`). `length` ends a response `incomplete` with `max_output_tokens`,
`content_filter` with `content_filter`.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

import orjson

from sdk.routing.translation import client_tools
from sdk.routing.translation.breakpoints import diagnostics
from sdk.routing.translation.compaction import compacting
from sdk.routing.translation.compaction import item as compaction_item
from sdk.routing.translation.namespaces import as_called, flattened, namespaced
from sdk.routing.translation.responses_requests import CUSTOM_INPUT
from sdk.routing.translation.tool_search import offered_tools
from sdk.routing.translation.web_search import ITEMS, annotations_c2r, search_item

_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


def new_id(prefix: str) -> str:
    """An id in OpenAI's style (`resp_…`, `msg_…`, `fc_…`), unique without coordination: 8 hex digits of
    the time, as OpenAI's ids begin, then 160 random bits. Led by the time, the ids a gateway makes are
    stored near each other in the response store's indexes (SQLite's B-trees, which a commit writes a
    page at a time): wholly random, each stored response and output item dirtied a page of its own."""
    return f"{prefix}_{int(time.time()):08x}{secrets.token_hex(20)}"


def usage_c2r(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if not isinstance(usage, dict):
        return None
    prompt = usage.get("prompt_tokens_details") or {}
    completion = usage.get("completion_tokens_details") or {}
    input_tokens, output_tokens = usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": prompt.get("cached_tokens") or 0, "cache_write_tokens": prompt.get("cache_write_tokens") or 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": completion.get("reasoning_tokens") or 0},
        "total_tokens": usage.get("total_tokens") or input_tokens + output_tokens,
    }


def response_object(request: dict[str, Any], response_id: str, model: str, status: str, output: list[dict[str, Any]],
                    usage: dict[str, Any] | None, finish_reason: str | None = None, created_at: int | None = None) -> dict[str, Any]:
    """The Responses API object for `request`'s settings, with `status`, `output` and `usage`."""
    incomplete = _INCOMPLETE.get(finish_reason or "") if status != "in_progress" else None
    if incomplete:
        status = "incomplete"
    text = request.get("text") or {}
    now = int(time.time())
    return {
        "id": response_id, "object": "response", "created_at": created_at or now, "status": status,
        "completed_at": now if status in ("completed", "incomplete") else None,
        "background": False, "error": None,
        "incomplete_details": {"reason": incomplete} if incomplete else None,
        "instructions": request.get("instructions"), "max_output_tokens": request.get("max_output_tokens"),
        "max_tool_calls": request.get("max_tool_calls"), "model": model, "output": output,
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "previous_response_id": request.get("previous_response_id"),
        "prompt_cache_key": request.get("prompt_cache_key"),
        "reasoning": request.get("reasoning") or {"effort": None, "summary": None},
        "safety_identifier": request.get("safety_identifier"), "service_tier": "default",
        "store": request.get("store", True),
        "temperature": request.get("temperature", 1.0),
        "presence_penalty": 0.0, "frequency_penalty": 0.0,  # a Responses request has neither: their defaults
        "text": {"format": text.get("format") or {"type": "text"}, "verbosity": text.get("verbosity", "medium")},
        "tool_choice": request.get("tool_choice", "auto"), "tools": [_echoed(tool) for tool in request.get("tools") or ()],
        "top_logprobs": 0, "top_p": request.get("top_p", 1.0), "truncation": request.get("truncation", "disabled"),
        "usage": usage, "user": request.get("user"), "metadata": request.get("metadata") or {}, **diagnostics(request),
    }


def _echoed(tool: dict[str, Any]) -> dict[str, Any]:
    """A request's function tool as a response echoes it: every field present. `strict` is what was
    sent, else false: a translated upstream does not enforce a schema it was not asked to."""
    if tool.get("type") != "function":
        return tool
    return {"type": "function", "name": tool.get("name"), "description": tool.get("description"),
            "parameters": tool.get("parameters"), "strict": bool(tool.get("strict", False))}


def message_item(item_id: str, text: str, status: str = "completed", refusal: bool = False,
                 annotations: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    part = ({"type": "refusal", "refusal": text} if refusal else
            {"type": "output_text", "text": text, "annotations": annotations or [], "logprobs": []})
    return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": [part]}


def function_call_item(item_id: str, call_id: str, name: str, arguments: str, status: str = "completed") -> dict[str, Any]:
    return {"id": item_id, "type": "function_call", "status": status, "call_id": call_id, "name": name, "arguments": arguments}


def custom_tools(request: dict[str, Any]) -> set[str]:
    """The names of `request`'s custom tools (a client-run tool search's too), which a Chat upstream calls as
    functions of one string."""
    return {str(tool.get("name")) for tool in flattened(offered_tools(request)) if isinstance(tool, dict) and tool.get("type") == "custom"}


def custom_input(arguments: str) -> str:
    """A custom tool call's input: the string of a Chat upstream's call (what was written of it, for a call
    cut by the output limit); the arguments as they are if they hold no such string."""
    text = client_tools.arguments_of(arguments).get(CUSTOM_INPUT)
    return text if isinstance(text, str) else arguments


def custom_call_item(item_id: str, call_id: str, name: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {"id": item_id, "type": "custom_tool_call", "status": status, "call_id": call_id, "name": name, "input": text}


def completion_c2r(request: dict[str, Any], response_id: str, body: bytes) -> bytes:
    """An OpenAI chat.completion as the Responses API object answering `request`."""
    data = orjson.loads(body)
    choice = (data.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    # Claude's web searches, each a web_search_call item before the message, as OpenAI's answer has them (web_search.py)
    output: list[dict[str, Any]] = [search_item(search, new_id("ws")) for search in message.get(ITEMS) or ()]
    if compacting(request):  # the summary is the one compaction item (compaction.py)
        output.append(compaction_item(new_id("cmp"), message.get("content") or ""))
    elif message.get("content"):  # with the url_citation annotations of a web search (web_search.py)
        output.append(message_item(new_id("msg"), message["content"], annotations=annotations_c2r(message)))
    elif message.get("refusal"):
        output.append(message_item(new_id("msg"), message["refusal"], refusal=True))
    custom, names, builtin = custom_tools(request), namespaced(request), client_tools.run_by_client(request)
    for call in () if compacting(request) else message.get("tool_calls") or ():
        function = call.get("function") or {}
        name, call_id, arguments = function.get("name") or "", call.get("id") or new_id("call"), function.get("arguments") or "{}"
        if name in builtin:  # a built-in tool the client runs: its own call item (client_tools.py)
            output.append(client_tools.call_item(builtin[name], new_id("ctc"), call_id, client_tools.arguments_of(arguments)))
            continue
        output.append(as_called(custom_call_item(new_id("ctc"), call_id, name, custom_input(arguments)) if name in custom
                                else function_call_item(new_id("fc"), call_id, name, arguments), names))
    finish = choice.get("finish_reason")
    return orjson.dumps(response_object(request, response_id, data.get("model") or request.get("model") or "", "completed",
                                        output, usage_c2r(data.get("usage")), finish, data.get("created")))
