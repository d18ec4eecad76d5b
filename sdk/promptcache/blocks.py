"""A request as the provider's cache sees it: an ordered list of blocks with cumulative hashes.

Anthropic (its prompt-caching guide, build-with-claude/prompt-caching): blocks in the order tools -> system -> messages, one per
content block (a string `system` or string content is one block); the key of a prefix is a hash of
everything up to a block, `cache_control` excluded. Settings that render into the prompt are folded
into the chain where the reference says they invalidate: image presence before `system`,
tool_choice / thinking / effort before `messages`. JSON inside tool schemas and tool inputs is
hashed in the key order sent, because the provider renders it that way.

OpenAI (C.1): the whole rendered context is one token prefix; tools and the structured-output schema
come first, then one part per message. Parts are the units we track (the provider matches at
128-token steps inside them, which only makes real reads larger than ours).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from hashlib import blake2b
from typing import Any

import orjson

from sdk.promptcache import tokens


@dataclass(slots=True)
class Block:
    section: str  # tools | system | messages
    path: str  # dotted path in the body, as provider error messages write it
    kind: str  # tool, text, document, image, tool_use, tool_result, thinking, message, ...
    role: str  # message role; "" outside messages
    message: int  # message index; -1 outside messages
    text: str  # what is counted and shown in miss excerpts
    digest: int  # stable 64-bit digest of (section, role, kind, text): the same in every process
    tokens: int
    eligible: bool  # may carry a cache_control marker (A.3)
    marker: str | None  # the client's own marker TTL ("5m" | "1h"), if any


@dataclass(slots=True)
class Layout:
    blocks: list[Block] = field(default_factory=list)
    chain: list[int] = field(default_factory=list)  # cumulative prefix digest through each block
    pos: list[int] = field(default_factory=list)  # cumulative estimated tokens through each block
    first_system: int = 0
    first_message: int = 0
    auto_marker: str | None = None  # top-level cache_control TTL (automatic caching), if any

    @property
    def total(self) -> int:
        return self.pos[-1] if self.pos else 0

    def section_end(self, section: str) -> int:
        """Index of the last block of a section, or -1."""
        end = {"tools": self.first_system, "system": self.first_message, "messages": len(self.blocks)}[section]
        start = {"tools": 0, "system": self.first_system, "messages": self.first_message}[section]
        return end - 1 if end > start else -1

    def common_prefix(self, other: list[int]) -> int:
        """Number of leading blocks shared with another chain (cumulative, so binary search works)."""
        lo, hi = 0, min(len(self.chain), len(other))
        while lo < hi:
            mid = (lo + hi) // 2
            if self.chain[mid] == other[mid]:
                lo = mid + 1
            else:
                hi = mid
        return lo


def _digest(tag: str, text: str) -> int:
    """64-bit blake2b of the tag and text. Not Python's hash(), which is salted per process
    (PYTHONHASHSEED): replicas sharing a ledger (sdk/promptcache/shared_ledger.py) must name the same
    prefix alike. 64 bits is enough for a predictor (a collision mispredicts; the provider decides)."""
    digest = blake2b(tag.encode(), digest_size=8)
    digest.update(b"\x00")
    digest.update(text.encode("utf-8", "surrogatepass"))  # JSON may carry lone surrogates
    return int.from_bytes(digest.digest(), "little")


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def _text(value: Any) -> str:
    """A field that should hold text; anything else (a number, a list) is hashed as its JSON. The
    provider refuses such a request; the optimizer must only not fail on it first."""
    if isinstance(value, str):
        return value
    return "" if value is None else _dumps(value)


def _ttl(cc: Any) -> str | None:
    if not isinstance(cc, dict):
        return None
    ttl = cc.get("ttl") or "5m"
    return ttl if ttl in ("5m", "1h") else "5m"


def render_anthropic_block(block: dict[str, Any]) -> tuple[str, bool]:
    """(rendered text, binary) for one content block; binary blocks have a fixed token cost."""
    kind = block.get("type")
    if kind == "text":
        return _text(block.get("text")), False
    if kind in ("tool_use", "server_tool_use"):
        return f"{block.get('id', '')} {block.get('name', '')} {_dumps(block.get('input', {}))}", False
    if kind == "tool_result":
        content = block.get("content", "")
        if isinstance(content, list):
            content = "\n".join(render_anthropic_block(b)[0] if isinstance(b, dict) else str(b) for b in content)
        error = " error" if block.get("is_error") else ""
        return f"{_text(block.get('tool_use_id'))}{error} {_text(content)}", False
    if kind == "thinking":
        return _text(block.get("thinking")), False
    if kind == "redacted_thinking":
        return _text(block.get("data")), False
    if kind in ("image", "document"):
        source = block.get("source") or {}
        if isinstance(source, dict) and source.get("type") == "text":
            return _text(source.get("data")), False
        return _dumps(source), True
    rest = {k: v for k, v in block.items() if k != "cache_control"}
    return orjson.dumps(rest, option=orjson.OPT_SORT_KEYS).decode(), False


def _render_tool(tool: dict[str, Any]) -> str:
    if "input_schema" in tool:
        return f"{tool.get('name', '')}\n{tool.get('description', '')}\n{_dumps(tool['input_schema'])}"
    rest = {k: v for k, v in tool.items() if k != "cache_control"}
    return orjson.dumps(rest, option=orjson.OPT_SORT_KEYS).decode()


def _make(counter: tokens.RequestCounter, section: str, path: str, kind: str, role: str, message: int, text: str,
          binary: bool, eligible: bool, marker: str | None) -> Block:
    digest = _digest(f"{section}:{role}:{kind}", text)
    count = tokens.IMAGE_TOKENS if binary else counter.count(digest, text)
    return Block(section, path, kind, role, message, text, digest, count, eligible, marker)


def _content_block(counter: tokens.RequestCounter, section: str, role: str, message: int, path: str, raw: dict[str, Any]) -> Block:
    kind = str(raw.get("type", ""))
    text, binary = render_anthropic_block(raw)
    eligible = kind not in ("thinking", "redacted_thinking") and not (kind == "text" and not text)
    return _make(counter, section, path, kind, role, message, text, binary, eligible, _ttl(raw.get("cache_control")))


def anthropic_layout(body: dict[str, Any], team: str = "") -> Layout:
    counter = tokens.RequestCounter(team)
    layout = Layout(auto_marker=_ttl(body.get("cache_control")))
    blocks = layout.blocks
    has_images = False
    for i, tool in enumerate(body.get("tools") or ()):
        if isinstance(tool, dict):
            blocks.append(_make(counter, "tools", f"tools.{i}", "tool", "", -1, _render_tool(tool), False, True, _ttl(tool.get("cache_control"))))
    layout.first_system = len(blocks)
    system = body.get("system")
    if isinstance(system, str) and system:
        blocks.append(_make(counter, "system", "system", "text", "", -1, system, False, True, None))
    elif isinstance(system, list):
        for j, raw in enumerate(system):
            if isinstance(raw, dict):
                blocks.append(_content_block(counter, "system", "", -1, f"system.{j}", raw))
    layout.first_message = len(blocks)
    for i, message in enumerate(body.get("messages") or ()):
        if not isinstance(message, dict):
            continue
        role = str(message.get("role", ""))
        content = message.get("content")
        if isinstance(content, str):
            blocks.append(_make(counter, "messages", f"messages.{i}.content", "text", role, i, content, False, bool(content), None))
        elif isinstance(content, list):
            for j, raw in enumerate(content):
                if isinstance(raw, dict):
                    block = _content_block(counter, "messages", role, i, f"messages.{i}.content.{j}", raw)
                    has_images = has_images or (block.kind in ("image", "document") and block.tokens == tokens.IMAGE_TOKENS)
                    blocks.append(block)
    settings = _settings_salt(body)
    _chain(layout, f"anthropic\x00{body.get('model', '')}".encode(), {layout.first_system: b"img" if has_images else b"noimg",
                                                                     layout.first_message: settings})
    return layout


def _settings_salt(body: dict[str, Any]) -> bytes:
    """Settings that render into the prompt, normalised so an explicit default equals omission (A.7)."""
    choice = body.get("tool_choice")
    choice = dict(choice) if isinstance(choice, dict) else {"type": "auto"}
    choice.setdefault("disable_parallel_tool_use", False)
    thinking = body.get("thinking") or {"type": "disabled"}
    config = body.get("output_config")
    effort = config.get("effort", "high") if isinstance(config, dict) else "high"
    return orjson.dumps([choice, thinking, effort], option=orjson.OPT_SORT_KEYS)


def _chain(layout: Layout, seed: bytes, salts: dict[int, bytes]) -> None:
    """Each block's prefix digest: blake2b(previous digest, salt, block digest), stable across processes."""
    state = blake2b(seed, digest_size=8).digest()
    acc = 0
    for i, block in enumerate(layout.blocks):
        step = blake2b(state, digest_size=8)
        step.update(salts.get(i, b""))
        step.update(block.digest.to_bytes(8, "little"))
        state = step.digest()
        acc += block.tokens
        layout.chain.append(int.from_bytes(state, "little"))
        layout.pos.append(acc)


