"""One request through compression: locate and prune material, compact history, count tokens before and after.

CPU work (counting, locating, splitting, static scoring, selection, writing back) runs in one trip to
the heavy-work pool (sdk/offload.py), never on the event loop; the contextual scorer awaits the
shared embedder, which batches in its own thread. The pool serves the teams in turn: in asyncio's
default pool, first come, first served, one team's compression of large documents held every other
team's, and the other users of that pool (the SQLite response store, policy reloads).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sdk.compression import documents, extractive, places, tokens
from sdk.compression.history import HistoryCompactor
from sdk.compression.places import Found
from sdk.compression.scoring import score_contextual, score_static
from sdk.lru import LRU, TeamMemo
from sdk.offload import off_loop
from sdk.pipeline import CompressionReport

if TYPE_CHECKING:
    from sdk.compression.surprisal import TokenPruner
    from sdk.embedding import Embedder

log = logging.getLogger("slipstream.compression")
# (team, digest of a message's text) → tokens: conversations resend the same turns every time. Per team: a
# count found is much faster than one made, and the time shows in x-slipstream-overhead-ms (another team's
# text). A digest, not the text: the memo would keep 16,384 texts of any size alive. When full, the fullest
# team's entries go (sdk/lru.py:TeamMemo), not every team's.
_COUNTS: TeamMemo[bytes, int] = TeamMemo(16_384)
_MAX_OUTCOMES = 1024  # compressed pieces remembered per team
# ... within what their texts hold (the piece as sent, what was dropped): by count alone a team's 1,024
# distinct documents, each up to its body limit, stayed in the process every team shares.
OUTCOME_CHARS = 16 << 20
_MIN_CHARS_PER_TOKEN = 2  # cheap pre-filter: text shorter than this many characters per token cannot reach min_tokens
_KNOWN = extractive.Prepared("", [], [], [], [], [], [], 0)  # placeholder for a piece whose outcome is remembered


@dataclass(frozen=True, slots=True)
class DocumentSettings:
    min_tokens: int
    scope: frozenset[str]  # places searched for material (sdk/compression/places.py)
    scorer: str  # "static" | "contextual"
    budget: extractive.Budget


@dataclass(slots=True)
class Result:
    body: dict[str, Any]
    report: CompressionReport
    removed: list[tuple[Found, list[str]]] = field(default_factory=list)


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
        # Outcomes keyed by a digest of the content (material, question, instructions): an earlier
        # turn resent on every request is compressed once, and always to the same bytes.
        self._outcomes: LRU[bytes, extractive.Outcome] = LRU(_MAX_OUTCOMES, OUTCOME_CHARS, _outcome_chars)
        self._outcomes_lock = threading.Lock()  # pieces compress in worker threads

    async def run(self, body: dict[str, Any], key_id: str = "", size: int = 0) -> Result:
        """Compress `body` (`size` bytes as the client sent it); `key_id` is the team key that sent it (a
        summary it triggers is that key's call)."""
        result = Result(body, CompressionReport())
        if self.docs is not None and self.docs.scorer == "contextual":
            counts = await self._contextual(result)
        else:  # one trip to a worker thread for the whole request: on a busy CPU each trip waits its turn
            counts = await off_loop(self._static, result)
        if self.history is not None:
            messages = result.body["messages"]
            compacted, result.report.history = await self.history.apply(messages, counts[1:], places.frozen_until(body)[0] >= 0,
                                                                        key_id, size)
            if compacted is not messages:
                result.body = {**result.body, "messages": compacted}
                counts = await off_loop(_body_counts, self.team, result.body)
        result.report.after = sum(counts)
        return result

    def _static(self, result: Result) -> list[int]:
        """Count, locate, prune with the static scorer and write back; the final body's counts."""
        found, counts = self._locate(result)
        if not found:
            return counts
        prepared = self._prepare(found)
        outcomes = [o if o is not None else self._finish(f, p, score_static(f.query, p.units, p.words)) for f, p, o in prepared]
        return self._apply(result, prepared, outcomes, counts)

    async def _contextual(self, result: Result) -> list[int]:
        found, counts = await off_loop(self._locate, result)
        if not found:
            return counts
        prepared = await off_loop(self._prepare, found)
        embedder = self.embedder()
        scores = [None if o is not None else await score_contextual(embedder, f.query, p.units, p.words, self.team) for f, p, o in prepared]

        def finish_all() -> list[extractive.Outcome]:
            done: list[extractive.Outcome] = []
            for (f, p, o), s in zip(prepared, scores, strict=True):
                if o is None:
                    assert s is not None  # scored exactly where no outcome was known
                    o = self._finish(f, p, s)
                done.append(o)
            return done

        outcomes = await off_loop(finish_all)
        return await off_loop(self._apply, result, prepared, outcomes, counts)

    def _locate(self, result: Result) -> tuple[list[Found], list[int]]:
        """The material to prune, and the token counts of the body as sent (system, then each message)."""
        counts = _body_counts(self.team, result.body)
        result.report.before = sum(counts)
        if self.docs is None:
            return [], counts
        located = places.locate(result.body, self.docs.scope, self.docs.min_tokens * _MIN_CHARS_PER_TOKEN)
        for place, reason, message in located.left:
            if counts[message + 1] >= self.docs.min_tokens:  # counts[0] is the system prompt (message -1)
                result.report.leave(place, reason)
        return located.found, counts

    def _apply(self, result: Result, prepared: list[tuple[Found, extractive.Prepared, extractive.Outcome | None]], outcomes: list[extractive.Outcome], counts: list[int]) -> list[int]:
        """Write the outcomes into a new body; its counts (or `counts`, the unchanged body's)."""
        edits: dict[tuple[int, int, str], list[documents.Edit]] = {}
        for (f, _, _), outcome in zip(prepared, outcomes, strict=True):
            if outcome.refused:
                result.report.refused += 1
                result.report.leave(f.place, "protected_items")
                log.info("team %s: %s material in %s left whole: pruning would drop %d protected items", self.team, f.place, _where(f),
                         len(outcome.refused))
                log.debug("team %s: protected items in %s: %s", self.team, _where(f), ", ".join(outcome.refused[:10]))  # prompt text: DEBUG only
            elif outcome.text != f.text:
                edits.setdefault((f.message, f.block, f.key), []).append((f.start, f.end, outcome.text))
                result.report.compress(f.place)
                result.removed.append((f, outcome.removed))
        if not edits:
            return counts
        result.body = documents.apply(result.body, edits)
        return _body_counts(self.team, result.body)

    def _prepare(self, found: list[Found]) -> list[tuple[Found, extractive.Prepared, extractive.Outcome | None]]:
        """Each piece prepared, with its outcome when this content was compressed before."""
        assert self.docs is not None
        out = []
        for f in found:
            known = self._remembered(_content_key(f))
            prepared = extractive.prepare(f.text) if known is None else _KNOWN
            if known is not None or prepared.total >= self.docs.min_tokens:
                out.append((f, prepared, known))
        return out

    def _finish(self, found: Found, prepared: extractive.Prepared, scores: list[float]) -> extractive.Outcome:
        assert self.docs is not None
        outcome = extractive.finish(prepared, scores, self.docs.budget, found.query, found.instructions)
        if self.pruner is not None and not outcome.refused:
            outcome = self.pruner.prune(outcome, self.docs.budget, found.query)
        with self._outcomes_lock:
            self._outcomes.put(_content_key(found), outcome)
        return outcome

    def _remembered(self, key: bytes) -> extractive.Outcome | None:
        with self._outcomes_lock:
            return self._outcomes.get(key)


def _outcome_chars(outcome: extractive.Outcome) -> int:
    """What a remembered outcome holds: its text, and the units it dropped and could not keep."""
    return len(outcome.text) + sum(map(len, outcome.removed)) + sum(map(len, outcome.refused))


def _content_key(found: Found) -> bytes:
    return hashlib.blake2b(f"{found.text}\0{found.query}\0{found.instructions}".encode(), digest_size=16).digest()


def _where(found: Found) -> str:
    return "system" if found.message == documents.SYSTEM else f"messages[{found.message}]"


def _body_counts(team: str, body: dict[str, Any]) -> list[int]:
    """Tokens of the system prompt, then of each message."""
    system = body.get("system")
    return [_count(team, _message_text(m)) for m in [{"content": system}, *body["messages"]]]


def _count(team: str, text: str) -> int:
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
    n = _COUNTS.get(team, digest)
    if n is None:
        n = tokens.count(text)
        _COUNTS.put(team, digest, n)
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
