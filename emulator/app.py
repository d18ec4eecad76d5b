"""The emulator ASGI app: configuration, counters, routing and the `/_emulator/*` control API."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import os
import random
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import orjson

from .asgi import Call, Receive, Scope, Send
from .batch_runner import BatchStore
from .caching import PrefixStore
from .conversations import ConversationStore
from .faults import FaultQueue, FaultSet, FaultSpecError, parse_fault
from .files import FileStore
from .responses_store import ResponseStore
from .routes import is_openai_call, route

_log = logging.getLogger("emulator")


@dataclass
class EmulatorConfig:
    """Latency model and behaviour knobs. Defaults are instant, for tests."""

    ttft_base_ms: float = 0.0  # time to first byte, fixed part
    ttft_per_uncached_token_ms: float = 0.0  # ... plus this per uncached input token
    ttft_per_cached_token_ms: float = 0.0  # ... plus this per cache-read token (reads are fast)
    ttft_jitter: float = 0.0  # sigma of a lognormal factor (median 1) on each TTFT; 0: deterministic
    per_output_token_ms: float = 0.0  # stream pacing; also added to non-streaming latency
    usage_delay_ms: float = 0.0  # a Chat or completions stream's pause between its last finish chunk and its usage chunk
    default_output_tokens: int = 48  # reply length when max_tokens allows
    tokens_per_delta: int = 4  # words per streamed text delta
    api_keys: set[str] | frozenset[str] | None = None  # None: any non-empty key is accepted
    require_anthropic_version: bool = True
    cache_lookback: int = 20  # Anthropic lookback window (positions, breakpoint included)
    max_breakpoints: int = 4
    openai_cache_ttl_s: float = 600.0  # in-memory retention of OpenAI prefix entries
    record_requests: int = 64  # recent requests kept for GET /_emulator/requests
    batch_delay_ms: float = 0.0  # how long a batch waits (queued) before running its requests
    priority_tier: bool = False  # the organisation has Priority Tier: Messages answers carry anthropic-priority-* limits
    openai_fine_tunes: list[str] = field(default_factory=list)  # fine-tuned models on the account (ft:BASE:ORG:SUFFIX:ID), listed by GET /v1/models
    openai_key_scopes: dict[str, list[str]] = field(default_factory=dict)  # a restricted key → its scopes: another path is OpenAI's 401 'Missing scopes'
    context_windows: dict[str, int] = field(default_factory=dict)  # model glob → tokens, before models.py's windows
    openai_tpm_limits: dict[str, int] = field(default_factory=dict)  # key → tokens per minute: a Chat request over it alone is OpenAI's 429 'Request too large'

    @classmethod
    def realistic(cls, **overrides: Any) -> EmulatorConfig:
        """Plausible production-like latencies for benchmarks and examples."""
        base: dict[str, Any] = dict(
            ttft_base_ms=200.0,
            ttft_per_uncached_token_ms=0.05,
            ttft_per_cached_token_ms=0.002,
            per_output_token_ms=10.0,
            default_output_tokens=64,
        )
        base.update(overrides)
        return cls(**base)

    def ttft_seconds(self, uncached: int, cached: int) -> float:
        ms = (self.ttft_base_ms + self.ttft_per_uncached_token_ms * uncached
              + self.ttft_per_cached_token_ms * cached)
        if self.ttft_jitter:
            ms *= random.lognormvariate(0.0, self.ttft_jitter)  # real providers' TTFT has a long right tail
        return ms / 1000.0


_STAT_FIELDS = (
    "requests_total", "open_requests", "open_streams", "completed_streams", "cancelled_streams",
    "errored_streams", "cancelled_requests", "faults_injected",
)


class Stats:
    """Plain counters (mutated only on the event loop thread; read from anywhere)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        for f in _STAT_FIELDS:
            setattr(self, f, 0)
        self.endpoints: dict[str, int] = {}
        self.statuses: dict[str, int] = {}

    def snapshot(self) -> dict[str, Any]:
        d: dict[str, Any] = {f: getattr(self, f) for f in _STAT_FIELDS}
        d["endpoints"] = dict(self.endpoints)
        d["statuses"] = dict(self.statuses)
        return d

    # typing aid: counters are set dynamically in reset()
    requests_total: int
    open_requests: int
    open_streams: int
    completed_streams: int
    cancelled_streams: int
    errored_streams: int
    cancelled_requests: int
    faults_injected: int


