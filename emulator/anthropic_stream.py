"""Anthropic reply content: the content blocks of a message (thinking, text, tool_use) and the
streamed event sequence that builds them (B.4)."""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from typing import Any

import orjson

from .reply import Reply
from .text import reply_text, split_chunks, split_deltas

STOP_REASONS = {"end": "end_turn", "max": "max_tokens", "stop_sequence": "stop_sequence",
                "tool": "tool_use"}
THINKING_TOKENS = 24  # extended thinking the emulator 'does' (capped by budget_tokens)


@dataclass(slots=True)
class Thinking:
    text: str  # "" when display is "omitted"
    signature: str
    tokens: int


def plan_thinking(body: dict[str, Any], seed: int) -> Thinking | None:
    """A thinking block for `thinking: enabled | adaptive`, signed with an opaque signature."""
    cfg = body.get("thinking")
    if not isinstance(cfg, dict) or cfg.get("type") not in ("enabled", "adaptive"):
        return None
    budget = cfg.get("budget_tokens") if cfg["type"] == "enabled" else None
    n = min(THINKING_TOKENS, budget) if isinstance(budget, int) else THINKING_TOKENS
    text = reply_text(seed ^ 0x7417, n)
    digest = hashlib.blake2b(f"thinking:{seed}:{n}".encode(), digest_size=48).digest()
    shown = "" if cfg.get("display") == "omitted" else text
    return Thinking(shown, base64.b64encode(digest).decode(), n)


def content_blocks(reply: Reply, tool_ids: list[str], thinking: Thinking | None) -> list[dict[str, Any]]:
    """The message's blocks; `tool_ids` holds one id per call of the reply (Reply.calls)."""
    blocks: list[dict[str, Any]] = []
    if thinking is not None:
        blocks.append({"type": "thinking", "thinking": thinking.text, "signature": thinking.signature})
    if reply.text:
        blocks.append({"type": "text", "text": reply.text})
    blocks += [{"type": "tool_use", "id": tool_id, "name": c.name, "input": c.input}
               for tool_id, c in zip(tool_ids, reply.calls(), strict=True)]
    return blocks


def sse(event: str, data: dict[str, Any]) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


_PING = sse("ping", {"type": "ping"})
_MESSAGE_STOP = sse("message_stop", {"type": "message_stop"})


def stream_events(message: dict[str, Any], reply: Reply, thinking: Thinking | None,
                  start_usage: dict[str, Any], tokens_per_delta: int) -> tuple[list[bytes], list[int]]:
    """The B.4 sequence for `message` (its final form), with per-event output tokens for pacing.
    A ping follows the first block's start, as in Anthropic's captures."""
    k = tokens_per_delta
    ev = [sse("message_start", {"type": "message_start", "message": dict(
        message, content=[], stop_reason=None, stop_sequence=None, usage=start_usage)})]
    toks = [0]

    def delta(i: int, d: dict[str, Any], tokens: int) -> None:
        ev.append(sse("content_block_delta", {"type": "content_block_delta", "index": i, "delta": d}))
        toks.append(tokens)

    calls = iter(reply.calls())  # the tool_use blocks' inputs as serialised, in order
    for i, block in enumerate(message["content"]):
        typ = block["type"]
        start = {"thinking": {"type": "thinking", "thinking": "", "signature": ""},
                 "text": {"type": "text", "text": "", **({"citations": []} if block.get("citations") else {})},
                 "tool_use": dict(block, input={}), "server_tool_use": dict(block, input={}),
                 "web_search_tool_result": block}[typ]
        ev.append(sse("content_block_start", {"type": "content_block_start", "index": i,
                                              "content_block": start}))
        toks.append(0)
        if i == 0:
            ev.append(_PING)
            toks.append(0)
        if typ == "thinking":
            assert thinking is not None
            pieces = split_deltas(block["thinking"], k) if block["thinking"] else []
            for piece in pieces:
                delta(i, {"type": "thinking_delta", "thinking": piece}, k)
            # omitted display: the time is still spent, before the signature
            delta(i, {"type": "signature_delta", "signature": block["signature"]},
                  0 if pieces else thinking.tokens)
        elif typ == "text":
            for citation in block.get("citations") or ():
                delta(i, {"type": "citations_delta", "citation": citation}, 0)
            for piece in split_deltas(block["text"], k):
                delta(i, {"type": "text_delta", "text": piece}, k)
        elif typ == "server_tool_use":  # web_search.py: its input streams as the client tools' does
            delta(i, {"type": "input_json_delta", "partial_json": orjson.dumps(block["input"]).decode()}, 0)
        elif typ == "tool_use":
            # one block at a time, as Anthropic streams parallel calls: each block's input ends before the next starts
            for frag in [""] + split_chunks(next(calls).json, 3):
                delta(i, {"type": "input_json_delta", "partial_json": frag}, max(0, len(frag) // 4))
        ev.append(sse("content_block_stop", {"type": "content_block_stop", "index": i}))
        toks.append(0)
    # Plain answers' message_delta carries output_tokens only; after a web search, the whole usage with
    # server_tool_use (Anthropic's streaming docs show both)
    usage = message["usage"] if "server_tool_use" in message["usage"] else {"output_tokens": message["usage"]["output_tokens"]}
    if "output_tokens_details" in message["usage"]:  # the thinking within them, with the final count
        usage = {**usage, "output_tokens_details": message["usage"]["output_tokens_details"]}
    ev.append(sse("message_delta", {"type": "message_delta",
                                    "delta": {"stop_reason": message["stop_reason"],
                                              "stop_sequence": message["stop_sequence"]},
                                    "usage": usage}))
    ev.append(_MESSAGE_STOP)
    toks += [0, 0]
    return ev, toks
