"""Responses API request bodies as Chat Completions request bodies.

A Responses request reaches a chat-completions-only upstream (the local engine, vLLM/SGLang, an
OpenAI-compatible server without /responses) as Chat, and an Anthropic upstream as Chat first and
then Messages (`requests.openai_to_anthropic`), so one walk of the Responses fields serves both.

`previous_response_id` and `item_reference` items are resolved before this runs, from the team's
store (sdk/responses/conversation.py): the body here holds the whole conversation. Fields with no faithful Chat counterpart are refused with
`TranslationRefused` naming them; fields that only tune delivery or storage are dropped (the table:
sdk/routing/translation/fields.py).
"""

from __future__ import annotations

from typing import Any

import orjson

from sdk.errors import InvalidRequestError
from sdk.routing.translation import client_tools, compaction, tool_search, web_search
from sdk.routing.translation.breakpoints import BREAKPOINT, breakpoints_travel, chat_options, options_travel, unmarked
from sdk.routing.translation.fields import Shape, check, effort_travels, refuse, retention_travels
from sdk.routing.translation.media import file_text, textual
from sdk.routing.translation.models import reasons
from sdk.routing.translation.namespaces import call_name, flattened
from sdk.routing.translation.output_modes import VERBOSITY, instructed
from sdk.routing.translation.tool_ids import openai_tool_id

_PASSED = ("temperature", "top_p", "parallel_tool_calls", "prompt_cache_key", "safety_identifier", "user")
_CHAT_TARGET = "Chat Completions"  # what refusals name; a Responses target passes the protocol its upstream speaks


def responses_to_chat(body: dict[str, Any], target: str = _CHAT_TARGET, dropped: list[str] | None = None) -> dict[str, Any]:
    """A Responses body as a Chat one for `target`; the fields its check drops are added to `dropped` when given."""
    body = configured(body)
    out: dict[str, Any] = {"model": body.get("model"), "messages": []}
    named = check(Shape.RESPONSES, body, target)  # every field by its meaning: sdk/routing/translation/fields.py
    if dropped is not None:
        dropped += named
    for key in _PASSED:
        if body.get(key) is not None:
            out[key] = body[key]
    retention = body.get("prompt_cache_retention")
    if retention is not None and retention_travels(target, body.get("model"), retention):
        out["prompt_cache_retention"] = retention
    options = chat_options(body.get("prompt_cache_options"))  # (its diagnostics are the answer's: breakpoints.diagnostics)
    if options and options_travel(target, body.get("model")):
        out["prompt_cache_options"] = options
    if body.get("max_output_tokens") is not None:
        out["max_completion_tokens"] = body["max_output_tokens"]
    if body.get("stream"):
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}  # usage must stay exact: response.completed waits for it
    _reasoning(body.get("reasoning"), out, effort_travels(target, body.get("model")))
    _text_format(body.get("text"), out, target)
    instructions = body.get("instructions")
    if instructions and not isinstance(instructions, str):
        raise refuse("'instructions' given as items", target)
    verbosity = out.get("verbosity")
    if verbosity is not None and not (target.startswith("Anthropic") or reasons(body.get("model"))):
        # a Chat model without verbosity (not gpt-5's family: the local engine, gpt-4o) refuses the field:
        # it is asked for in the system prompt, as for Claude (output_modes.VERBOSITY)
        del out["verbosity"]
        if verbosity in VERBOSITY:
            instructions = instructed(instructions or "", VERBOSITY[verbosity])
    if instructions:
        out["messages"].append({"role": "system", "content": instructions})
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    out["messages"] += _messages(items or [], target)
    if not breakpoints_travel(target, body.get("model")):  # a Chat model before gpt-5.6 (fields.py names them dropped)
        unmarked(out["messages"])
    # a namespace's tools as tools of their own (namespaces.py); those a client-run tool search loaded too (tool_search.py)
    tools = list(enumerate(flattened(tool_search.offered_tools(body))))
    for name in client_tools.run_by_client(body):  # the upstream's calls of a built-in client tool go by its name
        if any(isinstance(tool, dict) and tool.get("name") == name for _, tool in tools):
            raise refuse(f"a tool named {name!r} beside the built-in {name} tool", target)
    if target.startswith("Anthropic"):  # web search: Claude's server tool, by way of Chat's web_search_options
        searches = [tool for _, tool in tools if isinstance(tool, dict) and tool.get("type") in web_search.RESPONSES_TOOLS]
        limit = body.get("max_tool_calls")  # built-in calls: the searches, the one built-in tool Claude runs
        if searches and limit != 0:
            out["web_search_options"] = web_search.options_of(searches[0], limit)
        tools = [(i, tool) for i, tool in tools if not any(tool is search for search in searches)]
    if tools:
        out["tools"] = [_tool(tool, f"tools.{i}", target) for i, tool in tools]
    if body.get("tool_choice") is not None:
        out["tool_choice"] = _tool_choice(body["tool_choice"], target)
    if compaction.compacting(body) and out.get("tools"):  # a summary, not a call; the tools stay in the cached prefix
        out["tool_choice"] = "none"
    return out


