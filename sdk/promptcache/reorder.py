"""Move volatile lines out of the stable prefix into a trailing block of the latest user turn.

Opt-in (`prompt_cache.reorder: true`), because the model then reads those lines in the user turn
instead of the system prompt. The moved block is always the request's last block and never carries
a breakpoint, so the client's next request (whose history lacks it) still shares every cached
prefix. Everything else keeps its order: the provider's own order (tools -> system -> messages)
already runs from most to least stable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sdk.types import Protocol


@dataclass(frozen=True, slots=True)
class SystemText:
    path: str
    text: str


def _is_text(value: Any) -> bool:
    return isinstance(value, str) and bool(value)  # a non-string `text` is the provider's to refuse


def system_texts(protocol: Protocol, body: dict[str, Any]) -> list[SystemText]:
    """The texts of the system prompt, each with the path a finding reports."""
    out: list[SystemText] = []
    if protocol is Protocol.ANTHROPIC:
        system = body.get("system")
        if isinstance(system, str) and system:
            out.append(SystemText("system", system))
        elif isinstance(system, list):
            for j, block in enumerate(system):
                if isinstance(block, dict) and block.get("type") == "text" and _is_text(block.get("text")):
                    out.append(SystemText(f"system.{j}", block["text"]))
        return out
    for i, message in enumerate(body.get("messages") or ()):
        if not isinstance(message, dict) or message.get("role") not in ("system", "developer"):
            break
        content = message.get("content")
        if isinstance(content, str) and content:
            out.append(SystemText(f"messages.{i}", content))
        elif isinstance(content, list):
            for k, part in enumerate(content):
                if isinstance(part, dict) and part.get("type") == "text" and _is_text(part.get("text")):
                    out.append(SystemText(f"messages.{i}.content.{k}", part["text"]))
    return out


def _latest_user(messages: list[Any]) -> int:
    for i in range(len(messages) - 1, -1, -1):
        if isinstance(messages[i], dict) and messages[i].get("role") == "user":
            return i
    return -1


def _anthropic_system(system: Any, kept: dict[str, str]) -> Any:
    if isinstance(system, str):
        return kept.get("system", system) or None
    out: list[Any] = []
    for j, block in enumerate(system):
        text = kept.get(f"system.{j}")
        if text is None:
            out.append(block)
        elif text:
            out.append({**block, "text": text})
        elif isinstance(block, dict) and block.get("cache_control") and out and isinstance(out[-1], dict) and not out[-1].get("cache_control"):
            out[-1] = {**out[-1], "cache_control": block["cache_control"]}  # keep the client's marker
    return out or None


def _openai_system(messages: list[Any], kept: dict[str, str]) -> list[Any]:
    out: list[Any] = []
    for i, message in enumerate(messages):
        if f"messages.{i}" in kept:
            if kept[f"messages.{i}"]:
                out.append({**message, "content": kept[f"messages.{i}"]})
            continue
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list) and any(f"messages.{i}.content.{k}" in kept for k in range(len(content))):
            parts = []
            for k, part in enumerate(content):
                text = kept.get(f"messages.{i}.content.{k}")
                if text is None:
                    parts.append(part)
                elif text:
                    parts.append({**part, "text": text})
            if parts:
                out.append({**message, "content": parts})
            continue
        out.append(message)
    return out


def _append_to_user(protocol: Protocol, message: dict[str, Any], moved: str) -> dict[str, Any]:
    content = message.get("content")
    if isinstance(content, str):
        if protocol is Protocol.OPENAI:
            return {**message, "content": f"{content}\n\n{moved}"}
        content = [{"type": "text", "text": content}] if content else []
    elif not isinstance(content, list):
        content = []
    return {**message, "content": [*content, {"type": "text", "text": moved}]}


def move_lines(protocol: Protocol, body: dict[str, Any], texts: list[SystemText], lines: dict[str, tuple[str, ...]],
               remove: dict[str, set[int]]) -> tuple[dict[str, Any], list[str]]:
    """The body with the `remove`d lines (by path) taken out of the system prompt and appended,
    in their original order, as one text block at the end of the latest user turn."""
    messages = body.get("messages")
    if not remove or not isinstance(messages, list):
        return body, []
    target = _latest_user(messages)
    if target < 0:
        return body, []
    kept: dict[str, str] = {}
    moved: list[str] = []
    for item in texts:
        drop = remove.get(item.path)
        if not drop:
            continue
        all_lines = lines[item.path]
        moved.extend(all_lines[i] for i in sorted(drop))
        kept[item.path] = "\n".join(line for i, line in enumerate(all_lines) if i not in drop).strip("\n")
    out = dict(body)
    if protocol is Protocol.ANTHROPIC:
        system = _anthropic_system(body["system"], kept)
        if system is None:
            out.pop("system", None)
        else:
            out["system"] = system
        new_messages = list(messages)
    else:
        head = _openai_system(messages, kept)
        shift = len(messages) - len(head)  # system messages that became empty and were dropped
        new_messages = head
        target -= shift
    new_messages[target] = _append_to_user(protocol, new_messages[target], "\n".join(moved))
    out["messages"] = new_messages
    return out, moved
