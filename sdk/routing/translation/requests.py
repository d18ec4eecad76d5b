"""Request bodies between the Anthropic Messages and OpenAI Chat Completions dialects.

What becomes of each top-level field (translated, dropped, refused) is the table in
sdk/routing/translation/fields.py; each direction checks the body against it first (a refused field
is a 400 naming it, before anything is sent) and then translates what it keeps. Nested parts that
have no faithful counterpart are refused here, naming where they are.
"""

from __future__ import annotations

from typing import Any

import orjson

from sdk.errors import InvalidRequestError
from sdk.routing.translation import chat_custom, compaction, context_edits, tool_changes
from sdk.routing.translation.a2o_messages import a2o_message, block_text
from sdk.routing.translation.breakpoints import (
    system_parts,
    takes_breakpoints,
    tool_marker,
    with_claude_breakpoints,
)
from sdk.routing.translation.claude_tools import as_custom
from sdk.routing.translation.field_types import Fate
from sdk.routing.translation.fields import THINKING_OFF, Shape, check, fate, one_sampler, refuse
from sdk.routing.translation.media import image_source, o2a_document
from sdk.routing.translation.models import claude_efforts, fixed_sampling, in_place_system, long_retention, reasons, takes_sampling
from sdk.routing.translation.output_limits import WARMING_LIMIT, openai_output_limit
from sdk.routing.translation.output_modes import VERBOSITY, beta_format, claude_schema, instructed, json_mode, openai_strict
from sdk.routing.translation.reasoning import chat_thinking, max_tokens_of, unsampled
from sdk.routing.translation.stops import openai_stops, split_stops
from sdk.routing.translation.tool_ids import claude_tool_id, openai_tool_name
from sdk.routing.translation.tool_search import claude_tool_search
from sdk.routing.translation.web_search import claude_tool

# reasoning_effort values Anthropic's output_config.effort shares; "minimal" is its "low" (the least it has).
_EFFORTS = ("low", "medium", "high", "xhigh")
_O2A_EFFORT = {**{e: e for e in _EFFORTS}, "minimal": "low"}
_A2O_EFFORT = {**{e: e for e in _EFFORTS}, "max": "xhigh"}  # OpenAI's most is xhigh
# thinking.budget_tokens → reasoning_effort: the largest budget each effort stands for (more: high).
_BUDGETS = ((4096, "low"), (16384, "medium"))


def _text_of(blocks: Any, where: str, target: str) -> str:
    """A string, or a list of text blocks/parts, as one string."""
    if isinstance(blocks, str):
        return blocks
    parts = []
    for block in blocks or ():
        if not isinstance(block, dict) or block.get("type") != "text":
            raise refuse(f"{where}: a {block.get('type') if isinstance(block, dict) else type(block).__name__!r} part", target)
        parts.append(block_text(block, where))
    return "\n\n".join(parts)


# --- Anthropic → OpenAI -----------------------------------------------------------------------------

_A2O_TOOL_CHOICE = {"auto": "auto", "any": "required", "none": "none"}
# Messages fields translated apart from the walk of the others, or answered (diagnostics; context_management, whose
# tool-result clearing is applied to the conversation here, and which fields.check refuses where it cannot be: context_edits.py).
_A2O_ELSEWHERE = ("model", "messages", "system", "tools", "tool_choice", "thinking", "diagnostics", "context_management",
                  compaction.SUMMARIZE)


def _one_hour(body: dict[str, Any]) -> bool:
    """Whether a Messages body asks Anthropic to keep a prefix an hour (a `cache_control` with `ttl: "1h"`,
    top-level or on a block), which an OpenAI model with extended retention keeps as `prompt_cache_retention:
    "24h"` (its in-memory retention lasts minutes; 24h is the one that outlasts an hour)."""
    markers = [body.get("cache_control"), *(tool.get("cache_control") for tool in body.get("tools") or () if isinstance(tool, dict))]
    system = body.get("system")
    blocks = [*(system if isinstance(system, list) else ())]
    for message in body.get("messages") or ():
        content = message.get("content") if isinstance(message, dict) else None
        blocks += content if isinstance(content, list) else []
    markers += [block.get("cache_control") for block in blocks if isinstance(block, dict)]
    return any(isinstance(marker, dict) and marker.get("ttl") == "1h" for marker in markers)


