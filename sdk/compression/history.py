"""History compaction: older turns of a long conversation replaced by a summary, computed off the request path.

A request whose messages exceed `trigger_tokens` schedules a background summary of everything before
its last `keep_turns` user turns, and goes upstream unchanged. Later requests of that conversation
whose messages start with the same (byte-identical) turns get those turns replaced by the stored
summary: the same text every time, so the compacted prefix stays cacheable at the provider. When the
verbatim tail grows past `trigger_tokens` again, a new summary (the old one plus the turns after it)
is computed in the background; the old one is used until it is ready.

The summary is prepended to the first kept user message, inside <conversation-summary> tags, so the
conversation still starts with a user turn and no assistant text is invented. Cuts are made only
before a plain user message (never between a tool call and its result), and never inside the
provider's cached prefix (with a client cache_control marker in the messages, nothing is compacted).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson

from sdk.compression import report
from sdk.errors import RateLimitedError
from sdk.lru import LRU
from sdk.offload import off_loop_if_large

log = logging.getLogger("slipstream.compression")

SUMMARY_OPEN = "<conversation-summary>\nSummary of the earlier conversation (older turns were compacted by the gateway):\n"
SUMMARY_CLOSE = "\n</conversation-summary>"
MAX_CONVERSATIONS = 4096  # stored summaries, least recently used evicted

Summarize = Callable[[str, str], Awaitable[str]]  # (transcript, the key id of the request that asked for it)


@dataclass(frozen=True, slots=True)
class Settings:
    trigger_tokens: int
    keep_turns: int


@dataclass(frozen=True, slots=True)
class Summary:
    cut: int  # messages[:cut] are replaced
    digest: bytes  # of messages[:cut]
    text: str


class HistoryCompactor:
    def __init__(self, team: str, settings: Settings, summarize: Summarize):
        self.team = team
        self.settings = settings
        self.summarize = summarize
        self._summaries: LRU[bytes, list[Summary]] = LRU(MAX_CONVERSATIONS)  # by digest of messages[0]
        self._tasks: dict[bytes, asyncio.Task[None]] = {}  # by digest of the prefix being summarized

    async def apply(self, messages: list[Any], counts: list[int], cached_prefix: bool, key_id: str = "",
                    size: int = 0) -> tuple[list[Any], str]:
        """The messages to send and what happened ("compacted", "pending" or ""). `counts` are the
        messages' tokens. Compaction rewrites the conversation from its first message, so a client
        cache_control marker anywhere in the messages (`cached_prefix`) rules it out. A summary it
        schedules is admitted and charged as a call of `key_id`, the team key that sent the request.
        Digesting every message and writing the transcript are work in proportion to the request: for
        one of `size` 256 KiB or more, in the heavy-work pool as the team's work, not on the loop."""
        if len(messages) < 2 or cached_prefix:
            return messages, ""
        prefix = await off_loop_if_large(size, _prefix_digests, messages)
        current = self._current(messages, prefix)
        start = current.cut if current else 0
        status = ""
        if sum(counts[start:]) > self.settings.trigger_tokens:
            cut = await off_loop_if_large(size, self._cut, messages)
            if cut > start and prefix[cut] not in self._tasks:
                transcript = await off_loop_if_large(size, render_transcript, messages[start:cut], current.text if current else "")
                if prefix[cut] not in self._tasks:  # another request of the conversation may have scheduled it meanwhile
                    self._schedule(prefix, cut, transcript, key_id)
                    status = "pending"
        if current is None:
            return messages, status
        report.HISTORY.labels(self.team, "applied").inc()
        return _compacted(messages, current), "compacted"

    async def drain(self) -> None:
        """Wait for summaries being computed (tests and benchmarks; the stage never waits)."""
        while self._tasks:
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    def _current(self, messages: list[Any], prefix: list[bytes]) -> Summary | None:
        stored = self._summaries.get(prefix[1]) or []
        matching = [s for s in stored if s.cut < len(messages) and prefix[s.cut] == s.digest]
        return max(matching, key=lambda s: s.cut, default=None)

    def _cut(self, messages: list[Any]) -> int:
        """Index of the user message that starts the last `keep_turns` plain user turns (0: none)."""
        plain = [m for m, message in enumerate(messages) if _plain_user(message)]
        return plain[-self.settings.keep_turns] if len(plain) > self.settings.keep_turns else 0

    def _schedule(self, prefix: list[bytes], cut: int, transcript: str, key_id: str) -> None:
        key = prefix[cut]
        task = asyncio.get_running_loop().create_task(self._summarize(prefix[1], Summary(cut, key, ""), transcript, key_id))
        self._tasks[key] = task
        task.add_done_callback(lambda _: self._tasks.pop(key, None))
        report.HISTORY.labels(self.team, "scheduled").inc()

    async def _summarize(self, conversation: bytes, placeholder: Summary, transcript: str, key_id: str) -> None:
        try:
            text = (await self.summarize(transcript, key_id)).strip()
        except RateLimitedError as refused:  # the team's or key's limits, or the budget: uncompacted until they admit one
            log.info("team %s: history summary not sent: %s", self.team, refused)
            report.HISTORY.labels(self.team, "refused").inc()
            return
        except Exception:  # the conversation simply stays uncompacted; the next long turn retries
            log.exception("team %s: history summary failed", self.team)
            report.HISTORY.labels(self.team, "failed").inc()
            return
        if not text:
            report.HISTORY.labels(self.team, "failed").inc()
            return
        stored = self._summaries.get(conversation) or []
        stored.append(Summary(placeholder.cut, placeholder.digest, text))
        del stored[:-4]  # a few generations suffice: requests go forward in a conversation, not back
        self._summaries.put(conversation, stored)
        report.HISTORY.labels(self.team, "summarized").inc()
        log.debug("team %s: summarized %d messages into %d chars", self.team, placeholder.cut, len(text))