def configured(body: dict[str, Any]) -> dict[str, Any]:
    """`body` with the settings its `configuration_update` items leave in effect (the last update of each wins, as
    OpenAI applies them to the responses after it): reasoning effort and text format. A Chat or Claude request has
    one configuration, so they apply to the whole of it; the items themselves are left out of the messages."""
    items = body.get("input")
    updates = [item for item in items if isinstance(item, dict) and item.get("type") == "configuration_update"] \
        if isinstance(items, list) else []
    if not updates:
        return body
    body = dict(body)
    for update in updates:
        reasoning, text = update.get("reasoning"), update.get("text")
        if isinstance(reasoning, dict) and "effort" in reasoning:
            body["reasoning"] = {**(body.get("reasoning") or {}), "effort": reasoning["effort"]}
        if isinstance(text, dict) and "format" in text:
            body["text"] = {**(body.get("text") or {}), "format": text["format"]}
    return body


def _reasoning(reasoning: Any, out: dict[str, Any], effort: bool) -> None:
    """`effort` is translated where it travels (fields.py: effort_travels); a `summary` asks for
    reasoning items a translated answer has not, and is dropped (named `reasoning.summary`)."""
    if not reasoning:
        return
    if effort and reasoning.get("effort") is not None:
        out["reasoning_effort"] = reasoning["effort"]


def _text_format(text: Any, out: dict[str, Any], target: str) -> None:
    if not text:
        return
    if text.get("verbosity") is not None:
        out["verbosity"] = text["verbosity"]
    fmt = text.get("format") or {"type": "text"}
    kind = fmt.get("type")
    if kind == "json_schema":
        schema = {"name": fmt.get("name") or "response", "schema": fmt.get("schema") or {}}
        for key in ("strict", "description"):
            if fmt.get(key) is not None:
                schema[key] = fmt[key]
        out["response_format"] = {"type": "json_schema", "json_schema": schema}
    elif kind == "json_object":
        out["response_format"] = {"type": "json_object"}
    elif kind != "text":
        raise refuse(f"text.format {kind!r}", target)


# A custom tool (Codex's freeform `apply_patch`) takes one string; a Chat upstream gets it as a function
# of that string, and its calls come back as custom tool calls (responses_answers.custom_tools).
CUSTOM_INPUT = "input"


def custom_function(tool: dict[str, Any], target: str) -> dict[str, Any]:
    """A custom tool as a function tool taking its string as `input`; a grammar it names goes in the
    description (the upstream cannot enforce it)."""
    description = tool.get("description") or ""
    fmt = tool.get("format") or {}
    if fmt.get("type") == "grammar":
        description += f"\n\nThe input must follow this {fmt.get('syntax', '')} grammar:\n{fmt.get('definition', '')}"
    elif fmt.get("type") not in (None, "text"):
        raise refuse(f"a custom tool's format {fmt.get('type')!r}", target)
    return {"type": "function", "function": {
        "name": tool["name"], "description": description.strip(),
        "parameters": {"type": "object", "properties": {CUSTOM_INPUT: {"type": "string"}}, "required": [CUSTOM_INPUT],
                       "additionalProperties": False}}}


