"""One request through compression: prune documents, compact history, count tokens before and after.

CPU work (splitting, token counts, static scoring, selection) runs in a worker thread, never on the
event loop; the contextual scorer awaits the shared embedder, which batches in its own thread.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sdk.compression import documents, extractive, tokens
from sdk.compression.history import HistoryCompactor
from sdk.compression.scoring import score_contextual, score_static
from sdk.pipeline import CompressionReport

if TYPE_CHECKING:
    from sdk.compression.surprisal import TokenPruner
    from sdk.embedding import Embedder

log = logging.getLogger("slipstream.compression")
_COUNTS: dict[str, int] = {}  # message text → tokens: conversations resend the same turns every time
_MAX_COUNTS = 16_384


@dataclass(frozen=True, slots=True)
class DocumentSettings:
    min_tokens: int
    latest_turn: bool
    scorer: str  # "static" | "contextual"
    budget: extractive.Budget


@dataclass(slots=True)
class Result:
    body: dict[str, Any]
    report: CompressionReport
    removed: list[tuple[documents.Found, list[str]]] = field(default_factory=list)


class Compressor:
    def __init__(
        self,
        team: str,
        docs: DocumentSettings | None,
        history: HistoryCompactor | None,
        embedder: Callable[[], Embedder],
        pruner: TokenPruner | None = None,
    ):
        self.team = team
        self.docs = docs
        self.history = history
        self.embedder = embedder
        self.pruner = pruner

    async def run(self, body: dict[str, Any]) -> Result:
        result = Result(body, CompressionReport())
        counts = await asyncio.to_thread(_message_counts, body["messages"])
        result.report.before = sum(counts)
        if self.docs is not None:
            found = documents.find_documents(body, self.docs.min_tokens, self.docs.latest_turn)
            if found:
                result.body = documents.apply(body, await self._prune(found, result))
        if result.body is not body:
            counts = await asyncio.to_thread(_message_counts, result.body["messages"])
        if self.history is not None:
            messages = result.body["messages"]
            compacted, result.report.history = self.history.apply(messages, counts, documents.frozen_until(body)[0] >= 0)
            if compacted is not messages:
                result.body = {**result.body, "messages": compacted}
                counts = await asyncio.to_thread(_message_counts, compacted)
        result.report.after = sum(counts)
        return result

    async def _prune(self, found: list[documents.Found], result: Result) -> dict[documents.Found, str]:
        assert self.docs is not None
        if self.docs.scorer == "contextual":
            prepared = await asyncio.to_thread(self._prepare, found)
            embedder = self.embedder()
            scores = [await score_contextual(embedder, f.query, p.units) for f, p in prepared]
            outcomes = await asyncio.to_thread(lambda: [self._finish(p, s) for (_, p), s in zip(prepared, scores, strict=True)])
        else:  # one trip to the worker thread for the whole request
            prepared, outcomes = await asyncio.to_thread(self._static, found)
        replacements = {}
        for (f, _), outcome in zip(prepared, outcomes, strict=True):
            if outcome.refused:
                result.report.refused += 1
                log.info("team %s: document in messages[%d] left whole: pruning would drop %s", self.team, f.message, ", ".join(outcome.refused[:10]))
            elif outcome.text != f.text:
                replacements[f] = outcome.text
                result.removed.append((f, outcome.removed))
        return replacements

    def _prepare(self, found: list[documents.Found]) -> list[tuple[documents.Found, extractive.Prepared]]:
        assert self.docs is not None
        prepared = [(f, extractive.prepare(f.text)) for f in found]
        return [(f, p) for f, p in prepared if p.total >= self.docs.min_tokens]

    def _static(self, found: list[documents.Found]) -> tuple[list[tuple[documents.Found, extractive.Prepared]], list[extractive.Outcome]]:
        prepared = self._prepare(found)
        return prepared, [self._finish(p, score_static(f.query, p.units)) for f, p in prepared]

    def _finish(self, prepared: extractive.Prepared, scores: list[float]) -> extractive.Outcome:
        assert self.docs is not None
        outcome = extractive.finish(prepared, scores, self.docs.budget)
        if self.pruner is not None and not outcome.refused:
            return self.pruner.prune(outcome, self.docs.budget)
        return outcome


def _message_counts(messages: list[Any]) -> list[int]:
    return [_count(_message_text(m)) for m in messages]


def _count(text: str) -> int:
    n = _COUNTS.get(text)
    if n is None:
        n = tokens.count(text)
        if len(_COUNTS) >= _MAX_COUNTS:
            _COUNTS.clear()
        _COUNTS[text] = n
    return n


def _message_text(message: Any) -> str:
    """The text a message carries (text blocks, text documents, tool results); other blocks count 0."""
    if not isinstance(message, dict):
        return ""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    parts = []
    for block in content:
        if not isinstance(block, dict):
            continue
        if isinstance(block.get("text"), str):
            parts.append(block["text"])
        elif isinstance(block.get("source"), dict) and isinstance(block["source"].get("data"), str) and block["source"].get("type") == "text":
            parts.append(block["source"]["data"])
        elif block.get("type") == "tool_result":
            parts.append(_message_text({"content": block.get("content")}))
    return "\n".join(parts)