def _prefix_digests(messages: list[Any]) -> list[bytes]:
    """prefix[i] identifies messages[:i] (a hash chain, so each message is serialized once)."""
    digests = [b""]
    for message in messages:
        encoded = orjson.dumps(message, option=orjson.OPT_SORT_KEYS)
        digests.append(hashlib.sha256(digests[-1] + hashlib.sha256(encoded).digest()).digest())
    return digests


def _plain_user(message: Any) -> bool:
    if not isinstance(message, dict) or message.get("role") != "user":
        return False
    content = message.get("content")
    return isinstance(content, str) or (isinstance(content, list) and not any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content))


def _compacted(messages: list[Any], summary: Summary) -> list[Any]:
    first = dict(messages[summary.cut])
    block = SUMMARY_OPEN + summary.text + SUMMARY_CLOSE
    content = first.get("content")
    first["content"] = f"{block}\n\n{content}" if isinstance(content, str) else [{"type": "text", "text": block}, *(content or [])]
    return [first, *messages[summary.cut + 1 :]]


def render_transcript(messages: list[Any], previous: str) -> str:
    lines = [f"Summary of the conversation before this point:\n{previous}\n"] if previous else []
    for message in messages:
        if isinstance(message, dict):
            lines.append(f"{str(message.get('role', 'user')).capitalize()}: {_text(message)}")
    return "\n\n".join(lines)


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    parts = []
    if isinstance(content, str):
        parts.append(content)
    elif isinstance(content, list):
        for block in content:
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind == "text":
                parts.append(str(block.get("text", "")))
            elif kind == "tool_use":
                parts.append(f"[called tool {block.get('name')} with {orjson.dumps(block.get('input')).decode()}]")
            elif kind == "tool_result":
                inner = block.get("content")
                parts.append(f"[tool result: {inner if isinstance(inner, str) else _text({'content': inner})}]")
            elif kind == "document":
                source = block.get("source")
                parts.append(f"[document: {source.get('data', '') if isinstance(source, dict) else ''}]")
            else:
                parts.append(f"[{kind}]")
    for call in message.get("tool_calls") or []:  # OpenAI assistant tool calls
        function = call.get("function", {}) if isinstance(call, dict) else {}
        parts.append(f"[called tool {function.get('name')} with {function.get('arguments')}]")
    return "\n".join(p for p in parts if p)
