"""A Messages conversation's turns as Chat Completions messages (requests.anthropic_to_openai's walk of `messages`).

Assistant turns: text and tool_use (as tool_calls); Claude's own blocks another model cannot read (thinking, tool
searches, fallback markers) left out. User turns: tool results as `tool` messages, which hold text only (a result's
images and documents follow them in the user message), then the turn's own text, images and documents. For gpt-5.6 and
later a block's `cache_control` is the breakpoint of the part where the block ends (breakpoints.py).
"""

from __future__ import annotations

from typing import Any

import orjson

from sdk.errors import InvalidRequestError
from sdk.routing.translation.breakpoints import BREAKPOINT, marked_part
from sdk.routing.translation.fields import refuse
from sdk.routing.translation.media import a2o_document, image_url
from sdk.routing.translation.tool_ids import openai_tool_id, openai_tool_name
from sdk.routing.translation.tool_search import claude_search_block
from sdk.routing.translation.web_search import claude_search_history, history_text


def block_text(block: dict[str, Any], where: str) -> str:
    """A text block's text: translation joins and re-nests it, so it must be a string."""
    text = block.get("text")
    if not isinstance(text, str):
        raise InvalidRequestError(f"{where}.text: a string is required")
    return text


def a2o_message(message: dict[str, Any], where: str, explicit: bool) -> list[dict[str, Any]]:
    role, content = message.get("role"), message.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if role == "assistant":
        said: list[tuple[str, bool]] = []  # the turn's texts, each with whether it is a search's
        calls = []
        for j, block in enumerate(content or ()):
            kind = block.get("type")
            if kind == "text":
                said.append((block_text(block, f"{where}.content.{j}"), False))
            elif kind == "tool_use":
                arguments = orjson.dumps(block.get("input") or {}).decode()
                function = {"name": openai_tool_name(block["name"]), "arguments": arguments}
                calls.append({"id": openai_tool_id(block["id"]), "type": "function", "function": function})
            elif claude_search_block(block):
                continue
            elif claude_search_history(block):  # a web search's query and what it found, as text (web_search.py)
                said.append((history_text(block), True))
            elif kind in ("thinking", "redacted_thinking", "fallback", "compaction"):
                # Claude's reasoning, signed for Claude: another model cannot use it (Anthropic ignores an
                # earlier turn's thinking too); the visible turn carries the conversation. A `fallback` block
                # marks where a server-side fallback model took over; Anthropic renders it into no prompt. A
                # `compaction` block left here failed (no summary): a no-op to Claude (compaction.claude_compacted).
                continue
            else:
                raise refuse(f"{where}.content.{j}: a {kind!r} block", "OpenAI")
        out: dict[str, Any] = {"role": "assistant", "content": _joined(said) if said else None}
        if calls:
            out["tool_calls"] = calls
        return [out]
    # A user turn: tool results become `tool` messages, which must directly follow the assistant's calls.
    # Chat's tool messages hold text only: a result's images and documents follow them in the user message.
    tool_messages: list[dict[str, Any]] = []
    attached: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(content or ()):
        if block.get("type") != "tool_result":
            made = _a2o_parts(block, f"{where}.content.{j}")  # the block's end, where its marker goes, is its last part's
            parts += [*made[:-1], marked_part(made[-1], block) if explicit else made[-1]]
            continue
        result = block.get("content") or ""
        texts = [result] if isinstance(result, str) else []
        texted: list[dict[str, Any]] = []  # the inner blocks wholly in the tool message's text, whose markers it takes
        media: list[dict[str, Any]] = []  # the result's images and documents, which follow the tool messages
        for k, inner in enumerate([] if isinstance(result, str) else result):
            if inner.get("type") == "tool_reference":
                # A client-side tool search's answer (Claude Code's ToolSearch): Claude loads the named deferred
                # tool here; an OpenAI model has every tool from the start (defer_loading is not sent), so it is told which.
                texts.append(f"Tool loaded: {openai_tool_name(inner.get('tool_name'))}")
                texted.append(inner)
                continue
            made = _a2o_parts(inner, f"{where}.content.{j}.content.{k}")
            for part in made:
                if part["type"] == "text":
                    texts.append(part["text"])
                else:
                    media.append(marked_part(part, inner) if explicit else part)
            texted += [inner] if all(part["type"] == "text" for part in made) else []
        text = "\n\n".join(texts)
        if block.get("is_error"):
            text = f"Error: {text}"  # OpenAI has no error flag on tool results
        # A marker on the result ends Claude's prefix after all of it, its images too: where they follow the tool text,
        # on the last of them (OpenAI takes breakpoints on image and file parts), so the prefix cached holds them.
        ends_on_media = explicit and bool(media) and block.get("cache_control") is not None
        if ends_on_media:
            media[-1] = marked_part(media[-1], block)
        attached += media
        marked = marked_part({"type": "text", "text": text}, *([] if ends_on_media else [block]), *texted) if explicit else {}
        tool_content: Any = [marked] if BREAKPOINT in marked else text  # a marked result: one text part
        tool_messages.append({"role": "tool", "tool_call_id": openai_tool_id(block["tool_use_id"]), "content": tool_content})
    if attached or parts:
        tool_messages.append({"role": role, "content": attached + parts})
    return tool_messages


def _joined(said: list[tuple[str, bool]]) -> str:
    """An assistant turn's texts as one: its text blocks joined as they are, a search's text a paragraph of its own."""
    out = ""
    for i, (text, search) in enumerate(said):
        apart = search or (i > 0 and said[i - 1][1])
        out += ("\n\n" if apart and out else "") + text
    return out


def _a2o_parts(block: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """A user turn's text, image or document block as Chat content parts (a document's may be two: media.py)."""
    kind = block.get("type")
    if kind == "document":
        return a2o_document(block, where)
    return [_a2o_part(block, where)]


def _a2o_part(block: dict[str, Any], where: str) -> dict[str, Any]:
    kind = block.get("type")
    if kind == "text":
        return {"type": "text", "text": block_text(block, where)}
    if kind == "image":
        _oversized(block.get("transformations"), where)
        return {"type": "image_url", "image_url": {"url": image_url(block.get("source") or {}, where)}}
    if kind == "search_result":  # a RAG tool's or the client's source: its text, under its title and source
        if (block.get("citations") or {}).get("enabled"):
            raise refuse(f"{where}: a search result with citations", "OpenAI")
        body = "\n\n".join(block_text(inner, where) for inner in block.get("content") or ())
        return {"type": "text", "text": f"{block.get('title')}\nSource: {block.get('source')}\n\n{body}"}
    raise refuse(f"{where}: a {kind!r} block", "OpenAI")


def _oversized(transformations: Any, where: str) -> None:
    """anthropic 2.x's image `transformations.oversized_image: "error"` asks that an image past the model's largest size be
    a 400 naming its dimensions, never scaled down without a word; an OpenAI model scales a large image down to what it
    reads (OpenAI's images and vision guide, developers.openai.com/docs/guides/vision), as `downsize`, the default,
    does: that one travels, and `error` is refused, naming it, rather than dropped."""
    if isinstance(transformations, dict) and transformations.get("oversized_image") == "error":
        raise refuse(f"{where}.transformations.oversized_image: 'error' (an OpenAI model scales a large image down to fit)", "OpenAI")