def _openai_content(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                parts.append(_text(part.get("text")) if part.get("type") == "text" else _dumps(part))
        return "\n".join(parts)
    return _dumps(content)


def openai_layout(body: dict[str, Any], team: str = "") -> Layout:
    """Tools, response schema, then one block per message; leading system/developer messages are
    `system`. Token counts are memoised for `team` only (sdk/promptcache/tokens.py)."""
    counter = tokens.RequestCounter(team)
    layout = Layout()
    blocks = layout.blocks
    if body.get("tools"):
        blocks.append(_make(counter, "tools", "tools", "tools", "", -1, "<|tools|>" + _dumps(body["tools"]), False, True, None))
    schema = body.get("response_format")
    if isinstance(schema, dict) and schema.get("type") == "json_schema":
        blocks.append(_make(counter, "tools", "response_format", "schema", "", -1, "<|schema|>" + _dumps(schema), False, True, None))
    layout.first_system = len(blocks)
    leading = True
    for i, message in enumerate(body.get("messages") or ()):
        if not isinstance(message, dict):
            continue
        role = str(message.get("role", ""))
        if leading and role not in ("system", "developer"):
            leading = False
            layout.first_message = len(blocks)
        text = f"<|{role}|>"
        if message.get("name"):
            text += f"{message['name']}:"
        text += _openai_content(message.get("content"))
        if message.get("tool_calls"):
            text += _dumps(message["tool_calls"])
        if message.get("tool_call_id"):
            text += f"[{message['tool_call_id']}]"
        blocks.append(_make(counter, "system" if leading else "messages", f"messages.{i}", "message", role, i, text, False, True, None))
    if leading:
        layout.first_message = len(blocks)
    _chain(layout, f"openai\x00{body.get('model', '')}".encode(), {})  # prompt_cache_key: part of the ledger scope
    return layout
