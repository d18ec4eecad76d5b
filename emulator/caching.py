"""Prompt caches: Anthropic explicit/automatic breakpoints (reference A.4-A.11, E.3) and OpenAI
automatic prefix caching (reference C.1).

Anthropic model: the request is a list of blocks in the order tools -> system -> messages (a
string `system` or string message content is one block). Each block has a token count and a
cumulative prefix hash H(b) chained from a seed of (workspace, model). Cache entries are only
written at breakpoints; reads look back at most 20 positions from each breakpoint (latest first).
`cache_control` is never part of a hash; JSON inside tool schemas / tool inputs is hashed in the
key order the client sent. Request settings that render into the prompt are folded into the
chain where the reference says they invalidate: image presence before `system`, tool_choice /
disable_parallel_tool_use / thinking / effort before `messages`.

OpenAI model: the prompt is rendered to tokens (see `openai_prompt_tokens`); a prefix hash is
kept at every 128-token boundary from 1024 on, so a hit is floor(matched / 128) * 128 tokens.

Entries become readable only when the writing response starts (`CachePlan.commit`), and their
TTL clock starts at the start of the request that wrote or last read them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from hashlib import blake2b
from typing import Any

import orjson

from .text import count_tokens, token_bytes

TTL_SECONDS = {"5m": 300.0, "1h": 3600.0}
IMAGE_TOKENS = 1000  # fixed cost of an image/binary document block (real cost depends on size)

_TTL_ORDER_MSG = (
    "a ttl='1h' cache_control block must not come after a ttl='5m' cache_control block. "
    "Note that blocks are processed in the following order: `tools`, `system`, `messages`."
)

# Reference A.5 (current table, plus the historical Haiku 3 entry). Unknown models: 1024.
_MIN_TOKENS = {
    "claude-opus-5": 512,
    "claude-fable-5": 512,
    "claude-mythos-5": 512,
    "claude-opus-4-8": 1024,
    "claude-sonnet-5": 1024,
    "claude-sonnet-4-6": 1024,
    "claude-sonnet-4-5": 1024,
    "claude-opus-4-1": 1024,
    "claude-opus-4": 1024,
    "claude-sonnet-4": 1024,
    "claude-3-7-sonnet": 1024,
    "claude-3-5-sonnet": 1024,
    "claude-3-opus": 1024,
    "claude-mythos-preview": 2048,
    "claude-opus-4-7": 2048,
    "claude-3-5-haiku": 2048,
    "claude-3-haiku": 2048,
    "claude-opus-4-6": 4096,
    "claude-opus-4-5": 4096,
    "claude-haiku-4-5": 4096,
}
_SUFFIX = re.compile(r"(-\d{8}|-latest|-v\d+(:\d+)?)$")


def min_cacheable_tokens(model: str) -> int:
    """Per-model minimum prefix length (A.5): exact family name after dropping date suffixes."""
    name = model.lower().rsplit("/", 1)[-1]
    name = name.split("anthropic.", 1)[-1]
    name = _SUFFIX.sub("", name)
    while name:
        if name in _MIN_TOKENS:
            return _MIN_TOKENS[name]
        if "-" not in name:
            break
        name = name.rsplit("-", 1)[0]
    return 1024


class CacheError(ValueError):
    """A cache_control validation failure; the message is the provider's 400 message."""


@dataclass(slots=True)
class Entry:
    expires: float
    ttl: float
    readable: bool