def anthropic_to_openai(body: dict[str, Any], edits: context_edits.Edits = context_edits.edited) -> dict[str, Any]:
    """A Messages body as a Chat one; `edits`: how the request's context edits are had (context_edits.Memo)."""
    out: dict[str, Any] = {"model": body.get("model"), "messages": []}
    # (the body itself where TranslatingProvider has done so): as compacted, with the tools in effect (tool_changes.py)
    body = beta_format(tool_changes.applied(compaction.claude_compacted(body)))
    check(Shape.MESSAGES, body, "OpenAI", edits)
    body = edits(body).body  # the conversation as Claude would be sent it, its old tool results cleared
    for key, value in body.items():
        if value is None or key in _A2O_ELSEWHERE or fate(Shape.MESSAGES, key, value) is Fate.DROPPED:
            continue
        if key == "max_tokens":  # 0, Anthropic's cache warming, as OpenAI's least (output_limits.warming)
            out["max_completion_tokens"] = WARMING_LIMIT if value == 0 else openai_output_limit(out["model"], value)
        elif key == "stop_sequences":
            sent = openai_stops(value, out["model"])[0]  # those the model would refuse are the gateway's (stops.py)
            if sent is not None:
                out["stop"] = sent
        elif key in ("temperature", "top_p"):
            if takes_sampling(body):  # a reasoning model samples as it does (fields.py names them dropped)
                out[key] = value
        elif key == "stream":
            out["stream"] = value
            if value:
                out["stream_options"] = {"include_usage": True}  # usage must stay exact
        elif key == "metadata":
            if isinstance(value, dict) and value.get("user_id"):
                # Already the team's digest of the id (sdk/promptcache/keys.py:team_user, applied by the
                # limits stage): 37 characters, within OpenAI's 64 (Claude Code's own ids are ~150).
                out["user"] = str(value["user_id"])
        elif key == "output_config" and isinstance(value, dict):
            _a2o_output_config(value, out)
        else:
            raise refuse(f"{key!r}", "OpenAI")
    if _one_hour(body) and long_retention(out["model"]):
        out["prompt_cache_retention"] = "24h"
    effort = _a2o_effort(body)
    if effort is not None and reasons(out["model"]):  # other models take no reasoning_effort (fields.py names it dropped)
        out["reasoning_effort"] = effort
    elif reasons(out["model"]) and ("temperature" in out or "top_p" in out):
        out["reasoning_effort"] = "none"  # gpt-5.1's family samples at effort none only: said, not left to a default
    system = body.get("system")
    explicit = takes_breakpoints(out["model"])  # gpt-5.6 and later: the client's markers as OpenAI's breakpoints (breakpoints.py)
    if system:
        text = _text_of(system, "system", "OpenAI")
        out["messages"].append({"role": "system", "content": system_parts(system, text) if explicit and isinstance(system, list) else text})
    for i, message in enumerate(body.get("messages") or ()):
        out["messages"].extend(a2o_message(message, f"messages.{i}", explicit))
    if body.get("tools"):  # less a tool search Anthropic runs: an OpenAI model is offered the deferred tools from the start
        out["tools"] = [_a2o_tool(tool, f"tools.{i}") for i, tool in enumerate(body["tools"]) if not claude_tool_search(tool)]
    choice = body.get("tool_choice")
    # Claude takes `auto`/`none` with no tools (they choose among nothing); OpenAI refuses any tool_choice without tools.
    if isinstance(choice, dict) and (body.get("tools") or choice.get("type") not in ("auto", "none")):
        kind = choice.get("type")
        out["tool_choice"] = {"type": "function", "function": {"name": openai_tool_name(choice.get("name"))}} if kind == "tool" else _A2O_TOOL_CHOICE[str(kind)]
        if choice.get("disable_parallel_tool_use") and body.get("tools"):
            out["parallel_tool_calls"] = False
    if body.get(compaction.SUMMARIZE) is not None:  # a compaction request: the summary, asked for (compaction.py)
        compaction.summarize(body, out)
    return out