def _tool(tool: dict[str, Any], where: str, target: str) -> dict[str, Any]:
    if tool.get("type") == "custom":
        return custom_function(tool, target)
    found = client_tools.of(tool)  # a built-in tool the client runs (a search the provider runs was left out)
    if found is not None:
        return client_tools.function(tool, found)
    if tool.get("type") != "function":
        raise refuse(f"{where}: the built-in tool {tool.get('type')!r}", target)
    function: dict[str, Any] = {"name": tool["name"], "parameters": tool.get("parameters") or {"type": "object", "properties": {}}}
    if tool.get("description"):
        function["description"] = tool["description"]
    if tool.get("strict") is not None:
        function["strict"] = tool["strict"]
    return {"type": "function", "function": function}


def _tool_choice(choice: Any, target: str) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") in ("function", "custom"):
        return {"type": "function", "function": {"name": choice.get("name")}}
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":  # Chat's own; Claude is sent only these tools
        listed = [t for t in choice.get("tools") or () if isinstance(t, dict)]
        if any(t.get("type") not in ("function", "custom") for t in listed):
            raise refuse("tool_choice 'allowed_tools' of other than function and custom tools", target)
        tools = [{"type": "function", "function": {"name": call_name(t)}} for t in listed]
        return {"type": "allowed_tools", "allowed_tools": {"mode": choice.get("mode", "auto"), "tools": tools}}
    kind = choice.get("type") if isinstance(choice, dict) else choice
    raise refuse(f"tool_choice {kind!r}", target)


_OUTPUTS = ("function_call_output", "custom_tool_call_output", *client_tools.OUTPUTS)  # one turn's results, in a row


