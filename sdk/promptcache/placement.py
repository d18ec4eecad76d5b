"""Anthropic breakpoint placement (`breakpoints: auto`) and marker repair.

Rules followed (Anthropic's prompt-caching guide, build-with-claude/prompt-caching, and the pitfalls
reported against it; docs/prompt-cache.md):
- at most 4 markers, the top-level automatic one included; a request with more is repaired by
  dropping the client's markers in the history (the usual cause: markers stored in history), keeping
  the static ones (tools/system) and the latest ones;
- markers only on eligible blocks (no thinking, no empty text), moved onto existing blocks: never a
  synthetic anchor block, which would itself change the prefix;
- TTLs non-increasing in tools -> system -> messages order; the client's TTLs are never changed:
  ours bend around them (1h before a client's 1h marker, 5m after a client's 5m marker);
- a prefix shorter than the model's minimum is never cached, so no slot is spent on it;
- the rolling breakpoint goes on the last block that will be the same next turn, i.e. never on
  content Slipstream moved to the tail, never on a final assistant turn (a prefill, which the next
  turn holds whole), and never after unmoved volatile content, since such a prefix is written every
  time and read never (the optimizer leaves out content whose prefix recent requests sent unchanged);
- reads look back 20 positions: when the longest prefix the ledger knows is live lies further back
  than that, a breakpoint goes exactly on it so the read is found.
Breakpoints cost nothing by themselves (billing is by tokens), so every useful boundary is marked
while slots remain, in order of expected value: rolling, lookback anchor, system end, documents end,
tools end.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from sdk.promptcache.blocks import Layout

MAX_BREAKPOINTS = 4
LOOKBACK = 20

# Reference A.5 (current table plus the historical entries). Unknown models: 1024.
_MIN_TOKENS = {
    "claude-opus-5": 512, "claude-fable-5": 512, "claude-mythos-5": 512,
    "claude-opus-4-8": 1024, "claude-sonnet-5": 1024, "claude-sonnet-4-6": 1024, "claude-sonnet-4-5": 1024,
    "claude-opus-4-1": 1024, "claude-opus-4": 1024, "claude-sonnet-4": 1024, "claude-3-7-sonnet": 1024,
    "claude-3-5-sonnet": 1024, "claude-3-opus": 1024,
    "claude-mythos-preview": 2048, "claude-opus-4-7": 2048, "claude-3-5-haiku": 2048, "claude-3-haiku": 2048,
    "claude-opus-4-6": 4096, "claude-opus-4-5": 4096, "claude-haiku-4-5": 4096,
}
_SUFFIX = re.compile(r"(-\d{8}|-latest|-v\d+(:\d+)?)$")


def min_cacheable_tokens(model: str) -> int:
    """Per-model minimum prefix length: the longest known family name the model name starts with."""
    name = _SUFFIX.sub("", model.lower().rsplit("/", 1)[-1].split("anthropic.", 1)[-1])
    while name:
        if name in _MIN_TOKENS:
            return _MIN_TOKENS[name]
        if "-" not in name:
            break
        name = name.rsplit("-", 1)[0]
    return 1024


@dataclass(frozen=True, slots=True)
class Mark:
    index: int
    ttl: str
    reason: str  # client | auto | rolling | anchor | system | documents | tools


@dataclass(slots=True)
class Placement:
    marks: list[Mark] = field(default_factory=list)  # final markers, in block order (auto excluded)
    add: list[Mark] = field(default_factory=list)  # markers Slipstream adds
    remove: list[int] = field(default_factory=list)  # client markers Slipstream drops (repair)
    notes: list[str] = field(default_factory=list)  # what was repaired or left alone, for the report


def _last_eligible(layout: Layout, start: int, end: int) -> int:
    """Last eligible block in [start, end], or -1."""
    for i in range(end, start - 1, -1):
        if layout.blocks[i].eligible:
            return i
    return -1


def _prefill(layout: Layout) -> int:
    """The first block of a final assistant turn (a prefill, which the answer continues: a translated JSON mode's `{`, a
    paused turn sent back), or the number of blocks where there is none. The next turn holds the whole answer there, so a
    prefix through the prefill is written and never read."""
    blocks = layout.blocks
    start = len(blocks)
    while start > layout.first_message and blocks[start - 1].role == "assistant" and blocks[start - 1].message == blocks[-1].message:
        start -= 1
    return start


def _repair(client: list[Mark], budget: int, layout: Layout, placement: Placement) -> list[Mark]:
    if len(client) <= budget:
        return client
    static = [m for m in client if m.index < layout.first_message]
    recent = [m for m in client if m.index >= layout.first_message]
    keep_static = static[: max(0, budget - min(2, len(recent)))]
    keep = keep_static + recent[len(recent) - (budget - len(keep_static)):]
    kept = {m.index for m in keep}
    for m in client:
        if m.index not in kept:
            placement.remove.append(m.index)
    placement.notes.append(
        f"repaired: {len(client) + (MAX_BREAKPOINTS - budget)} cache_control markers (the provider allows {MAX_BREAKPOINTS}); "
        f"removed {', '.join(layout.blocks[i].path for i in placement.remove)}"
    )
    return sorted(keep, key=lambda m: m.index)


def _fit_ttls(client: list[Mark], ours: list[Mark], auto_ttl: str | None, placement: Placement) -> list[Mark]:
    """Give each of our markers a TTL that keeps the whole sequence non-increasing (1h before 5m)."""
    fixed = sorted(client, key=lambda m: m.index)
    out: list[Mark] = []
    for mark in sorted(ours, key=lambda m: m.index):
        need_1h = any(c.ttl == "1h" and c.index > mark.index for c in fixed)
        need_5m = any(c.ttl == "5m" and c.index < mark.index for c in fixed) or any(o.ttl == "5m" for o in out)
        if auto_ttl == "1h":
            need_1h = True
        if need_1h and need_5m:
            placement.notes.append(f"skipped a breakpoint at {mark.index}: the client's TTLs leave no valid order")
            continue
        ttl = "1h" if need_1h else "5m" if need_5m else mark.ttl
        out.append(Mark(mark.index, ttl, mark.reason))
    return out


def place(layout: Layout, *, auto: bool, ttl: str, tail_ttl: str, minimum: int, ratio: float,
          volatile_from: int | None, tail_moved: bool, anchor: int) -> Placement:
    """Decide the markers of one Anthropic request.

    volatile_from: first block still holding volatile content (None: none); tail_moved: the last
    block is content Slipstream moved there; anchor: block of the longest live ledger prefix (-1).
    """
    placement = Placement()
    blocks = layout.blocks
    client = [Mark(i, b.marker, "client") for i, b in enumerate(blocks) if b.marker]
    budget = MAX_BREAKPOINTS - (1 if layout.auto_marker else 0)
    client = _repair(client, budget, layout, placement)
    if not auto or not blocks:
        placement.marks = client
        return placement
    limit = len(blocks) - 1 - (1 if tail_moved else 0)  # last block that stays the same next turn
    limit = min(limit, _prefill(layout) - 1)  # a final assistant turn is continued: the next turn holds the whole answer
    if volatile_from is not None:
        limit = min(limit, volatile_from - 1)
    taken = {m.index for m in client}
    if layout.auto_marker:
        taken.add(_last_eligible(layout, 0, len(blocks) - 1))
    candidates: list[Mark] = []
    rolling = _last_eligible(layout, layout.first_message, limit) if limit >= layout.first_message else -1
    if rolling >= 0 and not layout.auto_marker:
        candidates.append(Mark(rolling, tail_ttl, "rolling"))
    if anchor >= 0 and anchor <= limit and blocks[anchor].eligible and (rolling < 0 or rolling - anchor >= LOOKBACK):
        candidates.append(Mark(anchor, tail_ttl if anchor >= layout.first_message else ttl, "anchor"))
    system_end = _last_eligible(layout, layout.first_system, min(limit, layout.first_message - 1))
    if system_end >= 0:
        candidates.append(Mark(system_end, ttl, "system"))
    documents = [i for i in range(layout.first_message, (rolling if rolling >= 0 else limit + 1)) if blocks[i].kind == "document"]
    if documents and blocks[documents[-1]].eligible:
        candidates.append(Mark(documents[-1], ttl, "documents"))
    tools_end = _last_eligible(layout, 0, min(limit, layout.first_system - 1))
    if tools_end >= 0:
        candidates.append(Mark(tools_end, ttl, "tools"))
    ours: list[Mark] = []
    slots = budget - len(client)
    for mark in candidates:
        if len(ours) >= slots:
            break
        if mark.index in taken or layout.pos[mark.index] * ratio < minimum:
            continue
        taken.add(mark.index)
        ours.append(mark)
    placement.add = _fit_ttls(client, ours, layout.auto_marker, placement)
    placement.marks = sorted(client + placement.add, key=lambda m: m.index)
    return placement


def _with_marker(block: Any, ttl: str | None) -> Any:
    """A copy of a content block with the marker set (ttl) or removed (None)."""
    if isinstance(block, str):  # string content / system: the one-block list form renders the same
        block = {"type": "text", "text": block}
    out = {k: v for k, v in block.items() if k != "cache_control"}
    if ttl is not None:
        out["cache_control"] = {"type": "ephemeral"} if ttl == "5m" else {"type": "ephemeral", "ttl": ttl}
    return out


def apply(body: dict[str, Any], layout: Layout, placement: Placement) -> dict[str, Any]:
    """The body with `placement.add` markers set and `placement.remove` markers dropped (copy on write)."""
    changes: list[tuple[str, str | None]] = [(layout.blocks[m.index].path, m.ttl) for m in placement.add]
    changes += [(layout.blocks[i].path, None) for i in placement.remove]
    if not changes:
        return body
    out = dict(body)
    copied: set[str] = set()

    def own_list(key: str, container: dict[str, Any]) -> list[Any]:
        if key not in copied:
            container[key] = list(container[key])
            copied.add(key)
        owned: list[Any] = container[key]
        return owned

    for path, ttl in changes:
        parts = path.split(".")
        if parts[0] == "tools":
            tools = own_list("tools", out)
            tools[int(parts[1])] = _with_marker(tools[int(parts[1])], ttl)
        elif parts[0] == "system":
            if len(parts) == 1:
                out["system"] = [_with_marker(out["system"], ttl)]
            else:
                system = own_list("system", out)
                system[int(parts[1])] = _with_marker(system[int(parts[1])], ttl)
        else:
            messages = own_list("messages", out)
            i = int(parts[1])
            key = f"messages.{i}"
            if key not in copied:
                messages[i] = dict(messages[i])
                copied.add(key)
            message = messages[i]
            if len(parts) == 3:  # string content
                message["content"] = [_with_marker(message["content"], ttl)]
            else:
                ckey = f"{key}.content"
                if ckey not in copied:
                    message["content"] = list(message["content"])
                    copied.add(ckey)
                content = message["content"]
                content[int(parts[3])] = _with_marker(content[int(parts[3])], ttl)
    return out