def refuse_prefill(body: dict[str, Any]) -> None:
    """A Messages conversation that ends with an assistant turn is a prefill: Claude continues that
    text (`{` for JSON, a started sentence), and clients put it back in front of the answer. A Chat
    model answers after such a turn instead, so the client's answer would be mangled: refused."""
    messages = body.get("messages")
    if body.get(compaction.SUMMARIZE) is not None:
        return  # a compaction request's conversation is summarized, not continued: the request asks last (compaction.py)
    if isinstance(messages, list) and messages and isinstance(messages[-1], dict) and messages[-1].get("role") == "assistant":
        raise refuse(f"messages.{len(messages) - 1}: a final assistant turn (a prefill, which Claude continues and a Chat "
                     "model answers after)", "OpenAI")


def _a2o_output_config(config: dict[str, Any], out: dict[str, Any]) -> None:
    if config.get("task_budget") is not None:  # Opus 4.7 and later: a countdown Claude is shown and paces a task by
        raise refuse("output_config.task_budget (a token budget for a whole task, which Claude is told of as it "
                     "goes and an OpenAI model is not)", "OpenAI")
    unknown = sorted(set(config) - {"format", "effort", "task_budget"})
    if unknown:
        raise refuse(f"output_config.{unknown[0]}", "OpenAI")
    fmt = config.get("format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        schema = fmt.get("schema") or {}
        out["response_format"] = {"type": "json_schema", "json_schema": {"name": "response", "schema": schema, "strict": openai_strict(schema)}}
    elif fmt is not None:
        raise refuse(f"output_config.format {fmt.get('type') if isinstance(fmt, dict) else fmt!r}", "OpenAI")


def _a2o_effort(body: dict[str, Any]) -> str | None:
    """The reasoning_effort a Messages request asks for: output_config.effort, else what thinking's
    budget stands for (adaptive thinking: the model's own effort, None)."""
    config, thinking = body.get("output_config"), body.get("thinking")
    effort = config.get("effort") if isinstance(config, dict) else None
    if effort is not None:
        if effort not in _A2O_EFFORT:
            raise refuse(f"output_config.effort {effort!r}", "OpenAI")
        return _A2O_EFFORT[effort]
    if thinking is None:
        return None
    if not isinstance(thinking, dict) or thinking.get("type") not in ("enabled", "adaptive", *THINKING_OFF):
        raise refuse(f"thinking {thinking!r}", "OpenAI")
    if thinking["type"] != "enabled":
        return None
    budget = thinking.get("budget_tokens")
    if not isinstance(budget, int):
        raise InvalidRequestError("thinking.budget_tokens: an integer is required")
    return next((effort for most, effort in _BUDGETS if budget <= most), "high")


def _a2o_tool(tool: dict[str, Any], where: str) -> dict[str, Any]:
    if tool.get("type") not in (None, "custom"):
        defined = as_custom(tool)  # an Anthropic-defined tool the client runs (memory, bash, text editor): its function
        if defined is None:
            raise refuse(f"{where}: server tool {tool.get('type')!r}", "OpenAI")
        tool = defined
    function = {"name": openai_tool_name(tool["name"]), "parameters": tool.get("input_schema") or {"type": "object"}}
    examples = tool.get("input_examples")
    # Claude shows a tool's input examples to the model; an OpenAI function has no place for them but its description.
    shown = "Example inputs:\n" + "\n".join(orjson.dumps(e).decode() for e in examples) if isinstance(examples, list) and examples else ""
    if tool.get("description") or shown:
        function["description"] = "\n\n".join(part for part in (tool.get("description"), shown) if part)
    if tool.get("strict") is not None:  # strict where OpenAI's strict mode takes the schema (output_modes.openai_strict)
        function["strict"] = bool(tool["strict"]) and openai_strict(function["parameters"])
    return {"type": "function", "function": function}


# --- OpenAI → Anthropic -----------------------------------------------------------------------------


# Chat fields translated after the walk of the others (or with the messages; `n`: one request per choice, choices.py).
_O2A_ELSEWHERE = ("model", "messages", "tools", "tool_choice", "parallel_tool_calls", "max_tokens", "max_completion_tokens",
                  "user", "safety_identifier", "stream_options", "response_format", "web_search_options", "n")


def openai_to_anthropic(body: dict[str, Any], checked: bool = False) -> dict[str, Any]:
    """A Chat body as a Messages one; `checked`: `fields.check` has already passed this very body for Anthropic
    (TranslatingProvider, which reports what it drops), so it is not walked again."""
    out: dict[str, Any] = {"model": body.get("model")}
    tool_choice: dict[str, Any] | None = None
    if not checked:
        check(Shape.CHAT, body, "Anthropic")
    if chat_custom.used(body):  # custom tools as functions of one string (chat_custom.py)
        body = chat_custom.as_functions(body)
    thinking = chat_thinking(body)  # reasoning asked of a model that thinks (reasoning.py); no sampling beside it
    unthought = unsampled(body)
    for key, value in body.items():
        if value is None or key in _O2A_ELSEWHERE or fate(Shape.CHAT, key, value) is Fate.DROPPED:
            continue
        if key == "stop":
            sent = split_stops(value)[0]  # whitespace-only stops, which Claude refuses, are the gateway's (stops.py)
            if sent:
                out["stop_sequences"] = sent
        elif (key in ("temperature", "top_p") and fixed_sampling(out["model"])) or (key == "top_p" and one_sampler(body) and thinking is None) or key in unthought:
            continue  # the model samples as it does, or takes temperature or top_p, not both (fields.py names it dropped)
        elif key == "temperature":
            if value is not None and value > 1:
                raise refuse("'temperature' above 1", "Anthropic")
            out["temperature"] = value
        elif key in ("top_p", "stream", "cache_control"):
            out[key] = value
        elif key == "reasoning_effort" and value in _O2A_EFFORT:
            levels = claude_efforts(out["model"])  # none: dropped and named (fields.py)
            if levels:
                out.setdefault("output_config", {})["effort"] = _O2A_EFFORT[value] if _O2A_EFFORT[value] in levels else "high"
        elif key == "verbosity" and value in VERBOSITY:
            continue  # an instruction in the system prompt, below
        else:
            raise refuse(f"{key!r}", "Anthropic")
    out["max_tokens"] = max_tokens_of(body)
    if thinking is not None:
        out["thinking"] = thinking
    user = body.get("user") or body.get("safety_identifier")  # Claude's abuse detection reads metadata.user_id
    if user:
        out["metadata"] = {"user_id": user}
    # OpenAI's explicit breakpoints (prompt_cache_breakpoint) become Claude's cache_control (breakpoints.py)
    system, messages = _o2a_messages(with_claude_breakpoints(body), in_place_system(out["model"]))
    if body.get("verbosity") in VERBOSITY:
        system = instructed(system, VERBOSITY[body["verbosity"]])
    mode = json_mode(body)
    if mode is not None:  # JSON output: structured outputs, or an instruction and a prefill (output_modes.py)
        system, messages = mode.apply(out, system, messages)
    if system:
        out["system"] = system
    out["messages"] = messages
    if body.get("tools"):
        out["tools"] = [_o2a_tool(tool, f"tools.{i}") for i, tool in enumerate(body["tools"])]
        choice = body.get("tool_choice", "auto")
        if choice == "none":
            tool_choice = {"type": "none"}
        elif choice == "required":
            tool_choice = {"type": "any"}
        elif isinstance(choice, dict) and choice.get("type") == "function":
            tool_choice = {"type": "tool", "name": (choice.get("function") or {}).get("name")}
        elif isinstance(choice, dict) and choice.get("type") == "allowed_tools":
            tool_choice, out["tools"] = _allowed(choice.get("allowed_tools"), out["tools"])
        elif isinstance(choice, dict):
            raise refuse(f"tool_choice {choice.get('type')!r}", "Anthropic")
        else:
            tool_choice = {"type": "auto"}
        if body.get("parallel_tool_calls") is False and tool_choice["type"] != "none":
            tool_choice["disable_parallel_tool_use"] = True
        out["tool_choice"] = tool_choice
    if body.get("web_search_options") is not None:  # Claude's web search server tool (web_search.py)
        out.setdefault("tools", []).append(claude_tool(body["web_search_options"]))
    return out


def _allowed(allowed: Any, tools: list[dict[str, Any]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """An allowed_tools choice (the model may call only these; `required`: one of them): Claude has no such choice,
    so it is sent only the allowed tools, with auto or any."""
    listed = allowed.get("tools") if isinstance(allowed, dict) else None
    if not isinstance(listed, list) or any(not isinstance(t, dict) or t.get("type") != "function" for t in listed):
        raise refuse("tool_choice 'allowed_tools' of other than function tools", "Anthropic")
    names = {(t.get("function") or {}).get("name") for t in listed}
    kept = [t for t in tools if t["name"] in names]
    if not kept:
        raise InvalidRequestError("tool_choice.allowed_tools.tools: none of them is a tool of the request")
    return {"type": "any" if allowed.get("mode") == "required" else "auto"}, kept


def _o2a_tool(tool: dict[str, Any], where: str) -> dict[str, Any]:
    if tool.get("type") != "function":
        raise refuse(f"{where}: a {tool.get('type')!r} tool", "Anthropic")
    function = tool["function"]
    out = {"name": function["name"], "input_schema": function.get("parameters") or {"type": "object", "properties": {}}}
    if function.get("description"):
        out["description"] = function["description"]
    if function.get("strict") is not None:
        out["strict"] = function["strict"]
    if function.get("strict") is True:  # Claude's strict tools take structured outputs' subset of JSON Schema
        out["input_schema"] = claude_schema(out["input_schema"])
    marker = tool_marker(tool)
    return {**out, "cache_control": marker} if marker is not None else out


def _o2a_messages(messages: list[dict[str, Any]], in_place: bool) -> tuple[str | list[dict[str, Any]], list[dict[str, Any]]]:
    """The system prompt (text, or text blocks where the client marked breakpoints), and messages with
    consecutive turns of one role merged (tool results join the user turn)."""
    system: list[tuple[str, Any]] = []
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        role, where = message.get("role"), f"messages.{i}"
        if role in ("system", "developer") and not out:
            system += _marked(_o2a_texts(message.get("content"), where), message)
            continue
        if role in ("system", "developer"):
            # Later instructions stay where they are (the cached prefix before them stays valid, where
            # folding them into `system` would rewrite it): a mid-conversation system message for a model
            # that takes one (`in_place`), else, as Claude Code writes them, a system reminder in the user turn.
            blocks = _joined(_marked(_o2a_texts(message.get("content"), where), message))
            role = "system" if in_place else "user"
            if not in_place:
                blocks[0]["text"] = f"<system-reminder>\n{blocks[0]['text']}"
                blocks[-1]["text"] += "\n</system-reminder>"
        elif role == "tool":
            if any(isinstance(part, dict) and part.get("type") in ("image_url", "file") for part in _parts(message)):
                content: Any = _o2a_user(message, where)  # a screenshot, a file a tool returned: Claude's tool_result holds them
            else:
                blocks = _joined(_marked(_o2a_texts(message.get("content"), where), message))
                content = blocks[0]["text"] if len(blocks) == 1 and "cache_control" not in blocks[0] else blocks
            blocks = [{"type": "tool_result", "tool_use_id": claude_tool_id(message["tool_call_id"]), "content": content}]
            role = "user"
        elif role == "assistant":
            blocks = _o2a_assistant(message, where)
            if not blocks:  # an empty turn (a generation stopped before its first word), which OpenAI takes and
                continue    # Claude refuses ("non-empty content"): it says nothing; the turns around it join
        elif role == "user":
            blocks = _o2a_user(message, where)
            if not blocks:  # nothing but empty or blank text, which OpenAI takes and Claude refuses: it says nothing,
                if out and (out[-1]["role"] == "user" or i < len(messages) - 1):  # so the turns around it join;
                    continue
                raise refuse(f"{where}: a user message with no content, first or after the assistant's last turn "  # else
                             "(Claude takes no empty turn, and without it would continue the assistant's turn)", "Anthropic")
        else:
            raise refuse(f"{where}: role {role!r}", "Anthropic")
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    blocks = [block for block in _joined(system) if block["text"]]
    if any("cache_control" in block for block in blocks):
        return blocks, out
    return "".join(block["text"] for block in blocks), out


# A Chat client's prompt-cache breakpoint (`cache_control` on a content part, a message or a tool, as
# LiteLLM and OpenRouter take them) is where it wants Claude's breakpoint: it goes on the block made
# from that part, so the prefix the client chose is the one cached.

def _o2a_texts(content: Any, where: str) -> list[tuple[str, Any]]:
    """A string, or a list of text parts, as (text, cache_control) pairs."""
    if isinstance(content, str):
        return [(content, None)]
    texts = []
    for j, part in enumerate(content or ()):
        if isinstance(part, dict) and part.get("type") == "refusal" and isinstance(part.get("refusal"), str):
            texts.append((part["refusal"], part.get("cache_control")))  # an assistant's echoed refusal: its text
            continue
        if not isinstance(part, dict) or part.get("type") != "text":
            raise refuse(f"{where}: a {part.get('type') if isinstance(part, dict) else type(part).__name__!r} part", "Anthropic")
        texts.append((block_text(part, f"{where}.content.{j}"), part.get("cache_control")))
    return texts


def _parts(message: dict[str, Any]) -> list[Any]:
    content = message.get("content")
    return content if isinstance(content, list) else []


def _marked(texts: list[tuple[str, Any]], message: dict[str, Any]) -> list[tuple[str, Any]]:
    """`texts` with a message-level `cache_control` on its last one."""
    if message.get("cache_control") is not None and texts:
        texts[-1] = (texts[-1][0], message["cache_control"])
    return texts


def _joined(texts: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    """Texts as text blocks, joined by blank lines into one block except after a breakpoint, which ends
    its block (the next block starts with the blank line): the same text with or without markers."""
    blocks: list[dict[str, Any]] = []
    pending: list[str] = []
    for text, cache_control in texts:
        pending.append(text)
        if cache_control is not None:
            blocks.append({"type": "text", "text": "\n\n".join(pending), "cache_control": cache_control})
            pending = [""]
    if pending != [""] or not blocks:
        blocks.append({"type": "text", "text": "\n\n".join(pending)})
    return blocks


def _cached(block: dict[str, Any], source: dict[str, Any]) -> dict[str, Any]:
    """`block` with the `cache_control` of the part or message it was made from."""
    if source.get("cache_control") is not None:
        block["cache_control"] = source["cache_control"]
    return block


def _o2a_assistant(message: dict[str, Any], where: str) -> list[dict[str, Any]]:
    content = message.get("content") or message.get("refusal") or ""  # an echoed refusal is the turn's text
    blocks = [block for block in _joined(_o2a_texts(content, f"{where}.content")) if block["text"].strip()]  # blank: says nothing
    for j, call in enumerate(message.get("tool_calls") or ()):
        function = call.get("function") or {}
        try:
            arguments = orjson.loads(function.get("arguments") or "{}")
        except orjson.JSONDecodeError:
            raise refuse(f"{where}.tool_calls.{j}: arguments that are not JSON", "Anthropic") from None
        blocks.append({"type": "tool_use", "id": claude_tool_id(call["id"]), "name": function["name"], "input": arguments})
    if blocks and message.get("cache_control") is not None:
        _cached(blocks[-1], message)
    return blocks


def _o2a_user(message: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """A user turn's blocks. Empty or blank text, which OpenAI takes and Claude answers with a 400 ("text content
    blocks must be non-empty", "... must contain non-whitespace text"), is left out: it says nothing (its
    breakpoint, if any, goes on the block before it)."""
    content = message.get("content")
    if isinstance(content, str):
        return [_cached({"type": "text", "text": content}, message)] if content.strip() else []
    blocks: list[dict[str, Any]] = []
    for j, part in enumerate(content or ()):
        kind = part.get("type")
        if kind == "text" and not block_text(part, f"{where}.content.{j}").strip():
            if blocks:
                _cached(blocks[-1], part)
        elif kind == "text":
            blocks.append(_cached({"type": "text", "text": block_text(part, f"{where}.content.{j}")}, part))
        elif kind == "image_url":
            blocks.append(_cached({"type": "image", "source": image_source((part.get("image_url") or {}).get("url", ""))}, part))
        elif kind == "file":
            blocks.append(_cached(o2a_document(part.get("file") or {}, f"{where}.content.{j}"), part))
        else:
            raise refuse(f"{where}.content.{j}: a {kind!r} part", "Anthropic")
    if blocks and message.get("cache_control") is not None:
        _cached(blocks[-1], message)
    return blocks
