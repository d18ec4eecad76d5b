"""One team's prompt-cache optimizer: plan a request before it goes upstream, verify it after.

`draft` runs canonicalization, volatility detection (and the opt-in move), the block layout and
prompt_cache_key; `plan` places breakpoints and predicts the read from the ledger, which a shared
ledger (sdk/promptcache/shared_ledger.py) updates between the two; both are synchronous and touch
only memoised work for blocks seen before. `settle` compares the provider's usage with the
prediction and does the accounting. The router's per-attempt planning (sdk/promptcache/stage.py) calls them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from hashlib import blake2b
from typing import Any

from sdk.policy import Price, PromptCachePolicy
from sdk.promptcache import ledger as ledgers
from sdk.promptcache import stats
from sdk.promptcache.blocks import Block, Layout, anthropic_layout, openai_layout
from sdk.promptcache.canonicalize import canonicalize
from sdk.promptcache.keys import gateway_key, salted
from sdk.promptcache.ledger import (
    OPENAI_MIN,
    OPENAI_TTL_S,
    TTL_S,
    Cause,
    Ledger,
    Prediction,
    Scope,
    Write,
)
from sdk.promptcache.placement import Placement, apply, min_cacheable_tokens, place
from sdk.promptcache.reorder import SystemText, move_lines, system_texts
from sdk.promptcache.tokens import Calibration
from sdk.promptcache.volatility import MAX_SCAN_CHARS, SCAN_BUDGET_CHARS, Finding, VolatilityDetector
from sdk.spend import PriceBook
from sdk.types import LLMRequest, Protocol, Usage

log = logging.getLogger("slipstream.prompt_cache")

MISS_TOLERANCE = 0.9  # a read below 90% of the prediction counts as a miss (token estimates are approximate)


ScopeKey = tuple[str, str, str]  # (protocol, model, OpenAI prompt_cache_key): one provider cache


@dataclass(frozen=True, slots=True)
class Draft:
    protocol: Protocol
    model: str
    body: dict[str, Any]
    layout: Layout
    scope: ScopeKey
    conversation: int
    findings: list[Finding]
    moved: list[str]
    canonicalized: bool


@dataclass(slots=True)
class Plan:
    protocol: Protocol
    model: str
    body: dict[str, Any]
    layout: Layout
    scope: Scope
    ratio: float
    conversation: int
    marks: list[tuple[int, float]]  # (block, ttl seconds) of the entries this request writes
    breakpoints: list[int]  # every breakpoint (Anthropic), for the read prediction
    prediction: Prediction
    findings: list[Finding] = field(default_factory=list)
    moved: list[str] = field(default_factory=list)
    placement: Placement | None = None
    cause: Cause | None = None
    writes: list[Write] = field(default_factory=list)
    canonicalized: bool = False
    chars: int = 0  # what its history snapshot holds (ledger.held_chars), counted with the plan


def _fingerprint(value: Any) -> int:
    """Structural hash of JSON; string hashes are cached on the objects, so this stays cheap."""
    if isinstance(value, dict):
        return hash(tuple((k, _fingerprint(v)) for k, v in value.items()))
    if isinstance(value, list):
        return hash(tuple(_fingerprint(v) for v in value))
    return hash(value)


def _stable_digest(blocks: list[Block]) -> str:
    """blake2b of the blocks' texts joined by NUL, fed block by block: no joined copy of a large
    prefix is made, and hashlib releases the GIL on large updates."""
    digest = blake2b(digest_size=8)
    for i, block in enumerate(blocks):
        if i:
            digest.update(b"\x00")
        digest.update(block.text.encode())
    return digest.hexdigest()


def _conversation(body: dict[str, Any]) -> int:
    """Identity of a thread: its first non-system message (history is append-only)."""
    for message in body.get("messages") or ():
        if isinstance(message, dict) and message.get("role") not in ("system", "developer"):
            return _fingerprint(message.get("content"))
    return 0


def _tool_descriptions(protocol: Protocol, body: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for i, tool in enumerate(body.get("tools") or ()):
        if not isinstance(tool, dict):
            continue
        holder = tool.get("function") if protocol is Protocol.OPENAI else tool
        text = holder.get("description") if isinstance(holder, dict) else None
        if isinstance(text, str) and text:
            out.append((f"tools.{i}", text))
    return out


class Optimizer:
    def __init__(self, team: str, config: PromptCachePolicy, pricing: dict[str, Price] | None = None):
        self.team = team
        self.config = config
        self.prices = PriceBook(pricing or {})  # the policy's `pricing:`, for the money a cache read saved
        self.detector = VolatilityDetector()
        self.used = 0.0  # when its latest request started (wall clock)
        self.ledger = Ledger()
        self.calibration = Calibration()
        self.stats = stats.team_stats(team)
        self._predicted = stats.PREDICTED.labels(team)  # counted on every settled request
        self._logged: set[tuple[str, str]] = set()  # findings already logged at INFO (then DEBUG)

    # --- before the request ----------------------------------------------------------------
    def draft(self, request: LLMRequest, rewrite: bool = True) -> Draft:
        """What does not depend on the ledger: the canonical body, volatile lines (moved if asked), the
        block layout and the cache scope. A shared ledger is read between this and `plan`.
        `rewrite=False` (the body is a view of another shape, responses_view.py): nothing is
        canonicalized or moved; only the cache key and the salt are added."""
        protocol, model = request.protocol, request.model
        body = canonicalize(protocol, request.body) if self.config.canonicalize and rewrite else request.body
        conversation = _conversation(body)
        canonicalized = body is not request.body
        findings, moved, body = self._volatility(protocol, body, conversation, rewrite)
        if self.config.isolate:  # the team's salt leads the prefix: no other team shares its cache entries
            body = salted(protocol, body, self.team)
        if protocol is Protocol.ANTHROPIC:
            if self.config.breakpoints == "auto" and isinstance(body.get("system"), str) and body["system"]:
                # Always the list form, so the prefix renders the same whether or not a marker lands on it.
                body = {**body, "system": [{"type": "text", "text": body["system"]}]}
            layout = anthropic_layout(body, self.team)
            scope: ScopeKey = ("anthropic", model, "")
        else:
            layout = openai_layout(body, self.team)
            if self.config.openai_cache_key and not body.get("prompt_cache_key"):
                # Team + stable prefix (tools, schema, system): requests sharing it land on warm machines.
                stable = layout.first_message - 1
                volatile = any(not (moved and f.movable) for f in findings if not f.path.startswith("tools"))
                # A stable digest (not Python's per-process hash): replicas and restarts must agree on the key.
                suffix = _stable_digest(layout.blocks[: stable + 1]) if stable >= 0 and not volatile else "default"
                # Keyed with the server secret: another team can neither guess nor send it (keys.py).
                body = {**body, "prompt_cache_key": gateway_key(self.team, suffix)}
            scope = ("openai", model, str(body.get("prompt_cache_key") or ""))
        if canonicalized:
            stats.CANONICALIZED.labels(self.team).inc()
            self.stats.canonicalized += 1
        return Draft(protocol, model, body, layout, scope, conversation, findings, moved, canonicalized)

    def cacheable(self, draft: Draft) -> list[int]:
        """Prefix digests another replica's requests may have cached for this one (what a shared
        ledger is asked about): blocks at or past the smallest prefix the provider caches, and before
        the last message, which is new (a conversation's next turn reads what its previous turn
        wrote, which ended before it). An identical prompt sent again through another replica is
        predicted up to its last message only."""
        layout = draft.layout
        minimum = OPENAI_MIN if draft.protocol is Protocol.OPENAI else min_cacheable_tokens(draft.model)
        ratio = self.calibration.ratio(draft.scope[0], draft.model)
        first = next((i for i, pos in enumerate(layout.pos) if pos * ratio >= minimum), len(layout.pos))
        end = len(layout.blocks)
        last = layout.blocks[-1].message if layout.blocks else -1
        while last >= 0 and end > 0 and layout.blocks[end - 1].message == last:
            end -= 1
        return layout.chain[first:end]

    def plan(self, draft: Draft, now: float) -> Plan:
        """Breakpoints (Anthropic) and the read prediction from the ledger as it stands."""
        if draft.protocol is Protocol.ANTHROPIC:
            plan = self._plan_anthropic(draft, now)
        else:
            plan = self._plan_openai(draft, now)
        plan.canonicalized = draft.canonicalized
        plan.chars = ledgers.held_chars(draft.layout)  # with the plan: off the loop for a large request
        return plan

    def _volatility(self, protocol: Protocol, body: dict[str, Any], conversation: int,
                    rewrite: bool) -> tuple[list[Finding], list[str], dict[str, Any]]:
        learn = conversation if self.config.learn_volatile else None
        texts = system_texts(protocol, body)
        findings: list[Finding] = []
        budget = SCAN_BUDGET_CHARS  # what one request may scan in all: texts past it are left alone
        scanned: list[SystemText] = []
        for item in texts:
            if budget <= 0:
                break
            findings += self.detector.scan(item.path, item.text, learn)
            scanned.append(item)
            budget -= min(len(item.text), MAX_SCAN_CHARS)
        for path, text in _tool_descriptions(protocol, body):
            if budget <= 0:
                break
            findings += self.detector.scan(path, text, None, movable_section=False)
            budget -= min(len(text), MAX_SCAN_CHARS)
        texts = scanned
        moved: list[str] = []
        if self.config.reorder and rewrite and any(f.movable for f in findings):
            remove: dict[str, set[int]] = {}
            for finding in findings:
                if finding.movable:
                    remove.setdefault(finding.path, set()).add(finding.line)
            lines = {item.path: self.detector.lines(item.text) for item in texts}
            body, moved = move_lines(protocol, body, texts, lines, remove)
        return findings, moved, body

    @staticmethod
    def _volatile_from(scope: Scope, layout: Layout, findings: list[Finding], moved: bool) -> int | None:
        """First block that still holds volatile content after any move, and whose prefix none of the
        scope's recent requests sent. A finding only guesses that its content changes on every call (so
        that a prefix through it is written at 1.25x and never read); one that recurred unchanged (an
        example timestamp in a tool description, a knowledge-cutoff date, a static UUID, a learned line
        back to a recent value) did not, and keeping every breakpoint out for it left the team with no
        prompt caching for good. Chain digests are cumulative, so one comparison per snapshot."""
        paths = {f.path for f in findings if not (moved and f.movable)}
        if "system" in paths:
            paths.add("system.0")  # a string system prompt becomes one list block before placement
        if not paths:
            return None
        chain = layout.chain
        for i, block in enumerate(layout.blocks):
            if block.path in paths and not any(len(s.chain) > i and s.chain[i] == chain[i] for s in scope.history):
                return i
        return None

    def _plan_anthropic(self, draft: Draft, now: float) -> Plan:
        body, model, layout = draft.body, draft.model, draft.layout
        auto = self.config.breakpoints == "auto"
        ratio = self.calibration.ratio("anthropic", model)
        scope = self.ledger.scope(*draft.scope)
        placement: Placement | None = None
        if self.config.breakpoints != "off":
            placement = place(
                layout, auto=auto, ttl=self.config.ttl, tail_ttl=self.config.tail_ttl,
                minimum=min_cacheable_tokens(model), ratio=ratio,
                volatile_from=self._volatile_from(scope, layout, draft.findings, bool(draft.moved)),
                tail_moved=bool(draft.moved), anchor=self._anchor(scope, layout, now),
            )
            body = apply(body, layout, placement)
            marks = [(m.index, m.ttl) for m in placement.marks]
        else:
            marks = [(i, b.marker) for i, b in enumerate(layout.blocks) if b.marker]
        if layout.auto_marker:
            last = next((i for i in range(len(layout.blocks) - 1, -1, -1) if layout.blocks[i].eligible), -1)
            if last >= 0 and all(i != last for i, _ in marks):
                marks.append((last, layout.auto_marker))
        marks.sort()
        minimum = min_cacheable_tokens(model)
        written = [(i, TTL_S[ttl or "5m"]) for i, ttl in marks if layout.pos[i] * ratio >= minimum]
        if marks and layout.pos[marks[-1][0]] * ratio < minimum:
            written = []  # the provider caches nothing when the last breakpoint is below the minimum (A.5)
        breakpoints = [i for i, _ in marks]
        prediction = self.ledger.predict_anthropic(scope, layout, breakpoints, now, ratio)
        return Plan(Protocol.ANTHROPIC, model, body, layout, scope, ratio, draft.conversation, written, breakpoints,
                    prediction, draft.findings, draft.moved, placement)

    @staticmethod
    def _anchor(scope: Scope, layout: Layout, now: float) -> int:
        """The last block whose prefix the ledger holds live and readable (-1: none)."""
        for b in range(len(layout.blocks) - 1, -1, -1):
            entry = scope.live(layout.chain[b], now)
            if entry is not None and entry.readable:
                return b
        return -1

    def _plan_openai(self, draft: Draft, now: float) -> Plan:
        layout, model = draft.layout, draft.model
        ratio = self.calibration.ratio("openai", model)
        scope = self.ledger.scope(*draft.scope)
        written = [(i, OPENAI_TTL_S) for i in range(len(layout.blocks)) if layout.pos[i] * ratio >= OPENAI_MIN]
        prediction = self.ledger.predict_openai(scope, layout, now, ratio)
        return Plan(Protocol.OPENAI, model, draft.body, layout, scope, ratio, draft.conversation, written, [], prediction,
                    draft.findings, draft.moved)

    def diagnose(self, plan: Plan) -> None:
        plan.cause = self.ledger.diagnose(plan.scope, plan.layout, plan.conversation, plan.ratio)

    def repredict(self, plan: Plan, now: float) -> None:
        if plan.protocol is Protocol.ANTHROPIC:
            plan.prediction = self.ledger.predict_anthropic(plan.scope, plan.layout, plan.breakpoints, now, plan.ratio)
        else:
            plan.prediction = self.ledger.predict_openai(plan.scope, plan.layout, now, plan.ratio)

    def begin(self, plan: Plan, start: float, with_event: bool) -> None:
        plan.writes = self.ledger.begin(plan.scope, plan.layout, plan.marks, plan.prediction.hit, start, plan.ratio, with_event)
        # How far this prefix could be reused by a later request: all of it but what was moved to the
        # tail. A later request that diverges before that point lost cache for a reason worth naming.
        reach = len(plan.layout.blocks) - 1 - (1 if plan.moved else 0)
        reach_pos = round(plan.layout.pos[reach] * plan.ratio) if reach >= 0 else 0
        self.ledger.remember(plan.scope, plan.layout, reach, reach_pos, plan.conversation, start, plan.chars)
        self.used = start

    def sweep(self, now: float) -> None:
        """Let go of what no provider cache can still hold (`Ledger.sweep`), and, a team gone for as long,
        its memo of analysed prompts."""
        self.ledger.sweep(now)
        if self.used < now - ledgers.HISTORY_TTL_S:
            self.detector.forget_texts()

    # --- reporting -------------------------------------------------------------------------
    def report_findings(self, plan: Plan) -> tuple[int, int]:
        """Log and count volatile findings; returns (moved, advice) line counts."""
        moved = advice = 0
        for finding in plan.findings:
            is_move = bool(plan.moved) and finding.movable
            if is_move:
                moved += 1
                stats.MOVES.labels(self.team, finding.kind).inc()
            else:
                advice += 1
                stats.ADVICE.labels(self.team, finding.kind).inc()
            key = (finding.path, finding.kind)
            what = "moved to the latest user turn" if is_move else "left in the cached prefix (advice: move it after the prefix or set prompt_cache.reorder)"
            if key not in self._logged:  # once per place at INFO, without the text: prompts are the client's
                if len(self._logged) < 4096:
                    self._logged.add(key)
                log.info("team %s: volatile %s at %s line %d %s", self.team, finding.kind, finding.path, finding.line, what)
            log.debug("team %s: volatile %s at %s line %d: %r", self.team, finding.kind, finding.path, finding.line, finding.excerpt)
        self.stats.moves += moved
        self.stats.advice += advice
        if plan.placement is not None and plan.placement.remove:
            self.stats.repairs += 1
            stats.REPAIRS.labels(self.team).inc()
            for note in plan.placement.notes:
                log.warning("team %s: %s", self.team, note)
        if plan.cause is not None:
            label = plan.cause.kind
            stats.MISSES.labels(self.team, label).inc()
            stats.MISSED_TOKENS.labels(self.team, label).inc(max(0, plan.cause.lost_tokens))
            self.stats.count_miss(plan.cause.label, plan.cause.kind, plan.cause.excerpt)
            log.info("team %s: prompt cache miss, %s (%d cached tokens lost)", self.team, plan.cause.label, plan.cause.lost_tokens)
            log.debug("team %s: prompt cache miss at %s: %s", self.team, plan.cause.label, plan.cause.excerpt)
        return moved, advice

    # --- after the response ----------------------------------------------------------------
    def settle(self, plan: Plan, usage: Usage) -> None:
        """Compare the provider's usage with the prediction; calibrate; account."""
        total = usage.total_input_tokens
        self.calibration.observe(plan.protocol.value, plan.model, plan.layout.total, total)
        read, write = usage.cache_read_tokens, usage.cache_write_tokens
        if plan.protocol is Protocol.ANTHROPIC and plan.writes:
            if read == 0 and write == 0:
                self.ledger.discard(plan.scope, plan.writes)  # below the provider's minimum after all
            elif plan.writes[-1].created:
                plan.writes[-1].entry.pos = read + write  # exact: the provider's own position of the last breakpoint
        expected = plan.prediction.read
        team = self.stats
        team.requests += 1
        team.hits += 1 if read else 0
        team.input_tokens += total
        team.read_tokens += read
        team.write_tokens += write
        team.expected_read_tokens += expected
        team.saved_usd += stats.saved_usd(self.prices.price(plan.model), read, write)
        self._predicted.inc(expected)
        if expected and read < expected * MISS_TOLERANCE:
            team.expected_misses += 1
            label = "expired_or_evicted"
            team.count_miss(label, label, f"expected {expected} cached tokens, provider read {read}")
            stats.EXPECTED_MISSES.labels(self.team).inc()
            stats.MISSES.labels(self.team, label).inc()
            stats.MISSED_TOKENS.labels(self.team, label).inc(expected - read)
            log.warning("team %s: expected %d cache-read tokens on %s, the provider read %d (entry expired or evicted upstream)",
                        self.team, expected, plan.model, read)