def _messages(items: list[Any], target: str) -> list[dict[str, Any]]:
    """Input items in order; function calls join the assistant turn they follow, as Chat requires."""
    out: list[dict[str, Any]] = []
    attached: list[dict[str, Any]] = []  # function outputs' images and files for a Chat model: its tool messages hold text
    for i, item in enumerate(items):
        where = f"input.{i}"
        if not isinstance(item, dict):
            raise refuse(f"{where}: an item that is not an object", target)
        kind = item.get("type", "message")
        if attached and kind not in _OUTPUTS:  # after the outputs of one turn, all of them
            out.append({"role": "user", "content": attached})
            attached = []
        if kind == "message":
            out.append(_message(item, where, target))
        elif kind == compaction.TRIGGER:
            if i != len(items) - 1:
                raise InvalidRequestError(f"{where}: a compaction_trigger must be the last input item")
            out.append({"role": "user", "content": compaction.INSTRUCTION})
        elif kind == "compaction":
            summary = compaction.as_message(item)
            if summary is None:
                raise refuse(f"{where}: a 'compaction' item made by OpenAI (its content is encrypted for OpenAI's models)", target)
            out.append(summary)
        elif (kind in ("tool_search_call", "tool_search_output") and item.get("execution") != "client") or kind == "additional_tools":
            continue  # the tools they add (or a provider-run search would) are offered from the start (tool_search.py)
        elif kind == "configuration_update":
            continue  # its settings are the request's (configured)
        elif kind in ("function_call", "custom_tool_call", *client_tools.CALLS):
            name = client_tools.CALLS[kind].kind if kind in client_tools.CALLS else call_name(item)
            call = {"id": openai_tool_id(item.get("call_id") or ""), "type": "function",
                    "function": {"name": name, "arguments": _arguments(kind, item)}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind in client_tools.OUTPUTS:
            result = client_tools.result_text(client_tools.OUTPUTS[kind], item)
            out.append({"role": "tool", "tool_call_id": openai_tool_id(item.get("call_id") or ""), "content": result})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            text, parts = _output(item.get("output"), where, target)
            if parts and target.startswith("Anthropic"):
                # Claude's tool_result holds a tool's images and documents: the output's parts, in order, go in the
                # tool message, which the Chat step makes that tool_result (requests._o2a_messages)
                text, parts = [_part(part, f"{where}.output.{j}", target) for j, part in enumerate(item["output"])], []
            out.append({"role": "tool", "tool_call_id": openai_tool_id(item["call_id"]), "content": text})
            attached += parts  # a Chat model's tool messages hold text: its images and files follow in a user turn
        elif kind == "reasoning":
            # Reasoning from another model cannot be replayed (OpenAI drops it too on a model mismatch:
            # `input_transformations` reason "model_mismatch"). The visible turns carry the conversation.
            continue
        elif kind == "web_search_call":  # what was searched and found, as text in the assistant's turn (web_search.py)
            out.append({"role": "assistant", "content": web_search.responses_history_text(item)})
        else:
            raise refuse(f"{where}: a {kind!r} item", target)
    if attached:
        out.append({"role": "user", "content": attached})
    return out


def _arguments(kind: str, item: dict[str, Any]) -> str:
    """A history call's arguments as Chat's JSON string: a custom tool's string as `input`, a tool search's object."""
    if kind == "function_call":
        return item.get("arguments") or "{}"
    if kind in client_tools.CALLS:
        return client_tools.history_arguments(client_tools.CALLS[kind], item)
    return orjson.dumps({CUSTOM_INPUT: item["input"]}).decode()


def _message(item: dict[str, Any], where: str, target: str) -> dict[str, Any]:
    role, content = item.get("role"), item.get("content")
    if role not in ("user", "assistant", "system", "developer"):
        raise refuse(f"{where}: role {role!r}", target)
    if isinstance(content, str):
        return {"role": role, "content": content}
    parts = [_part(part, f"{where}.content.{j}", target) for j, part in enumerate(content or ())]
    if role != "user" or all(p["type"] == "text" for p in parts):
        if any(p["type"] != "text" for p in parts):
            raise refuse(f"{where}: an image or file in a {role} message", target)
        return {"role": role, "content": "".join(p["text"] for p in parts) if role == "assistant" else parts}
    return {"role": role, "content": parts}


def _part(part: Any, where: str, target: str) -> dict[str, Any]:
    """A message's (or a function output's) content part as a Chat content part, with its explicit prompt-cache
    breakpoint: Chat's own field (for gpt-5.6 and later), which the Chat step makes Claude's `cache_control`
    (breakpoints.py)."""
    chat = _chat_part(part, where, target)
    if isinstance(part.get(BREAKPOINT), dict):
        chat[BREAKPOINT] = part[BREAKPOINT]
    return chat


def _chat_part(part: Any, where: str, target: str) -> dict[str, Any]:
    kind = part.get("type") if isinstance(part, dict) else "non-object"
    if kind in ("input_text", "output_text"):
        return {"type": "text", "text": part.get("text", "")}
    if kind == "refusal":
        return {"type": "text", "text": part.get("refusal", "")}
    if kind == "input_image" and part.get("image_url"):
        image: dict[str, Any] = {"url": part["image_url"]}
        if part.get("detail") and part["detail"] != "auto":
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    if kind == "input_file" and part.get("file_data"):  # inline, as Chat takes it (file_id: refused)
        text = None if target.startswith("Anthropic") else file_text(part["file_data"], where, target)
        if text is not None:  # a text file, whose text OpenAI gives the model: a Chat model takes files as PDFs only
            return {"type": "text", "text": text}
        named = part.get("filename") or (None if textual(part["file_data"]) else "document.pdf")  # Chat names a PDF
        return {"type": "file", "file": {**({"filename": named} if named else {}), "file_data": part["file_data"]}}
    if kind == "input_file" and part.get("file_url") and target.startswith("Anthropic"):
        # Claude reads a PDF by URL (a document's `url` source); Chat takes files inline only: refused there, below.
        return {"type": "file", "file": {"file_url": part["file_url"]}}
    raise refuse(f"{where}: a {kind!r} part" + (" given by file_id or URL" if kind in ("input_image", "input_file") else ""), target)


def _output(output: Any, where: str, target: str) -> tuple[str | list[dict[str, Any]], list[dict[str, Any]]]:
    """A function call's output: its text (the tool message; one text part holding the last breakpoint of its text
    parts, if they carry one), and its images and files (which follow it)."""
    if isinstance(output, str):
        return output, []
    parts = [_part(part, f"{where}.output.{j}", target) for j, part in enumerate(output or ())]
    texts = [p for p in parts if p["type"] == "text"]
    text = "".join(p["text"] for p in texts)
    marks = [p[BREAKPOINT] for p in texts if BREAKPOINT in p]
    return [{"type": "text", "text": text, BREAKPOINT: marks[-1]}] if marks else text, [p for p in parts if p["type"] != "text"]