@dataclass
class EmulatorState:
    """Everything mutable, exposed as `app.state` for in-process tests."""

    config: EmulatorConfig
    stats: Stats = field(default_factory=Stats)
    anthropic_cache: PrefixStore = field(default_factory=PrefixStore)
    openai_cache: PrefixStore = field(default_factory=PrefixStore)
    faults: FaultQueue = field(default_factory=FaultQueue)
    responses: ResponseStore = field(default_factory=ResponseStore)
    conversations: ConversationStore = field(default_factory=ConversationStore)
    files: FileStore = field(default_factory=FileStore)
    batches: BatchStore = field(default_factory=BatchStore)
    threads: dict[tuple[str, str], list[dict[str, Any]]] = field(default_factory=dict)  # (key, msg id): a Thread's conversation
    threads_continued: set[tuple[str, str]] = field(default_factory=set)  # each answer in a Thread is continued once
    prompts: dict[tuple[str, str], Any] = field(default_factory=dict)  # (key, msg id): a diagnosed request's prompt
    clock_offset: float = 0.0  # added by POST /_emulator/clock to test TTL expiry
    recent: deque[dict[str, Any]] = field(default_factory=deque)


class Emulator:
    """ASGI callable. `create_app()` returns one; `app.state` holds counters and caches."""

    def __init__(self, config: EmulatorConfig | None = None) -> None:
        self.config = config or EmulatorConfig()
        self.state = EmulatorState(self.config)
        self.state.recent = deque(maxlen=max(1, self.config.record_requests))
        prefix = os.urandom(4).hex()
        self._ids = itertools.count(1)
        self._id_prefix = prefix

    # --- helpers used by provider modules ---------------------------------------------------

    @property
    def stats(self) -> Stats:
        return self.state.stats

    def now(self) -> float:
        return time.monotonic() + self.state.clock_offset

    def natural_length(self, call: Call) -> int:
        """How long the model 'wants' to answer: the x-emulator-output-tokens header, else the
        configured default."""
        v = call.headers.get("x-emulator-output-tokens")
        return int(v) if v and v.isdigit() else self.config.default_output_tokens

    def new_id(self, prefix: str) -> str:
        return f"{prefix}{self._id_prefix}{next(self._ids):012d}"

    def take_faults(self, call: Call, model: str | None, stream: bool) -> FaultSet | None:
        """Faults for this request: the x-emulator-fault header, else the first queued match."""
        if call.scope.get("emulator.internal"):
            return None  # a batch line: faults apply to the batch request itself, not its lines
        spec = call.headers.get("x-emulator-fault")
        fs = parse_fault(spec) if spec else self.state.faults.take(call.path, model, stream)
        if fs is None:
            return None
        fs = fs.for_request(stream)
        if not fs.active:
            return None
        self.stats.faults_injected += 1
        return fs

    async def run_internal(self, method: str, path: str, headers: dict[str, str],
                           body: bytes) -> tuple[int, bytes]:
        """Answer a request in process with the route's own handler: (status, body). Used by
        batches; not counted as an API request, and never given a fault."""
        found = route(method, path)
        if found is None:
            raise ValueError(f"no emulator route for {method} {path}")
        handler, _, params = found
        scope = {"type": "http", "method": method, "path": path, "query_string": b"",
                 "emulator.internal": True,
                 "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]}
        sent: list[dict[str, Any]] = []
        pending = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict[str, Any]:
            if pending:
                return pending.pop()
            await asyncio.get_running_loop().create_future()  # never disconnects
            raise AssertionError("unreachable")

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        call = Call(scope, receive, send, self.now())
        call.params = params
        await call.read_body()
        try:
            await handler(self, call)
        finally:
            call.finish()
        status = next((m["status"] for m in sent if m["type"] == "http.response.start"), 500)
        return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")

    # --- ASGI ----------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        typ = scope["type"]
        if typ == "http":
            await self._http(scope, receive, send)
        elif typ == "lifespan":
            await _lifespan(receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        call = Call(scope, receive, send, self.now())
        method, path = scope["method"], call.path
        found = route(method, path)
        if found is None:
            if path.startswith("/_emulator/"):
                await self._control(call, method, path)
                return
            await self._not_found(call, method, path)
            return
        handler, name, call.params = found
        st = self.stats
        st.requests_total += 1
        key = f"{method} {name}"
        st.endpoints[key] = st.endpoints.get(key, 0) + 1
        st.open_requests += 1
        try:
            await call.read_body()
            self._record(call, method)
            await handler(self, call)
        except Exception:  # an emulator bug must still look like a provider 500
            _log.exception("emulator handler failed for %s %s", method, path)
            if not call.started:
                await self._internal_error(call, path)
        finally:
            st.open_requests -= 1
            call.finish()

    def _record(self, call: Call, method: str) -> None:
        if self.config.record_requests <= 0:
            return
        self.state.recent.append({"method": method, "path": call.path,
                                  "query": call.scope.get("query_string", b""),
                                  "headers": call.headers, "body": call.body})

    def count_status(self, status: int) -> None:
        k = str(status)
        self.stats.statuses[k] = self.stats.statuses.get(k, 0) + 1

    async def _internal_error(self, call: Call, path: str) -> None:
        self.count_status(500)
        if is_openai_call(call):
            await call.json(500, {"error": {"message": "The server had an error while processing "
                                            "your request. Sorry about that!",
                                            "type": "server_error", "param": None, "code": None}})
        else:
            await call.json(500, {"type": "error", "error": {"type": "api_error",
                                                             "message": "Internal server error"}})

    async def _not_found(self, call: Call, method: str, path: str) -> None:
        msg = f"Unknown request URL: {method} {path}."
        if is_openai_call(call):
            await call.json(404, {"error": {"message": msg, "type": "invalid_request_error",
                                            "param": None, "code": "unknown_url"}})
        else:
            await call.json(404, {"type": "error",
                                  "error": {"type": "not_found_error", "message": msg}})

    # --- control API -----------------------------------------------------------------------

    async def _control(self, call: Call, method: str, path: str) -> None:
        await call.read_body()
        name = path[len("/_emulator/"):]
        try:
            body = orjson.loads(call.body) if call.body else {}
        except orjson.JSONDecodeError:
            await call.json(400, {"error": "body is not valid JSON"})
            return
        st = self.state
        if name == "stats" and method == "GET":
            snap = st.stats.snapshot()
            snap["cache"] = {"anthropic_entries": len(st.anthropic_cache.entries),
                             "openai_entries": len(st.openai_cache.entries)}
            snap["pending_faults"] = len(st.faults.rules)
            snap["stored"] = {"responses": len(st.responses.entries), "files": len(st.files.entries),
                              "batches": len(st.batches.entries)}
            await call.json(200, snap)
        elif name == "reset" and method == "POST":
            self.reset()
            await call.json(200, {"ok": True})
        elif name == "faults" and method == "POST":
            try:
                rule = st.faults.add(body)
            except FaultSpecError as e:
                await call.json(400, {"error": str(e)})
                return
            await call.json(200, {"ok": True, "rule": rule.to_json()})
        elif name == "faults" and method == "GET":
            await call.json(200, {"faults": st.faults.to_json()})
        elif name == "faults" and method == "DELETE":
            st.faults.clear()
            await call.json(200, {"ok": True})
        elif name == "clock" and method == "POST":
            st.clock_offset += float(body.get("advance_s", 0))
            await call.json(200, {"offset_s": st.clock_offset})
        elif name == "config" and method in ("GET", "POST"):
            await self._config(call, body if method == "POST" else {})
        elif name == "requests" and method == "GET":
            await call.json(200, {"requests": [_jsonable_request(r) for r in st.recent]})
        else:
            await call.json(404, {"error": f"unknown control endpoint {method} {path}"})

    async def _config(self, call: Call, updates: dict[str, Any]) -> None:
        names = {f.name: f for f in dataclasses.fields(self.config)}
        for k, v in updates.items():
            if k not in names or k == "api_keys":
                await call.json(400, {"error": f"unknown or read-only config field {k!r}"})
                return
            cur = getattr(self.config, k)
            if (isinstance(cur, bool) or not isinstance(v, (int, float))) and type(v) is not type(cur):
                await call.json(400, {"error": f"{k} must be {type(cur).__name__}"})
                return
            setattr(self.config, k, type(cur)(v))
        cfg = {k: getattr(self.config, k) for k in names if k != "api_keys"}
        await call.json(200, cfg)

    def reset(self) -> None:
        """Clear counters, caches, queued faults, recorded requests and the clock offset."""
        st = self.state
        st.stats.reset()
        st.anthropic_cache.clear()
        st.openai_cache.clear()
        st.faults.clear()
        st.responses.clear()
        st.conversations.clear()
        st.files.clear()
        st.batches.clear()
        st.threads.clear()
        st.threads_continued.clear()
        st.prompts.clear()
        st.recent.clear()
        st.clock_offset = 0.0


def _jsonable_request(r: dict[str, Any]) -> dict[str, Any]:
    headers = dict(r["headers"])
    for k in ("x-api-key", "authorization"):
        if k in headers:
            headers[k] = headers[k][:12] + "…" if len(headers[k]) > 12 else headers[k]
    try:
        body: Any = orjson.loads(r["body"]) if r["body"] else None
    except orjson.JSONDecodeError:
        body = r["body"].decode("utf-8", "replace")
    return {"method": r["method"], "path": r["path"], "query": r["query"].decode("latin-1"),
            "headers": headers, "body": body}


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif msg["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def create_app(config: EmulatorConfig | None = None) -> Emulator:
    """A fresh emulator (own caches and counters) as an ASGI callable."""
    return Emulator(config)


def serve(host: str = "127.0.0.1", port: int = 8081, config: EmulatorConfig | None = None) -> None:
    """Run the emulator with uvicorn until interrupted (blocking)."""
    import uvicorn

    uvicorn.run(create_app(config), host=host, port=port, loop="uvloop", http="httptools",
                log_level="warning", access_log=False, lifespan="on")