@dataclass
class PrefixStore:
    """Hash -> entry map with lazy expiry and a periodic sweep to bound memory."""

    entries: dict[bytes, Entry] = field(default_factory=dict)
    max_entries: int = 500_000
    _writes: int = 0

    def live(self, key: bytes, now: float) -> Entry | None:
        e = self.entries.get(key)
        if e is not None and e.readable and e.expires > now:
            return e
        return None

    def write(self, key: bytes, start: float, ttl: float) -> Entry:
        e = self.entries.get(key)
        if e is None:
            e = self.entries[key] = Entry(start + ttl, ttl, False)
        else:
            e.ttl = max(e.ttl, ttl)
            e.expires = max(e.expires, start + ttl)
        self._writes += 1
        if self._writes % 4096 == 0:
            self.sweep(start)
        return e

    def sweep(self, now: float) -> None:
        dead = [k for k, e in self.entries.items() if e.expires <= now]
        for k in dead:
            del self.entries[k]
        if len(self.entries) > self.max_entries:  # drop the oldest half (insertion order)
            for k in list(self.entries)[: len(self.entries) // 2]:
                del self.entries[k]

    def clear(self) -> None:
        self.entries.clear()


def _refresh(e: Entry, start: float, ttl: float = 0.0) -> None:
    e.ttl = max(e.ttl, ttl)
    e.expires = max(e.expires, start + e.ttl)


@dataclass(slots=True)
class CachePlan:
    """Usage numbers for one request plus the entries to publish when its response starts."""

    total: int
    input_tokens: int
    read: int = 0
    write_5m: int = 0
    write_1h: int = 0
    pending: list[Entry] = field(default_factory=list)

    @property
    def write(self) -> int:
        return self.write_5m + self.write_1h

    @property
    def uncached(self) -> int:
        return self.total - self.read

    def commit(self) -> None:
        for e in self.pending:
            e.readable = True
        self.pending = []


# --- Anthropic ------------------------------------------------------------------------------


@dataclass(slots=True)
class _Mark:
    index: int
    ttl: str
    path: str


def _ttl_of(cc: Any, path: str) -> str:
    if not isinstance(cc, dict):
        raise CacheError(f"{path}.cache_control: Input should be a valid dictionary")
    if cc.get("type") != "ephemeral":
        raise CacheError(f"{path}.cache_control.type: Input should be 'ephemeral'")
    ttl = cc.get("ttl", "5m")
    if ttl is None:
        ttl = "5m"
    if not isinstance(ttl, str) or ttl not in TTL_SECONDS:
        raise CacheError(f"{path}.cache_control.ttl: Input should be '5m' or '1h'")
    return ttl


def _dumps(obj: Any) -> str:
    return orjson.dumps(obj).decode()


def _render_content_block(block: dict[str, Any]) -> tuple[str, int | None]:
    """(text whose tokens are counted and hashed, fixed token count or None)."""
    t = block.get("type")
    if t == "text":
        return block.get("text") or "", None
    if t == "tool_use" or t == "server_tool_use":
        return f"{block.get('id', '')} {block.get('name', '')} {_dumps(block.get('input', {}))}", None
    if t == "tool_result":
        c = block.get("content", "")
        if isinstance(c, list):
            parts = [_render_content_block(b)[0] if isinstance(b, dict) else str(b) for b in c]
            c = "\n".join(parts)
        err = " error" if block.get("is_error") else ""
        return f"{block.get('tool_use_id', '')}{err} {c}", None
    if t == "thinking":
        return block.get("thinking") or "", None
    if t == "redacted_thinking":
        return block.get("data") or "", None
    if t in ("image", "document"):
        src = block.get("source") or {}
        if isinstance(src, dict) and src.get("type") == "text":
            return src.get("data") or "", None
        return _dumps(src), IMAGE_TOKENS
    rest = {k: v for k, v in block.items() if k != "cache_control"}
    return orjson.dumps(rest, option=orjson.OPT_SORT_KEYS).decode(), None


def _render_tool(tool: dict[str, Any]) -> str:
    if "input_schema" in tool:  # client tool: schema key order matters, so no sorting inside
        return f"{tool.get('name', '')}\n{tool.get('description', '')}\n{_dumps(tool['input_schema'])}"
    rest = {k: v for k, v in tool.items() if k != "cache_control"}
    return orjson.dumps(rest, option=orjson.OPT_SORT_KEYS).decode()


@dataclass(slots=True)
class _Blocks:
    tags: list[bytes] = field(default_factory=list)  # section/role/type tag, part of the hash
    texts: list[str] = field(default_factory=list)
    fixed: list[int | None] = field(default_factory=list)
    eligible: list[bool] = field(default_factory=list)  # may carry a breakpoint
    paths: list[str] = field(default_factory=list)
    marks: list[_Mark] = field(default_factory=list)
    first_system: int = 0
    first_message: int = 0
    has_images: bool = False

    def add(self, tag: bytes, text: str, fixed: int | None, eligible: bool, path: str) -> int:
        self.tags.append(tag)
        self.texts.append(text)
        self.fixed.append(fixed)
        self.eligible.append(eligible)
        self.paths.append(path)
        return len(self.tags) - 1


def _collect(body: dict[str, Any], validate: bool) -> _Blocks:
    bl = _Blocks()
    for i, tool in enumerate(body.get("tools") or ()):
        if not isinstance(tool, dict):
            continue
        idx = bl.add(b"tool", _render_tool(tool), None, True, f"tools.{i}")
        if validate and tool.get("cache_control") is not None:
            bl.marks.append(_Mark(idx, _ttl_of(tool["cache_control"], f"tools.{i}"), f"tools.{i}"))
    bl.first_system = len(bl.tags)
    system = body.get("system")
    if isinstance(system, str):
        if system:
            bl.add(b"system", system, None, True, "system")
    elif isinstance(system, list):
        for j, b in enumerate(system):
            if isinstance(b, dict):
                _add_block(bl, b"system", b, f"system.{j}", validate)
    bl.first_message = len(bl.tags)
    for i, m in enumerate(body.get("messages") or ()):
        if not isinstance(m, dict):
            continue
        role = str(m.get("role", "")).encode()
        content = m.get("content")
        if isinstance(content, str):
            bl.add(role + b":text", content, None, bool(content), f"messages.{i}.content")
        elif isinstance(content, list):
            for j, b in enumerate(content):
                if isinstance(b, dict):
                    _add_block(bl, role, b, f"messages.{i}.content.{j}", validate)
    return bl


def _add_block(bl: _Blocks, role: bytes, b: dict[str, Any], path: str, validate: bool) -> None:
    t = b.get("type")
    text, fixed = _render_content_block(b)
    if t in ("image", "document") and fixed is not None:
        bl.has_images = True
    no_marker = t in ("thinking", "redacted_thinking")
    empty = t == "text" and not text
    idx = bl.add(role + b":" + str(t).encode(), text, fixed, not (no_marker or empty), path)
    cc = b.get("cache_control")
    if not validate or cc is None:
        return
    if no_marker:
        raise CacheError(f"{path}.{t}.cache_control: Extra inputs are not permitted")
    if empty:
        raise CacheError(f"{path}.text: cache_control cannot be set for empty text blocks")
    bl.marks.append(_Mark(idx, _ttl_of(cc, path), path))


def count_input_tokens(body: dict[str, Any]) -> int:
    """Total input tokens (count_tokens endpoint and usage): sum over all blocks."""
    bl = _collect(body, validate=False)
    return sum(f if f is not None else count_tokens(t) for t, f in zip(bl.texts, bl.fixed, strict=True))


def _settings_salt(body: dict[str, Any]) -> bytes:
    """Settings that render into the prompt, normalised so explicit defaults equal omission."""
    tc = body.get("tool_choice")
    tc = dict(tc) if isinstance(tc, dict) else {"type": "auto"}
    tc.setdefault("disable_parallel_tool_use", False)
    thinking = body.get("thinking") or {"type": "disabled"}
    oc = body.get("output_config")
    effort = oc.get("effort", "high") if isinstance(oc, dict) else "high"
    return orjson.dumps([tc, thinking, effort], option=orjson.OPT_SORT_KEYS)


def plan_anthropic(
    store: PrefixStore,
    body: dict[str, Any],
    workspace: str,
    model: str,
    start: float,
    lookback: int = 20,
    max_breakpoints: int = 4,
) -> CachePlan:
    """Validate cache_control markers and compute this request's cache reads and writes."""
    bl = _collect(body, validate=True)
    marks = bl.marks
    auto = body.get("cache_control")
    if auto is not None:
        ttl = _ttl_of(auto, "cache_control")
        target = next((i for i in range(len(bl.tags) - 1, -1, -1) if bl.eligible[i]), -1)
        if target >= 0:
            same = next((m for m in marks if m.index == target), None)
            if same is None:
                marks.append(_Mark(target, ttl, "cache_control"))
            elif same.ttl != ttl:
                raise CacheError(
                    f"cache_control.ttl: automatic caching uses ttl='{ttl}' but the last cacheable "
                    f"block ({same.path}) already has cache_control with ttl='{same.ttl}'"
                )
    if len(marks) > max_breakpoints:
        raise CacheError(
            f"A maximum of {max_breakpoints} blocks with cache_control may be provided. "
            f"Found {len(marks)}."
        )
    seen_5m = False
    for m in marks:
        if m.ttl == "5m":
            seen_5m = True
        elif seen_5m:
            raise CacheError(f"{m.path}.cache_control.ttl: {_TTL_ORDER_MSG}")

    pos: list[int] = []
    acc = 0
    for text, fixed in zip(bl.texts, bl.fixed, strict=True):
        acc += fixed if fixed is not None else count_tokens(text)
        pos.append(acc)
    total = acc
    if not marks:
        return CachePlan(total, total)
    last = marks[-1].index
    minimum = min_cacheable_tokens(model)
    if pos[last] < minimum:  # silently uncached (A.5)
        return CachePlan(total, total)

    hashes = _chain(bl, body, workspace, model, last)
    hit = -1
    for m in reversed(marks):
        for b in range(m.index, max(-1, m.index - lookback), -1):
            e = store.live(hashes[b], start)
            if e is not None:
                hit = b
                _refresh(e, start)
                break
        if hit >= 0:
            break
    a = pos[hit] if hit >= 0 else 0
    b_1h = max((pos[m.index] for m in marks if m.ttl == "1h" and m.index > hit), default=a)
    c = pos[last]
    plan = CachePlan(total, total - c, read=a, write_1h=b_1h - a, write_5m=c - b_1h)
    for m in marks:
        if pos[m.index] < minimum:
            continue
        seconds = TTL_SECONDS[m.ttl]
        e = store.live(hashes[m.index], start) if m.index <= hit else None
        if e is not None:
            _refresh(e, start, seconds)  # a marked block inside the read prefix is refreshed
        else:
            plan.pending.append(store.write(hashes[m.index], start, seconds))
    return plan


def _chain(bl: _Blocks, body: dict[str, Any], workspace: str, model: str, upto: int) -> list[bytes]:
    """Cumulative prefix hashes H(0..upto)."""
    msg_salt = _settings_salt(body)
    state = blake2b(f"{workspace}\x00{model}".encode(), digest_size=16).digest()
    out: list[bytes] = []
    for i in range(upto + 1):
        if i == bl.first_system:
            state = blake2b(state + (b"img" if bl.has_images else b"noimg"), digest_size=16).digest()
        if i == bl.first_message:
            state = blake2b(state + msg_salt, digest_size=16).digest()
        h = blake2b(state, digest_size=16)
        h.update(bl.tags[i])
        h.update(b"\x00")
        h.update(bl.texts[i].encode())
        state = h.digest()
        out.append(state)
    return out


# --- OpenAI ---------------------------------------------------------------------------------

OPENAI_MIN = 1024
OPENAI_STEP = 128


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if not isinstance(p, dict):
                continue
            if p.get("type") == "text":
                parts.append(p.get("text") or "")
            elif p.get("type") == "image_url":
                url = (p.get("image_url") or {}).get("url", "")
                parts.append(f"<image:{blake2b(str(url).encode(), digest_size=8).hexdigest()}>")
            else:
                parts.append(_dumps(p))
        return "\n".join(parts)
    return _dumps(content)


def openai_prompt_parts(body: dict[str, Any]) -> list[str]:
    """Canonical rendering: tools, response_format, then one part per message.

    Each message renders as `<|role|>` + name + content + tool_calls JSON + tool_call_id; JSON is
    serialised in the client's key order (as the real API renders it).
    """
    parts: list[str] = []
    if body.get("tools"):
        parts.append("<|tools|>" + _dumps(body["tools"]))
    rf = body.get("response_format")
    if isinstance(rf, dict) and rf.get("type") == "json_schema":
        parts.append("<|schema|>" + _dumps(rf))
    for m in body.get("messages") or ():
        if not isinstance(m, dict):
            continue
        s = f"<|{m.get('role', '')}|>"
        if m.get("name"):
            s += f"{m['name']}:"
        s += _content_text(m.get("content"))
        if m.get("tool_calls"):
            s += _dumps(m["tool_calls"])
        if m.get("tool_call_id"):
            s += f"[{m['tool_call_id']}]"
        parts.append(s)
    return parts


def openai_prompt_blob(body: dict[str, Any]) -> bytes:
    """Prompt tokens as packed uint32s (each part tokenised separately so appends are stable)."""
    return b"".join(token_bytes(p) for p in openai_prompt_parts(body))


def plan_openai(
    store: PrefixStore, blob: bytes, scope: str, start: float, ttl: float, bills_writes: bool = False
) -> CachePlan:
    """Longest live 128-token-boundary prefix (>= 1024 tokens) is the cached count. With `bills_writes` (gpt-5.6 and
    later, which bill writes at 1.25x and report them as `cache_write_tokens`, reference C.2) the tokens newly written,
    the longest boundary written less the cached count, are the plan's `write_5m`."""
    n = len(blob) // 4
    plan = CachePlan(n, n)
    if n < OPENAI_MIN:
        return plan
    view = memoryview(blob)
    h = blake2b(scope.encode(), digest_size=16)
    keys: list[tuple[int, bytes]] = []
    for k in range(OPENAI_STEP, n + 1, OPENAI_STEP):
        h.update(view[(k - OPENAI_STEP) * 4 : k * 4])
        if k >= OPENAI_MIN:
            keys.append((k, h.copy().digest()))
    cached = 0
    for k, key in reversed(keys):
        e = store.live(key, start)
        if e is not None:
            cached = k
            _refresh(e, start)
            break
    plan.read = cached
    plan.input_tokens = n  # OpenAI prompt_tokens includes cached tokens
    for k, key in keys:
        if k > cached:
            plan.pending.append(store.write(key, start, ttl))
    if bills_writes and keys and keys[-1][0] > cached:
        plan.write_5m = keys[-1][0] - cached
    return plan
